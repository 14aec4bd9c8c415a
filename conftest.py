# Fixtures shared across test folders: browser + live server (tests/unit/gpu and e2e/), and the
# session's data cache (tests/*/test_data_*.py).
import os
import shutil
import signal
import tempfile

pytest_plugins = ["tests.browser", "tests.data_fixtures"]

_OWN_CACHE: list[str] = []

# Dawn toggles for the tests' own browsers, and for those of the `andrea train` runs they start
# (pytest_configure adds them to ANDREA_CHROMIUM_ARGS): no robustness clamp on every storage
# index, and no zero-fill of workgroup memory at every kernel's start. The kernels index in
# bounds and write workgroup memory before reading it, so every value is the same bit for bit
# (tiny's 40-step loss is), and a kernel that broke either rule is no longer masked by a clamp
# or a zero-fill.
# On SwiftShader they take ~20% off a step (tiny in `andrea train`: 140-149 -> 115-122 ms).
# Users' browsers keep both: nothing outside the tests asks for them.
TEST_DAWN_FEATURES = "--enable-dawn-features=disable_robustness,disable_workgroup_init"


def _interrupted(signum, frame) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def _signals_end_the_run() -> None:
    """A SIGINT, SIGTERM or SIGHUP ends the run as Ctrl-C does, its teardown included: the
    servers the tests started (andrea.cli.launch: in their own sessions, out of the signal's reach)
    are stopped by it, or at exit. A run started with SIGINT ignored (a script's background job:
    bash ignores it there, and scripts/test's `exec` keeps that) heard no SIGINT at all; a
    SIGTERM or SIGHUP (the terminal closed) killed it before any teardown. A SIGHUP ignored on
    purpose (nohup) stays ignored."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) is signal.SIG_DFL:
            signal.signal(sig, _interrupted)


def pytest_configure(config) -> None:
    """One corpus cache (tokenizers, token files: ANDREA_CACHE_DIR) for every test of the
    session, its servers and `andrea train` subprocesses included: each test still gets a fresh
    data dir, but the embedded corpus is tokenized once per vocab size, not once per test. A
    cache the caller set is used as it is."""
    if "ANDREA_CACHE_DIR" not in os.environ:
        _OWN_CACHE.append(tempfile.mkdtemp(prefix="andrea-test-cache-"))
        os.environ["ANDREA_CACHE_DIR"] = _OWN_CACHE[0]
    # The tests' Dawn toggles (TEST_DAWN_FEATURES), for their browsers and, through the
    # environment, for the `andrea train` subprocesses and the xdist workers (once: a worker
    # inherits the controller's value).
    args = os.environ.get("ANDREA_CHROMIUM_ARGS", "")
    if TEST_DAWN_FEATURES not in args:
        os.environ["ANDREA_CHROMIUM_ARGS"] = f"{args} {TEST_DAWN_FEATURES}".strip()
    _signals_end_the_run()


def pytest_unconfigure(config) -> None:
    for path in _OWN_CACHE:
        shutil.rmtree(path, ignore_errors=True)
        os.environ.pop("ANDREA_CACHE_DIR", None)


def _import_anyio_now() -> None:
    """anyio (4.12+) imports its modules on first use, and pytest rewrites the asserts of every
    plugin's package, anyio's included, as it imports them. A first use inside a request (a
    FileResponse opening its file) then parses that module deep in the event loop's stack, where
    CPython 3.11.7's parser can fail ("AST constructor recursion depth mismatch", fixed in
    3.11.8). Resolved here, at collection, in the main thread."""
    import anyio
    import anyio.abc
    import anyio.from_thread
    import anyio.streams
    import anyio.to_thread  # noqa: F401
    for name in dir(anyio):
        getattr(anyio, name, None)


_import_anyio_now()


# Markers from what a test needs, so a part of the suite runs alone: `pytest -m "not browser"`
# (no Chromium: minutes), `-m gpu` (the kernel and engine parity tests), `-m db` (PostgreSQL or
# Redis), `-m soak`. Declared in pyproject.toml; a test may also carry one by hand (a browser
# started in a subprocess, which no fixture shows).
_BROWSER_FIXTURES = {"page", "browser", "context", "lab_session"}
_DB_FIXTURES = {"pg_url", "pg_cluster", "redis_url"}


def pytest_collection_modifyitems(config, items) -> None:
    import pytest
    for item in items:
        parts = item.path.parts
        used = set(getattr(item, "fixturenames", ()))
        params = getattr(getattr(item, "callspec", None), "params", {})
        gpu = "gpu" in parts and "tests" in parts
        if gpu:
            item.add_marker(pytest.mark.gpu)
        if gpu or "e2e" in parts or used & _BROWSER_FIXTURES:
            item.add_marker(pytest.mark.browser)
        if used & _DB_FIXTURES or "postgresql" in params.values():
            item.add_marker(pytest.mark.db)
        if "soak" in item.path.stem:
            item.add_marker(pytest.mark.soak)
    _longest_first(items)


# The files that take longest, in the order to start them: pytest-xdist (scripts/test: a file per
# worker at a time) hands out files in collection order, and a long file started last is the
# suite's tail (the 300-step quality test began last and ran alone for minutes). Then the other
# browser files, then the rest. Measured with `bash scripts/test ... --durations=0`.
_LONGEST = ("e2e/test_resume.py", "e2e/test_training_quality.py", "e2e/test_training.py",
            "e2e/test_room.py", "e2e/test_headless_cli.py", "e2e/test_server_restart.py")


def _longest_first(items) -> None:
    def rank(item):
        name = "/".join(item.path.parts[-2:])
        if name in _LONGEST:
            return _LONGEST.index(name)
        return len(_LONGEST) + (0 if item.get_closest_marker("browser") else 1)
    items.sort(key=rank)       # stable: a file's tests keep their order

