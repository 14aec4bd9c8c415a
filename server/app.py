"""App factory: mounts /static and /shaders, includes one router per resource."""

from __future__ import annotations

import asyncio
import logging
import re
import time
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.gzip import GZipMiddleware
from fastapi.responses import JSONResponse, PlainTextResponse
from fastapi.templating import Jinja2Templates
from starlette.middleware.gzip import DEFAULT_EXCLUDED_CONTENT_TYPES
from starlette.types import ASGIApp, Receive, Scope, Send

from andrea import __version__, telemetry
from andrea.assets import IMMUTABLE, REVALIDATE, CachedFiles, asset_dir, content_version
from andrea.broker import RedisBroker
from andrea.checkpoints import CheckpointStore
from andrea.config import Settings, host_of
from andrea.data import wire
from andrea.data.hub import DataHub
from andrea.data.run_registry import RunRegistry
from andrea.fanout import Fanout
from andrea.page_facts import page_facts
from andrea.room.lifecycle import close_due_rounds, recover_rooms
from andrea.routes import (
    checkpoints,
    data,
    exports,
    health,
    pages,
    presets,
    room,
    runs,
    spikes,
)
from andrea.runs import sweep
from andrea.runs.lifecycle import watch_runs_left
from andrea.shown import shown_text
from andrea.storage import StorageBudget
from andrea.store import Store
from andrea.web.auth import TOKEN_STORAGE_PREFIX
from andrea.web.errors import answer_refusals
from andrea.web.limits import BodyLimits, ReadBudget
from andrea.web.origin_check import OriginCheck
from andrea.web.quotas import MessageRates, RateLimiter

# Media types never gzipped: Starlette's own list (images, archives, event streams, ...) and this
# server's binary bodies, not worth the CPU: checkpoints and weights (octet-stream), and batches
# (a 33 MB batch: 0.18 s plain, 11 s gzipped).
NOT_GZIPPED = (*DEFAULT_EXCLUDED_CONTENT_TYPES, "application/octet-stream", wire.MEDIA_TYPE)

# A training tab fetches a batch every step (and the eval batches): uvicorn's access log line
# for each buried everything else `andrea serve` says. The run's own and the lab's ad-hoc ones.
_BATCH_PATH = re.compile(r"/api/(?:runs/[^/?]+/)?(?:val_)?batches/\d+(?:\?.*)?")

# Every route of the app, in the order create_app includes them; the pages get their paths by
# name (page_facts.route_paths).
ROUTERS = (health.router, pages.router, presets.router, data.router, runs.router, exports.router,
           spikes.router, checkpoints.router, room.router, telemetry.router)


class QuietBatchFetches(logging.Filter):
    """Drops uvicorn's access log lines of batch fetches that succeeded; a refused one (a bad
    step, an unknown run) is still logged, as is every other request."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args     # uvicorn's: (client, method, path with query, version, status)
        if not isinstance(args, tuple) or len(args) != 5:
            return True
        _, method, path, _, status = args
        return not (method == "GET" and isinstance(status, int) and status < 400
                    and isinstance(path, str) and _BATCH_PATH.fullmatch(path))


def quiet_batch_fetches() -> None:
    """Installs QuietBatchFetches on uvicorn's access logger, once per process: create_app runs
    in every worker process, and several times in one (tests). uvicorn's logging config
    (dictConfig, when a Config is made) replaces the logger's handlers and keeps its filters."""
    access = logging.getLogger("uvicorn.access")
    if not any(isinstance(f, QuietBatchFetches) for f in access.filters):
        access.addFilter(QuietBatchFetches())


@asynccontextmanager
async def _lifespan(app: FastAPI):
    settings, store = app.state.settings, app.state.store
    # Branches a killed server left half-copied: every one when this process is the only one
    # (its own SQLite file); else those whose copy stopped moving, now and in the sweep below.
    others_since = time.time() - sweep.BRANCH_STALE_S if settings.shares_store else None
    await sweep.drop_unfinished_branches(store, settings.data_dir, others_since)
    # Folders a stop left ahead of their rows (a delete's files, a branch's links).
    await sweep.settle_run_folders(store, settings.data_dir, others_since)
    await _recover_checkpoints(store, app.state.checkpoints)
    # Rooms whose close a stop cut short: finished, and their runs told.
    await recover_rooms(store, app.state.fanout, app.state.checkpoints)
    await app.state.fanout.start()      # with a broker: hears the other processes first
    # The runs whose tabs should come back: the old process's watchdogs went with it.
    await watch_runs_left(store, app.state.fanout, settings.trainer_grace_s)
    # Runs that never started: those left from before a restart now, then every few seconds.
    # With them, the room runs' rounds whose deadline passed and their silent workers.
    await sweep.expire_runs(store, app.state.fanout, settings.start_grace_s,
                           settings.data_dir if settings.shares_store else None,
                           also=lambda: close_due_rounds(store, app.state.fanout,
                                                         app.state.checkpoints, app.state.storage))
    yield
    await app.state.fanout.shutdown()   # pending "trainer went away" checks
    app.state.store.close()             # pending writes land, then the file is closed


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings()
    quiet_batch_fetches()   # here, so that `--workers`' processes (which build their own) get it
    # /docs and /redoc would load their scripts from a CDN (blank offline): off; the API is
    # described by /openapi.json.
    app = FastAPI(title="Andrea", version=__version__, docs_url=None, redoc_url=None,
                  lifespan=_lifespan)
    app.state.settings = settings
    app.add_exception_handler(RequestValidationError, _validation_error)
    answer_refusals(app)    # the domain's refusals (errors.py), each kind its status
    # Text (pages, modules, shaders, JSON) is gzipped; binary bodies are not (NOT_GZIPPED).
    # JSON reads paced per client address (limits.ReadBudget), inside gzip: counted as sent.
    app.add_middleware(ReadBudget, bytes_per_s=settings.read_bytes_per_s)
    app.add_middleware(GZipMiddleware, minimum_size=1024, exclude_content_types=NOT_GZIPPED)
    static, shaders = asset_dir("static"), asset_dir("shaders")
    version = content_version(static, shaders)
    templates = Jinja2Templates(directory=str(asset_dir("templates")))
    templates.env.globals.update(version=__version__, static_base=f"/static/{version}/",
                                 shader_base=f"/shaders/{version}/",
                                 run_token_key=TOKEN_STORAGE_PREFIX, facts=page_facts(ROUTERS))
    templates.env.filters["shown"] = shown_text     # user text: bidi controls neutralised
    # tojson keeps the order of the facts' tables (the clip modes' order is the experiment's).
    templates.env.policies["json.dumps_kwargs"] = {"sort_keys": False}
    app.state.templates = templates
    wgsl = "text/plain; charset=utf-8"
    app.mount(f"/static/{version}", CachedFiles(directory=static, cache_control=IMMUTABLE),
              name="static-versioned")
    app.mount(f"/shaders/{version}", CachedFiles(directory=shaders, cache_control=IMMUTABLE,
                                                  media_type=wgsl), name="shaders-versioned")
    app.mount("/static", CachedFiles(directory=static, cache_control=REVALIDATE), name="static")
    app.mount("/shaders", CachedFiles(directory=shaders, cache_control=REVALIDATE,
                                      media_type=wgsl), name="shaders")
    # The app's objects, made once here and handed to handlers by deps.py. Data is read and
    # tokenized lazily, on first use, so page loads and tests stay fast.
    app.state.data = DataHub(settings.corpus_dir, settings.corpora, settings.only_corpus)
    app.state.store = store = Store.open(settings.database_url, settings.db_path)
    app.state.runs = RunRegistry(store, settings.batch_wait_s)
    broker = RedisBroker(settings.broker_url) if settings.broker_url else None
    app.state.fanout = fanout = Fanout(settings.viewer_queue_bytes, broker)
    fanout.on_reset = app.state.runs.forget     # resumed or deleted on another process
    app.state.checkpoints = CheckpointStore(settings.data_dir, settings.checkpoints_kept,
                                            shared=settings.broker_url is not None)
    # New runs per client address (quotas.py: each process counts its own).
    app.state.run_limiter = RateLimiter(settings.run_burst, settings.run_rate_per_s)
    # The bytes per second of trainer messages, per run and per client address (quotas.py).
    app.state.message_rates = MessageRates(settings.metrics_bytes_per_s,
                                           settings.client_metrics_bytes_per_s)
    # The data dir's free space above its floor, for every writer (storage.py); the SQLite
    # file's free pages count as free for rows.
    app.state.storage = StorageBudget(
        settings.data_dir, settings.min_free_bytes,
        free_pages=lambda: store.run(store.db.free_page_bytes),
        records_here=settings.database_url is None)
    # Another site's page may not POST, PUT, PATCH or DELETE here (a text/plain form needs no
    # CORS preflight).
    app.add_middleware(OriginCheck, settings=settings)
    # Outermost: a request for a host name this server does not answer to (a DNS-rebinding
    # page) is refused before any route sees it.
    app.add_middleware(HostCheck, hosts=settings.hosts)
    # Before anything reads a byte: bodies over max_body_bytes get 413, stalled or trickled
    # transfers are dropped. Added last, so outermost: it needs uvicorn's own receive to cut a
    # connection.
    app.add_middleware(BodyLimits, max_body_bytes=settings.max_body_bytes,
                       idle_timeout_s=settings.idle_timeout_s,
                       upload_timeout_s=settings.upload_timeout_s,
                       min_upload_bytes_per_s=settings.min_upload_bytes_per_s)
    for router in ROUTERS:
        app.include_router(router)
    return app


async def _recover_checkpoints(store: Store, ckpts: CheckpointStore) -> None:
    """A crash mid-upload leaves temp files or a .ckpt without its sidecar: removed; the
    database's newest checkpoint per run is set from what is on disk (the sidecars commit)."""
    on_disk = await asyncio.to_thread(ckpts.recover)
    recorded = await store.run(store.runs.checkpoint_steps)
    for run_id in set(on_disk) | set(recorded):
        if on_disk.get(run_id) != recorded.get(run_id):
            await store.run(store.runs.set_checkpoint_step, run_id, on_disk.get(run_id))


async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    """422 with where and why, without echoing the input (which may hold NaN, not JSON)."""
    detail = [{"loc": list(e.get("loc", ())), "msg": e.get("msg", ""), "type": e.get("type", "")}
              for e in exc.errors()]
    return JSONResponse({"detail": detail}, status_code=422)


class HostCheck:
    """Answers only requests (and websockets) whose Host header names an allowed host
    (Settings.hosts: loopback, the configured host, ANDREA_ALLOWED_HOSTS): DNS rebinding
    cannot reach the API or the sockets from another site's page."""

    def __init__(self, app: ASGIApp, hosts: tuple[str, ...]):
        self.app, self.hosts = app, frozenset(hosts)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # Starlette's in-process TestClient (client "testclient", Host "testserver") is no
        # socket, so no page can be behind it.
        client = (scope.get("client") or ("",))[0]
        if scope["type"] in ("http", "websocket") and client != "testclient":
            raw = dict(scope["headers"]).get(b"host", b"").decode("latin-1")
            name, _ = host_of(raw)
            if name not in self.hosts:
                response = PlainTextResponse(
                    f"host {raw!r} is not served here; allowed: {', '.join(sorted(self.hosts))}"
                    " (ANDREA_ALLOWED_HOSTS adds names)", status_code=400)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)
