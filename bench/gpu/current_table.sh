#!/usr/bin/env bash
# The current speed table (bench/README.md, bench/results/current_h200.txt): the engine's real
# Trainer loop (bench_trainer.mjs, fp32 and 8-bit AdamW) and PyTorch eager fp32 (TF32 off,
# bench_step_torch.py) for the 12m and 120m presets, each run REPEATS times in this one command,
# then median, min and max per row (current_table.py). Per-kernel GPU times come from one
# bench_step.mjs run per preset.
# On the GPU machine, from the checkout's root, after `bash .gpu/setup-remote.sh` and the exports
# in bench/gpu/README.md, with the layouts made beforehand where Python has the package:
#   python -m andrea.optim 12m > .gpu/l12.json; python -m andrea.optim 120m > .gpu/l120.json
#   bash bench/gpu/current_table.sh [REPEATS] > table.txt
set -euo pipefail
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"   # the torch scripts import bench/ and tests/
REPEATS=${1:-3}
NODE=${NODE:-/tmp/gpu/node}
out=$(mktemp -d)
for i in $(seq "$REPEATS"); do
  "$NODE" bench/bench_trainer.mjs .gpu/l12.json --batch 32 --steps 40 --warmup 8 > "$out/t12_$i.txt"
  "$NODE" bench/bench_trainer.mjs .gpu/l120.json --batch 8 --steps 16 --warmup 4 > "$out/t120_$i.txt"
  python3 bench/bench_step_torch.py .gpu/l12.json --batch 32 > "$out/p12_$i.txt"
  python3 bench/bench_step_torch.py .gpu/l120.json --batch 8 --iters 10 > "$out/p120_$i.txt"
done
"$NODE" bench/bench_step.mjs .gpu/l12.json --batch 32 --iters 20 > "$out/k12.txt"
"$NODE" bench/bench_step.mjs .gpu/l120.json --batch 8 --iters 5 > "$out/k120.txt"
python3 bench/gpu/current_table.py "$out"
echo
echo "## per-kernel GPU time (bench_step.mjs, one run each)"
cat "$out/k12.txt" "$out/k120.txt"
echo
echo "## raw runs"
for f in "$out"/t*.txt "$out"/p*.txt; do echo "### $(basename "$f")"; cat "$f"; done
