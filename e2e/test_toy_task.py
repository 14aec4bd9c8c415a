"""A toy task run in real Chromium, start to end: the new-run form's task, its held-out accuracy
rising and charted, its samples answering problems, and the prompt box answering from the model
training in the tab, from the run's newest checkpoint in a viewer's tab, and from its final
weights."""

from __future__ import annotations

import httpx
import numpy as np

from andrea import tasks
from tests.browser import PAGE_WAIT_MS

STEPS = 300
DIGITS = 4
TIMEOUT = 600_000


def ask(page) -> dict:
    """Generate in the page's prompt box; -> what it says and the tokens it wrote."""
    page.click("#prompt-go")
    page.wait_for_function("['done', 'failed'].includes(document.body.dataset.prompt)",
                           timeout=PAGE_WAIT_MS)
    return page.evaluate("""() => ({
        state: document.body.dataset.prompt,
        source: document.getElementById('prompt-status').textContent,
        prompt: document.querySelector('#prompt-out .sample-prompt')?.textContent,
        tokens: [...document.querySelectorAll('#prompt-out .prompt-token')].map(
            (s) => [s.textContent, Number(s.dataset.p)]),
    })""")


def attention(page, text: str) -> dict:
    """The page's attention maps of `text` (4 digits reversed); -> what it says, the tokens on
    its axes, and per layer and head the share of the answer's rows whose largest cell is the
    prompt digit the next answer token copies: the mean probability there."""
    if not page.evaluate("document.getElementById('attention-details').open"):
        page.click("#attention-details summary")
    page.fill("#attention-text", text)
    page.click("#attention-go")
    page.wait_for_function("['done', 'failed'].includes(document.body.dataset.attention)",
                           timeout=PAGE_WAIT_MS)
    return page.evaluate("""() => {
        const maps = [...document.querySelectorAll('#attention-maps figure')];
        const L = Math.max(...maps.map((f) => Number(f.dataset.layer))) + 1;
        // Row i (a token of "1234>4321") predicts token i + 1: from '>' (i = 4) on, the digit
        // it writes is the prompt's at 7 - i (the anti-diagonal of the prompt's columns).
        const mirror = [...Array(L)].map(() => []);
        for (const f of maps) {
          const rows = [...f.querySelectorAll('tbody tr')];
          let p = 0, n = 0;
          for (let i = 4; i < 8; i++) {
            const cells = [...rows[i].querySelectorAll('td')].slice(1, i + 2)
              .map((c) => Number(c.title.split(': ').pop()));
            p += cells[7 - i];
            n++;
          }
          mirror[Number(f.dataset.layer)].push(p / n);
        }
        return {
          state: document.body.dataset.attention,
          source: document.getElementById('attention-status').textContent,
          tokens: JSON.parse(document.getElementById('attention-maps').dataset.tokens),
          maps: maps.length, mirror,
        };
    }""")


def errors_of(page, errors: list[str]) -> list[str]:
    """Console errors and uncaught exceptions of a page, into `errors` as they come."""
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    return errors


def test_a_reverse_run_learns_and_answers_its_prompts(browser, live_server):
    trainer = browser.new_context().new_page()
    errors = errors_of(trainer, [])
    trainer.goto(live_server + "/")
    trainer.wait_for_function("document.body.dataset.ready === '1'", timeout=PAGE_WAIT_MS)
    trainer.select_option("#task", "reverse")
    trainer.wait_for_function("!document.getElementById('task-fields').hidden")
    assert trainer.input_value("#preset") == "toy"      # the preset sized for the tasks
    trainer.select_option("#preset", "tiny")            # (tiny learns reverse 4 fast enough)
    trainer.fill("input[name=task_digits]", str(DIGITS))
    for name, value in {"steps": STEPS, "batch_size": 32, "eval_every": 25, "sample_every": 100,
                        "checkpoint_every": 50, "seed": 1}.items():
        trainer.fill(f"input[name={name}]", str(value))
    trainer.wait_for_function("document.getElementById('task-example').textContent.includes('>')")
    # A CPU adapter (SwiftShader here): the form says which size learns in a minute.
    trainer.wait_for_function("document.getElementById('data-budget').textContent"
                              ".includes('trains on the CPU')", timeout=PAGE_WAIT_MS)
    assert trainer.is_hidden("#sources")        # the corpus's fields are not a task's
    trainer.wait_for_function("!document.getElementById('start').disabled")
    trainer.click("#start")
    trainer.wait_for_url("**/runs/*")
    run_id = trainer.url.rsplit("/", 1)[1]
    cfg = httpx.get(f"{live_server}/api/runs/{run_id}").json()["config"]
    facts = tasks.facts("reverse", DIGITS)
    assert (cfg["task"], cfg["task_digits"], cfg["vocab_size"], cfg["seq_len"]) == (
        "reverse", DIGITS, tasks.VOCAB, facts.problem_len - 1)

    # Mid-run, paused after a checkpoint: the tab's own model answers, and a viewer's tab
    # answers from the newest checkpoint, loaded into its own GPU.
    trainer.wait_for_function("Number(document.getElementById('charts').dataset.steps || 0) >= 110",
                              timeout=TIMEOUT)
    trainer.click("#pause")
    trainer.wait_for_function("document.body.dataset.status === 'paused'", timeout=PAGE_WAIT_MS)
    prompt = trainer.input_value("#prompt")
    assert len(prompt) == facts.answer_start and prompt.endswith(">")
    live = ask(trainer)
    assert live["state"] == "done" and "training in this tab" in live["source"], live
    assert live["prompt"] == prompt and len(live["tokens"]) == facts.answer_len
    assert all(0 < p <= 1 for _, p in live["tokens"])
    viewer = browser.new_context().new_page()
    errors_of(viewer, errors)
    viewer.goto(f"{live_server}/runs/{run_id}")
    viewer.wait_for_function("!document.getElementById('prompt-card').hidden",
                             timeout=PAGE_WAIT_MS)
    viewer.fill("#prompt", prompt)
    seen = ask(viewer)
    step = httpx.get(f"{live_server}/api/runs/{run_id}").json()["checkpoint"]["last_step"]
    assert step >= 100 and f"checkpoint after step {step}" in seen["source"], seen
    assert len(seen["tokens"]) == facts.answer_len

    live_maps = attention(trainer, "1234>4321")
    assert "training in this tab" in live_maps["source"], live_maps
    cfg_model = httpx.get(f"{live_server}/api/runs/{run_id}/layout").json()["config"]
    assert live_maps["maps"] == cfg_model["n_layer"] * cfg_model["n_head"]
    assert live_maps["tokens"] == list("1234>4321")      # the text's tokens label both axes
    # The viewer scrubs to a checkpoint: the list holds each, newest first.
    viewer.click("#attention-details summary")
    viewer.wait_for_function("document.querySelectorAll('#attention-weights option').length > 2",
                             timeout=PAGE_WAIT_MS)
    oldest = viewer.evaluate("[...document.querySelectorAll('#attention-weights option')]"
                             ".pop().value")
    viewer.select_option("#attention-weights", oldest)
    old = attention(viewer, "1234>4321")
    assert f"checkpoint after step {oldest}" in old["source"], old

    trainer.click("#resume")
    trainer.wait_for_function("document.body.dataset.done !== undefined", timeout=TIMEOUT)
    assert trainer.evaluate("document.body.dataset.done") == "finished"

    # The accuracy on held-out problems, every eval: it rises, and the page charts it.
    metrics = httpx.get(f"{live_server}/api/runs/{run_id}/metrics").json()
    acc = [(m["step"], m["eval_acc"]) for m in metrics if "eval_acc" in m]
    assert [s for s, _ in acc] == list(range(25, STEPS + 1, 25)), acc
    print("\nreverse 4 on SwiftShader, exact match by step:",
          " ".join(f"{s}:{a:.2f}" for s, a in acc))
    assert acc[0][1] < 0.2 and max(a for _, a in acc[-3:]) >= acc[0][1] + 0.3, acc
    assert trainer.get_attribute("[data-chart=accuracy]", "data-points") == str(STEPS)
    assert "exact match on held-out problems:" in trainer.inner_text("#stats")
    # The model's inside at every eval, charted: a point per eval in each line chart (the
    # residual RMS, the dead units, the update ratio of each layer's tensors), and each layer's
    # MLP histogram the shares of the last eval.
    inside = [m["step"] for m in metrics if "resid_rms" in m and "update_ratio" in m]
    assert inside == list(range(25, STEPS + 1, 25)), inside
    trainer.wait_for_function(f"""() => {{ const v = window.andreaInside;
        return v && v.lines.every((c) => c.box.dataset.points === '{len(inside)}')
          && v.hists.every((h) => h.box.dataset.step === '{STEPS}'); }}""", timeout=PAGE_WAIT_MS)
    view = trainer.evaluate("""() => { const v = window.andreaInside; return {
        lines: v.lines.map((c) => c.title),
        hists: v.hists.map((h) => h.plot.data[1].reduce((a, b) => a + b, 0)) }; }""")
    assert view["lines"][:2] == ["residual stream RMS", "dead MLP units"], view
    assert view["lines"][2:] == [f"update / weight: {g}" for g in
                                 ["embed", *(f"layer {i}" for i in range(cfg_model["n_layer"])),
                                  "final norm"]], view
    assert len(view["hists"]) == cfg_model["n_layer"] and all(
        abs(t - 1) < 1e-6 for t in view["hists"]), view
    samples = httpx.get(f"{live_server}/api/runs/{run_id}").json()["samples"]
    assert samples and all(">" in s["text"] and ("(right)" in s["text"] or "(wrong: " in s["text"])
                           for s in samples), samples

    # Trained, a head reads the reversed digit: each answer token's row puts much of its
    # attention on the prompt digit it copies (the map's anti-diagonal), where a head that
    # spread it evenly would put a fifth to an eighth.
    final_maps = attention(trainer, "1234>4321")
    assert "final weights" in final_maps["source"]
    mirror = [max(share) for share in final_maps["mirror"]]
    print("attention on the mirrored digit, per layer and head:", final_maps["mirror"])
    even = np.mean([1 / (i + 1) for i in range(4, 8)])             # 0.158
    assert max(mirror) >= 2.5 * even, final_maps["mirror"]          # 0.479 measured

    # Finished: the viewer's box now loads the final weights.
    final = ask(viewer)
    assert "final weights" in final["source"] and len(final["tokens"]) == facts.answer_len
    assert errors == []
