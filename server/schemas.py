"""What the JSON API answers (response models, so /openapi.json names each shape). Storage
keeps its own rows (andrea.store); these are the public view. Models of values computed elsewhere
(model.py layouts, optim.py sizes) list the fields clients use and let later ones through."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from andrea.run_config import StoredRunConfig
from andrea.runs.info import RunStatus


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class Health(BaseModel):
    status: Literal["ok"]
    version: str
    pid: int        # which server process answered (several with --workers)


# ---- model shapes (server/model.py) and optimizer state (server/optim.py) -----------------
class ModelShape(_Open):
    vocab_size: int
    n_embd: int
    n_layer: int
    n_head: int
    ffn_dim: int
    seq_len: int
    norm_eps: float
    rope_theta: float
    init_std: float
    head_dim: int


class Param(_Open):
    name: str
    shape: list[int]
    offset: int                     # in f32 elements, into W (and G, M, V)
    numel: int
    layer: str                      # what a page groups it by: "embed", "layer {i}", "final norm"


class OptimizerState(_Open):
    state_bytes: int
    bytes_per_param: float


class Layout(_Open):
    preset: str | None = None
    config: ModelShape
    params: list[Param]
    n_params: int
    total_numel: int
    decay_numel: int
    align_elems: int


class LayoutWithState(Layout):
    optimizer_state: dict[str, OptimizerState]      # per optimizer variant


class Preset(BaseModel):
    name: str
    config: ModelShape
    n_params: int


class QuantizationMaps(_Open):
    signed: list[float]
    unsigned: list[float]
    blocksize: int
    min_8bit_size: int


# ---- runs -----------------------------------------------------------------------------------
class BatchSpecInfo(BaseModel):
    """data/spec.py BatchSpec: everything that decides a run's batches."""
    seed: int
    batch_size: int
    seq_len: int
    vocab_size: int
    total_steps: int
    mode: Literal["uniform", "fixed", "bandit"]
    weights: list[float]
    corpus_hash: str
    sources: list[str] = []         # the sources rows come from; [] = every one
    task: str = ""                  # a toy task's problems instead (tasks.py)
    task_digits: int = 0


class RunDataLinks(BaseModel):
    batches: str                    # URL template with {step}
    val_batches: str                # URL template with {index}
    tokenizer: str
    spec: BatchSpecInfo


class CheckpointSection(BaseModel):
    name: str                       # W, then M and V (adamw) or codes and small (adamw_8bit)
    bytes: int


class CheckpointInfo(BaseModel):
    """optim.checkpoint_sections and how uploads are cut; the trainer never works these out."""
    sections: list[CheckpointSection]
    chunk_bytes: int                # one SHA-256 per chunk in X-Andrea-Chunk-SHA256
    every: int | None               # config.checkpoint_every; null: the trainer picks
    last_step: int | None           # the newest checkpoint; a resumed run starts after it


class RoomLinks(BaseModel):
    join_token: str                 # joins the room as a worker (never the run's owner)
    room: str                       # GET: the room now
    batches: str                    # a worker's batches ({version}, {slot}, {step} to fill)


class RunCreated(BaseModel):
    id: str
    token: str                      # the write token: shown once, stored only as a hash
    config: StoredRunConfig
    layout: Layout
    optimizer_state: dict[str, OptimizerState]
    data: RunDataLinks
    checkpoint: CheckpointInfo      # a branch starts after checkpoint.last_step
    room: RoomLinks | None = None   # a room run's join token (shown once) and its routes


class Run(BaseModel):
    id: str
    name: str                       # "tiny adamw #12" unless renamed (PATCH /api/runs/{id})
    tags: list[str]
    notes: str | None
    created_at: float
    updated_at: float
    config: StoredRunConfig
    status: RunStatus
    message: str | None
    adapter: dict | None            # the GPU adapter the trainer reported
    last_step: int | None
    last_loss: float | None
    first_time: float | None        # when the first and the last step records were committed
    last_time: float | None
    last_eval_loss: float | None
    best_eval_loss: float | None
    state_bytes: int                # the run's optimizer state on the GPU
    n_params: int
    model_name: str                 # the preset, and the shape fields that differ ("tiny L4")
    checkpoint: CheckpointInfo
    # A training tab holds the run now (its trainer socket): a `running` run without one
    # reads "no training tab" until the grace period marks it interrupted.
    connected: bool
    can_resume: bool                # no trainer connected, a resumable status, a checkpoint


# How long a run's name, a tag and its notes may be, and how many tags (RunUpdate; the run
# page's edit form is rendered with them, routes/pages.py).
NAME_MAX, TAG_MAX, TAGS_MAX, NOTES_MAX = 120, 40, 20, 10_000


class RunUpdate(BaseModel):
    """PATCH /api/runs/{id}: what people may change about a run (fields left out stay)."""
    model_config = ConfigDict(extra="forbid", strict=True)
    name: Annotated[str, Field(min_length=1, max_length=NAME_MAX)] | None = None
    tags: Annotated[list[Annotated[str, Field(min_length=1, max_length=TAG_MAX)]],
                    Field(max_length=TAGS_MAX)] | None = None
    notes: Annotated[str, Field(max_length=NOTES_MAX)] | None = None


class Sample(BaseModel):
    step: int
    kind: Literal["sample"]
    text: str


class RunResumed(BaseModel):
    token: str                      # the new write token; the old one is revoked
    step: int                       # the checkpoint's step: training goes on at step + 1
    run: Run


class CheckpointStored(BaseModel):
    step: int
    bytes: int
    sha256: str


class CheckpointListed(CheckpointStored):
    created_at: float


class RunDetail(Run):
    samples: list[Sample]
    has_weights: bool


# ---- data -----------------------------------------------------------------------------------
class SourceInfo(BaseModel):
    index: int
    name: str
    kind: str
    origin: str
    chars: int
    documents: int
    tokens: int
    train_tokens: int
    val_tokens: int
    chars_per_token: float


class CorpusInfo(BaseModel):
    corpus_hash: str
    vocab_size: int
    tokenizer_tokens: int
    val_fraction: float
    sources: list[SourceInfo]       # corpus order: the batch header's source indices


class TokenizerInfo(BaseModel):
    vocab_size: int
    n_tokens: int
    corpus_hash: str
    eot: str
    eot_id: int
    token_bytes_b64: list[str]
    tokenizer_json: str


MAX_PROMPT_CHARS = 8192        # a prompt box's text (templates/run.html's maxlength)


class TextToEncode(BaseModel):
    """A prompt to encode with a run's tokenizer (POST /api/tokenizer/{key}/encode)."""
    model_config = ConfigDict(extra="forbid", strict=True)
    text: str = Field(max_length=MAX_PROMPT_CHARS)


class EncodedText(BaseModel):
    ids: list[int]


class TaskInfo(BaseModel):
    """A toy task's facts (server/tasks.py TaskFacts): what a page needs to read its
    batches and measure its exact-match accuracy."""
    task: str
    digits: int
    alphabet: str                   # token id -> character
    problem_len: int                # problems start at multiples of it in every row
    answer_start: int               # the answer's offset in a problem
    answer_len: int
    example: str                    # one problem, as a row holds it


class PhaseInfo(BaseModel):
    index: int
    start: int
    length: int
    weights: list[float]            # one per source, corpus order
    estimates: list[float]


class RunData(BaseModel):
    run_id: str
    spec: BatchSpecInfo
    sources: list[str]
    corpus_hash: str
    phases: list[PhaseInfo]


class LossesTaken(BaseModel):
    run_id: str
    step: int
    used_by_bandit: bool
