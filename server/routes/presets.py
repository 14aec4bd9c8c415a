"""Model presets and their parameter tables (computed only in server/model.py)."""

from fastapi import APIRouter, HTTPException
from pydantic import BaseModel, ConfigDict, Field

from andrea.model import PRESETS, ModelConfig, build_layout, preset_layout
from andrea.optim import optimizer_memory, quantization_maps

router = APIRouter(prefix="/api")


class ConfigBody(BaseModel):
    """A custom model shape (lab and tests); bounded so a request cannot ask for absurd sizes."""
    model_config = ConfigDict(extra="forbid")
    vocab_size: int = Field(512, ge=2, le=65536)
    n_embd: int = Field(64, ge=2, le=4096)
    n_layer: int = Field(2, ge=1, le=64)
    n_head: int = Field(4, ge=1, le=64)
    ffn_dim: int = Field(192, ge=1, le=16384)
    seq_len: int = Field(64, ge=1, le=8192)
    norm_eps: float = Field(1e-5, gt=0, lt=1)
    rope_theta: float = Field(10000.0, gt=1)
    init_std: float = Field(0.02, gt=0, lt=1)


@router.get("/presets")
def list_presets() -> list[dict]:
    return [{"name": name, "config": cfg.to_dict(), "n_params": build_layout(cfg)["n_params"]}
            for name, cfg in PRESETS.items()]


@router.get("/presets/{name}/layout")
def get_preset_layout(name: str) -> dict:
    if name not in PRESETS:
        raise HTTPException(404, f"unknown preset {name!r}; known: {', '.join(PRESETS)}")
    layout = preset_layout(name)
    return {**layout, "optimizer_state": optimizer_memory(layout)}


@router.post("/layout")
def layout_for_config(body: ConfigBody) -> dict:
    try:
        cfg = ModelConfig(**body.model_dump())
    except ValueError as e:
        raise HTTPException(422, str(e)) from e
    layout = build_layout(cfg)
    return {"preset": None, **layout, "optimizer_state": optimizer_memory(layout)}


@router.get("/optimizer/maps")
def optimizer_maps() -> dict:
    """bitsandbytes' dynamic quantization maps (signed for m, unsigned for v) for 8-bit AdamW."""
    return quantization_maps()
