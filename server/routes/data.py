"""Data API: corpus description, tokenizer for decoding, and binary batches (server/data/).

Batches for a run:    GET /api/runs/{run_id}/batches/{step}, .../val_batches/{index}
Ad hoc (no run yet):  GET /api/batches/{step}?preset=tiny&seed=0&batch_size=8&mode=uniform
                      GET /api/val_batches/{index}?preset=...   (same query)
Ad hoc specs are registered as `adhoc-<hash>` runs (header X-Andrea-Run), so both go through
the same code; their responses carry the ad hoc run's write token (X-Andrea-Token) for
POST /api/runs/{id}/source_losses, which, as every write, needs `Authorization: Bearer`. The
body format is in server/data/wire.py.

No batch request holds a thread while it waits: a bandit run's batch whose phase needs
training losses still in flight waits on the event loop (_wait_for_reports), at most
MAX_WAITING of them per run, and one that asks far ahead of the reports is answered at once
(503, Retry-After). The batch itself is made on Starlette's thread pool once it can be.

Every request's work is bounded: tokenizers exist for the presets' vocab sizes only, ad hoc
batches are at most what a run of the preset could ask (batch size, context, steps), and an
ad hoc bandit run is at most AD_HOC_BANDIT_STEPS long (its phases are decided from step 0).
"""

from __future__ import annotations

import asyncio
import base64
from typing import Annotated, Literal

from fastapi import APIRouter, HTTPException, Path, Query, Request
from fastapi.responses import FileResponse, Response
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from andrea import tasks
from andrea.data import tokenizer as tk
from andrea.data import wire
from andrea.data.bandit import NotReady, SourceBandit
from andrea.data.batches import CorpusMismatch, make_batch
from andrea.data.hub import DataHub, PreparedCorpus
from andrea.data.run_registry import MAX_REPORT_LAG, MAX_WAITING, RunRegistry
from andrea.data.shards import batch_step, rounds_total
from andrea.data.sources import CorpusError
from andrea.data.spec import MAX_STEPS, BatchSpec
from andrea.model import PRESETS, VOCAB_SIZES
from andrea.run_config import RunConfig
from andrea.schemas import (
    CorpusInfo,
    EncodedText,
    LossesTaken,
    RunData,
    TaskInfo,
    TextToEncode,
    TokenizerInfo,
)
from andrea.web.deps import DataDep, RunDep, RunsDep, StoreDep, bearer, check_write_token

router = APIRouter(prefix="/api", tags=["data"])

# The binary batch body (wire.py), for /openapi.json.
BATCH = {200: {"content": {wire.MEDIA_TYPE: {}}, "description": "a batch, wire.py's format"}}
Step = Annotated[int, Path(ge=0, lt=2**32, description="training step, from 0")]
Index = Annotated[int, Path(ge=0, lt=2**32, description="validation batch index, from 0")]


def _prepare(hub: DataHub, vocab_size: int) -> PreparedCorpus:
    try:
        return hub.prepared(vocab_size)
    except CorpusError as e:        # user text changed or vanished since start
        raise HTTPException(500, f"corpus unavailable: {e}") from e
    except ValueError as e:
        raise HTTPException(400, str(e)) from e


# Tokenizers are built only for the vocabulary sizes a run may ask for (model.VOCAB_SIZES): each
# costs seconds and megabytes once; any other size would be a new one per request.
_FIELDS = RunConfig.model_fields
MAX_BATCH_SIZE = next(m.le for m in _FIELDS["batch_size"].metadata if hasattr(m, "le"))
MAX_RUN_STEPS = next(m.le for m in _FIELDS["steps"].metadata if hasattr(m, "le"))
AD_HOC_BANDIT_STEPS = 100_000


def _vocab_of(key: str) -> int:
    """A preset name ("tiny") or a vocabulary size a run may have ("512")."""
    if key in PRESETS:
        return PRESETS[key].vocab_size
    if key.isascii() and key.isdecimal() and int(key) in VOCAB_SIZES:
        return int(key)
    raise HTTPException(404, f"unknown tokenizer {key!r}: give a preset ({', '.join(PRESETS)}) "
                             f"or a run's vocab size ({', '.join(map(str, VOCAB_SIZES))})")


@router.get("/corpus")
def corpus(hub: DataDep, preset: Annotated[str | None, Query()] = "tiny",
           vocab_size: Annotated[int | None, Query(ge=tk.MIN_VOCAB, le=65536)] = None
           ) -> CorpusInfo:
    """Sources in corpus order (the batch header's source indices), with token and split sizes
    for the given preset's (or vocabulary size's) tokenizer."""
    if vocab_size is not None and vocab_size not in VOCAB_SIZES:
        raise HTTPException(400, f"vocab_size must be one a run may have: "
                                 f"{', '.join(map(str, VOCAB_SIZES))}")
    return _prepare(hub, vocab_size or _vocab_of(preset or "tiny")).describe()


@router.get("/tokenizer/{key}")
def tokenizer(hub: DataDep, key: str) -> TokenizerInfo:
    """What the browser needs to decode samples: the bytes of every token id, base64. `task`:
    the toy tasks' alphabet (tasks.py)."""
    if key == tasks.TOKENIZER_KEY:
        return TokenizerInfo(vocab_size=tasks.VOCAB, n_tokens=len(tasks.ALPHABET),
                             corpus_hash="", eot=tasks.END, eot_id=0,
                             token_bytes_b64=[base64.b64encode(c.encode()).decode("ascii")
                                              for c in tasks.ALPHABET],
                             tokenizer_json=f"/api/tokenizer/{key}/tokenizer.json")
    c = _prepare(hub, _vocab_of(key))
    return TokenizerInfo(vocab_size=c.vocab_size, n_tokens=c.tokenizer.get_vocab_size(),
                         corpus_hash=c.corpus_hash, eot=tk.EOT,
                         eot_id=c.tokenizer.token_to_id(tk.EOT),
                         token_bytes_b64=tk.decode_table(c.tokenizer),
                         tokenizer_json=f"/api/tokenizer/{key}/tokenizer.json")


@router.get("/tokenizer/{key}/tokenizer.json")
def tokenizer_json(hub: DataDep, key: str) -> Response:
    """The standard Hugging Face tokenizer.json (for PyTorch/transformers after export)."""
    if key == tasks.TOKENIZER_KEY:
        return Response(tasks.tokenizer().to_str(), media_type="application/json")
    return FileResponse(_prepare(hub, _vocab_of(key)).tokenizer_path, media_type="application/json")


@router.get("/tasks/{task}")
def task_info(task: str, digits: Annotated[int | None, Query(ge=1, le=tasks.MAX_DIGITS)] = None
              ) -> TaskInfo:
    """A toy task's facts for `digits` (default: the task's): its alphabet, its problems'
    length and where their answers lie, and an example problem."""
    try:
        f = tasks.facts(task, digits)
    except ValueError as e:
        raise HTTPException(404 if task not in tasks.TASKS else 400, str(e)) from e
    prompt, answer = tasks.example(task, f.digits)
    return TaskInfo(**f.to_dict(), example=prompt + answer + tasks.END)


@router.post("/tokenizer/{key}/encode")
def encode_text(hub: DataDep, key: str, body: TextToEncode) -> EncodedText:
    """A prompt's token ids under the tokenizer a run trained with (the page's prompt box:
    the browser has the decode table only). A toy task's alphabet refuses other characters."""
    if key == tasks.TOKENIZER_KEY:
        bad = sorted(set(body.text) - set(tasks.ALPHABET))
        if bad:
            raise HTTPException(422, f"a toy task's text is made of {tasks.ALPHABET.strip()!r} and "
                                     f"newlines; {''.join(bad)[:20]!r} are not in it")
        return EncodedText(ids=tasks.encode(body.text))
    c = _prepare(hub, _vocab_of(key))
    return EncodedText(ids=c.tokenizer.encode(body.text).ids)


REPORTS_POLL_S = 0.02       # how often a waiting batch request looks at the reports arrived


def _not_ready(detail: str) -> HTTPException:
    return HTTPException(503, detail, headers={"Retry-After": "1"})


async def _wait_for_reports(runs: RunRegistry, run_id: str, bandit: SourceBandit,
                            step: int) -> None:
    """Returns once `step`'s bandit phase can be decided without waiting: on the event loop,
    holding no thread, up to the bandit's wait_s; 503 with Retry-After at once for a step far
    ahead of the reports, or when MAX_WAITING requests of the run already wait."""
    need = await run_in_threadpool(bandit.needs, step)
    if bandit.reported_to >= need:
        return
    await run_in_threadpool(bandit.refill_to, need)     # reports another process received
    behind = f"steps 1..{bandit.reported_to} have arrived"
    if need - bandit.reported_to > MAX_REPORT_LAG:
        raise _not_ready(f"step {step} is too far ahead of the training: its bandit phase needs "
                         f"the training losses of steps 1..{need}, and {behind}; ask for a "
                         "step once the steps before it have been trained and reported")
    if not runs.start_waiting(run_id):
        raise _not_ready(f"{MAX_WAITING} batch requests of run {run_id} already wait for its "
                         f"training losses (step {step} needs steps 1..{need}, and {behind}); "
                         "retry in a second")
    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + bandit.wait_s
        while bandit.reported_to < need:
            if loop.time() >= deadline:
                raise _not_ready(f"step {step}'s bandit phase waits for the training losses of "
                                 f"steps 1..{need}; steps 1..{bandit.reported_to} have arrived")
            await asyncio.sleep(REPORTS_POLL_S)
    finally:
        runs.stop_waiting(run_id)


async def _batch_response(hub: DataHub, runs: RunRegistry, run_id: str, step: int,
                          split) -> Response:
    spec = await run_in_threadpool(runs.get, run_id)
    if spec is None:
        raise HTTPException(404, f"unknown run {run_id!r}")
    if spec.task:       # a toy task's problems: no corpus, no bandit
        try:
            batch = await run_in_threadpool(make_batch, None, spec, step, split)
        except ValueError as e:
            raise HTTPException(400, str(e)) from e
        return Response(await run_in_threadpool(wire.encode, batch), media_type=wire.MEDIA_TYPE,
                        headers={"X-Andrea-Run": run_id, "X-Andrea-Sources": spec.task})
    corpus = await run_in_threadpool(_prepare, hub, spec.vocab_size)
    try:
        bandit = await run_in_threadpool(runs.bandit, run_id, corpus.source_names)
        if bandit is not None and split == "train" and step < spec.total_steps:
            await _wait_for_reports(runs, run_id, bandit, step)
        batch = await run_in_threadpool(make_batch, corpus, spec, step, split, bandit)
    except CorpusMismatch as e:
        raise HTTPException(409, str(e)) from e
    except NotReady as e:           # telemetry still in flight: the page retries
        raise HTTPException(503, str(e), headers={"Retry-After": "1"}) from e
    except ValueError as e:         # StepOutOfRange, seq_len longer than every source, ...
        raise HTTPException(400, str(e)) from e
    headers = {"X-Andrea-Run": run_id, "X-Andrea-Sources": ",".join(corpus.source_names)}
    if run_id.startswith("adhoc-"):
        headers["X-Andrea-Token"] = runs.ad_hoc_token(run_id)
    body = await run_in_threadpool(wire.encode, batch)
    return Response(body, media_type=wire.MEDIA_TYPE, headers=headers)


@router.get("/runs/{run_id}/batches/{step}", response_class=Response, responses=BATCH)
async def run_batch(hub: DataDep, runs: RunsDep, run_id: str, step: Step) -> Response:
    """B x (T + 1) training tokens for `step`: the same bytes for the same (run, step)."""
    return await _batch_response(hub, runs, run_id, step, "train")


@router.get("/runs/{run_id}/room/batches/{version}/{slot}/{step}", response_class=Response,
            responses=BATCH)
async def room_batch(hub: DataDep, runs: RunsDep, run: RunDep, version: Index, slot: Index,
                     step: Step) -> Response:
    """A room worker's batch: the one of its slot's inner step `step` in the round that trains
    global version `version` (data/shards.py): no two workers of a round share one."""
    cfg = run["config"]
    room = cfg.room
    if room is None:
        raise HTTPException(404, f"run {run['id']} is not a room run")
    for value, bound, what in ((version, rounds_total(cfg), "rounds"),
                               (slot, room.max_workers, "worker slots"),
                               (step, room.inner_steps, "inner steps per round")):
        if value >= bound:
            raise HTTPException(400, f"this room has {bound} {what} (from 0); {value} is past "
                                     "them")
    return await _batch_response(hub, runs, run["id"], batch_step(cfg, version, slot, step),
                                 "train")


@router.get("/runs/{run_id}/val_batches/{index}", response_class=Response, responses=BATCH)
async def run_val_batch(hub: DataDep, runs: RunsDep, run_id: str, index: Index) -> Response:
    """Validation batch `index`, from the held-out tail of every source."""
    return await _batch_response(hub, runs, run_id, index, "val")


@router.get("/runs/{run_id}/data")
def run_data(hub: DataDep, runs: RunsDep, run_id: str) -> RunData:
    """The run's batch spec, its sources, and its bandit phases: those decided so far, at
    least up to its last reported step (chart marks)."""
    spec = runs.get(run_id)
    if spec is None:
        raise HTTPException(404, f"unknown run {run_id!r}")
    if spec.task:
        return RunData(run_id=run_id, spec=spec.to_dict(), sources=[spec.task], corpus_hash="",
                       phases=[])
    corpus = _prepare(hub, spec.vocab_size)
    bandit = runs.bandit(run_id, corpus.source_names)
    return RunData(run_id=run_id, spec=spec.to_dict(), sources=corpus.source_names,
                   corpus_hash=corpus.corpus_hash,
                   phases=[p.to_dict() for p in bandit.phases_reported(spec.total_steps)]
                   if bandit else [])


class SourceLosses(BaseModel):
    """Per-source mean training loss at one step, as a telemetry record carries it (for runs
    without a trainer socket, such as ad hoc ones)."""
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)
    step: int = Field(ge=0, lt=MAX_STEPS)
    losses: dict[str, float] = Field(max_length=256,
                                     description="{source index: mean training loss}")


@router.post("/runs/{run_id}/source_losses")
async def report_source_losses(request: Request, hub: DataDep, runs: RunsDep, store: StoreDep,
                               run_id: str, body: SourceLosses) -> LossesTaken:
    """Authorised by the run's write token (Authorization: Bearer; an ad hoc run's is the
    X-Andrea-Token of its batches)."""
    spec = await asyncio.to_thread(runs.get, run_id)
    if spec is None:
        raise HTTPException(404, f"unknown run {run_id!r}")
    if run_id.startswith("adhoc-"):
        if not runs.ad_hoc_token_ok(run_id, bearer(request)):
            raise HTTPException(403, "wrong or missing write token (an ad hoc run's is the "
                                     "X-Andrea-Token header of its batches)")
    else:
        await check_write_token(store, run_id, bearer(request))
    if body.step > spec.total_steps:
        raise HTTPException(400, f"step {body.step} is beyond the run's {spec.total_steps} "
                                 "steps")

    def report() -> bool:
        runs.bandit(run_id, _prepare(hub, spec.vocab_size).source_names)  # made if not yet
        return runs.report_losses(run_id, body.step, body.losses)
    try:
        used = await asyncio.to_thread(report)
    except ValueError as e:
        raise HTTPException(400, str(e)) from e
    return LossesTaken(run_id=run_id, step=body.step, used_by_bandit=used)


def _ad_hoc_spec(hub: DataHub, preset: str, seed: int, batch_size: int, seq_len: int | None,
                 mode: str, weights: str | None, steps: int) -> BatchSpec:
    if preset not in PRESETS:
        raise HTTPException(400, f"unknown preset {preset!r}; known: {', '.join(PRESETS)}")
    cfg = PRESETS[preset]
    try:
        w = tuple(float(x) for x in weights.split(",")) if weights else ()
    except ValueError:
        raise HTTPException(400, f"weights must be comma-separated numbers, got {weights!r}"
                            ) from None
    try:
        corpus_hash = hub.corpus_hash()
    except CorpusError as e:
        raise HTTPException(500, f"corpus unavailable: {e}") from e
    try:
        spec = BatchSpec(seed=seed, batch_size=batch_size, seq_len=seq_len or cfg.seq_len,
                         vocab_size=cfg.vocab_size, total_steps=steps, mode=mode, weights=w,
                         corpus_hash=corpus_hash)
    except ValueError as e:
        raise HTTPException(400, str(e)) from e
    # No more than a run of this preset could ask for (RunConfig's bounds).
    limits = [(spec.batch_size, MAX_BATCH_SIZE, "batch_size"),
              (spec.seq_len, cfg.seq_len, f"seq_len (preset {preset}'s context)"),
              (spec.total_steps, MAX_RUN_STEPS, "steps")]
    if mode == "bandit":
        limits.append((spec.total_steps, AD_HOC_BANDIT_STEPS, "steps of an ad hoc bandit run"))
    for value, limit, what in limits:
        if value > limit:
            raise HTTPException(400, f"{what} must be at most {limit} for an ad hoc batch, "
                                     f"got {value}")
    return spec


class AdHocQuery(BaseModel):
    model_config = ConfigDict(extra="forbid")
    preset: str = "tiny"
    seed: int = Field(0, ge=0, lt=2**63)
    batch_size: int = Field(8, ge=1, le=4096)
    seq_len: int | None = Field(None, ge=1, le=65536, description="default: the preset's T")
    mode: Literal["uniform", "fixed", "bandit"] = "uniform"
    weights: str | None = Field(None, description="mode=fixed: comma-separated, one per source")
    steps: int = Field(100_000, ge=1, le=MAX_STEPS, description="the run's length (at most "
                       "a run's, 1e6; 1e5 in bandit mode)")


def _ad_hoc_run(hub: DataHub, runs: RunRegistry, q: AdHocQuery) -> str:
    return runs.register_ad_hoc(_ad_hoc_spec(hub, **q.model_dump()))


@router.get("/batches/{step}", response_class=Response, responses=BATCH)
async def ad_hoc_batch(hub: DataDep, runs: RunsDep, step: Step,
                       q: Annotated[AdHocQuery, Query()]) -> Response:
    run_id = await run_in_threadpool(_ad_hoc_run, hub, runs, q)
    return await _batch_response(hub, runs, run_id, step, "train")


@router.get("/val_batches/{index}", response_class=Response, responses=BATCH)
async def ad_hoc_val_batch(hub: DataDep, runs: RunsDep, index: Index,
                           q: Annotated[AdHocQuery, Query()]) -> Response:
    run_id = await run_in_threadpool(_ad_hoc_run, hub, runs, q)
    return await _batch_response(hub, runs, run_id, index, "val")
