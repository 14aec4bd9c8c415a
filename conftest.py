# Fixtures shared across test folders: browser + live server (tests/gpu and e2e/), and the
# session's data cache (tests/test_data_*.py).
pytest_plugins = ["tests.browser", "tests.data_fixtures"]


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
