"""Text is gzipped, binary bodies are not (app.py NOT_GZIPPED): a 33 MB batch took 0.18 s
plain and 11 s gzipped."""

from __future__ import annotations

import httpx

from andrea.data import wire
from tests.api.test_web_limits import new_run

# ---- binary bodies are never gzipped -------------------------------------------------------------


def test_a_batch_is_never_gzipped_and_a_json_answer_still_is(live_server):
    url = live_server                           # the session's: a run of this test's own
    run = new_run(url)
    gzip = {"accept-encoding": "gzip"}
    r = httpx.get(f"{url}/api/runs/{run['id']}/batches/1", headers=gzip, timeout=120)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == wire.MEDIA_TYPE
    assert "content-encoding" not in r.headers
    assert r.content[:4] == wire.MAGIC and int(r.headers["content-length"]) == len(r.content)
    assert len(r.content) > 1024                # past GZipMiddleware's minimum_size
    j = httpx.get(url + "/api/run_config", headers=gzip)
    assert j.status_code == 200 and j.headers["content-encoding"] == "gzip"
    assert "properties" in j.json()
