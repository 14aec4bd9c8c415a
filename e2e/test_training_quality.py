"""8-bit AdamW trains as well as fp32 AdamW: `tiny`, 300 steps each, same seed and batches,
through the real page (headless CLI). Final loss (mean of the last 20 steps) within 2%."""

import json
import subprocess
import sys

import httpx

STEPS = 300


def start(live_server, optimizer) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "andrea", "train", "--headless",
                             "--preset", "tiny", "--optimizer", optimizer, "--steps", str(STEPS),
                             "--batch-size", "4", "--seed", "3", "--server", live_server, "--json",
                             # No evals or samples: they cost a third of the time and touch no
                             # weight.
                             "--eval-every", "0", "--sample-every", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def losses(live_server, proc: subprocess.Popen) -> list[float]:
    out, err = proc.communicate(timeout=1200)
    assert proc.returncode == 0, out + err
    run_id = json.loads(out.strip().splitlines()[-1])["run_id"]
    return [m["loss"] for m in httpx.get(f"{live_server}/api/runs/{run_id}/metrics").json()]


def test_8bit_final_loss_within_2_percent_of_fp32(live_server):
    # The two runs train side by side (two browsers): neither reads the other's state, and the
    # suite's longest test then takes what cores the machine has free.
    procs = [start(live_server, opt) for opt in ("adamw", "adamw_8bit")]
    try:
        fp32, q8 = (losses(live_server, p) for p in procs)
    finally:
        for p in procs:
            p.kill()
    assert len(fp32) == len(q8) == STEPS
    def tail(xs):
        return sum(xs[-20:]) / 20
    print("\nstep    fp32     8-bit")
    for s in (1, 10, 50, 100, 150, 200, 250, 300):
        print(f"{s:4d}  {fp32[s - 1]:.4f}  {q8[s - 1]:.4f}")
    gap = abs(tail(q8) - tail(fp32)) / tail(fp32)
    print(f"final (mean of last 20): fp32 {tail(fp32):.4f}  8-bit {tail(q8):.4f}  gap {gap:.2%}")
    assert tail(fp32) < 0.8 * fp32[0], "fp32 did not learn"
    assert gap <= 0.02
