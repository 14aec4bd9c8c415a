"""`andrea generate RUN_ID PROMPT`: a run's newest weights from a running server continue a
prompt with PyTorch (the greedy chain that the weights spell), from the final weights or a
checkpoint's, and every refusal is one line with exit code 2."""

from __future__ import annotations

import httpx
import pytest

from andrea import tasks
from andrea.cli.main import main
from tests.api.test_export import chain_weights
from tests.trainer_client import bearer, new_run

CHAIN = "1234567"        # the weights' greedy continuation of "1" is "234567", then newlines

# The server is the session's (tests/browser.py live_server): each test makes and reads runs of
# its own, by id.


def task_run(url: str, weights: bool) -> dict:
    run = new_run(url, task="copy", steps=5)
    if weights:
        w = chain_weights(run["layout"], tasks.encode(CHAIN) + [0])
        r = httpx.put(f"{url}/api/runs/{run['id']}/weights", content=w.astype("<f4").tobytes(),
                      headers=bearer(run["token"]), timeout=60)
        assert r.status_code == 204, r.text
    return run


def test_generate_continues_a_prompt_with_the_runs_final_weights(live_server, capsys):
    run = task_run(live_server, weights=True)
    assert main(["generate", run["id"], "1", "--server", live_server, "--tokens", "8",
                 "--temperature", "0"]) == 0
    assert capsys.readouterr().out == "234567\n\n\n"
    # Sampling at a temperature follows the same chain: the chain's logits are 1 apart from the
    # rest at most, so check only that it writes its tokens, every one of the alphabet.
    assert main(["generate", run["id"], "12", "--server", live_server, "--tokens", "5",
                 "--temperature", "1", "--top-k", "3", "--seed", "4"]) == 0
    out = capsys.readouterr().out
    assert len(out) >= 5 and set(out) <= set(tasks.ALPHABET)


def cli(*args: str) -> int:
    """`andrea ARGS`'s exit code (argparse's refusals exit; the command returns)."""
    try:
        return main(list(args))
    except SystemExit as e:
        return e.code


@pytest.mark.parametrize("args,why", [
    (["nope", "1"], "unknown run"),
    (["{bare}", "1"], "has no weights yet"),
    (["{run}", "12a"], "'a' are not in it"),
    (["{run}", "1", "--tokens", "0"], "--tokens"),
    (["{run}", "1", "--step", "3"], "no checkpoint at step 3"),
])
def test_generate_refusals_are_one_line_exit_2(live_server, capsys, args, why):
    ids = {"run": task_run(live_server, weights=True)["id"],
           "bare": task_run(live_server, False)["id"]}
    assert cli("generate", *[a.format(**ids) for a in args], "--server", live_server) == 2
    err = capsys.readouterr().err.strip()
    assert why in err and len(err.splitlines()) == 1, err
