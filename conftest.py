# Fixtures shared across test folders: browser + live server (tests/gpu and e2e/), and the
# session's data cache (tests/test_data_*.py).
pytest_plugins = ["tests.browser", "tests.data_fixtures"]
