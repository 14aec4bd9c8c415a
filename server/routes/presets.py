"""Model presets and their parameter tables (computed only in server/model.py)."""

from dataclasses import fields
from typing import Annotated, get_type_hints

from fastapi import APIRouter, HTTPException
from pydantic import ConfigDict, Field, create_model

from andrea.model import PRESETS, ModelConfig, build_layout, preset_layout
from andrea.optim import optimizer_memory, quantization_maps
from andrea.schemas import LayoutWithState, Preset, QuantizationMaps

router = APIRouter(prefix="/api", tags=["presets"])

# Request bounds, so a request cannot ask for absurd sizes; names, types and defaults are
# ModelConfig's own.
_BOUNDS = {
    "vocab_size": Field(ge=2, le=65536), "n_embd": Field(ge=2, le=4096),
    "n_layer": Field(ge=1, le=64), "n_head": Field(ge=1, le=64),
    "ffn_dim": Field(ge=1, le=16384), "seq_len": Field(ge=1, le=8192),
    "norm_eps": Field(gt=0, lt=1), "rope_theta": Field(gt=1), "init_std": Field(gt=0, lt=1),
}
_TYPES = get_type_hints(ModelConfig)
ConfigBody = create_model(
    "ConfigBody", __doc__="A custom model shape (lab and tests).",
    __config__=ConfigDict(extra="forbid"),
    **{f.name: (Annotated[_TYPES[f.name], _BOUNDS.get(f.name, Field())], f.default)
       for f in fields(ModelConfig)})


@router.get("/presets")
def list_presets() -> list[Preset]:
    return [Preset(name=name, config=cfg.to_dict(), n_params=build_layout(cfg)["n_params"])
            for name, cfg in PRESETS.items()]


@router.get("/presets/{name}/layout")
def get_preset_layout(name: str) -> LayoutWithState:
    if name not in PRESETS:
        raise HTTPException(404, f"unknown preset {name!r}; known: {', '.join(PRESETS)}")
    layout = preset_layout(name)
    return LayoutWithState(**layout, optimizer_state=optimizer_memory(layout))


@router.post("/layout")
def layout_for_config(body: ConfigBody) -> LayoutWithState:      # type: ignore[valid-type]
    try:
        cfg = ModelConfig(**body.model_dump())
    except ValueError as e:
        raise HTTPException(422, str(e)) from e
    layout = build_layout(cfg)
    return LayoutWithState(**{"preset": None, **layout}, optimizer_state=optimizer_memory(layout))


@router.get("/optimizer/maps")
def optimizer_maps() -> QuantizationMaps:
    """bitsandbytes' dynamic quantization maps (signed for m, unsigned for v) for 8-bit AdamW."""
    return QuantizationMaps(**quantization_maps())
