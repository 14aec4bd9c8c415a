"""andrea.telemetry.uvicorn_shim against the installed uvicorn, served as `andrea serve` serves
(cli.py: uvicorn.Config's defaults, `ws="auto"`, with and without per-message deflate). The shim
itself degrades to doing nothing when uvicorn's internals change under it; these tests fail
instead: the protocol object behind `receive`, its `conn.max_message_size` and `transport`."""

from __future__ import annotations

import asyncio
import contextlib
import socket

import pytest
import uvicorn
from fastapi import FastAPI, WebSocket, WebSocketDisconnect
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from andrea.telemetry.uvicorn_shim import abort, limit_frames, protocol_of
from tests.aio import run

LIMIT = 1000


@contextlib.asynccontextmanager
async def served(app: FastAPI, compression: bool):
    """`app` on a real uvicorn server on a loopback port (this event loop); yields its ws URL."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off",
                                           ws_per_message_deflate=compression))
    task = asyncio.ensure_future(server.serve(sockets=[sock]))
    try:
        while not server.started:
            assert not task.done(), "the server did not start"
            await asyncio.sleep(0.01)
        yield f"ws://127.0.0.1:{sock.getsockname()[1]}/ws"
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 10)
        sock.close()


def app_with(endpoint) -> FastAPI:
    app = FastAPI()
    app.websocket("/ws")(endpoint)
    return app


@pytest.mark.parametrize("compression", [False, True])
def test_the_protocol_behind_the_socket_is_reachable(compression):
    seen = {}

    async def endpoint(ws: WebSocket):
        proto = protocol_of(ws)
        seen["proto"] = proto
        await ws.accept()
        await ws.close()

    async def main():
        async with served(app_with(endpoint), compression) as url, connect(url) as client:
            with pytest.raises(ConnectionClosed):
                await client.recv()

    run(main())
    proto = seen["proto"]
    assert proto is not None, "uvicorn_shim.protocol_of no longer finds uvicorn's protocol"
    assert isinstance(proto.conn.max_message_size, int)
    assert callable(proto.transport.abort)


@pytest.mark.parametrize("compression", [False, True])
def test_limit_frames_makes_the_websocket_layer_close_1009(compression):
    got = []

    async def endpoint(ws: WebSocket):
        limit_frames(ws, LIMIT)
        await ws.accept()
        with contextlib.suppress(WebSocketDisconnect):
            while True:
                text = await ws.receive_text()
                got.append(len(text))
                await ws.send_text(text)

    async def main():
        async with served(app_with(endpoint), compression) as url, connect(url) as client:
            await client.send("x" * LIMIT)
            assert await client.recv() == "x" * LIMIT
            await client.send("x" * (LIMIT + 1))
            with pytest.raises(ConnectionClosed) as e:
                await client.recv()
            return e.value.rcvd

    rcvd = run(main())
    assert rcvd is not None and rcvd.code == 1009, rcvd
    assert got == [LIMIT]           # the big message never reached the app


@pytest.mark.parametrize("compression", [False, True])
def test_abort_drops_the_connection_without_a_close(compression):
    after = []

    async def endpoint(ws: WebSocket):
        await ws.accept()
        await ws.send_text("hello")
        abort(ws)
        after.append(await ws.receive())

    async def main():
        async with served(app_with(endpoint), compression) as url, connect(url) as client:
            assert await client.recv() == "hello"
            with pytest.raises(ConnectionClosed) as e:
                await asyncio.wait_for(client.recv(), 10)
            return e.value.rcvd

    assert run(main()) is None      # no close frame: the TCP connection was cut
    assert after and after[0]["type"] == "websocket.disconnect"
