"""Data: corpus sources, tokenizer, token files, the batch windows and the source bandit.

    sources.py    named streams of text (embedded Python docs + stdlib, user files)
    tokenizer.py  byte-level BPE per (corpus hash, V), cached as tokenizer.json
    tokens.py     per-source uint16 token files (memmap), train part + held-out val tail
    hub.py        DataHub: the server's corpus, prepared lazily per vocab size
    spec.py       BatchSpec: everything that decides a run's batches
    windows.py    THE batch draw: (spec, step, split) -> tokens [B, T + 1] and row sources
    bandit.py     phases of 7-42 steps and the per-source weights learned from loss progress
    batches.py    one run's batch: weights + windows + wire record
    wire.py       the binary body (header layout documented there and in README.md)
    run_registry.py  run_id -> BatchSpec (+ bandit), restored from the runs store
    shards.py     a room worker's batches: (round, slot, inner step) -> the run's batch step
A toy task's problems are andrea.tasks' (server/tasks.py): the model and the run config read
its facts too.
"""
