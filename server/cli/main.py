"""Andrea: train a Llama-style transformer in your browser's WebGPU and watch it learn.

  andrea serve              serve the app (http://127.0.0.1:8000 by default)
  andrea train              train a run in headless Chromium, from the command line
  andrea export RUN_ID      write a run's model as a Hugging Face checkpoint (in ./RUN_ID)
  andrea generate RUN_ID PROMPT
                            continue a prompt with a run's model (PyTorch, transformers)

Settings come from ANDREA_HOST, ANDREA_PORT and ANDREA_DATA_DIR (and, past one process,
ANDREA_DATABASE_URL and ANDREA_BROKER_URL); flags override them.
"""

from __future__ import annotations

import argparse
import socket
import sys
from pathlib import Path

from andrea import __version__
from andrea.cli.bad_settings import BadSetting, load_settings, typed
from andrea.config import Settings

# The flag that gives each Settings field `andrea serve` takes (an error names it); the rest
# come from ANDREA_*.
SERVE_FLAGS = {"host": "--host", "port": "--port", "data_dir": "--data-dir",
               "only_corpus": "--only-corpus", "corpora": "--corpus"}


class Parser(argparse.ArgumentParser):
    """A usage error in one line (the flag, what was given, what is allowed), exit 2: the whole
    usage is --help's, not printed above it."""

    def error(self, message):
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


def _bind(host: str, port: int) -> socket.socket:
    """The listening socket, bound before anything is printed: a taken port is an error here,
    not a promise to open a URL that another program answers."""
    family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(addr)
    except OSError as e:
        sock.close()
        raise OSError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    sock.set_inheritable(True)
    return sock


WILDCARD_HOSTS = ("0.0.0.0", "::", "")


def open_url(host: str, port: int) -> str:
    """The URL to open this machine's server at: a wildcard bind (every address) is opened at
    127.0.0.1, not at 0.0.0.0, which is no address to open."""
    if host in WILDCARD_HOSTS:
        host = "127.0.0.1"
    return f"http://[{host}]:{port}/" if ":" in host else f"http://{host}:{port}/"


def _serve(args: argparse.Namespace) -> int:
    from andrea.data.sources import (
        CorpusError,
        corpus_summary,
        parse_corpus_arg,
        skipped_warnings,
    )

    try:
        corpora = tuple(parse_corpus_arg(a) for a in args.corpus)
        settings = load_settings(SERVE_FLAGS,
                                 **_given(args, "host", "port", "data_dir", "only_corpus"),
                                 **({"corpora": corpora} if corpora else {}))  # or ANDREA_CORPORA
        if settings.only_corpus and not settings.corpora:
            print("andrea serve: error: --only-corpus serves only your own text, and none was "
                  "given: add --corpus NAME=PATH (a file or a folder), or drop --only-corpus to "
                  "train on the embedded Python sources", file=sys.stderr)
            return 2
        if args.workers > 1 and not settings.broker_url:
            print("andrea serve: error: --workers needs ANDREA_BROKER_URL (redis://...): "
                  "viewers on one process must hear the records committed on another",
                  file=sys.stderr)
            return 2
        settings, made_token = _with_admin_token(settings)   # before any worker: one for all
        # (Imported once the settings are known good: a bad one is said at once.)
        import uvicorn

        from andrea.app import create_app
        from andrea.model import PRESETS
        app = create_app(settings)
        sources = app.state.data.sources()   # reads every source now: bad text fails here
    except BadSetting as e:     # the setting, what was given and what is allowed
        print(f"andrea serve: {e}", file=sys.stderr)
        return 2
    except CorpusError as e:
        print(f"andrea serve: error: {e}", file=sys.stderr)
        return 2
    try:
        sock = _bind(settings.host, settings.port)
    except OSError as e:
        print(f"andrea serve: error: {e}", file=sys.stderr)
        return 1
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    port = sock.getsockname()[1]
    url = open_url(settings.host, port)
    lock = None
    if not settings.shares_store:
        from andrea.data_dir_lock import DataDirBusy, hold
        try:
            lock = hold(settings.data_dir, url)    # noqa: F841 (held while this process serves)
        except DataDirBusy as e:
            sock.close()
            print(f"andrea serve: error: {e}", file=sys.stderr)
            return 1
    print(corpus_summary(sources), flush=True)    # what was read, and what was skipped: why
    for line in skipped_warnings(sources):
        print(line, file=sys.stderr, flush=True)
    if args.warm_data:  # tokenizer + token files for every preset, off the request path
        app.state.data.warm(cfg.vocab_size for cfg in PRESETS.values())
    anywhere = (" (from another machine: this machine's name or address)"
                if settings.host in WILDCARD_HOSTS else "")
    print(f"Andrea {__version__}: open {url} in Chrome{anywhere} "
          f"(data in {settings.data_dir})", flush=True)
    if made_token:
        print(f"Andrea: operator token (resume, rename, delete or branch any run from another "
              f"machine: Authorization: Bearer ..., or ANDREA_ADMIN_TOKEN to keep one): "
              f"{made_token}", flush=True)
    if args.workers > 1:
        return _serve_workers(settings, sock, args.workers)
    from andrea.app import quiet_batch_fetches
    from andrea.web.uvicorn_limits import bound_to
    server = uvicorn.Server(uvicorn.Config(app, log_level="info",
                                           ws_per_message_deflate=settings.ws_compression,
                                           http=bound_to(settings), **_connection_limits(settings)))
    quiet_batch_fetches()   # (create_app did; again after uvicorn's logging config, to be sure)
    server.run(sockets=[sock])
    return 0


def _serve_workers(settings: Settings, sock: socket.socket, workers: int) -> int:
    """N uvicorn worker processes on the one bound socket (the kernel spreads connections over
    them); each builds the app from the same settings, handed down through ANDREA_*."""
    import json
    import os

    import uvicorn
    from uvicorn.supervisors import Multiprocess

    for name, value in settings.model_dump(mode="json", exclude_none=True).items():
        if name == "allowed_hosts":
            value = ",".join(value)         # the form ANDREA_ALLOWED_HOSTS takes
        elif not isinstance(value, str):
            value = json.dumps(value)       # numbers, and corpora as a JSON list
        os.environ[f"ANDREA_{name.upper()}"] = value
    # (The protocol class by name: each worker reads the settings from ANDREA_*, set above.)
    config = uvicorn.Config("andrea.app:create_app", factory=True, workers=workers,
                            log_level="info", ws_per_message_deflate=settings.ws_compression,
                            http="andrea.web.uvicorn_limits:LimitedHTTPProtocol",
                            **_connection_limits(settings))
    Multiprocess(config, sockets=[sock]).run()
    return 0


def _connection_limits(settings: Settings) -> dict:
    """uvicorn's own bounds (the header timeout and the per-client cap are uvicorn_limits.py's):
    503 past max_connections open connections or running requests; 5 s between keep-alive
    requests (uvicorn's default); heads as big as uvicorn_limits allows under h11 too."""
    from andrea.web.uvicorn_limits import MAX_HEAD_BYTES
    return {"limit_concurrency": settings.max_connections, "timeout_keep_alive": 5,
            "h11_max_incomplete_event_size": MAX_HEAD_BYTES}


def _with_admin_token(settings: Settings) -> tuple[Settings, str | None]:
    """A server whose local user is not trusted (other machines can reach it, or it serves a
    workshop's names behind a proxy) needs an operator token (deps.authorize): one is made
    when ANDREA_ADMIN_TOKEN gives none, and returned to be printed once."""
    if settings.trusts_local_user or settings.admin_token:
        return settings, None
    import secrets
    token = secrets.token_urlsafe(24)
    return settings.model_copy(update={"admin_token": token}), token


def _given(args: argparse.Namespace, *names: str) -> dict:
    """The settings given on the command line; the rest come from ANDREA_* or the defaults."""
    return {n: getattr(args, n) for n in names if getattr(args, n, None) is not None}


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="andrea", description=__doc__,
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"andrea {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve the app")
    serve.add_argument("--host", help="bind address (default: ANDREA_HOST or 127.0.0.1, loopback)")
    # (Checked by Settings, which says what is allowed: 0 to 65535.)
    serve.add_argument("--port", help="default: ANDREA_PORT or 8000")
    serve.add_argument("--data-dir", type=Path,
                       help="where the database, tokenizers and token files live "
                            "(default: ANDREA_DATA_DIR or the platform's user data folder)")
    serve.add_argument("--corpus", action="append", default=[], metavar="NAME=PATH",
                       help="add a text source: a UTF-8 file, or a folder of .txt/.md/.jsonl/"
                            ".parquet files (repeatable; served beside the embedded Python "
                            "sources, or alone with --only-corpus)")
    serve.add_argument("--only-corpus", action="store_true", default=None,
                       help="serve only the --corpus sources: the embedded Python sources "
                            "(python-docs, python-stdlib, python-tests, python-bundled) are "
                            "left out and the tokenizer is trained on your text alone (another "
                            "corpus hash: runs made without it are not served). Needs at least "
                            "one --corpus (default: ANDREA_ONLY_CORPUS or off)")
    serve.add_argument("--no-warm-data", dest="warm_data", action="store_false",
                       help="do not build tokenizers and token files in the background at start "
                            "(the first batch request builds them instead)")
    serve.add_argument("--workers", type=typed(int, {"type": "integer", "minimum": 1}),
                       default=1, metavar="N",
                       help="server processes on the one port (needs ANDREA_BROKER_URL; use "
                            "ANDREA_DATABASE_URL=postgresql://... past one machine)")
    serve.set_defaults(func=_serve)

    from andrea.cli.headless import train
    from andrea.cli.train_args import (
        BROWSER_HELP,
        HelpFormatter,
        add_train_arguments,
        room_help,
    )
    tr = sub.add_parser("train", help="train a run in headless Chromium (Playwright)",
                        formatter_class=HelpFormatter, epilog=room_help(),
                        description="Creates a run with the given config and trains it in "
                                    "headless Chromium, as the run page does in a browser. "
                                    "Config flags left out take the server's defaults. "
                                    + BROWSER_HELP)
    add_train_arguments(tr)
    tr.set_defaults(func=train)

    ex = sub.add_parser("export", help="write a run's trained model as a Hugging Face checkpoint",
                        description="Writes config.json, generation_config.json, "
                                    "model.safetensors, the tokenizer files and a README.md "
                                    "model card: AutoModelForCausalLM.from_pretrained(OUT).")
    ex.add_argument("run_id")
    ex.add_argument("--out", type=Path,
                    help="folder for the checkpoint; its checkpoint files are replaced (default: "
                         "./RUN_ID, or ./RUN_ID-stepK with --step, refused if it holds anything)")
    ex.add_argument("--step", type=int, metavar="K",
                    help="the weights of the run's training checkpoint after step K (see "
                         "GET /api/runs/RUN_ID/checkpoints) instead of its final upload")
    where = ex.add_mutually_exclusive_group()
    where.add_argument("--data-dir", type=Path,
                       help="the data dir holding the run (default: ANDREA_DATA_DIR or the "
                            "platform's user data folder)")
    where.add_argument("--server", metavar="URL",
                       help="download the checkpoint from a running `andrea serve` instead")
    ex.set_defaults(func=_export)

    gen = sub.add_parser("generate", help="continue a prompt with a run's model (PyTorch)",
                         description="Streams a run's continuation of PROMPT, as the run page's "
                                     "prompt box does: the run's newest weights (final, or its "
                                     "newest checkpoint's) from a running server, run on this "
                                     "machine with PyTorch and transformers (pip install torch "
                                     "transformers).")
    gen.add_argument("run_id")
    gen.add_argument("prompt")
    gen.add_argument("--server", metavar="URL", default=None,
                     help="the server holding the run (default: ANDREA_HOST and ANDREA_PORT's, "
                          "http://127.0.0.1:8000)")
    gen.add_argument("--step", type=int, metavar="K",
                     help="the weights of its checkpoint after step K instead of its newest")
    gen.add_argument("--tokens", type=typed(int, {"type": "integer", "minimum": 1,
                                                  "maximum": 4096}), default=48)
    gen.add_argument("--temperature", type=typed(float, {"type": "number", "minimum": 0,
                                                         "maximum": 10}), default=0.8,
                     help="0: the most likely token every time")
    gen.add_argument("--top-k", type=typed(int, {"type": "integer", "minimum": 0}), default=40,
                     help="sample among the k most likely tokens only; 0: all")
    gen.add_argument("--seed", type=int, default=0)
    gen.set_defaults(func=_generate)
    return parser


def _generate(args: argparse.Namespace) -> int:
    """Exit 2 for what is not there (the run, its weights, the libraries), 1 for a server out
    of reach."""
    from andrea.cli import generate_command
    from andrea.cli.http_client import ServerError, Unreachable

    try:
        server = args.server
        if server is None:
            settings = load_settings()
            server = open_url(settings.host, settings.port)
        generate_command.generate(server, args.run_id, args.prompt, args.tokens,
                                  args.temperature, args.top_k, args.seed, args.step)
    except (generate_command.NeedsTorch, ValueError, BadSetting) as e:
        print(f"andrea generate: {e}", file=sys.stderr)
        return 2
    except ServerError as e:
        print(f"andrea generate: {e}", file=sys.stderr)
        return 2 if e.status in (404, 409, 422) else 1
    except Unreachable as e:
        print(f"andrea generate: {e}", file=sys.stderr)
        return 1
    return 0


def _export(args: argparse.Namespace) -> int:
    """Exit 2 for what is not there (the run, its database, its weights, the checkpoint asked
    for) or a default folder already used, as for a wrong command; 1 for what could not be done
    (a server out of reach, a damaged checkpoint, a disk error)."""
    from andrea import export
    from andrea.cli import export_command

    try:
        if args.step is not None and args.step < 1:
            raise export_command.UsageError(f"--step must be 1 or more, got {args.step}")
        if args.server:
            out = export_command.fetch_export(args.server, args.run_id, args.out, args.step)
        else:
            settings = load_settings(**({"data_dir": args.data_dir} if args.data_dir else {}))
            out = export_command.export_local(args.data_dir or settings.data_dir, args.run_id,
                                      args.out, args.step, settings.database_url,
                                      settings.cache_dir)
    except (export_command.UsageError, export.NoWeights, BadSetting) as e:
        print(f"andrea export: {e}", file=sys.stderr)
        return 2
    except (OSError, ValueError) as e:
        print(f"andrea export: {e}", file=sys.stderr)
        return 1
    if not (out / "tokenizer.json").exists():
        print("andrea export: no cached tokenizer for this run's corpus; wrote the weights, "
              "configs and card only", file=sys.stderr)
    print(f"wrote {out}: AutoModelForCausalLM.from_pretrained({str(out)!r})")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)
