"""Data for bench/bench_fidelity.mjs: everything a GPU machine without an andrea server (and
without network) needs to train the 12m preset through the engine's Trainer on the server's
default corpus, with exactly the batches the server would serve.

    python bench/prepare_fidelity.py [--out bench/fidelity_data] [--preset 12m] [--batch 32]
                                     [--steps 1000] [--seeds 0 1] [--data-dir DIR]

Writes (the folder is git-ignored; ~24 MB at V 8192, so it travels with `carry`):
    tokens_<i>.u16            the corpus' token files for the preset's V (server/data/tokens.py)
    windows_seed<S>.u32       [steps, B, 2] (source index, window start) of every training row:
                              windows.train_windows, i.e. the server's batches for a run of seed S
    val_windows.u32           [4, B, 2] the validation batches 0..3 the trainer evaluates on
    check_seed<S>.u32         [B, T + 1] tokens of step 0 from windows.sample_batch, which the
                              bench rebuilds from the windows and compares before training
    layout_<policy>.json      {layout (with optimizer_state for that 8-bit policy), maps}
    meta.json                 corpus hash, sources, B, T, steps, seeds
Only the windows (a few hundred KB per seed) are per seed: the tokens are shared.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import numpy as np

from andrea.data.hub import DataHub
from andrea.data.spec import BatchSpec
from andrea.data.windows import sample_batch, static_weights, train_windows, val_windows
from andrea.model import PRESETS, build_layout
from andrea.optim import F32_POLICIES, optimizer_memory, quantization_maps

VAL_BATCHES = 4          # the trainer evaluates on val batches (step / eval_every) % 4


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "fidelity_data")
    ap.add_argument("--preset", default="12m", choices=list(PRESETS))
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--data-dir", type=Path, default=None,
                    help="andrea's data dir (its caches); default: the server's default")
    a = ap.parse_args(argv)
    if a.data_dir is None:
        from andrea.config import Settings
        a.data_dir = Settings().data_dir
    cfg = PRESETS[a.preset]
    B, T, V = a.batch, cfg.seq_len, cfg.vocab_size
    corpus = DataHub(a.data_dir).prepared(V)
    out = a.out
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    sources = []
    for i, f in enumerate(corpus.files):
        np.asarray(f.tokens, dtype="<u2").tofile(out / f"tokens_{i}.u16")
        sources.append({"name": f.name, "file": f"tokens_{i}.u16", "n_tokens": f.n_tokens,
                        "n_train": f.n_train})
    for seed in a.seeds:
        spec = BatchSpec(seed=seed, batch_size=B, seq_len=T, vocab_size=V, total_steps=a.steps,
                         corpus_hash=corpus.corpus_hash)
        w = static_weights(spec, len(corpus.files))
        win = np.empty((a.steps, B, 2), "<u4")
        for step in range(a.steps):
            src, start = train_windows(corpus.files, spec, step, w)
            win[step, :, 0], win[step, :, 1] = src, start
        win.tofile(out / f"windows_seed{seed}.u32")
        sample_batch(corpus.files, spec, 0)[0].astype("<u4").tofile(out / f"check_seed{seed}.u32")
    spec = BatchSpec(seed=0, batch_size=B, seq_len=T, vocab_size=V, total_steps=a.steps)
    val = np.empty((VAL_BATCHES, B, 2), "<u4")
    for i in range(VAL_BATCHES):
        src, start = val_windows(corpus.files, spec, i)
        val[i, :, 0], val[i, :, 1] = src, start
    val.tofile(out / "val_windows.u32")
    layout = {"preset": a.preset, **build_layout(cfg)}
    for policy in F32_POLICIES:
        (out / f"layout_{policy}.json").write_text(json.dumps({
            "layout": {**layout, "optimizer_state": optimizer_memory(layout, policy)},
            "maps": quantization_maps()}))
    train = [s["n_train"] for s in sources]
    from andrea.run_config import RunConfig  # the run a user would start: the server's defaults
    run_config = RunConfig(preset=a.preset, steps=a.steps, batch_size=B, seq_len=T,
                           sample_every=0).model_dump()
    meta = {"preset": a.preset, "corpus_hash": corpus.corpus_hash, "batch_size": B, "seq_len": T,
            "run_config": run_config,
            "vocab_size": V, "steps": a.steps, "seeds": a.seeds, "sources": sources,
            "val_batches": VAL_BATCHES, "policies": list(F32_POLICIES),
            "tokens_per_step": B * T, "train_tokens": sum(train),
            "passes_per_source_uniform": [round(a.steps * B * T / len(train) / n, 3)
                                          for n in train]}
    (out / "meta.json").write_text(json.dumps(meta, indent=1))
    size = sum(p.stat().st_size for p in out.iterdir())
    print(f"{out}: {size / 1e6:.1f} MB, corpus {corpus.corpus_hash}, "
          f"{sum(train):,} train tokens, passes (uniform) {meta['passes_per_source_uniform']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
