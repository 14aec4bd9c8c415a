"""The model the browser tests train where their claim is about the app (resume, restarts, the
CLI, the page) rather than about the `tiny` preset's shape: `tiny` narrowed to 32 wide, 2 heads of
16 (tiny's head dim), a SwiGLU of 128 (so its two matrices have the 4096 elements from which 8-bit
AdamW quantizes a tensor), on rows of 32 tokens; tiny's 2 layers and 512-token vocabulary kept.
On SwiftShader (a CPU) its step takes a quarter to a fifth of tiny's, and the suite's browser
tests spend most of their time in training steps. The kernel and engine parity tests
(tests/unit/gpu), the shape tests and the 8-bit quality test keep their own shapes."""

SMALL = {"preset": "tiny", "n_embd": 32, "n_head": 2, "ffn_dim": 128, "seq_len": 32}


def cli_args(shape: dict = SMALL) -> list[str]:
    """The same shape as `andrea train` flags."""
    return [arg for name, value in shape.items()
            for arg in ("--" + name.replace("_", "-"), str(value))]
