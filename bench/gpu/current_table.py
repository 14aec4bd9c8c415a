"""Median, min and max over the repeated runs that current_table.sh wrote into one folder:
the engine's Trainer loop (bench_trainer.mjs summary lines) and PyTorch eager fp32 with TF32
off with HF's default (SDPA) attention (bench_step_torch.py), with throughput ratios engine /
PyTorch. Usage: current_table.py DIR"""

from __future__ import annotations

import re
import statistics
import sys
from pathlib import Path

# bench_trainer.mjs: "  adamw          40.87    41.04   1.004"
TRAINER = re.compile(r"^\s+(adamw\S*)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)", re.M)
TORCH = re.compile(r"^  fp32 \(TF32 off\): ([\d.]+) ms/step", re.M)


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):7.2f} ({min(values):.2f}-{max(values):.2f})"


def main(folder: Path) -> None:
    print("| preset, batch | variant | back to back ms | Trainer ms | PyTorch fp32 (SDPA) ms "
          "| Trainer vs PyTorch (throughput) |")
    print("|---|---|---|---|---|---|")
    for preset, batch in (("12", 32), ("120", 8)):
        torch_ms = [float(m) for f in sorted(folder.glob(f"p{preset}_*.txt"))
                    for m in TORCH.findall(f.read_text())]
        runs: dict[str, list[tuple[float, float]]] = {}
        for f in sorted(folder.glob(f"t{preset}_*.txt")):
            text = f.read_text().split("summary:", 1)[-1]
            for variant, b2b, trainer, _ in TRAINER.findall(text):
                runs.setdefault(variant, []).append((float(b2b), float(trainer)))
        for variant, pairs in runs.items():
            b2b, trainer = [p[0] for p in pairs], [p[1] for p in pairs]
            ratio = statistics.median(torch_ms) / statistics.median(trainer) if torch_ms else 0
            print(f"| {preset}m, B {batch} | {variant} | {spread(b2b)} | {spread(trainer)} | "
                  f"{spread(torch_ms) if torch_ms else 'n/a'} | {ratio:.2f}x |")
    print(f"\n(median (min-max) of {len(list(folder.glob('t12_*.txt')))} runs each)")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
