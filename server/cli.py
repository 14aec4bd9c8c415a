"""Command line: `andrea serve` (and later `train --headless`, `export`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from server.config import Settings


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from server.app import create_app

    settings = Settings(host=args.host, port=args.port, data_dir=Path(args.data_dir).resolve())
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    print(f"Andrea: open http://{args.host}:{args.port}/ in Chrome (data in {settings.data_dir})",
          flush=True)
    uvicorn.run(create_app(settings), host=args.host, port=args.port, log_level="info")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="andrea", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve the app")
    serve.add_argument("--host", default="127.0.0.1", help="bind address (loopback by default)")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--data-dir", default=str(Settings().data_dir),
                       help="where the database, tokenizers and token files live")
    serve.set_defaults(func=_serve)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)
