"""Data benchmark (not a test): cold build of the default corpus, then warm batch throughput.

    python bench/bench_data.py [--steps 2000] [--data-dir DIR]

Prints: source loading, tokenizer training and token-file build times for the default corpus
(V 512 and V 8192, from an empty data dir), the warm reload time, then batches per second for
the `120m` shape (B 8, T 1024, V 8192) through the raw sampler, the sampler + wire encoding,
the FastAPI app in process (TestClient), and a real uvicorn over loopback HTTP (httpx).
"""

from __future__ import annotations

import argparse
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx  # noqa: E402
import uvicorn  # noqa: E402
from fastapi.testclient import TestClient  # noqa: E402

from andrea.app import create_app  # noqa: E402
from andrea.config import Settings  # noqa: E402
from andrea.data import wire  # noqa: E402
from andrea.data.hub import DataHub  # noqa: E402
from andrea.data.spec import BatchSpec  # noqa: E402
from andrea.data.windows import sample_batch  # noqa: E402
from andrea.model import PRESETS  # noqa: E402


def rate(label: str, n: int, fn) -> None:
    t0 = time.perf_counter()
    for step in range(n):
        fn(step)
    dt = time.perf_counter() - t0
    mb = n * 8 * 1025 * 4 / dt / 2**20
    print(f"  {label:<34} {n / dt:9.0f} batches/s  {1e3 * dt / n:7.3f} ms/batch  {mb:7.0f} MiB/s")


def cold_build(data_dir: Path) -> None:
    print(f"cold build in {data_dir}")
    hub = DataHub(data_dir)
    t0 = time.perf_counter()
    sources = hub.sources()
    print(f"  load sources + hash            {time.perf_counter() - t0:6.2f} s  "
          + ", ".join(f"{s.name} {s.n_chars:,} chars" for s in sources))
    for v in (PRESETS["tiny"].vocab_size, PRESETS["120m"].vocab_size):
        c = hub.prepared(v)
        tokens = ", ".join(f"{f.name} {f.n_tokens:,} tok ({f.n_train:,} train / {f.n_val:,} val)"
                           for f in c.files)
        print(f"  V {v:<5} tokenizer {c.build_s['tokenizer']:5.2f} s  token files "
              f"{c.build_s['tokens']:5.2f} s  {tokens}")
    t0 = time.perf_counter()
    warm = DataHub(data_dir)
    warm.prepared(PRESETS["120m"].vocab_size)
    print(f"  warm reload (new process view)  {time.perf_counter() - t0:6.2f} s")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def throughput(data_dir: Path, n: int) -> None:
    cfg = PRESETS["120m"]
    spec = BatchSpec(seed=0, batch_size=8, seq_len=cfg.seq_len, vocab_size=cfg.vocab_size,
                     total_steps=10**9)
    print(f"warm throughput, 120m shape: B 8, T {cfg.seq_len}, V {cfg.vocab_size}, {n} steps")
    app = create_app(Settings(data_dir=data_dir))
    corpus = app.state.data.prepared(cfg.vocab_size)
    app.state.runs.register("bench", spec)
    rate("sample_batch (numpy, memmap)", n, lambda s: sample_batch(corpus.files, spec, s))

    def encoded(s):
        tokens, sources = sample_batch(corpus.files, spec, s)
        wire.encode(wire.Batch(s, "train", len(corpus.files), None, sources, tokens))
    rate("sample_batch + wire.encode", n, encoded)

    with TestClient(app) as client:
        rate("HTTP in process (TestClient)", n,
             lambda s: client.get(f"/api/runs/bench/batches/{s}"))

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}") as http:
            def get(s):
                r = http.get(f"/api/runs/bench/batches/{s}")
                assert r.status_code == 200 and len(r.content) == 48 + 8 * 1025 * 4
            rate("HTTP uvicorn loopback (httpx)", n, get)
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--data-dir", help="reuse this data dir (default: a fresh temp dir)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="andrea-bench-") as tmp:
        data_dir = Path(args.data_dir) if args.data_dir else Path(tmp)
        cold_build(data_dir)
        throughput(data_dir, args.steps)


if __name__ == "__main__":
    main()
