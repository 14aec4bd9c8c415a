"""A run's gradient spikes: GET /api/runs/{run_id}/spikes. The rule and the detector are in
andrea/spikes.py, each spike's anatomy (tensors, layer, non-finite elements, numerical flags) in
andrea/spike_anatomy.py; here the committed records are read a page at a time, the tensors are
named from the run's layout, and each outlier row of the newest spikes gets its data source and
the start of its text: the row's tokens made again from the run's batch spec (the same bytes
the trainer got for that step) and decoded with the run's tokenizer. A read, open to all, like
the metrics.

What a read may cost is bounded (viewers poll it while a run trains): an answer is current
for a request when it was made for the run's last step, or, while a trainer trains the run,
when it was begun less than spikes_fresh_s ago (a trainer's steps move the last step every
few milliseconds, and a poller must not make one each; a run whose training ended gets its
last answer at once). A current answer kept is served as it is; otherwise a request awaits the
run's answer being made (single-flight: one task per run that every request it is current for
awaits), or begins the next one. Making it is incremental: the run's
detector (SpikeFinder) is kept and fed only the records after the last one it saw (a resume
that cut the records back to before it starts it over), and each spike's rows are described
once (its batch made once).
So a new answer costs what the new records cost, not the run's length: each spike's JSON is
made once too (again only where its rows or boundary gain their description), an answer joins
them. At most COMPUTING are made at once; a run's newest MAX_SPIKES are kept and listed (a
run that found more says how many older ones were left out: `omitted`). What is kept of the
runs (detector, spikes, their JSON, the answer) is bounded by its memory, not by a count of
runs: each run's is estimated (_RunSpikes.estimate, held to a measure of the real objects by
tests/api/test_web_reads.py) and the runs least recently asked go first while the sum is over
Settings.spikes_cache_bytes. The x-andrea-spikes header says how an answer came:
`computed; records=N; batches=M` (records fed, batches made for it), `shared` (another
request's computation) or `kept`. (A trainer that commits a step below one the detector has
seen, out of order, is not seen until the detector starts over; the engine sends its steps in
order.)"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections import OrderedDict
from functools import partial

from fastapi import APIRouter, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from andrea import spike_anatomy as anatomy
from andrea import spikes as rule
from andrea import tasks
from andrea.config import Settings
from andrea.data import tokenizer as tk
from andrea.data.batches import make_batch
from andrea.run_config import run_layout
from andrea.runs.info import ENDED
from andrea.web.deps import DataDep, FanoutDep, RunDep, RunsDep, SettingsDep, StoreDep
from andrea.web.quotas import app_state

router = APIRouter(prefix="/api", tags=["runs"])

DETAILED = 50       # the newest spikes whose outlier rows get their source and text
TEXT_CHARS = 300    # of each row's text
MAX_SPIKES = 5000       # a run's newest spikes kept and listed (a NaN every step is a spike)
COMPUTING = 2       # answers made at once, over all runs
FEED_PAGE = 250     # records read at a time (~2.5 ms of a reader thread: the loop waits less)
HEADER = "x-andrea-spikes"
BUDGET = Settings.model_fields["spikes_cache_bytes"].default    # (the app passes its setting)
# A kept run's memory, estimated (_RunSpikes.estimate) from what is cheap to count: its
# detector with full running medians and its object overhead; per tensor of its layout; per
# phase change its detector saw; per spike, SPIKE_BYTES and BYTES_PER_JSON_BYTE per byte of
# its JSON for its objects (besides the JSON itself); per described row, ROW_BYTES besides
# its strings. Measured (CPython 3.11; records with and without row losses, per-tensor norms,
# non-finite counts, phases): a spike's objects take up to 2.6 times its JSON plus ~350 B, a
# run's fixed part ~15 KB; the estimate is 1.1-1.5 times what tests/api/test_web_reads.py measures.
RUN_BYTES, TENSOR_BYTES, CHANGE_BYTES = 16 << 10, 320, 160
SPIKE_BYTES, BYTES_PER_JSON_BYTE, ROW_BYTES = 1024, 3, 192
RULE = {"window": rule.WINDOW, "factor": rule.FACTOR, "min_history": rule.MIN_HISTORY,
        "quiet": rule.QUIET, "boundary": rule.BOUNDARY, "top_tensors": anatomy.TOP_TENSORS,
        "collapse_denom": anatomy.COLLAPSE_DENOM, "logit_factor": anatomy.LOGIT_FACTOR}


def _json(obj) -> bytes:
    """As the app's JSON responses encode (starlette's JSONResponse.render)."""
    return json.dumps(obj, ensure_ascii=False, allow_nan=False, indent=None,
                      separators=(",", ":")).encode("utf-8")


class _RunSpikes:
    """One run's detector, fed up to `fed` (the step and commit time of the last record it
    saw; its newest MAX_SPIKES spikes kept, `omitted` older ones dropped), its spikes' described
    rows (step -> {row: (source, text), or None where the batch has no such row}), each spike's
    JSON as last listed (step -> ((rows described, boundary weights known), JSON)), and its last
    answer (last step, JSON, the clock's time when it was begun)."""

    def __init__(self, tensors: list[dict]):
        self.tensors = tensors      # the run's layout's (name, layer) of each parameter tensor
        self.lock = asyncio.Lock()
        self.reset()

    def reset(self) -> None:
        self.finder = rule.SpikeFinder(self.tensors)
        self.fed: tuple[int, float | None] | None = None
        self.omitted = 0
        self.described: dict[int, dict[int, tuple[str, str] | None]] = {}
        self.shown: dict[int, tuple[tuple[bool, bool], bytes]] = {}
        self.answer: tuple[int | None, bytes, float] | None = None

    def estimate(self) -> int:
        """The bytes it holds, about (an upper estimate: see RUN_BYTES): its answer, each
        spike's JSON and the spike's objects, its described rows' text, its layout and the
        phase changes its detector keeps."""
        size = (RUN_BYTES + TENSOR_BYTES * len(self.tensors)
                + CHANGE_BYTES * len(self.finder.changes))
        if self.answer is not None:
            size += sys.getsizeof(self.answer[1])
        # Every spike listed has its JSON in `shown` (a spike not listed yet: its JSON's size
        # is not known; only a computation that failed leaves one, and it is reset).
        size += sum(SPIKE_BYTES + (1 + BYTES_PER_JSON_BYTE) * len(js)
                    for _, js in self.shown.values())
        size += sum(ROW_BYTES + sys.getsizeof(d[0]) + sys.getsizeof(d[1])
                    if d is not None else ROW_BYTES
                    for rows in self.described.values() for d in rows.values())
        return size


class _Flight:
    """A run's answer being made: for its last step, begun (by `clock`) at `begun`."""

    def __init__(self, last: int | None, begun: float, future: asyncio.Future):
        self.last, self.begun, self.future = last, begun, future


class Spikes:
    """The app's (app.state.spikes): the runs kept (LRU, their estimated bytes `size` in all
    at most `budget_bytes`), the answer being made for each run (its newest: `flights`), and
    how many were made (`computed`). An answer is current for a request for the run's last
    step `last` when it was made for that step or, while a trainer trains the run
    (`training`), begun less than `fresh_s` ago by `clock`."""

    def __init__(self, fresh_s: float, clock=time.monotonic, budget_bytes: int = BUDGET):
        self.fresh_s, self.budget, self.clock = fresh_s, budget_bytes, clock
        self.runs: OrderedDict[str, _RunSpikes] = OrderedDict()
        self.sizes: dict[str, int] = {}     # each kept run's estimate, as last made
        self.size = 0
        self.flights: dict[str, _Flight] = {}
        self.computing = asyncio.Semaphore(COMPUTING)
        self.computed = 0

    def current(self, made_for: int | None, begun: float, last: int | None,
                training: bool) -> bool:
        return made_for == last or training and self.clock() - begun < self.fresh_s

    def keep(self, run_id: str, state: _RunSpikes) -> None:
        """Keeps `state` as the run's, the most recently asked, at its size now; the least
        recently asked runs go while the sum is over the budget (this one too, where it
        alone is over it: its answer has been made, a later one starts over)."""
        self.drop(run_id)
        self.runs[run_id] = state
        self.sizes[run_id] = size = state.estimate()
        self.size += size
        while self.size > self.budget:
            self.drop(next(iter(self.runs)))

    def drop(self, run_id: str, state: _RunSpikes | None = None) -> None:
        """Forgets the run's kept state (only where it is `state`, if given)."""
        if run_id in self.runs and (state is None or self.runs[run_id] is state):
            del self.runs[run_id]
            self.size -= self.sizes.pop(run_id)


@router.get("/runs/{run_id}/spikes")
async def get_spikes(request: Request, run: RunDep, store: StoreDep, hub: DataDep,
                     runs: RunsDep, settings: SettingsDep, fanout: FanoutDep) -> dict:
    """The run's spikes, oldest first: step, grad norm, its running level and their ratio, why
    it counts (reasons), the phase boundary it follows, its outlier rows (row index, loss,
    excess over the step's loss, source, text), and its anatomy: the tensors and the layer with
    the largest shares of the step's squared gradient norm, its non-finite gradient elements,
    the loss kernel's largest |logit| and smallest softmax denominator, and numerical flags;
    with the rule that found them."""
    cache: Spikes = app_state(request.app, "spikes", lambda: Spikes(
        settings.spikes_fresh_s, budget_bytes=settings.spikes_cache_bytes))
    run_id, last = run["id"], run.get("last_step")
    training = _training(run, fanout)
    state = cache.runs.get(run_id)
    if state is not None and state.answer is not None and cache.current(
            state.answer[0], state.answer[2], last, training):
        cache.runs.move_to_end(run_id)
        return _response(state.answer[1], "kept")
    flight = cache.flights.get(run_id)
    if flight is not None and cache.current(flight.last, flight.begun, last, training):
        body, _ = await asyncio.shield(flight.future)
        return _response(body, "shared")
    # The run's next answer (one for an earlier step, not current for this request, is made
    # to its end for its own requests; this one waits for it: the run's lock).
    flight = cache.flights[run_id] = _Flight(last, cache.clock(), asyncio.ensure_future(
        _compute(cache, run, store, hub, runs)))
    flight.future.add_done_callback(lambda _, flight=flight: _landed(cache, run_id, flight))
    body, how = await asyncio.shield(flight.future)     # (made to the end if this request goes)
    return _response(body, how)


def _training(run: dict, fanout) -> bool:
    """A trainer is at the run and its training has not ended: its last step is moving."""
    return run["status"] not in ENDED and fanout.has_trainer(run["id"])


def _response(body: bytes, how: str) -> Response:
    return Response(body, media_type="application/json", headers={HEADER: how})


def _landed(cache: Spikes, run_id: str, flight: _Flight) -> None:
    if cache.flights.get(run_id) is flight:
        del cache.flights[run_id]
    if not flight.future.cancelled():
        flight.future.exception()   # retrieved: a failure is its requests' (503, 500), not lost


async def _compute(cache: Spikes, run: dict, store, hub, runs) -> tuple[bytes, str]:
    """The run's answer, made from its kept detector (fed the records it has not seen) and
    kept: (JSON, how it was made)."""
    run_id, last = run["id"], run.get("last_step")
    tensors = [{"name": p["name"], "layer": p["layer"]}
               for p in run_layout(run["config"])["params"]]
    async with cache.computing:
        state = cache.runs.get(run_id)
        if state is None or state.tensors != tensors:
            state = _RunSpikes(tensors)
            cache.keep(run_id, state)
        async with state.lock:
            begun = cache.clock()       # (the answer holds the records committed by now)
            try:
                fed = await _feed(state, store, run_id)
                body, made = await _answer(state, hub, runs, run_id)
            except BaseException:
                state.reset()   # fed part of a page, perhaps: start over next time
                cache.drop(run_id, state)
                raise
            state.answer = (last, body, begun)
            cache.computed += 1
            # At its new size (kept again where it went meanwhile: it is the newest).
            cache.keep(run_id, state)
    return body, f"computed; records={fed}; batches={made}"


async def _feed(state: _RunSpikes, store, run_id: str) -> int:
    """Feeds the detector the records after the last one it saw, a page at a time (off the
    event loop); starts it over where the run's records went back (a resume deleted the last
    one it saw: gone, or committed again since, at another time). Returns the records fed."""
    check = state.fed is not None
    after = state.fed[0] - 1 if check else None
    fed = 0
    while True:
        page = await store.run(store.metrics.page, run_id, after, FEED_PAGE)
        full = len(page) == FEED_PAGE
        if check:
            check = False
            if not page or (page[0]["step"], page[0].get("time")) != state.fed:
                state.reset()
                after = None
                continue
            page = page[1:]
        if page:
            await run_in_threadpool(lambda page=page: [state.finder.feed(r) for r in page])
            state.fed = (page[-1]["step"], page[-1].get("time"))
            fed += len(page)
            spikes = state.finder.spikes        # (feed only appends to it)
            if len(spikes) > MAX_SPIKES:
                old = len(spikes) - MAX_SPIKES
                for s in spikes[:old]:
                    state.shown.pop(s["step"], None)
                del spikes[:old]
                state.omitted += old
        if not full:
            return fed
        after = state.fed[0]


async def _answer(state: _RunSpikes, hub, runs, run_id: str) -> tuple[bytes, int]:
    """The answer's JSON from the detector's spikes (never changed here: copies get the rows'
    source and text and the boundaries' weights), each spike's encoded once for each form it
    is listed in; and how many batches were made for it."""
    found = state.finder.spikes
    newest = [s for s in found[-DETAILED:] if s["rows"]]
    missing = [s for s in newest if s["step"] not in state.described]
    made = {}
    if missing:
        made = await run_in_threadpool(_describe_rows, hub, runs, run_id, missing)
    steps = {s["step"] for s in newest}     # older spikes are never described again
    state.described = {k: v for k, v in {**state.described, **made}.items() if k in steps}
    weights = {}
    if any(s.get("boundary") for s in found):
        weights = await run_in_threadpool(_describe_boundaries, hub, runs, run_id, found)
    body = await run_in_threadpool(_encode, state, weights)
    return body, len(made)


def _encode(state: _RunSpikes, weights: dict[int, list]) -> bytes:
    """{"rule": RULE, "spikes": [...], "omitted": N (only where some were)}, as _json would
    encode it, from each spike's JSON as it was last made where its form is the same."""
    found, shown = state.finder.spikes, state.shown
    window = max(0, len(found) - DETAILED)
    parts = []
    for i, s in enumerate(found):
        rows = state.described.get(s["step"]) if i >= window and s["rows"] else None
        w = weights.get(i)
        form = (rows is not None, w is not None)
        kept = shown.get(s["step"])
        if kept is None or kept[0] != form:
            spike = s
            if rows is not None:
                spike = {**spike, "rows": [_described(row, rows.get(row["row"]))
                                           for row in s["rows"]]}
            if w is not None:
                spike = {**spike, "boundary": {**s["boundary"], "weights": w}}
            kept = shown[s["step"]] = (form, _json(spike))
        parts.append(kept[1])
    omitted = b',"omitted":%d' % state.omitted if state.omitted else b""
    return b'{"rule":' + _json(RULE) + b',"spikes":[' + b",".join(parts) + b"]" + omitted + b"}"


def _described(row: dict, described: tuple[str, str] | None) -> dict:
    if described is None:
        return row
    return {**row, "source": described[0], "text": described[1]}


def _describe_rows(hub, runs, run_id: str, found: list[dict]
                   ) -> dict[int, dict[int, tuple[str, str] | None]]:
    """Each spike's rows' source and text, by step (None: its batch has no such row), where
    the run's batches can be made here; a step whose batch cannot be made is left out."""
    spec = runs.get(run_id)
    if spec is None:
        return {}
    if spec.task:       # a toy task's rows: its problems, in its alphabet
        corpus, bandit, names = None, None, [spec.task]
        decode = tasks.decode
    else:
        corpus = hub.prepared(spec.vocab_size)
        bandit, names = runs.bandit(run_id, corpus.source_names), corpus.source_names
        decode = partial(tk.decode, corpus.tokenizer)
    out = {}
    for s in found:
        try:
            batch = make_batch(corpus, spec, s["step"] - 1, "train", bandit)
        except Exception:   # a corpus changed since, a phase not decided here: rows as they are
            continue
        rows: dict[int, tuple[str, str] | None] = {}
        for row in s["rows"]:
            b = row["row"]
            rows[b] = None if b >= len(batch.sources) else (
                names[int(batch.sources[b])], decode(batch.tokens[b][:-1])[:TEXT_CHARS])
        out[s["step"]] = rows
    return out


def _describe_boundaries(hub, runs, run_id: str, found: list[dict]) -> dict[int, list]:
    """For each phase boundary (by its spike's index in `found`), the sources whose sampling
    weight changed there: boundary.weights = [{source, before, after}], the largest change
    first (the phases up to the reports: an answer never waits for the bandit)."""
    spec = runs.get(run_id)
    if spec is None or spec.task:
        return {}
    bandit = runs.bandit(run_id, hub.prepared(spec.vocab_size).source_names)
    if bandit is None:
        return {}
    phases = {p.index: p.weights for p in bandit.phases_reported(spec.total_steps)}
    out = {}
    for i, s in enumerate(found):
        b = s.get("boundary")
        if not b or b["phase"] not in phases or b["previous"] not in phases:
            continue
        pairs = zip(bandit.sources, phases[b["previous"]], phases[b["phase"]])
        changed = [{"source": n, "before": w0, "after": w1} for n, w0, w1 in pairs
                   if abs(w1 - w0) > 1e-9]
        out[i] = sorted(changed, key=lambda c: -abs(c["after"] - c["before"]))
    return out
