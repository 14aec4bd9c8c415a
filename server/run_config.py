"""RunConfig: what a run is asked to be. The one place for its defaults and bounds: the API
validates with it, and the new-run form takes its values, limits and required marks from its
JSON schema (form_fields; templates/index.html)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from andrea.model import PRESETS

Positive = Annotated[float, Field(gt=0, allow_inf_nan=False)]
MAX_WARMUP = 20                     # the default warmup: min(MAX_WARMUP, steps // 10)


class Parent(BaseModel):
    """Where a branched run starts: run `run`'s checkpoint after step `step`."""
    model_config = ConfigDict(extra="forbid", strict=True)
    run: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    step: int = Field(ge=1)


class RunConfig(BaseModel):
    """Everything but `preset` has a default, so {"preset": "tiny"} is a valid run. Strict: a
    number is a JSON number and a switch a JSON boolean ("100" or true for steps: 422)."""
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)
    preset: Literal[tuple(PRESETS)]                                  # type: ignore[valid-type]
    optimizer: Literal["adamw", "adamw_8bit"] = "adamw"
    f16_mirror: bool = False          # forward/backward matmuls read an f16 copy of the weights
    steps: int = Field(200, ge=1, le=1_000_000)
    batch_size: int = Field(8, ge=1, le=1024)
    seq_len: int | None = Field(None, ge=2, description="default: the preset's context")
    lr: Positive = Field(3e-3, le=1.0)
    min_lr_ratio: float = Field(0.1, ge=0, le=1)    # cosine decays to lr * min_lr_ratio
    warmup_steps: int | None = Field(
        None, ge=0, description=f"default: min({MAX_WARMUP}, steps // 10)")
    beta1: float = Field(0.9, ge=0, lt=1)
    beta2: float = Field(0.95, ge=0, lt=1)
    eps: Positive = Field(1e-8, le=1.0)
    weight_decay: float = Field(0.1, ge=0, le=1)
    clip: bool = True
    max_norm: Positive = Field(1.0, le=1e6)
    seed: int = Field(0, ge=0, lt=2**31)
    data_mode: Literal["uniform", "bandit"] = "uniform"
    eval_every: int = Field(50, ge=0, description="0: no eval")
    sample_every: int = Field(100, ge=0, description="0: no samples")
    checkpoint_every: int | None = Field(
        None, ge=1, le=1_000_000,
        description="default: the trainer picks it (checkpoints take ~2% of training time)")
    # A branch: a new run that starts from another run's checkpoint (same preset and
    # optimizer). Set by the run page's branch button, never by the new-run form.
    parent: Parent | None = Field(None, json_schema_extra={"form": False})

    @model_validator(mode="after")
    def _fit_preset(self):
        T = PRESETS[self.preset].seq_len
        if self.seq_len is None:
            self.seq_len = T
        if self.seq_len > T:
            raise ValueError(f"seq_len {self.seq_len} exceeds preset {self.preset}'s context {T}")
        if self.warmup_steps is None:
            self.warmup_steps = min(MAX_WARMUP, self.steps // 10)
        if self.warmup_steps > self.steps:
            raise ValueError(f"warmup_steps ({self.warmup_steps}) exceeds steps ({self.steps})")
        return self


class StoredRunConfig(RunConfig):
    """A run's config as stored and served: every default filled in, plus the corpus it was
    made with (a restart on other text answers 409; export finds the tokenizer by it)."""
    seq_len: int
    warmup_steps: int
    corpus_hash: str


def form_fields() -> dict[str, dict]:
    """Per field, what an HTML input needs: default ("": the server decides), min, max, step,
    required (a field whose default is None may be left empty), hint, and a Literal's choices."""
    out = {}
    for name, prop in RunConfig.model_json_schema()["properties"].items():
        if prop.get("form") is False:
            continue
        kind = next((p for p in prop.get("anyOf", [prop]) if p.get("type") != "null"), {})
        integer = kind.get("type") == "integer"
        lo, hi = kind.get("minimum"), kind.get("maximum")
        if "exclusiveMinimum" in kind:    # HTML bounds are inclusive: the server checks equality
            lo = kind["exclusiveMinimum"] + integer
        if "exclusiveMaximum" in kind:
            hi = kind["exclusiveMaximum"] - integer
        default = prop.get("default")
        out[name] = {"default": "" if default is None else default, "min": lo, "max": hi,
                     "step": 1 if integer else "any",
                     "required": "default" not in prop or default is not None,
                     "hint": prop.get("description", ""), "choices": kind.get("enum", [])}
    return out
