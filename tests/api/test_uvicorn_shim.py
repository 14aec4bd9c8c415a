"""andrea.telemetry.uvicorn_shim against the installed uvicorn, served as `andrea serve` serves
(cli.py: uvicorn.Config's defaults, `ws="auto"`, with and without per-message deflate). The shim
itself degrades to doing nothing when uvicorn's internals change under it; these tests fail
instead: the protocol object behind `receive`, its `conn.max_message_size`, `conn.recv_frame`
(where ping frames are answered) and `transport`.
And andrea.web.uvicorn_limits: the transport behind an HTTP request's `receive`, and its subclass of
uvicorn's HTTP protocol (the hooks it overrides: heads, keep-alive, upgrade, per-client cap)."""

from __future__ import annotations

import asyncio
import contextlib
import socket

import pytest
import uvicorn
from fastapi import FastAPI, Request, WebSocket, WebSocketDisconnect
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from andrea.config import Settings
from andrea.telemetry.uvicorn_shim import CloseFrame, abort, limit_frames, limit_pings, protocol_of
from andrea.web.uvicorn_limits import bound_to, transport_of
from tests.aio import run

LIMIT = 1000


@contextlib.asynccontextmanager
async def served(app: FastAPI, compression: bool, **config):
    """`app` on a real uvicorn server on a loopback port (this event loop); yields its ws URL."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off",
                                           ws_per_message_deflate=compression, **config))
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


def send_far_too_big(url: str, size: int):
    """A blocking client (websockets' sync one, as tests and `andrea train` use) that sends one
    message of `size` bytes; what close it saw."""
    from websockets.sync.client import connect as connect_sync
    with connect_sync(url, max_size=None) as client:
        with pytest.raises(ConnectionClosed) as e:
            client.send("x" * size)
            client.recv(timeout=10)
        return e.value.rcvd


def test_a_message_far_over_the_limit_still_gets_its_close_frame():
    """The server stops reading at the limit; without a lingering close the megabytes still in
    flight meet a closed socket, the kernel resets the connection, and the reset can overtake
    the close frame (the client saw "no close frame received or sent")."""
    async def endpoint(ws: WebSocket):
        limit_frames(ws, LIMIT)
        await ws.accept()
        with contextlib.suppress(WebSocketDisconnect):
            while True:
                await ws.receive_text()

    async def main():
        async with served(app_with(endpoint), False) as url:
            return [await asyncio.to_thread(send_far_too_big, url, 8 << 20) for _ in range(10)]

    codes = [rcvd.code if rcvd else None for rcvd in run(main())]
    assert codes == [1009] * 10, codes


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


@pytest.mark.parametrize("compression", [False, True])
def test_limit_pings_asks_before_each_pong_paces_and_refuses(compression):
    """Each ping frame asks the app's hook before its pong (the app never sees ping frames
    otherwise): 0 answers it, seconds answer it and pause the socket's reads (the messages
    behind it still arrive, later), a CloseFrame sends its text and closes with its code; the
    app hears the close. Pings while the app reads messages too (the websocket layer answers
    them between messages)."""
    verdicts = [0.0, 0.05, 0.0, CloseFrame(1008, "too many pings", '{"type": "error"}')]
    asked, got, installed = [], [], []

    def on_ping():
        asked.append(len(got))
        return verdicts[len(asked) - 1]

    async def endpoint(ws: WebSocket):
        await ws.accept()
        installed.append(limit_pings(ws, on_ping))
        try:
            while True:
                got.append(await ws.receive_text())
                await ws.send_text("ok")
        except WebSocketDisconnect as e:
            got.append(e.code)

    async def main():
        async with served(app_with(endpoint), compression) as url, connect(
                url, ping_interval=None) as client:
            await asyncio.wait_for(await client.ping(), 10)
            await asyncio.wait_for(await client.ping(), 10)        # answered, then a pause
            await client.send("after the pause")
            assert await client.recv() == "ok"
            await asyncio.wait_for(await client.ping(), 10)
            refused = await client.ping()
            assert await client.recv() == '{"type": "error"}'
            with pytest.raises(ConnectionClosed) as e:
                await client.recv()
            assert isinstance(refused.exception(), ConnectionClosed)     # never ponged
            return e.value.rcvd

    rcvd = run(main())
    assert installed == [True], "uvicorn_shim.limit_pings no longer reaches conn.recv_frame"
    assert rcvd is not None and (rcvd.code, rcvd.reason) == (1008, "too many pings")
    assert asked == [0, 0, 1, 1] and got == ["after the pause", 1008]


# ---- uvicorn_limits: the HTTP protocol subclass and the transport behind `receive` ----------


def limited(**settings):
    """The protocol class `andrea serve` passes to uvicorn, with these settings."""
    return bound_to(Settings(**settings))


async def exchange(port: int, raw: bytes, then: bytes = b"", pause: float = 0.0) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(raw)
    if then:
        await asyncio.sleep(pause)
        writer.write(then)
    got = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    return got


def test_the_transport_behind_an_http_receive_is_reachable():
    seen = {}
    app = FastAPI()

    @app.get("/t")
    async def endpoint(request: Request):
        seen["transport"] = transport_of(request.receive)
        return {}

    async def main():
        async with served(app, False, http=limited()) as url:
            port = int(url.rsplit(":", 1)[1].split("/")[0])
            await exchange(port, b"GET /t HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")

    run(main())
    assert seen["transport"] is not None, "uvicorn_limits.transport_of no longer finds it"
    assert callable(seen["transport"].abort)


def test_the_protocol_subclass_times_heads_keeps_alive_and_upgrades():
    """Keep-alive requests are served; a second head that trickles is closed with 408; a
    websocket upgrade goes through and gives its per-client count back when it closes."""
    app = FastAPI()
    app.get("/t")(lambda: {"ok": True})
    protocol = limited(header_timeout_s=0.5, max_connections_per_client=4)

    async def echo(ws: WebSocket):
        await ws.accept()
        await ws.send_text(await ws.receive_text())
    app.websocket("/ws")(echo)

    async def main():
        async with served(app, False, http=protocol) as url:
            port = int(url.rsplit(":", 1)[1].split("/")[0])
            get = b"GET /t HTTP/1.1\r\nHost: x\r\n\r\n"
            two = await exchange(port, get, get.replace(b"\r\n\r\n", b"\r\nConnection: close"
                                                          b"\r\n\r\n"), pause=0.2)
            slow = await exchange(port, get, b"GET /t HTTP/1.1\r\n", pause=0.2)
            async with connect(url) as client:
                assert protocol.open_per_client == {"127.0.0.1": 1}
                await client.send("hi")
                assert await client.recv() == "hi"
            await asyncio.sleep(0.1)
            return two, slow

    two, slow = run(main())
    assert two.count(b"HTTP/1.1 200") == 2
    assert slow.count(b"HTTP/1.1 200") == 1 and b"HTTP/1.1 408" in slow
    assert protocol.open_per_client == {}       # every connection, the websocket's too, released


def test_the_protocol_subclass_closes_connections_past_the_per_client_cap():
    app = FastAPI()
    protocol = limited(header_timeout_s=5, max_connections_per_client=2)

    async def main():
        async with served(app, False, http=protocol) as url:
            port = int(url.rsplit(":", 1)[1].split("/")[0])
            held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(2)]
            extra = await exchange(port, b"")
            for _, writer in held:
                writer.close()
            return extra

    assert run(main()).startswith(b"HTTP/1.1 503")
