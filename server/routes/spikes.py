"""A run's gradient spikes: GET /api/runs/{run_id}/spikes. The rule and the detector are in
andrea/spikes.py, each spike's anatomy (tensors, layer, non-finite elements, numerical flags) in
andrea/spike_anatomy.py; here the committed records are read a page at a time, the tensors are
named from the run's layout, and each outlier row of the newest spikes gets its data source and
the start of its text: the row's tokens made again from the run's batch spec (the same bytes
the trainer got for that step) and decoded with the run's tokenizer. A read, open to all, like
the metrics."""

from __future__ import annotations

from collections import OrderedDict

from fastapi import APIRouter
from starlette.concurrency import run_in_threadpool

from andrea import spike_anatomy as anatomy
from andrea import spikes as rule
from andrea.data import tokenizer as tk
from andrea.data.batches import make_batch
from andrea.deps import DataDep, RunDep, RunsDep, StoreDep
from andrea.model import run_layout
from andrea.routes.exports import record_pages

router = APIRouter(prefix="/api", tags=["runs"])

DETAILED = 50       # the newest spikes whose outlier rows get their source and text
TEXT_CHARS = 300    # of each row's text
CACHED = 64         # runs whose answer is kept until their last step moves (viewers poll it)
_answers: OrderedDict[str, tuple[int | None, dict]] = OrderedDict()


@router.get("/runs/{run_id}/spikes")
async def get_spikes(run: RunDep, store: StoreDep, hub: DataDep, runs: RunsDep) -> dict:
    """The run's spikes, oldest first: step, grad norm, its running level and their ratio, why
    it counts (reasons), the phase boundary it follows, its outlier rows (row index, loss,
    excess over the step's loss, source, text), and its anatomy: the tensors and the layer with
    the largest shares of the step's squared gradient norm, its non-finite gradient elements,
    the loss kernel's largest |logit| and smallest softmax denominator, and numerical flags;
    with the rule that found them."""
    kept = _answers.get(run["id"])
    if kept and kept[0] == run.get("last_step"):
        _answers.move_to_end(run["id"])
        return kept[1]
    finder = rule.SpikeFinder([p["name"] for p in run_layout(run["config"])["params"]])
    async for page in record_pages(store, run["id"]):   # fed off the event loop
        await run_in_threadpool(lambda page=page: [finder.feed(r) for r in page])
    found = finder.spikes
    newest = [s for s in found[-DETAILED:] if s["rows"]]
    if newest:
        await run_in_threadpool(_describe_rows, hub, runs, run["id"], newest)
    if any(s.get("boundary") for s in found):
        await run_in_threadpool(_describe_boundaries, hub, runs, run["id"], found)
    answer = {"rule": {"window": rule.WINDOW, "factor": rule.FACTOR,
                       "min_history": rule.MIN_HISTORY, "quiet": rule.QUIET,
                       "boundary": rule.BOUNDARY, "top_tensors": anatomy.TOP_TENSORS,
                       "collapse_denom": anatomy.COLLAPSE_DENOM,
                       "logit_factor": anatomy.LOGIT_FACTOR},
              "spikes": found}
    _answers[run["id"]] = (run.get("last_step"), answer)
    while len(_answers) > CACHED:
        _answers.popitem(last=False)
    return answer


def _describe_rows(hub, runs, run_id: str, found: list[dict]) -> None:
    """Adds source and text to each spike's rows, where the run's batches can be made here."""
    spec = runs.get(run_id)
    if spec is None:
        return
    corpus = hub.prepared(spec.vocab_size)
    bandit = runs.bandit(run_id, corpus.source_names)
    for s in found:
        try:
            batch = make_batch(corpus, spec, s["step"] - 1, "train", bandit)
        except Exception:   # a corpus changed since, a phase not decided here: rows as they are
            continue
        for row in s["rows"]:
            b = row["row"]
            if b < len(batch.sources):
                row["source"] = corpus.source_names[int(batch.sources[b])]
                row["text"] = tk.decode(corpus.tokenizer, batch.tokens[b][:-1])[:TEXT_CHARS]


def _describe_boundaries(hub, runs, run_id: str, found: list[dict]) -> None:
    """Adds to each phase boundary the sources whose sampling weight changed there:
    boundary.weights = [{source, before, after}], the largest change first (phases decided here
    only: an answer never waits for the bandit)."""
    spec = runs.get(run_id)
    if spec is None:
        return
    bandit = runs.bandit(run_id, hub.prepared(spec.vocab_size).source_names)
    if bandit is None:
        return
    phases = {p.index: p.weights for p in bandit.phases()}
    for s in found:
        b = s.get("boundary")
        if not b or b["phase"] not in phases or b["previous"] not in phases:
            continue
        pairs = zip(bandit.sources, phases[b["previous"]], phases[b["phase"]])
        changed = [{"source": n, "before": w0, "after": w1} for n, w0, w1 in pairs
                   if abs(w1 - w0) > 1e-9]
        b["weights"] = sorted(changed, key=lambda c: -abs(c["after"] - c["before"]))
