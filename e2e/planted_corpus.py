"""A user corpus with a planted outlier, for the outlier e2e test and the README's picture:
`plain` (sentences of twenty words) and `planted` (the same kind of sentences with ~600
characters of random Greek a third of the way in, inside the training split)."""

from __future__ import annotations

import random
from pathlib import Path

WORDS = ("river stone lantern quiet harbour morning letter garden window silver orchard bell "
         "meadow candle thread compass anchor feather winter market").split()
GREEK = "αβγδεζηθικλμνξοπρστυφχψω"


def sentences(rng: random.Random, n: int) -> str:
    return " ".join(" ".join(rng.choice(WORDS) for _ in range(8)) + "." for _ in range(n))


def greek_share(text: str) -> float:
    letters = [c for c in text if not c.isspace()]
    return sum(c in GREEK for c in letters) / max(1, len(letters))


def write_planted_corpus(root: Path) -> tuple[str, ...]:
    """Writes the two sources under `root`; -> the `andrea serve` options that serve them alone."""
    rng = random.Random(7)
    root.mkdir(parents=True, exist_ok=True)
    (root / "plain.txt").write_text(sentences(rng, 1500), encoding="utf-8")
    outlier = " ".join("".join(rng.choice(GREEK) for _ in range(rng.randint(3, 9)))
                       for _ in range(100))
    (root / "planted.txt").write_text(sentences(rng, 500) + "\n\n" + outlier + "\n\n"
                                      + sentences(rng, 1000), encoding="utf-8")
    return ("--only-corpus", "--corpus", f"plain={root / 'plain.txt'}",
            "--corpus", f"planted={root / 'planted.txt'}")


# The run that the outlier spikes in (seeded: the same batches every time). The planted row
# comes at step 63, where it spikes 28x the median of the 50 steps before; the learning rate is
# flat after its warmup, as a longer run's cosine still nearly is there, so 100 steps find what
# 300 found in three times the time.
TRAIN_ARGS = ("--preset", "tiny", "--steps", "100", "--batch-size", "4", "--lr", "0.01",
              "--warmup-steps", "20", "--min-lr-ratio", "1",
              "--eval-every", "0", "--sample-every", "0")
