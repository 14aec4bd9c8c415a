"""What `andrea train` says: progress on stderr (a bar on a terminal, a line per tenth of the run
in a log), and at the end the result: stdout gets one JSON object with --json (else the run in
a few lines of words), stderr one line "andrea train: <reason>" when it failed, each reason said
once.
"""

from __future__ import annotations

import json
import re
import sys
import time


def report(args, result: dict) -> None:
    """The error as one line on stderr; with --json, the result as one JSON object on stdout,
    else the run in words (summary)."""
    progress_end()
    if result.get("error"):
        result["error"] = " ".join(str(result["error"]).split())
        print(f"andrea train: {result['error']}", file=sys.stderr, flush=True)
    if args.json:
        print(json.dumps(result), flush=True)
        return
    lines = summary(result)
    if lines:
        print("\n".join(lines), flush=True)


def summary(result: dict) -> list[str]:
    """The result for a terminal: the run, how it ended and its numbers in words, what is not
    known left out (no run: nothing, the error line said why) and the page's read-back counters
    left to --json; the error is stderr's line, not said again."""
    if not result.get("run_id"):
        return []
    room = "rounds" in result
    head = f"{'room run' if room else 'run'} {result['run_id']}"
    if result.get("server"):
        head += f" on {result['server']}"
    facts = [result["status"]] if result.get("status") else []
    if room:
        if result.get("version") is not None:
            facts.append(f"version {result['version']} of {result['rounds']} rounds")
        if result.get("workers") is not None:
            facts.append(f"{result['workers']} worker(s)")
        if result.get("final_eval_loss") is not None:
            facts.append(f"global eval loss {result['final_eval_loss']:.4f} (version "
                         f"{result['final_eval_version']})")
        if result.get("sent_bytes"):
            facts.append(f"{result['sent_bytes'] / 2**20:.1f} MiB of pseudo-gradients sent "
                         f"from here")
    if result.get("steps") is not None:
        facts.append(f"{result['steps']} steps")
    if result.get("final_loss") is not None:
        facts.append(f"final loss {result['final_loss']:.4f}")
    if result.get("final_eval_loss") is not None and not room:
        facts.append(f"eval loss {result['final_eval_loss']:.4f}")
    if result.get("final_eval_acc") is not None:
        facts.append(f"{result['final_eval_acc']:.1%} of held-out problems answered exactly")
    if result.get("final_grad_norm") is not None:
        facts.append(f"grad norm {result['final_grad_norm']:.3g}")
    if result.get("median_step_ms") is not None:
        facts.append(f"median step {result['median_step_ms']:.1f} ms")
    if isinstance(result.get("adapter"), dict):
        facts.append(f"on {adapter_name(result['adapter'])}")
    if result.get("device_losses"):
        facts.append(f"GPU device lost {result['device_losses']} time(s)")
    lines = [head + (": " + ", ".join(facts) if facts else "")]
    if result.get("resume_link"):
        lines.append(f"resume link: {result['resume_link']}")
    if result.get("join_link"):
        lines.append(f"join link: {result['join_link']}")
    if result.get("resume_hint"):
        lines.append(f"({result['resume_hint']})")
    return lines


def unexpected(e: BaseException) -> str:
    """An error nobody foresaw, still one line: its type and its message's first line."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return f"unexpected {type(e).__name__}" + (f": {lines[0]}" if lines else "")


def adapter_name(adapter: dict) -> str:
    """The WebGPU adapter the browser offers, in words."""
    name = " ".join(filter(None, (adapter.get("vendor"), adapter.get("architecture")))) or \
        adapter.get("description") or "(unnamed)"
    return name + (" (software)" if adapter.get("fallback") else "")


# Prefixes that say where an error was seen, not what it says: the page throws an error and shows
# it too, so "page error: X" and "Cannot train here: X" are one error.
_SEEN_AS = re.compile(r"^(?:(?:page error|browser|Cannot train here|Training failed|"
                      r"Uncaught|[A-Za-z]*Error):\s*)+")


def page_exit(result: dict, page: dict, timeout: float, what: str = "run") -> int:
    """How the page ended (chromium.drive's result) as the command's exit code, with
    result["ok"] and, when it failed, result["error"]: 130 interrupted, 1 failed, 0 finished."""
    from andrea.cli.train_args import EXIT_FAILED, EXIT_INTERRUPTED
    if page["interrupted"]:
        result["error"] = "interrupted"
        return EXIT_INTERRUPTED
    result["ok"] = page["done"] == "finished" and not page["errors"]
    if result["ok"]:
        return 0
    late = f"no result within {timeout:.0f} s"
    result["error"] = one_reason([
        *page["errors"], page["error_text"],
        f"{late}: the {what} was stopped" if page.get("timed_out") else
        None if page["done"] else late]) or f"the {what} ended {page['done']}"
    return EXIT_FAILED


def one_reason(reasons) -> str:
    """The reasons joined, each said once: a reason whose message another reason already
    contains is dropped, keeping the more informative one (the longer; the first of equals)."""
    texts = list(dict.fromkeys(" ".join(r.split()) for r in reasons if r and r.strip()))
    kept = []
    for i, text in enumerate(texts):
        said = _SEEN_AS.sub("", text)
        if any(j != i and said in other and
               (len(other) > len(text) or (len(other) == len(text) and j < i))
               for j, other in enumerate(texts)):
            continue
        kept.append(text)
    return "; ".join(kept)


_tty = sys.stderr.isatty()
_logged_tenth = {"value": -1}


def progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def progress_bar(done: int, total: int, loss, width: int = 30) -> None:
    """A bar redrawn in place on a terminal; in a log, a line per tenth of the run."""
    loss_s = "-" if loss is None else f"{loss:.4f}"
    if not _tty:
        tenth = 10 * done // max(total, 1)
        if tenth != _logged_tenth["value"]:
            _logged_tenth["value"] = tenth
            print(f"step {done}/{total} loss {loss_s}", file=sys.stderr, flush=True)
        return
    filled = int(width * done / max(total, 1))
    print(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} loss {loss_s}",
          end="", file=sys.stderr, flush=True)


def progress_end() -> None:
    if _tty:
        print(file=sys.stderr)


def spike_line(s: dict) -> str:
    """One gradient spike (GET /api/runs/{id}/spikes) in words, for stderr."""
    norm = "non-finite" if s["grad_norm"] is None else f"{s['grad_norm']:.3g}"
    parts = [f"spike at step {s['step']}: grad norm {norm} ({'; '.join(s['reasons'])})"]
    if s.get("boundary"):
        b = s["boundary"]
        moved = ", ".join(f"{w['source']} {w['before']:.2f}->{w['after']:.2f}"
                          for w in b.get("weights", [])[:3])
        parts.append(f"{b['steps_after']} step(s) after the data phase {b['previous']} -> "
                     f"{b['phase']}" + (f" ({moved})" if moved else ""))
    if s.get("layer"):
        top = s["tensors"][0]
        layer = s["layer"]
        parts.append(f"mostly {layer['name']} ({100 * layer['share']:.0f}% of the squared norm; "
                     f"{top['name'] or top['index']} {100 * top['share']:.0f}%)")
    parts += [f["text"] for f in s.get("numerical", []) if f["flag"] != "nonfinite_grad"]
    for r in s.get("rows", [])[:1]:
        loss = "non-finite" if r["loss"] is None else f"{r['loss']:.3f}"
        text = " ".join((r.get("text") or "").split())[:60]
        parts.append(f"highest row {r['row']} loss {loss}"
                     + (f" from {r['source']}: {text!r}" if r.get("source") else ""))
    return "; ".join(parts)


SPIKES_TIMEOUT_S = 5     # a spikes poll that gets no answer within this is skipped


class SpikeLog:
    """Prints each new gradient spike (GET /api/runs/{id}/spikes, at most every POLL_S) on
    stderr while the run trains; a failed poll is skipped (the next one catches up)."""
    POLL_S = 5.0

    def __init__(self):
        self.after, self.next_poll = 0, 0.0

    def poll(self, url: str, run_id: str, last: bool = False) -> None:
        """`last`: the run has ended: asked now, whenever the previous poll was (the spikes of
        its last POLL_S seconds were never printed)."""
        if time.monotonic() < self.next_poll and not last:
            return
        self.next_poll = time.monotonic() + self.POLL_S
        from andrea.cli import http_client
        try:
            found = http_client.request("GET", f"{url}/api/runs/{run_id}/spikes",
                                        timeout=SPIKES_TIMEOUT_S)["spikes"]
        except (http_client.ServerError, http_client.Unreachable):
            return
        for s in found:
            if s["step"] > self.after:
                progress(spike_line(s))
                self.after = s["step"]
