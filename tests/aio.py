"""Run a coroutine to completion from a synchronous test.

Not plain `asyncio.run`: once a test in the session has used Playwright's sync API, its
event loop stays running on the main thread and `asyncio.run` refuses to start another
there. A thread of its own has no running loop, wherever the test sits in the suite.
"""

import asyncio
from concurrent.futures import ThreadPoolExecutor

import pytest

from andrea.errors import Refused


def run(coro):
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coro).result()


def refused(kind, coro):
    """The Refused error `coro` raises, checked to be of `kind` (errors.Refusal): a service's
    refusal, as its route's status is web/errors.py's."""
    with pytest.raises(Refused) as e:
        run(coro)
    assert e.value.kind == kind, e.value
    return e.value
