"""Andrea: train a Llama-style transformer in the browser with WebGPU, served from Python."""

__version__ = "0.1.0"
