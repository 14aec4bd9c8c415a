"""One Settings object for the whole server, read from the environment the ecosystem way:
ANDREA_HOST, ANDREA_PORT, ANDREA_DATA_DIR, ANDREA_CHECKPOINTS_KEPT, ANDREA_DATABASE_URL,
ANDREA_BROKER_URL, ANDREA_ONLY_CORPUS, ... (command-line flags override them). The default data
dir is the platform's user data folder, the same for `serve`, `train` and `export`."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated
from urllib.parse import urlsplit

import platformdirs
from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict


def host_of(value: str) -> tuple[str, int | None]:
    """The Host header's (name, port): "[::1]:8000" -> ("::1", 8000); name lowercased."""
    name, port = value, None
    if value.startswith("["):
        end = value.find("]")
        name, rest = value[1:end] if end > 0 else "", value[end + 1:] if end > 0 else ""
        port = rest[1:] if rest.startswith(":") else None
    elif value.count(":") == 1:
        name, port = value.split(":")
    name = name.strip().lower().rstrip(".")
    try:
        return name, int(port) if port else None
    except ValueError:
        return "", None


# The port a URL of each scheme means when it names none.
DEFAULT_PORTS = {"http": 80, "ws": 80, "https": 443, "wss": 443}


def page_port(host: str, scheme: str) -> int | None:
    """The port the participant's browser used: the Host header's, or, where it names none,
    the default of the request's scheme (a proxy on 443 or 80 passes `workshop.local` as Host;
    uvicorn takes the scheme from a trusted proxy's X-Forwarded-Proto). Never this server's own
    port: the browser did not use it."""
    _, port = host_of(host)
    return port or DEFAULT_PORTS.get(scheme)


# Host names that always reach this server from this machine (the Host header's name part).
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
# Live bytes buffered per viewer socket before it is dropped: Settings.viewer_queue_bytes's
# default, and fanout.Viewer's when it is made without settings.
VIEWER_QUEUE_BYTES = 1 << 20


def default_data_dir() -> Path:
    """~/.local/share/andrea on Linux, ~/Library/Application Support/andrea on macOS, ..."""
    return Path(platformdirs.user_data_dir("andrea", appauthor=False))


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="ANDREA_", frozen=True, extra="ignore")

    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    data_dir: Path = Field(default_factory=default_data_dir)
    # Where tokenizers and token files are kept (ANDREA_CACHE_DIR): they are derived from the
    # corpus and keyed by its hash and V, so data dirs (and test sessions) may share one.
    # Default: the data dir itself.
    cache_dir: Path | None = None
    # Seconds a running run may go without its trainer socket before it is marked interrupted.
    trainer_grace_s: float = 60.0
    # Seconds a new run may wait for its first training tab before it reads "never started"
    # (status `abandoned`; a tab that comes later still trains it). A training page opens its
    # socket as soon as it loads, before compiling anything, so a real tab is there within
    # seconds; 90 s also covers `andrea train` starting Chromium on a busy machine.
    start_grace_s: float = Field(90.0, gt=0)
    # Checkpoints kept per run (the newest ones); older ones are deleted after each upload.
    checkpoints_kept: int = Field(2, ge=1)
    # User text sources beside the embedded default: (name, file or folder), `--corpus NAME=PATH`.
    corpora: tuple[tuple[str, Path], ...] = ()
    # Serve the user's sources alone (`--only-corpus`, ANDREA_ONLY_CORPUS=1): the embedded
    # Python sources are not read, the tokenizer is trained on the user's text, and the corpus
    # hash (so every cache and run) is that text's. Needs at least one corpus.
    only_corpus: bool = False
    # Host names the server answers to besides the loopback names and `host` (ANDREA_ALLOWED_HOSTS,
    # comma-separated): a page whose Host is anything else (DNS rebinding) gets 400, and a
    # websocket whose Origin is not one of them is refused.
    allowed_hosts: Annotated[tuple[str, ...], NoDecode] = ()
    # A viewer socket that has this many bytes of live messages waiting is dropped (close 1013;
    # it reconnects and resumes after its last step); a send that takes longer than the
    # deadline frees the connection.
    viewer_queue_bytes: int = Field(VIEWER_QUEUE_BYTES, ge=64 << 10)
    viewer_send_timeout_s: float = Field(10.0, gt=0)
    # permessage-deflate on the websockets. Off by default: under load compressing every
    # message for every viewer was a fifth of the server's busy time (and a zlib context per
    # socket); records are small and a workshop's network is a LAN. On for slow links.
    ws_compression: bool = False
    # Past one process: runs, metrics and events in PostgreSQL (postgresql://user@host/db)
    # instead of the data dir's SQLite file, and live records to the viewers of every server
    # process through Redis (redis://host:6379/0). Several processes share one data dir
    # (checkpoints, weights, the corpus' token files): on one machine, or a shared folder.
    database_url: str | None = None
    broker_url: str | None = None

    # --- A workshop's server (docs/workshop.md): who may change what, and
    # the bounds no participant can push the server past. ---
    # The machine's own user (a request from a loopback address, through no proxy, naming a
    # loopback host and this server's port) may change any run without a token
    # (deps.request_is_local). None: only on a loopback-only server with no ANDREA_ALLOWED_HOSTS
    # (a workshop's names mean a proxy may be in front); True (ANDREA_LOCAL_OWNER=1) keeps it
    # for such a server too; False turns it off. Never on a server bound beyond loopback.
    local_owner: bool | None = None
    # The operator's token (ANDREA_ADMIN_TOKEN): accepted wherever a run's write token is
    # (resume, delete, rename, branch, checkpoint reads). A server bound beyond loopback without
    # one makes one at start and prints it once (`andrea serve`).
    admin_token: str | None = None
    # Every JSON (or other non-upload) request body: refused with 413 before it is read past
    # this. Checkpoint and weights uploads have their own exact sizes (the run's layout).
    max_body_bytes: int = Field(1 << 20, ge=1024)
    # A connection that has not sent a whole request head within this many seconds is closed;
    # one whose upload or download moves no byte for idle_timeout_s is dropped.
    header_timeout_s: float = Field(10.0, gt=0)
    idle_timeout_s: float = Field(30.0, gt=0)
    # Open connections per client address (the rest are closed at once), and in all (uvicorn's
    # limit_concurrency: 503 past it).
    max_connections_per_client: int = Field(64, ge=1)
    max_connections: int = Field(2048, ge=1)
    # New runs: a burst of run_burst per client address, then one per 1/run_rate_per_s seconds
    # (429 with Retry-After past it); max_runs in all (507: delete some).
    run_burst: int = Field(30, ge=1)
    run_rate_per_s: float = Field(0.5, gt=0)
    max_runs: int = Field(10_000, ge=1)
    # Per run: samples stored and their bytes (past them new samples are dropped, the trainer
    # told once), and metric records per second (past it the server reads the trainer's socket
    # more slowly: nothing is lost, the tab waits).
    max_samples_per_run: int = Field(2000, ge=1)
    max_sample_bytes_per_run: int = Field(16 << 20, ge=1024)
    metrics_rate_per_s: float = Field(5000.0, gt=0)
    # Seconds a bandit run's batch request may wait for the training losses its phase needs
    # (on the event loop, holding no thread) before it is answered 503 and retried.
    batch_wait_s: float = Field(10.0, gt=0)
    # Free space the data dir keeps (storage.py, for every writer): a new run, checkpoint or
    # weights upload that would leave less is refused with 507, and a trainer whose records,
    # samples or status would is closed (protocol.STORAGE_BUDGET) before the disk fills.
    min_free_bytes: int = Field(256 << 20, ge=0)
    # The records one run may store (as storage.py estimates their bytes in the store): a new
    # run whose steps' records would take more is refused (422), a trainer past it is closed.
    # 1 GiB holds any default-shaped run (the tiny preset's ~0.7 KB records for its 1M steps
    # at most), and refuses 1M steps of batch 1024 with per-row losses (~13 GB).
    max_run_bytes: int = Field(1 << 30, ge=1 << 20)
    # The largest room run (parameters) this server takes: a room's version 0 is made here and
    # its closes stream a chunk at a time, but each version is 8 bytes a parameter on disk and
    # making version 0 holds its weights in memory once. Default: a parameter per 32 bytes of
    # the machine's memory (24 GiB: ~800M).
    room_max_params: int = Field(default_factory=lambda: _memory_bytes() // 32, ge=1)
    # Bytes per second of a trainer's messages (metrics, status, samples), per run and per
    # client address (all its trainer sockets together): past them the server reads the
    # sockets more slowly (nothing is lost, the tab's acks come later). The fastest real
    # trainer (tiny on an H200, ~1 ms a step, ~650 B a record) sends ~0.7 MB/s: 1 MiB/s per
    # run keeps it unpaced; an address gets one such run (a laptop's are far slower: ~70 KB/s
    # for tiny at 10 ms a step). At 4 MiB/s one address' stored records held another
    # trainer's ack p99 at 4x its alone (bench/results/hostile_writers_cpu.txt), at 1 at 1.3x.
    metrics_bytes_per_s: float = Field(1 << 20, gt=0)
    client_metrics_bytes_per_s: float = Field(1 << 20, gt=0)
    # Readers, per client address: export zips streamed at once (429 with Retry-After past it),
    # viewer sockets open (more are closed 1008), and the bytes of backlog viewers read from
    # the store, a burst then a rate (past it their backlog is sent more slowly; live records
    # are not counted): re-reading a run from its start in a loop cannot crowd out trainers.
    # A backlog MiB costs the server ~55 ms of CPU: 4 MiB/s is a fifth of one core, and a run
    # page of up to 32 MiB of records (~50k steps of the tiny preset, ~650 B each) loads at once.
    # JSON reads of the API per client address (GET /api/..., batches and downloads aside):
    # each costs its bytes plus 128 KiB, from a budget of read_bytes_per_s (a 1 s burst); a
    # client in debt waits before its next read, and past 10 s of debt gets 429 (limits.py
    # ReadBudget). 8 MiB/s: about 60 small reads or 20 spike lists of 240 KB a second; a page
    # polls a few a second.
    read_bytes_per_s: float = Field(8 << 20, gt=0)
    # While a trainer trains a run, its spike list may be this many seconds behind its records:
    # an answer made less than this ago is served as it is, so pollers at any rate cost one
    # computation a second a run (the page polls every 10 s). A run whose training ended, or
    # with no trainer at it, is always current.
    spikes_fresh_s: float = Field(1.0, ge=0)
    # The memory the spike lists' cache may hold (routes/spikes.py: each run's detector, its
    # spikes and its answer, as estimated; the least recently asked run goes first). A run
    # with a few dozen spikes takes ~0.1-0.3 MB, one at the cap of 5000 spikes with per-tensor
    # norms up to ~45 MB: 64 MiB keeps hundreds of ordinary runs, or the biggest one.
    spikes_cache_bytes: int = Field(64 << 20, ge=1 << 20)
    max_exports_per_client: int = Field(2, ge=1)
    max_viewers_per_client: int = Field(16, ge=1)
    viewer_backlog_burst_bytes: int = Field(32 << 20, ge=64 << 10)
    viewer_backlog_bytes_per_s: float = Field(4 << 20, gt=0)
    # A request body (an upload) may take max(upload_timeout_s, its size / min_upload_bytes_per_s)
    # seconds in all (a chunked one: the bytes received so far), however it trickles: 408 past
    # it, nothing stored. 32 KiB/s: an 80 MB checkpoint has 42 minutes.
    upload_timeout_s: float = Field(60.0, gt=0)
    min_upload_bytes_per_s: int = Field(32 << 10, ge=1)

    @field_validator("allowed_hosts", mode="before")
    @classmethod
    def _split(cls, v):
        if isinstance(v, str):
            v = v.split(",")
        return tuple(h.strip().lower() for h in v if h.strip())

    @field_validator("data_dir", "cache_dir")
    @classmethod
    def _absolute(cls, v: Path | None) -> Path | None:
        return v.expanduser().resolve() if v is not None else None

    @property
    def corpus_dir(self) -> Path:
        """The folder under which tokenizers/ and tokens/ are kept (cache_dir or data_dir)."""
        return self.cache_dir or self.data_dir

    @property
    def db_path(self) -> Path:
        return self.data_dir / "andrea.sqlite"

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def loopback_only(self) -> bool:
        """Bound to a loopback address alone: no other machine can reach this server."""
        return self.host.lower() in LOOPBACK_HOSTS

    @property
    def shares_store(self) -> bool:
        """Other processes may serve this data dir too (a database or a broker that several
        processes share); else this one is its only server (data_dir_lock.py holds it so)."""
        return self.broker_url is not None or self.database_url is not None

    @property
    def trusts_local_user(self) -> bool:
        """Whether requests of this machine's own user may skip the token (local_owner)."""
        if not self.loopback_only or self.local_owner is False:
            return False
        return self.local_owner is True or not self.allowed_hosts

    @property
    def hosts(self) -> tuple[str, ...]:
        """Every host name the Host header may carry (no port): loopback, `host`, the extras.
        Binding to every interface (0.0.0.0, ::) adds no name: list them in allowed_hosts."""
        names = {*LOOPBACK_HOSTS, *self.allowed_hosts}
        if self.host not in ("0.0.0.0", "::", ""):
            names.add(self.host.lower())
        return tuple(sorted(names))

    def origin_allowed(self, origin: str, port: int | None) -> bool:
        """A page's Origin: http(s) from an allowed host on `port`, the one the page used
        (page_port: the Host header's, which the middleware has checked already, or its
        scheme's default behind a proxy)."""
        try:
            parts = urlsplit(origin)
            ok_port = parts.port or {"http": 80, "https": 443}.get(parts.scheme)
        except ValueError:
            return False
        return (parts.scheme in ("http", "https") and (parts.hostname or "") in self.hosts
                and ok_port == port)


def _memory_bytes() -> int:
    """The machine's physical memory (4 GiB where it cannot be read)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 4 << 30
