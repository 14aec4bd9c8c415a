"""Hostile connections against `andrea serve` (issue 23, item 4): /healthz latency with no
attack, then while --trickle connections send their request head a byte every --every s and
--bodies clients announce 200 MiB bodies (pushing them as fast as the server takes them, half
with Content-Length, half chunked); the server's RSS and open files before and after.

    python bench/hostile_connections.py                      # its own server, default settings
    python bench/hostile_connections.py --trickle 210 --window 15 --env ANDREA_HEADER_TIMEOUT_S=5

The trickling connections come from --addresses loopback addresses (127.0.0.2, ...), as a
classroom's laptops would: from one address all but max_connections_per_client are refused at
once. Figures only, no verdict.
"""

from __future__ import annotations

import argparse
import socket
import statistics
import tempfile
import threading
import time
from pathlib import Path

import httpx

from andrea.cli.launch import start_server, stop_server
from tests.trainer_client import n_fds, rss_mib


def healthz_ms(url: str, n: int) -> list[float]:
    """n sequential /healthz on fresh connections (a new client each time, as a page load)."""
    times = []
    for _ in range(n):
        t = time.perf_counter()
        try:
            httpx.get(url + "/healthz", timeout=30).raise_for_status()
            times.append((time.perf_counter() - t) * 1000)
        except httpx.HTTPError:
            times.append(float("inf"))
    return times


def figures(name: str, times: list[float]) -> str:
    ok = sorted(t for t in times if t != float("inf"))
    p99 = ok[min(len(ok) - 1, int(len(ok) * 0.99))] if ok else float("nan")
    return (f"{name:<28} n={len(times):4d} failed={len(times) - len(ok):3d} "
            f"p50={statistics.median(ok) if ok else float('nan'):8.2f} ms  p99={p99:8.2f} ms")


class Trickler:
    """Connections that send "GET /healthz HTTP/1.1\\r\\n" and then one byte every `every` s."""

    def __init__(self, host: str, port: int, n: int, addresses: int, every: float):
        self.socks, self.refused, self.every = [], 0, every
        for i in range(n):
            s = socket.socket()
            s.bind((f"127.0.0.{2 + i % addresses}", 0))
            s.connect((host, port))
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            self.socks.append(s)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while not self.stop.wait(self.every):
            for s in self.socks:
                try:
                    s.sendall(b"X")
                except OSError:
                    pass

    def still_open(self) -> int:
        """Connections the server has not closed (a closed one reads EOF or a reply)."""
        n = 0
        for s in self.socks:
            s.setblocking(False)
            try:
                s.recv(1, socket.MSG_PEEK)      # EOF or the server's 408: closed
            except BlockingIOError:
                n += 1
            except OSError:
                pass
        return n

    def close(self):
        self.stop.set()
        for s in self.socks:
            s.close()


def big_body(host: str, port: int, chunked: bool, sent: list[int]) -> None:
    s = socket.create_connection((host, port))
    fields = "Transfer-Encoding: chunked" if chunked else f"Content-Length: {200 << 20}"
    total = 0
    try:
        s.sendall(f"POST /api/runs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json"
                  f"\r\n{fields}\r\n\r\n".encode())
        piece = b" " * (1 << 20)
        piece = b"%x\r\n" % len(piece) + piece + b"\r\n" if chunked else piece
        while total < 200 << 20:
            s.sendall(piece)
            total += 1 << 20
    except OSError:
        pass
    sent.append(total)
    s.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trickle", type=int, default=210)
    ap.add_argument("--addresses", type=int, default=7)
    ap.add_argument("--every", type=float, default=5.0)
    ap.add_argument("--bodies", type=int, default=4)
    ap.add_argument("--window", type=float, default=15.0,
                    help="seconds of /healthz under attack (past the header timeout)")
    ap.add_argument("--n", type=int, default=200, help="/healthz requests with no attack")
    ap.add_argument("--env", action="append", default=[], help="ANDREA_X=V for the server")
    args = ap.parse_args()
    env = dict(e.split("=", 1) for e in args.env)
    proc, url = start_server(Path(tempfile.mkdtemp(prefix="andrea-bench-")) / "data", env=env)
    host, port = url.removeprefix("http://").split(":")
    try:
        healthz_ms(url, 20)     # warm
        rss0, fds0 = rss_mib(proc.pid), n_fds(proc.pid)
        print(figures("/healthz, no attack", healthz_ms(url, args.n)))
        trickle = Trickler(host, int(port), args.trickle, args.addresses, args.every)
        sent: list[int] = []
        bodies = [threading.Thread(target=big_body, args=(host, int(port), i % 2 == 1, sent))
                  for i in range(args.bodies)]
        for t in bodies:
            t.start()
        time.sleep(0.5)
        held = trickle.still_open()
        rss_attack, fds_attack = rss_mib(proc.pid), n_fds(proc.pid)
        times, end = [], time.monotonic() + args.window
        while time.monotonic() < end:
            times += healthz_ms(url, 10)
        print(figures("/healthz, under attack", times))
        for t in bodies:
            t.join(30)
        print(f"trickling connections       {args.trickle} from {args.addresses} addresses: "
              f"{held} open 0.5 s in, {trickle.still_open()} open after {args.window:g} s")
        print(f"200 MiB bodies              {args.bodies}: bytes the clients got to send "
              f"{', '.join(f'{b / 2**20:.0f} MiB' for b in sorted(sent))}")
        print(f"server RSS                  {rss0:.0f} MiB before, {rss_attack:.0f} MiB under "
              f"attack, {rss_mib(proc.pid):.0f} MiB after")
        print(f"server open files           {fds0} before, {fds_attack} under attack, "
              f"{n_fds(proc.pid)} after")
        trickle.close()
    finally:
        stop_server(proc)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
