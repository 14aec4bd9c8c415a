"""RunConfig: what a run is asked to be. The one place for its defaults and bounds: the API
validates with it, and the new-run form takes its values, limits and required marks from its
JSON schema (form_fields; templates/index.html)."""

from __future__ import annotations

import json
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from andrea.metrics import MAX_BATCH, MAX_LAYERS
from andrea.model import (
    PRESETS,
    SHAPE_FIELDS,
    VOCAB_SIZES,
    ModelConfig,
    model_layout,
    shaped_model,
)
from andrea.tasks import MAX_DIGITS as MAX_TASK_DIGITS
from andrea.tasks import TASKS, task_digits
from andrea.tasks import VOCAB as TASK_VOCAB
from andrea.tasks import facts as task_facts

Positive = Annotated[float, Field(gt=0, allow_inf_nan=False)]
MAX_WARMUP = 20                     # the default warmup: min(MAX_WARMUP, steps // 10)

# Each clip_mode and how it reads wherever it is shown: `choice` the new-run form's option,
# `label` a run's own clipping on its page ("per tensor, max_norm 1"), `name` a run named or
# labelled for it (the clipping experiment's runs, /compare's legends), `card` the model card's
# clause (max_norm as {norm}). The pages get these words from here (page_facts.py).
# global: the whole gradient's norm clipped to max_norm; per_tensor: each tensor's own (torch's
# clip_grad_norm_ once per parameter); off.
CLIP_MODES = {
    "global": {"choice": "the global grad norm", "label": "global", "name": "clip global",
               "card": ", gradient clipping at norm {norm:g}"},
    "per_tensor": {"choice": "each tensor's grad norm", "label": "per tensor",
                   "name": "clip per tensor",
                   "card": ", per-tensor gradient clipping at norm {norm:g}"},
    "off": {"choice": "off", "label": "off", "name": "no clip", "card": ""},
}
# The Dawn toggles a Chrome needs for mixed precision on NVIDIA's Vulkan driver, passed as
# --enable-dawn-features=...: vulkan_enable_f16_on_nvidia gives shader-f16, and with it the f16
# subgroup matrices (Chrome leaves it off there by default for driver bugs; elsewhere it does
# nothing); allow_unsafe_apis the experimental subgroup matrices. `andrea train --gpu` passes
# them, the pages name them (page_facts.py), bench/dawn.mjs sets them under Node.
MIXED_DAWN_TOGGLES = ("allow_unsafe_apis", "vulkan_enable_f16_on_nvidia")
# The optimizer's hyperparameters with a default here (the engine has none of its own: the
# trainer passes a run's, the kernels page and the lab these).
OPTIMIZER_HYPER = ("beta1", "beta2", "eps", "weight_decay", "max_norm", "clip_mode")


class Parent(BaseModel):
    """Where a branched run starts: run `run`'s checkpoint after step `step`."""
    model_config = ConfigDict(extra="forbid", strict=True)
    run: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    step: int = Field(ge=1)


class RoomConfig(BaseModel):
    """A room run: the room's workers (browser tabs, anyone with its join link) train one model
    together by DiLoCo (Douillard et al. 2023). From the same global weights each runs
    inner_steps AdamW steps on its own batches, then sends its pseudo-gradient (global minus its
    weights); the server clips each to clip_multiple x the median norm of the round and the
    last rounds, averages those that agree with their peers (server/room/aggregate.py),
    and applies SGD with Nesterov momentum (outer_lr, outer_momentum) to make the next global
    version (server/room/). The defaults, lr 1 and momentum 0, make the next version that mean
    of the workers' weights: measured through the app (issue 52's table, bench/room.py), a room
    of 4 from scratch over 32 rounds then reached 3.633 eval loss against data parallelism's
    3.675, while the paper's 0.7 and 0.9 (tuned for hundreds of rounds from a pretrained
    model) overshot to 4.400, worse than one tab alone (3.827). With 8 workers too an outer lr
    of 1 was the best of 0.7 to 4, and at these defaults (H 50) the room of 8 reached 3.620
    against 3.857 for 8x the batch (bench/results/room_torch_h100.txt). The run's `steps` are
    each worker's inner steps in all: steps / inner_steps rounds."""
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)
    inner_steps: int = Field(50, ge=1, le=100_000, description=(
        "H: the AdamW steps a worker trains on its own batches from the global weights before "
        "it sends its pseudo-gradient (one round)"))
    outer_lr: float = Field(1.0, gt=0, le=10, description=(
        "the learning rate of the outer step, SGD with Nesterov momentum on the round's "
        "averaged pseudo-gradient: 1 with momentum 0 takes the workers' mean weights, best in "
        "rooms of a few dozen rounds from scratch; DiLoCo's is 0.7 (hundreds of rounds)"))
    outer_momentum: float = Field(0.0, ge=0, lt=1, description=(
        "the outer step's Nesterov momentum: 0 for a room of a few dozen rounds; DiLoCo's 0.9 "
        "overshot there"))
    codec: Literal["int8", "f16", "f32"] = Field("int8", description=(
        "how pseudo-gradients travel: int8 block-wise absmax (~4x less than f32), f16 or f32"))
    max_workers: int = Field(16, ge=1, le=64, description=(
        "workers that may train in the room at once: one more is refused, the room is full"))
    workers_per_address: int = Field(1, ge=1, le=64, description=(
        "active workers one client address may have: one participant is one worker; more "
        "for one machine with several GPUs, or a demo in one browser"))
    quorum: int = Field(1, ge=1, le=64, description=(
        "pseudo-gradients a round needs to close at its deadline (it closes before that once "
        "every worker has answered)"))
    round_deadline_s: float = Field(120.0, gt=0, le=86_400, description=(
        "after a round's first pseudo-gradient, how long the others have (seconds); a worker "
        "that sends nothing this long after it joined leaves: set it above the slowest "
        "machine's round"))
    clip_multiple: float = Field(2.0, ge=1, le=1000, description=(
        "each pseudo-gradient is clipped to this multiple of the median norm of the round and "
        "the last rounds"))
    missed_rounds: int = Field(3, ge=1, le=10_000, description=(
        "a worker that sends nothing for this many rounds in a row has left the room"))
    wait_for_slowest: bool = Field(True, description=(
        "off: once half the workers have sent a whole round, the others send what they have "
        "trained so far and the round closes, each pseudo-gradient weighted by the steps it "
        "took: a slow laptop no longer holds the room (turn it off when machines differ); on: "
        "every round waits for every worker's inner_steps"))
    overlap: bool = Field(False, description=(
        "on: a worker trains its next round while the server closes the last one and the new "
        "version comes down, starting it from the version before plus its own last round; "
        "the sending and waiting hide behind training, a round's delay on each worker"))

    @model_validator(mode="after")
    def _quorum_fits(self):
        if self.quorum > self.max_workers:
            raise ValueError(f"quorum ({self.quorum}) exceeds max_workers ({self.max_workers})")
        return self


class RunConfig(BaseModel):
    """Everything but `preset` has a default, so {"preset": "tiny"} is a valid run. Strict: a
    number is a JSON number and a switch a JSON boolean ("100" or true for steps: 422)."""
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)
    preset: Literal[tuple(PRESETS)]                                  # type: ignore[valid-type]
    optimizer: Literal["adamw", "adamw_8bit"] = "adamw"
    f16_mirror: bool = False          # forward/backward matmuls read an f16 copy of the weights
    # mixed: the linears' matmuls take f16 operands with f32 accumulation on the GPU's matrix
    # units (WGSL subgroup matrices), with dynamic loss scaling; weights, optimizer state, norms,
    # softmax and loss stay f32. Only where the browser's adapter has f16 subgroup matrices.
    precision: Literal["fp32", "mixed"] = Field("fp32", description=(
        "mixed: f16 matmuls on the GPU's matrix units with loss scaling, where the browser "
        "offers f16 subgroup matrices"))
    steps: int = Field(200, ge=1, le=1_000_000)
    batch_size: int = Field(8, ge=1, le=MAX_BATCH)
    seq_len: int | None = Field(None, ge=2, le=8192, description=(
        "default: the preset's context; longer lengthens the model's context"))
    # The model's own shape instead of the preset's (server/model.py run_model): each left out
    # is the preset's. Stored runs have every one filled in.
    n_layer: int | None = Field(None, ge=1, le=MAX_LAYERS,
                                description="default: the preset's layers")
    n_embd: int | None = Field(None, ge=8, le=4096, description="default: the preset's width")
    n_head: int | None = Field(None, ge=1, le=64, description="default: the preset's heads")
    ffn_dim: int | None = Field(None, ge=1, le=16384, description=(
        "default: the preset's SwiGLU width"))
    vocab_size: Literal[VOCAB_SIZES] | None = Field(  # type: ignore[valid-type]
        None, description="default: the preset's (a tokenizer per size, trained once)")
    lr: Positive = Field(3e-3, le=1.0)
    min_lr_ratio: float = Field(0.1, ge=0, le=1)    # cosine decays to lr * min_lr_ratio
    warmup_steps: int | None = Field(
        None, ge=0, description=f"default: min({MAX_WARMUP}, steps // 10)")
    beta1: float = Field(0.9, ge=0, lt=1)
    beta2: float = Field(0.95, ge=0, lt=1)
    eps: Positive = Field(1e-8, le=1.0)
    weight_decay: float = Field(0.1, ge=0, le=1)
    # CLIP_MODES above. Older clients' and stored runs' `clip` (true/false) is read as
    # global/off (legacy_clip).
    clip_mode: Literal[tuple(CLIP_MODES)] = Field(                   # type: ignore[valid-type]
        "global", description="global: the whole gradient's norm; per_tensor: each tensor's own")
    max_norm: Positive = Field(1.0, le=1e6)
    seed: int = Field(0, ge=0, lt=2**31)
    data_mode: Literal["uniform", "bandit"] = "uniform"
    # The corpus sources rows are drawn from (training and eval), by name as GET /api/corpus
    # lists them; checked against the server's at POST /api/runs. The tokenizer stays the whole
    # corpus's, so runs on different sources share it.
    sources: list[str] | None = Field(
        None, min_length=1, max_length=255,
        description="the corpus sources to train on (names from GET /api/corpus); default: all")
    # A toy task instead of the corpus (server/tasks.py): problems made from the run's
    # seed in a character alphabet (the model's vocabulary is its 16 tokens), with an exact-match
    # accuracy on held-out problems at each eval.
    task: Literal[TASKS] | None = Field(None, description=(  # type: ignore[valid-type]
        "train on a toy task instead of the corpus: copy, reverse or sort digits, add numbers, "
        "or add modulo 97 (grokking); its accuracy on held-out problems is charted"))
    task_digits: int | None = Field(None, ge=1, le=MAX_TASK_DIGITS, description=(
        "the task's digits: default 10 (copy, reverse, sort) or 3 (add); mod has 2"))
    eval_every: int = Field(50, ge=0, description="also at the last step; 0: no eval")
    sample_every: int = Field(100, ge=0, description=(
        "also one early (a quarter into a short run) and at the last step; 0: no samples"))
    checkpoint_every: int | None = Field(
        None, ge=1, le=1_000_000,
        description=("default: the trainer picks it (at each tenth of the run and within 2 "
                     "minutes of training; a minute apart, ~2% of training time, where those "
                     "allow)"))
    # A branch: a new run that starts from another run's checkpoint (same preset and
    # optimizer). Set by the run page's branch button, never by the new-run form.
    parent: Parent | None = Field(None, json_schema_extra={"form": False})
    # A room run (RoomConfig): trained by the workers who join it, not by one tab.
    room: RoomConfig | None = Field(None, json_schema_extra={"form": False})

    @model_validator(mode="before")
    @classmethod
    def _legacy_clip(cls, data):
        if isinstance(data, dict) and "clip" in data:
            if "clip_mode" in data:
                raise ValueError("give clip_mode, or the older clip, not both")
            if not isinstance(data["clip"], bool):    # strict, as every other switch
                raise ValueError("clip must be true or false (or give clip_mode: 'global', "
                                 "'per_tensor' or 'off')")
            data = legacy_clip(data)
        return data

    @model_validator(mode="after")
    def _fit_preset(self):
        base = PRESETS[self.preset]
        if self.seq_len is None and self.task is not None:
            # One problem a row: its first token at position 0. Packed problems (a longer
            # seq_len) are learned far slower: with RoPE a problem's place in the row is only
            # known from where the row starts (bench/tasks_torch.py: reverse 10 at 99% after 500
            # steps, and 0% after 800 packed three a row).
            self.seq_len = task_facts(self.task, self.task_digits).problem_len - 1
        if self.seq_len is None:
            self.seq_len = base.seq_len
        try:     # the shape's own rules (heads divide the width, head dim even and <= 128)
            model = run_model(self)
        except ValueError as e:
            raise ValueError(f"model shape: {e}") from None
        for name in SHAPE_FIELDS:
            setattr(self, name, getattr(model, name))
        if self.warmup_steps is None:
            self.warmup_steps = min(MAX_WARMUP, self.steps // 10)
        if self.warmup_steps > self.steps:
            raise ValueError(f"warmup_steps ({self.warmup_steps}) exceeds steps ({self.steps})")
        return self

    @model_validator(mode="after")
    def _room_fits(self):
        if self.room is not None:
            if self.parent is not None:
                raise ValueError("a room run cannot be a branch")
            if self.data_mode != "uniform":
                raise ValueError("a room run draws its batches uniformly (data_mode 'uniform'): "
                                 "the source bandit follows one trainer's losses")
        return self

    @model_validator(mode="before")
    @classmethod
    def _task_vocab(cls, data):
        if isinstance(data, dict) and data.get("task") and data.get("vocab_size") not in (
                None, TASK_VOCAB):
            raise ValueError(f"a task run's vocabulary is its alphabet's {TASK_VOCAB} tokens: "
                             "give no vocab_size")
        return data

    @model_validator(mode="after")
    def _task_fits(self):
        if self.task is None:
            if self.task_digits is not None:
                raise ValueError("task_digits is a task's: give a task too")
            return self
        self.task_digits = task_digits(self.task, self.task_digits)
        if self.sources is not None or self.data_mode != "uniform":
            raise ValueError("a task run's batches are its problems: give no sources and "
                             "data_mode 'uniform'")
        return self

    @model_validator(mode="after")
    def _unique_sources(self):
        if self.sources is not None:
            twice = sorted({s for s in self.sources if self.sources.count(s) > 1})
            if twice:
                raise ValueError(f"sources: {', '.join(map(repr, twice))} listed more than once")
        return self


class StoredRunConfig(RunConfig):
    """A run's config as stored and served: every default filled in, plus the corpus it was
    made with (a restart on other text answers 409; export finds the tokenizer by it). What
    every reader of a stored run has as its run["config"] (store/run_rows.py)."""
    seq_len: int
    warmup_steps: int
    n_layer: int
    n_embd: int
    n_head: int
    ffn_dim: int
    vocab_size: int
    corpus_hash: str

    @classmethod
    def of(cls, config: RunConfig, corpus_hash: str, **fields) -> StoredRunConfig:
        """The stored config of a validated RunConfig: its own fields, `fields` in place of
        some of them (the run's sources as the server resolved them), and `corpus_hash`."""
        return cls.model_validate({**config.model_dump(), **fields, "corpus_hash": corpus_hash})


def stored_json(config: StoredRunConfig) -> str:
    """A run config as the runs table stores it: its model_dump as JSON, in field order
    (what the store wrote as a dict before StoredRunConfig was its type, byte for byte)."""
    return json.dumps(config.model_dump())


def read_stored(text: str) -> StoredRunConfig:
    """A stored run config (stored_json's) as its model. A row of before clip_mode has its
    `clip` read as clip_mode (legacy_clip), one of before custom shapes its preset's shape
    filled in (with_shape); a field added since takes RunConfig's default. Validated, in lax
    mode: every row was validated when it was stored, by rules no later version narrowed for
    the fields it could hold then, and FastAPI already validates each run it serves against
    StoredRunConfig (schemas.Run), so this refuses no row the API served."""
    return StoredRunConfig.model_validate(with_shape(legacy_clip(json.loads(text))),
                                          strict=False)


def legacy_clip(config: dict) -> dict:
    """A config of before clip_mode: its `clip` switch read as clip_mode global (true) or off
    (false), and dropped. A config without one is returned as it is."""
    if "clip" not in config:
        return config
    rest = {k: v for k, v in config.items() if k != "clip"}
    return {**rest, "clip_mode": rest.get("clip_mode", "global" if config["clip"] else "off")}


def with_shape(config: dict) -> dict:
    """A stored run config's JSON object with every shape field filled in (runs stored before
    shapes could be given have only their preset): read_stored's, before it is validated."""
    model = shaped_model(config["preset"], config, bool(config.get("task")), config.get("seq_len"))
    return {**{k: getattr(model, k) for k in SHAPE_FIELDS}, **config}


def run_model(config: RunConfig) -> ModelConfig:
    """The model a run config describes: its preset, with the shape fields it gives on top
    (model.shaped_model)."""
    return shaped_model(config.preset, {k: getattr(config, k) for k in SHAPE_FIELDS},
                        config.task is not None, config.seq_len)


def run_layout(config: RunConfig) -> dict:
    """The parameter table of a run (its preset's, or its own shape's): computed once per
    model (model.model_layout), shared, never to be changed by a caller."""
    return model_layout(config.preset, run_model(config))


def model_name(config: RunConfig) -> str:
    """How a run's model is named in lists and cards: the preset, or the preset and what differs
    ("tiny L4 C128")."""
    base, cfg = PRESETS[config.preset], run_model(config)
    tags = {"n_layer": "L", "n_embd": "C", "n_head": "H", "ffn_dim": "F", "vocab_size": "V",
            "seq_len": "T"}
    diff = [f"{tag}{getattr(cfg, k)}" for k, tag in tags.items()
            if getattr(cfg, k) != getattr(base, k)]
    return " ".join([config.preset, *diff])


def form_fields(model: type[BaseModel] = RunConfig) -> dict[str, dict]:
    """Per field, what an HTML input needs: default ("": the server decides), min, max, step,
    required (a field whose default is None may be left empty), hint, and a Literal's choices.
    min_exclusive / max_exclusive: a float's bound that the value itself may not take (lr > 0),
    which HTML's inclusive min and max cannot say: the page checks it (new_run.js)."""
    out = {}
    for name, prop in model.model_json_schema()["properties"].items():
        if prop.get("form") is False:
            continue
        kind = next((p for p in prop.get("anyOf", [prop]) if p.get("type") != "null"), {})
        integer = kind.get("type") == "integer"
        lo, hi = kind.get("minimum"), kind.get("maximum")
        # An integer's exclusive bound is the next integer in; a float's has no next value.
        if "exclusiveMinimum" in kind:
            lo = kind["exclusiveMinimum"] + integer
        if "exclusiveMaximum" in kind:
            hi = kind["exclusiveMaximum"] - integer
        default = prop.get("default")
        out[name] = {"default": "" if default is None else default, "min": lo, "max": hi,
                     "min_exclusive": "exclusiveMinimum" in kind and not integer,
                     "max_exclusive": "exclusiveMaximum" in kind and not integer,
                     "step": 1 if integer else "any",
                     "required": "default" not in prop or default is not None,
                     "hint": prop.get("description", ""), "choices": kind.get("enum", []),
                     "boolean": kind.get("type") == "boolean"}
    return out
