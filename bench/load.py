"""Load generator: real websocket trainers and viewers against `andrea serve`, speaking the
telemetry protocol as the page does (server/telemetry/protocol.py, static/js/app/telemetry.js).

    python bench/load.py --trainers 5 --viewers 50 --duration 20 --warmup 5
    python bench/load.py --trainers 100 --viewers 1000 --duration 120 --procs 4 --out r.json
    python bench/load.py --server http://127.0.0.1:8000 --server-pid 1234 --trainers 20
    (a server of your own: all clients share one address, so start it with
    ANDREA_RUN_BURST and ANDREA_MAX_CONNECTIONS_PER_CLIENT above the trainers and sockets,
    ANDREA_MAX_VIEWERS_PER_CLIENT above the viewers, ANDREA_VIEWER_BACKLOG_BURST_BYTES large)
    python bench/load.py --server http://127.0.0.1:8001 --server http://127.0.0.1:8002 \\
        --server-pid 111 --server-pid 222 --trainers 40 --viewers 400

Without --server it starts its own server (free port, temporary data dir) and stops it at the
end. Each trainer is one run (tiny preset) with one training tab: a record every --interval s,
kept until acked, flushed every --flush-ms (0: at once), resent after a reconnect. Viewers
(--viewers in all, spread evenly over the runs) watch /ws/runs/{id}/watch and reconnect after
their last step. Clients connect gradually over --ramp s; the first --warmup s (ramp
included) are left out of the latency, CPU and memory figures; then --duration s are measured.
After that, trainers stop producing and wait (at most --drain s) for every ack, viewers wait
(at most --drain s) for their run's last acked step, and every run is read back over HTTP.

Figures (latencies only of records first sent inside the measured window):
  sent        distinct records the trainers sent (warm-up included; a resend counts once)
  stored      records the server holds at the end (GET /api/runs/{id}/metrics)
  lost        store: acked but not stored; viewer: (viewer, step) pairs stored but never
              received by that viewer of the run
  duplicated  a step a viewer received again while it already had it, plus steps stored twice
  unacked     records a trainer still held (unsent or unacked) when the drain ended
  ack ms      ack arrival - the record's first send (the message that carried it); the JSON
              also has ack_from_made_ms: ack arrival - when the record was made (adds the
              flush wait and any time spent disconnected)
  lag ms      a viewer's receipt - the record's first send by its trainer (one wall clock)
  CPU %       the server's processes (and children), % of one core, per 1 s sample: mean, max
  RSS         the server's resident memory at the start and end of the window, and its
              least-squares slope over the window (MiB per minute)
  phantom     (JSON) steps a viewer received that the store does not hold
Exit status 0 when nothing is lost, duplicated, phantom or left unacked, at least one record
was acked and no client was refused nor worker lost; 1 otherwise; 2 for bad arguments (a
server URL that is not loopback). Progress goes to stderr; a warning there says when the
generator itself was overloaded (a worker's loop late by > 50 ms at p99, or a worker above
85% of a core): use more --procs then.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import math
import multiprocessing as mp
import os
import shlex
import shutil
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from multiprocessing.connection import wait
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))           # load_clients
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))    # andrea, from a checkout
import load_clients  # noqa: E402

from andrea.cli.launch import start_server, stop_server  # noqa: E402

HEADER = ("| trainers/viewers | server CPU % mean/max | ack ms p50/p99/max "
          "| viewer lag ms p50/p99/max | sent | stored | lost store+viewer | duplicated "
          "| RSS MiB start→end (slope/min) |")
# No proxy, ever: every address is loopback (urllib would follow http_proxy otherwise).
HTTP = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trainers", type=int, default=10, help="runs, one trainer each")
    ap.add_argument("--viewers", type=int, default=100, help="viewers in all")
    ap.add_argument("--duration", type=float, default=30, help="measured seconds")
    ap.add_argument("--warmup", type=float, default=5, help="seconds before, not measured")
    ap.add_argument("--ramp", type=float, help="seconds over which clients connect "
                                               "(default: min(5, warmup / 2))")
    ap.add_argument("--interval", type=float, default=0.1, help="seconds between records")
    ap.add_argument("--flush-ms", type=float, default=250, help="0: send each record at once")
    ap.add_argument("--drain", type=float, default=30, help="bound on each final wait (s)")
    ap.add_argument("--procs", type=int, default=1, help="worker processes for the clients")
    ap.add_argument("--server", action="append", default=[], metavar="URL",
                    help="a running server (loopback only; repeatable: round-robin)")
    ap.add_argument("--server-pid", action="append", type=int, default=[], metavar="PID",
                    help="a server process to sample CPU and memory of (repeatable)")
    ap.add_argument("--sample-every", type=int, default=100, help="a text sample every N steps")
    ap.add_argument("--out", type=Path, help="write every figure here as JSON")
    ap.add_argument("--keep-data", action="store_true", help="keep an own server's data dir")
    args = ap.parse_args(argv)
    if args.ramp is None:
        args.ramp = min(5.0, args.warmup / 2)
    if args.trainers < 1 or args.viewers < 0 or args.procs < 1 or args.interval <= 0 \
            or args.duration <= 0 or args.ramp > args.warmup:
        ap.error("need trainers >= 1, viewers >= 0, procs >= 1, interval > 0, duration > 0 "
                 "and ramp <= warmup")
    for url in args.server:
        if not is_loopback(url):
            ap.error(f"{url}: only http:// servers on a loopback address (127.0.0.1, ::1, "
                     "localhost) may be loaded")
    return args


def is_loopback(url: str) -> bool:
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        return False
    if parts.hostname == "localhost":
        return True
    try:
        return ipaddress.ip_address(parts.hostname).is_loopback
    except ValueError:
        return False


def log(msg: str) -> None:
    print(f"[load] {msg}", file=sys.stderr, flush=True)


# ---- the server --------------------------------------------------------------------------
def http_json(method: str, url: str, body: dict | None = None, timeout: float = 60):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"content-type": "application/json"})
    with HTTP.open(req, timeout=timeout) as r:
        return json.loads(r.read())


def create_runs(servers: list[str], n: int, steps: int, sample_every: int) -> list[dict]:
    """n runs of the tiny preset, created round-robin on the servers (the first one may take
    ~15 s: the corpus is hashed then)."""
    runs = []
    for i in range(n):
        server = servers[i % len(servers)]
        made = http_json("POST", server + "/api/runs",
                         {"preset": "tiny", "steps": steps, "sample_every": sample_every},
                         timeout=180)
        runs.append({"id": made["id"], "token": made["token"], "server": i % len(servers)})
    return runs


def read_stored(servers: list[str], runs: list[dict]) -> dict[str, list[int]]:
    """Every run's stored steps, in the order the server lists them."""
    return {r["id"]: [rec["step"] for rec in http_json(
        "GET", servers[r["server"]] + f"/api/runs/{r['id']}/metrics", timeout=120)]
        for r in runs}


# ---- CPU and memory ----------------------------------------------------------------------
class Sampler(threading.Thread):
    """Each second, per group of root pids (the server; each worker): CPU % of one core
    (CPU time used by the roots and their children since the last sample) and RSS."""

    def __init__(self, groups: dict[str, list[int]]):
        super().__init__(daemon=True)
        self.groups = groups
        self.samples: dict[str, list[tuple[float, float, float]]] = {g: [] for g in groups}
        self.prev: dict[str, tuple[float, dict[int, float]]] = {}
        self.stop = threading.Event()

    @staticmethod
    def tree(roots: list[int]) -> list[psutil.Process]:
        procs = []
        for pid in roots:
            try:
                p = psutil.Process(pid)
                procs += [p, *p.children(recursive=True)]
            except psutil.Error:
                pass
        return procs

    def sample(self, name: str, roots: list[int]) -> None:
        now, cpu, rss = time.time(), {}, 0
        for p in self.tree(roots):
            try:
                t = p.cpu_times()
                cpu[p.pid] = t.user + t.system
                rss += p.memory_info().rss
            except psutil.Error:
                pass
        if name in self.prev:
            then, old = self.prev[name]
            used = sum(c - old.get(pid, 0.0) for pid, c in cpu.items())
            self.samples[name].append((now, 100 * used / (now - then), rss / 2**20))
        self.prev[name] = (now, cpu)

    def run(self) -> None:
        while not self.stop.is_set():
            for name, roots in self.groups.items():
                self.sample(name, roots)
            self.stop.wait(1.0)


# ---- clients -------------------------------------------------------------------------------
def plan(args: argparse.Namespace, servers: list[str], runs: list[dict]) -> list[dict]:
    """Clients split round-robin over the worker processes; start offsets spread over the
    ramp; each viewer on another server than its run's trainer where there are several."""
    def endpoint(i: int) -> dict:
        base = servers[i]
        return {"ws": "ws" + base[len("http"):], "origin": base}

    specs = [{"trainers": [], "viewers": []} for _ in range(args.procs)]
    for i, r in enumerate(runs):
        specs[i % args.procs]["trainers"].append(
            {"run": r["id"], "token": r["token"], "steps": args.steps,
             "start": args.ramp * i / len(runs), **endpoint(r["server"])})
    for j in range(args.viewers):
        r = runs[j % len(runs)]
        s = len(servers)
        server = r["server"] if s == 1 else (r["server"] + 1 + (j // len(runs)) % (s - 1)) % s
        specs[j % args.procs]["viewers"].append(
            {"run": r["id"], "start": args.ramp * (j + 0.5) / args.viewers, **endpoint(server)})
    return specs


def schedule(args: argparse.Namespace) -> dict:
    return {"warmup": args.warmup, "duration": args.duration, "interval": args.interval,
            "flush_s": args.flush_ms / 1000, "drain_s": args.drain,
            "sample_every": args.sample_every, "eval_every": 50}


def collect(conns: list, kind: str, deadline: float, failed: dict) -> dict:
    """The `kind` message of every live worker (until the deadline); errors go to failed."""
    got, pending = {}, [c for c in conns if c not in failed]
    while pending and time.time() < deadline:
        for c in wait(pending, timeout=max(0.0, deadline - time.time())):
            try:
                tag, payload = c.recv()
            except EOFError:
                tag, payload = "error", "the worker exited"
            if tag == kind:
                got[c] = payload
            else:
                failed[c] = payload
            pending.remove(c)
    for c in pending:
        failed[c] = f"no {kind!r} message in time"
    return got


def run_workers(args: argparse.Namespace, specs: list[dict], server_pids: list[int]):
    """Starts the workers, sets t0, relays the final acked steps, returns their logs."""
    ctx = mp.get_context("spawn")
    sched = schedule(args)
    pipes, procs, failed = [], [], {}
    for spec in specs:
        parent, child = ctx.Pipe()
        p = ctx.Process(target=load_clients.worker_main, args=(child, {**spec, "schedule": sched}),
                        daemon=True)
        p.start()
        pipes.append(parent)
        procs.append(p)
    ready = collect(pipes, "ready", time.time() + 120, failed)
    t0 = time.time() + 0.5
    for c in ready:
        c.send(t0)
    groups = {f"worker {p.pid}": [p.pid] for p in procs} | (
        {"server": server_pids} if server_pids else {})
    sampler = Sampler(groups)
    sampler.start()
    log(f"{len(ready)} worker(s) ready; warm-up {args.warmup:g} s, then {args.duration:g} s "
        "measured")
    end = t0 + args.warmup + args.duration
    acked = collect(pipes, "acked", end + args.drain + 60, failed)
    final = {run: step for part in acked.values() for run, step in part.items()}
    log("trainers done; waiting for the viewers")
    for c in acked:
        c.send(final)
    results = list(collect(pipes, "result", time.time() + args.drain + 60, failed).values())
    sampler.stop.set()
    sampler.join()
    for p in procs:
        p.join(timeout=10)
        if p.is_alive():
            p.kill()
    return t0, results, sampler.samples, [str(e) for e in failed.values()]


# ---- figures -----------------------------------------------------------------------------
def spread(values) -> dict:
    v = np.asarray(values, dtype=float)
    if v.size == 0:
        return {"n": 0, "p50": None, "p99": None, "max": None, "mean": None}
    return {"n": int(v.size), "p50": float(np.percentile(v, 50)),
            "p99": float(np.percentile(v, 99)), "max": float(v.max()), "mean": float(v.mean())}


def window(t0: float, args: argparse.Namespace) -> tuple[float, float]:
    return t0 + args.warmup, t0 + args.warmup + args.duration


def delivery(results: list[dict], stored: dict[str, list[int]], win) -> dict:
    """Sent, acked, stored, lost, duplicated, and the latencies, from the workers' logs."""
    trainers = [t for r in results for t in r["trainers"]]
    viewers = [v for r in results for v in r["viewers"]]
    sends, acks, made, lags = {}, [], [], []
    out = Counter()
    for t in trainers:
        steps, send, ack, made_t = (np.asarray(t[k]) for k in ("steps", "send_t", "ack_t",
                                                               "made_t"))
        sends[t["run"]] = (steps, send)
        acked = steps[~np.isnan(ack)]
        stored_set = set(stored.get(t["run"], []))
        out["produced"] += t["produced"]
        out["sent"] += len(steps)
        out["acked"] += len(acked)
        out["unacked"] += t["produced"] - len(acked)
        out["resent"] += t["resent"]
        out["lost_store"] += sum(1 for s in acked.tolist() if s not in stored_set)
        inside = (send >= win[0]) & (send < win[1]) & ~np.isnan(ack)
        acks.append((ack[inside] - send[inside]) * 1000)
        made.append((ack[inside] - made_t[inside]) * 1000)
    for run, steps in stored.items():
        out["stored"] += len(set(steps))
        out["dup_stored"] += len(steps) - len(set(steps))
    for v in viewers:
        got = np.asarray(v["steps"])
        stored_set = set(stored.get(v["run"], []))
        got_set = set(got.tolist())
        out["lost_viewer"] += len(stored_set - got_set)
        out["phantom"] += len(got_set - stored_set)
        out["dup_viewer"] += v["dups"]
        lags.append(viewer_lags(sends.get(v["run"]), got, np.asarray(v["recv_t"]), win))
    out["duplicated"] = out["dup_viewer"] + out["dup_stored"]
    return {**out, "ack_ms": spread(np.concatenate(acks) if acks else []),
            "ack_from_made_ms": spread(np.concatenate(made) if made else []),
            "lag_ms": spread(np.concatenate(lags) if lags else [])}


def viewer_lags(sent, got: np.ndarray, recv: np.ndarray, win) -> np.ndarray:
    """Receipt - first send, for the steps first sent inside the window."""
    if sent is None or got.size == 0 or sent[0].size == 0:
        return np.empty(0)
    steps, send = sent
    idx = np.clip(np.searchsorted(steps, got), 0, steps.size - 1)
    known = steps[idx] == got
    t = send[idx]
    inside = known & (t >= win[0]) & (t < win[1])
    return (recv[inside] - t[inside]) * 1000


def resources(samples: list[tuple[float, float, float]], win) -> dict:
    """CPU mean/max and RSS start, end, slope over the window's samples."""
    # A sample covers the second before it: the ones mostly inside the window.
    inside = [s for s in samples if win[0] + 0.5 <= s[0] <= win[1] + 0.5]
    if not inside:
        return {}
    t = np.array([s[0] for s in inside])
    cpu = np.array([s[1] for s in inside])
    rss = np.array([s[2] for s in inside])
    slope = float(np.polyfit(t - t[0], rss, 1)[0] * 60) if len(inside) > 2 else None
    return {"cpu_mean": float(cpu.mean()), "cpu_max": float(cpu.max()),
            "rss_start_mib": float(rss[0]), "rss_end_mib": float(rss[-1]),
            "rss_slope_mib_per_min": slope, "samples": len(inside)}


def generator_health(results: list[dict], samples: dict, win) -> dict:
    """The workers' own load: a worker near 100% of a core or with a late loop is the
    bottleneck, not the server (use more --procs)."""
    lag = [np.asarray(r["loop_lag"])[(np.asarray(r["loop_lag_t"]) >= win[0])
                                     & (np.asarray(r["loop_lag_t"]) < win[1])] for r in results]
    lag_ms = spread(np.concatenate(lag) * 1000 if lag else [])
    cpu = {name: resources(s, win) for name, s in samples.items() if name.startswith("worker")}
    busiest = max((c.get("cpu_mean", 0) for c in cpu.values()), default=0)
    return {"loop_lag_ms": lag_ms, "workers": cpu, "busiest_worker_cpu_mean": busiest,
            "overloaded": bool(lag_ms["p99"] is not None and lag_ms["p99"] > 50
                               or busiest > 85)}


def closes(results: list[dict], kind: str) -> dict:
    return dict(Counter(str(c) for r in results for x in r[kind] for c in x["closes"]))


def fmt(x, digits: int = 0) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) \
        else f"{x:.{digits}f}"


def row(args: argparse.Namespace, d: dict, res: dict) -> str:
    a, lag = d["ack_ms"], d["lag_ms"]
    rss = (f"{fmt(res.get('rss_start_mib'))}→{fmt(res.get('rss_end_mib'))} "
           f"({fmt(res.get('rss_slope_mib_per_min'), 1)})") if res else "n/a"
    return (f"| {args.trainers}/{args.viewers} | {fmt(res.get('cpu_mean'))}/"
            f"{fmt(res.get('cpu_max'))} | {fmt(a['p50'], 1)}/{fmt(a['p99'], 1)}/"
            f"{fmt(a['max'], 1)} | {fmt(lag['p50'], 1)}/{fmt(lag['p99'], 1)}/"
            f"{fmt(lag['max'], 1)} | {d['sent']} | {d['stored']} | "
            f"{d['lost_store']}+{d['lost_viewer']} | {d['duplicated']} | {rss} |")


# ---- main --------------------------------------------------------------------------------
def serve_own(args: argparse.Namespace):
    data = Path(tempfile.mkdtemp(prefix="andrea-load-"))
    # `python -m andrea` from any working directory: the checkout first on its path.
    os.environ["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(Path(__file__).resolve().parent.parent), os.environ.get("PYTHONPATH")]))
    log(f"starting a server (data in {data})")
    proc, url = start_server(data, timeout=120, env=client_bounds_env(args))
    return proc, url, data


def client_bounds_env(args: argparse.Namespace) -> dict[str, str]:
    """The settings a server loaded by these clients starts with (serve_own, and every process
    of bench/load_cluster.py): every simulated laptop here has the one address 127.0.0.1, so the
    per-address bounds of a workshop (new runs, open connections, viewer sockets and their
    backlog reads) would count them all as one participant; raised above what the run needs."""
    return {
        "ANDREA_RUN_BURST": str(args.trainers + 10),
        "ANDREA_MAX_CONNECTIONS_PER_CLIENT": str(2 * (args.trainers + args.viewers) + 64),
        "ANDREA_MAX_VIEWERS_PER_CLIENT": str(args.viewers + 16),
        "ANDREA_VIEWER_BACKLOG_BURST_BYTES": str(1 << 40)}


def measure(args: argparse.Namespace, servers: list[str], pids: list[int]) -> dict:
    args.steps = math.ceil((args.warmup + args.duration) / args.interval) + 100
    log(f"creating {args.trainers} run(s) of {args.steps} steps")
    runs = create_runs(servers, args.trainers, args.steps, args.sample_every)
    specs = plan(args, servers, runs)
    t0, results, samples, errors = run_workers(args, specs, pids)
    win = window(t0, args)
    log("reading the runs back")
    stored = read_stored(servers, runs)
    d = delivery(results, stored, win)
    res = resources(samples.get("server", []), win)
    gen = generator_health(results, samples, win)
    errors += [f"trainer {t['run']}: {t['error']}" for r in results for t in r["trainers"]
               if t["error"]] + [f"viewer of {v['run']}: refused {v['refused']}"
                                 for r in results for v in r["viewers"] if v["refused"]]
    if len(results) < args.procs:
        errors.append(f"only {len(results)} of {args.procs} workers reported")
    return {"delivery": d, "server": res, "generator": gen, "errors": errors,
            "trainer_closes": closes(results, "trainers"),
            "viewer_closes": closes(results, "viewers"),
            "viewer_reconnects": sum(max(0, v["connects"] - 1) for r in results
                                     for v in r["viewers"]),
            "trainer_reconnects": sum(max(0, t["connects"] - 1) for r in results
                                      for t in r["trainers"]),
            "server_samples": [[round(t - t0, 2), round(c, 1), round(m, 1)]
                               for t, c, m in samples.get("server", [])],
            "runs": [r["id"] for r in runs], "t0": t0}


def ok(report: dict) -> bool:
    d = report["delivery"]
    return not report["errors"] and d["acked"] > 0 and all(
        d[k] == 0 for k in ("lost_store", "lost_viewer", "duplicated", "phantom", "unacked"))


def raise_fd_limit() -> None:
    """Thousands of sockets: the soft limit on open files up to the hard one (the workers and
    an own server inherit it)."""
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    raise_fd_limit()
    own = None
    servers, pids = [s.rstrip("/") for s in args.server], list(args.server_pid)
    if not servers:
        own = serve_own(args)
        servers, pids = [own[1]], [own[0].pid]
    try:
        report = measure(args, servers, pids)
    finally:
        if own:
            stop_server(own[0])
            if not args.keep_data:
                shutil.rmtree(own[2], ignore_errors=True)
    line = row(args, report["delivery"], report["server"])
    print(HEADER)
    print("|---" * (HEADER.count("|") - 1) + "|")
    print(line)
    for e in report["errors"][:10]:
        log(f"error: {e}")
    if report["generator"]["overloaded"]:
        log("warning: the generator itself was overloaded (late loop or a busy worker): "
            "figures are upper bounds; use more --procs")
    if args.out:
        args.out.write_text(json.dumps({
            "command": shlex.join([sys.executable, *sys.argv]),
            "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
            "servers": servers, "server_pids": pids, "summary": line, "ok": ok(report),
            **report}, indent=1))
    return 0 if ok(report) else 1


if __name__ == "__main__":
    sys.exit(main())
