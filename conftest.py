# Fixtures shared across test folders: browser + live server (tests/gpu and e2e/), and the
# session's data cache (tests/test_data_*.py).
import os
import shutil
import tempfile

pytest_plugins = ["tests.browser", "tests.data_fixtures"]

_OWN_CACHE: list[str] = []


def pytest_configure(config) -> None:
    """One corpus cache (tokenizers, token files: ANDREA_CACHE_DIR) for every test of the
    session, its servers and `andrea train` subprocesses included: each test still gets a fresh
    data dir, but the embedded corpus is tokenized once per vocab size, not once per test. A
    cache the caller set is used as it is."""
    if "ANDREA_CACHE_DIR" not in os.environ:
        _OWN_CACHE.append(tempfile.mkdtemp(prefix="andrea-test-cache-"))
        os.environ["ANDREA_CACHE_DIR"] = _OWN_CACHE[0]


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
