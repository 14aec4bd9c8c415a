"""What bench/room.py and bench/room_node.py share, apart from any browser: a room's reports
read back page by page, each worker's split of a round (training, sending, waiting,
downloading, evaluating) and the room's, the outer step's `lr,momentum` option, and the table
as it is printed (Said)."""

from __future__ import annotations

import httpx

EVAL_BATCHES = 8    # validation batches every final model is evaluated on
PHASES = ("train_ms", "send_ms", "wait_ms", "download_ms", "eval_ms")   # a report's timings


def room_reports(url: str, run_id: str) -> list[dict]:
    """Every worker's report of the room, page by page."""
    reports, offset = [], 0
    while offset is not None:
        page = httpx.get(f"{url}/api/runs/{run_id}/room/reports",
                         params={"offset": offset, "limit": 1000}, timeout=60).json()
        reports += page["reports"]
        offset = page["next"] if page["reports"] else None
    return reports


def round_phases(reports: list[dict], rounds: int) -> list[str]:
    """Per worker, then the room's: mean ms per round trained in each phase, the inner steps it
    took a round (fewer than H where its rounds were cut), and the share of the time not
    training. A report of version v carries v's wait, download and eval, then its training and
    sending (room_worker.js); the room's last version (v == rounds) is trained by none, its
    report only its wait, download and eval: so the sums over a worker's reports are its
    rounds' time from joining to the end, divided by the rounds it trained. A worker's first
    version (the one it joined at) is left out: its eval compiles the kernels (9.7 s of a
    tiny round's 0.2 s eval on SwiftShader), a cost of joining, not of a round."""
    sums: dict = {}
    first: dict = {}
    for r in reports:
        first[r["worker"]] = min(first.get(r["worker"], r["version"]), r["version"])
    for r in reports:
        if r.get("timings") is None or r["version"] == first[r["worker"]]:
            continue
        s = sums.setdefault(r["worker"], dict.fromkeys(PHASES, 0.0) | {"rounds": 0, "steps": 0})
        for k in PHASES:
            s[k] += r["timings"][k]
        s["rounds"] += r["version"] < rounds
        s["steps"] += len(r["losses"])
    if not sums:
        return ["  (no timings reported)"]
    sums["room"] = {k: sum(s[k] for s in sums.values()) for k in (*PHASES, "rounds", "steps")}
    lines = [f"  {'ms per round':>14s} " + " ".join(f"{k[:-3]:>9s}" for k in PHASES)
             + f" {'steps':>6s} {'overhead':>9s}"]
    for who, s in sums.items():
        n = max(s["rounds"], 1)
        total = sum(s[k] for k in PHASES)
        share = (total - s["train_ms"]) / total if total else 0.0
        name = who if who == "room" else f"worker {who}"
        lines.append(f"  {name:>14s} " + " ".join(f"{s[k] / n:9.1f}" for k in PHASES)
                     + f" {s['steps'] / n:6.1f} {share:9.1%}")
    return lines


def outer_step(pair: str) -> dict:
    """'lr,momentum' -> the room's outer settings; '' -> the room's defaults."""
    if not pair:
        return {}
    lr, mu = (float(x) for x in pair.split(","))
    return {"outer_lr": lr, "outer_momentum": mu}


class Said:
    """A bench's table as it prints: say(line) prints it at once and keeps it; save(path)
    appends what was said to `path` (--out), when given."""

    def __init__(self):
        self.lines: list[str] = []

    def __call__(self, s: str = "") -> None:
        print(s, flush=True)
        self.lines.append(s)

    def save(self, path: str | None) -> None:
        if path:
            with open(path, "a") as f:
                f.write("\n".join(self.lines) + "\n")
