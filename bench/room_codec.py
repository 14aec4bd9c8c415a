"""How much the room's pseudo-gradient codecs lose (server/room/codec.py): relative L2 error and
bytes per element of int8 block-wise absmax and f16 against f32, on Gaussian values and on
heavy-tailed ones (a Gaussian times a log-normal scale, as a pseudo-gradient's tensors differ
in scale), a million each.
    python -m bench.room_codec"""

import numpy as np

from andrea.room import codec


def main() -> None:
    rng = np.random.default_rng(0)
    n = 1_000_000
    cases = {"gaussian": rng.standard_normal(n) * 1e-3,
             "heavy-tailed": rng.standard_normal(n) * np.exp(rng.standard_normal(n)) * 1e-3}
    print(f"{'values':14s} {'codec':5s} {'bytes/elem':>10s} {'rel L2 error':>12s}")
    for name, x in cases.items():
        x = x.astype(np.float32)
        for c in ("int8", "f16", "f32"):
            q = codec.decode(codec.encode(x, c), c, n)
            err = np.linalg.norm(q - x) / np.linalg.norm(x)
            print(f"{name:14s} {c:5s} {codec.payload_bytes(c, n) / n:10.3f} {err:12.2e}")


if __name__ == "__main__":
    main()
