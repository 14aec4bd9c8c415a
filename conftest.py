# Browser + live-server fixtures shared by tests/gpu (kernel parity through the lab page) and e2e/.
pytest_plugins = ["tests.browser"]
