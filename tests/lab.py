"""Moving arrays between numpy and the /lab page (base64 both ways; JSON lists are too slow)."""

from __future__ import annotations

import base64

import numpy as np

_DTYPES = {"f32": np.float32, "i32": np.int32, "u32": np.uint32}


def b64(arr: np.ndarray) -> dict:
    """Encode an array for the page; window.andrea.b64.decode turns it into a typed array."""
    arr = np.ascontiguousarray(arr)
    kind = {np.dtype(np.float32): "f32", np.dtype(np.int32): "i32",
            np.dtype(np.uint32): "u32"}[arr.dtype]
    return {"__b64__": base64.b64encode(arr.tobytes()).decode(), "dtype": kind}


def unb64(obj) -> np.ndarray:
    """Decode what window.andrea.b64.encode produced (recursively through dicts and lists)."""
    if isinstance(obj, dict) and "__b64__" in obj:
        return np.frombuffer(base64.b64decode(obj["__b64__"]), dtype=_DTYPES[obj["dtype"]]).copy()
    if isinstance(obj, dict):
        return {k: unb64(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [unb64(v) for v in obj]
    return obj


def call(page, body: str, args: dict | None = None):
    """Run `body` (an async JS function body with `lab` and decoded `args` in scope) in the page;
    typed arrays in the result come back as numpy arrays."""
    script = ("async ([body, args]) => { const {lab, b64} = window.andrea;"
              " const a = b64.decodeAll(args);"
              " const fn = new Function('lab', 'args', 'b64', `return (async () => {${body}})()`);"
              " return b64.encodeAll(await fn(lab, a, b64)); }")
    return unb64(page.evaluate(script, [body, args or {}]))


def mirror_words(x: np.ndarray) -> np.ndarray:
    """The f16 weight mirror of f32 x as the engine packs it (packHalf2 on the CPU,
    pack2x16float on the GPU): numpy's float16 (round to nearest even), element i in half
    i % 2 of word i / 2, an odd tail's high half 0. -> u32 [ceil(len / 2)]"""
    with np.errstate(over="ignore"):
        h = np.append(x, np.zeros(len(x) % 2, np.float32)).astype(np.float16).view(np.uint16)
    return h[0::2].astype(np.uint32) | h[1::2].astype(np.uint32) << 16
