"""Command line: `andrea serve` (and later `train --headless`, `export`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from andrea.config import Settings


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from andrea.app import create_app
    from andrea.data.sources import CorpusError, parse_corpus_arg
    from andrea.model import PRESETS

    try:
        corpora = tuple(parse_corpus_arg(a) for a in args.corpus)
        settings = Settings(host=args.host, port=args.port, data_dir=Path(args.data_dir).resolve(),
                            corpora=corpora)
        app = create_app(settings)
        sources = app.state.data.sources()   # reads every source now: bad text fails here
    except CorpusError as e:
        print(f"andrea serve: error: {e}", file=sys.stderr)
        return 2
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    print("Andrea: corpus " + ", ".join(f"{s.name} ({s.n_chars:,} chars)" for s in sources),
          flush=True)
    if args.warm_data:  # tokenizer + token files for every preset, off the request path
        app.state.data.warm(cfg.vocab_size for cfg in PRESETS.values())
    print(f"Andrea: open http://{args.host}:{args.port}/ in Chrome (data in {settings.data_dir})",
          flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level="info")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="andrea", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve the app")
    serve.add_argument("--host", default="127.0.0.1", help="bind address (loopback by default)")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--data-dir", default=str(Settings().data_dir),
                       help="where the database, tokenizers and token files live")
    serve.add_argument("--corpus", action="append", default=[], metavar="NAME=PATH",
                       help="add a text source: a UTF-8 file, or a folder of .txt/.md files "
                            "(repeatable; the embedded Python docs and stdlib are always there)")
    serve.add_argument("--no-warm-data", dest="warm_data", action="store_false",
                       help="do not build tokenizers and token files in the background at start "
                            "(the first batch request builds them instead)")
    serve.set_defaults(func=_serve)

    tr = sub.add_parser("train", help="run a training run in headless Chromium (Playwright)")
    tr.add_argument("--headless", action="store_true", required=True,
                    help="drive the training page in a headless browser (the only mode)")
    tr.add_argument("--preset", default="tiny")
    tr.add_argument("--optimizer", choices=["adamw", "adamw_8bit"], default="adamw")
    tr.add_argument("--f16-mirror", action="store_true", help="matmuls read an f16 weight mirror")
    tr.add_argument("--steps", type=int, default=200)
    tr.add_argument("--seed", type=int, default=0)
    tr.add_argument("--batch-size", type=int)
    tr.add_argument("--lr", type=float)
    tr.add_argument("--max-norm", type=float)
    tr.add_argument("--no-clip", action="store_true", help="turn gradient clipping off")
    tr.add_argument("--data-mode", choices=["uniform", "bandit"])
    tr.add_argument("--server", help="an Andrea server URL (default: start one for this run)")
    tr.add_argument("--data-dir", help="data dir of the server started for this run")
    tr.add_argument("--gpu", action="store_true",
                    help="use the machine's GPU through Vulkan instead of SwiftShader")
    tr.add_argument("--timeout", type=float, default=3600, help="seconds before giving up")
    tr.add_argument("--json", action="store_true", help="print one JSON object at the end")
    tr.set_defaults(func=lambda a: __import__("andrea.headless", fromlist=["train"]).train(a))

    ex = sub.add_parser("export", help="write a run's trained model as a Hugging Face checkpoint")
    ex.add_argument("run_id")
    ex.add_argument("--out", required=True,
                    help="folder for config.json, model.safetensors, tokenizer.json "
                         "(LlamaForCausalLM.from_pretrained)")
    ex.add_argument("--data-dir", default=str(Settings().data_dir))
    ex.set_defaults(func=_export)
    return parser


def _export(args: argparse.Namespace) -> int:
    from andrea.data.tokenizer import tokenizer_dir
    from andrea.export import export_run
    from andrea.model import PRESETS
    from andrea.store import Store

    data_dir = Path(args.data_dir).resolve()
    if not (data_dir / "andrea.sqlite").exists():
        print(f"andrea export: no database in {data_dir}", file=sys.stderr)
        return 2
    run = Store(data_dir / "andrea.sqlite").get_run(args.run_id)
    if run is None:
        print(f"andrea export: unknown run {args.run_id!r} in {data_dir}", file=sys.stderr)
        return 2
    # The tokenizer the run trained with: cached under the run's own corpus hash.
    corpus_hash = run["config"].get("corpus_hash")
    vocab = PRESETS[run["config"]["preset"]].vocab_size
    tokenizer = tokenizer_dir(data_dir, corpus_hash, vocab) / "tokenizer.json"
    if not tokenizer.exists():
        print("andrea export: no cached tokenizer for this run's corpus; writing the weights "
              "and config only", file=sys.stderr)
        tokenizer = None
    try:
        out = export_run(run, data_dir, tokenizer, Path(args.out))
    except (FileNotFoundError, ValueError) as e:
        print(f"andrea export: {e}", file=sys.stderr)
        return 1
    print(f"wrote {out}: LlamaForCausalLM.from_pretrained({str(out)!r})")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)
