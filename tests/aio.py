"""Run a coroutine to completion from a synchronous test.

Not plain `asyncio.run`: once a test in the session has used Playwright's sync API, its
event loop stays running on the main thread and `asyncio.run` refuses to start another
there. A thread of its own has no running loop, wherever the test sits in the suite.
"""

import asyncio
from concurrent.futures import ThreadPoolExecutor


def run(coro):
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coro).result()
