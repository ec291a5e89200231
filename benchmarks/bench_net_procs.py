"""Network echo benchmarks with server and client in separate processes (issue 5).

Frames: 4-byte big-endian length + payload. Servers: Go (``benchmarks/go/net``, the
ceiling), netframe's ``Server`` in raw mode on gosim.net (``netframe``: a handler call
per frame, an async function; ``netframe-plain``: a plain function per frame;
``netframe-batch``: one ``handle_batch`` call per receive), a batched
plain-trio server, an asyncio ``Protocol`` server and the same ``Protocol`` on uvloop
(``benchmarks/net_peers.py``), and ``c-epoll``, an echo server in C with no interpreter
(``benchmarks/c/echo_epoll.c``, built with the system's C compiler): the floor.
Clients: the Go load generator, and netframe and trio clients for the "at both ends"
rows. Each benchmark starts the server, runs one client process, checks every echo (the clients
do) and records the client's figure in ``extra_info``; pytest-benchmark's own timing is
the client's wall time and is not the figure to compare.

Workloads: ``pipelined`` (one connection, 64-byte frames, all in flight: frames/s),
``rr`` (100 connections, one request in flight each: requests/s), ``big`` (1 MiB frames
pipelined: MB/s). Go runs with ``GOMAXPROCS=1`` on both sides. ``idle``: one netframe
session server process holding 10,000 TCP connections from a client process, heartbeats
every 5 s on both sides, idle for 11 s (past the 10 s dead-peer timeout), then one
request on each; the figure is the server's peak RSS (``VmHWM``).

Reproduce::

    .venv/bin/python -m pytest benchmarks/bench_net_procs.py --benchmark-json=netp.json
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from benchmarks.procs import Server, c_build, find_go, gc_settings_env, go_build, run_json

HERE = Path(__file__).parent
PEERS = HERE / "net_peers.py"
HAVE_GO = find_go() is not None
ENV = {**os.environ, "GOMAXPROCS": "1", **gc_settings_env()}
GO_CLIENT_SERVERS = [
    "go", "c-epoll", "netframe", "netframe-plain", "netframe-batch", "trio", "asyncio", "uvloop"
]  # fmt: skip
BIG_SERVERS = ["go", "netframe", "trio", "asyncio", "uvloop"]
BOTH_ENDS = ["netframe", "trio", "asyncio", "uvloop"]  # server and client of one library
IDLE_FULL = (10_000, 11.0, 5.0)  # connections, idle seconds, heartbeat interval


def go_net_binary(out: Path) -> Path:
    """The Go echo server and load generator (benchmarks/go/net)."""
    return go_build("net", out)


@pytest.fixture(scope="module")
def go_binary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not HAVE_GO:
        pytest.skip("Go toolchain not installed (CI installs golang-go)")
    return go_net_binary(tmp_path_factory.mktemp("gonet") / "net")


@pytest.fixture(scope="module")
def c_binary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The C echo server (benchmarks/c/echo_epoll.c): the floor, no interpreter."""
    return c_build("echo_epoll", tmp_path_factory.mktemp("cecho") / "echo_epoll")


def server_cmd(kind: str, go_bin: Path | None, c_bin: Path | None = None) -> list[str]:
    """The command line of echo server ``kind`` (``go`` needs the Go binary,
    ``c-epoll`` the C one)."""
    if kind == "go":
        assert go_bin is not None
        return [str(go_bin), "server", "-addr", "127.0.0.1:0"]
    if kind == "c-epoll":
        assert c_bin is not None
        return [str(c_bin), "127.0.0.1:0"]
    return [sys.executable, str(PEERS), "server", kind]


def _server(kind: str, go_bin: Path | None, c_bin: Path | None = None) -> Iterator[Server]:
    srv = Server(server_cmd(kind, go_bin, c_bin), env=ENV)
    try:
        yield srv
    finally:
        srv.stop()


def _run_client(cmd: list[str]) -> dict[str, Any]:
    result: dict[str, Any] = run_json(cmd, env=ENV)
    return result


def _measure(benchmark: Any, cmd: list[str]) -> dict[str, Any]:
    result: dict[str, Any] = {}

    def once() -> None:
        result.update(_run_client(cmd))

    benchmark.pedantic(once, rounds=1, iterations=1)
    benchmark.extra_info.update(result)
    return result


def _sizes(benchmark: Any) -> tuple[int, float, int]:
    """Frames for pipelined, seconds for rr, frames for big: small for the CI smoke run."""
    if benchmark.disabled:
        return 2_000, 0.2, 4
    return 1_000_000, 2.0, 1000


@pytest.mark.benchmark(group="net-pipelined-64B")
@pytest.mark.parametrize("server", GO_CLIENT_SERVERS)
def bench_pipelined_go_client(benchmark: Any, go_binary: Path, c_binary: Path, server: str) -> None:
    n, _, _ = _sizes(benchmark)
    for srv in _server(server, go_binary, c_binary):
        r = _measure(benchmark, [str(go_binary), "pipelined", "-addr", srv.addr, "-n", str(n)])
        assert r["frames"] == n


@pytest.mark.benchmark(group="net-pipelined-64B")
@pytest.mark.parametrize("peer", BOTH_ENDS)
def bench_pipelined_both_ends(benchmark: Any, peer: str) -> None:
    n, _, _ = _sizes(benchmark)
    for srv in _server(peer, None):
        cmd = [sys.executable, str(PEERS), "pipelined", peer, "--addr", srv.addr, "--n", str(n)]
        r = _measure(benchmark, cmd)
        assert r["frames"] == n


@pytest.mark.benchmark(group="net-rr-100conns")
@pytest.mark.parametrize("server", GO_CLIENT_SERVERS)
def bench_rr_go_client(benchmark: Any, go_binary: Path, c_binary: Path, server: str) -> None:
    _, seconds, _ = _sizes(benchmark)
    for srv in _server(server, go_binary, c_binary):
        r = _measure(benchmark, [str(go_binary), "rr", "-addr", srv.addr, "-seconds", str(seconds)])
        assert r["requests"] > 0


@pytest.mark.benchmark(group="net-rr-100conns")
@pytest.mark.parametrize("peer", BOTH_ENDS)
def bench_rr_both_ends(benchmark: Any, peer: str) -> None:
    _, seconds, _ = _sizes(benchmark)
    for srv in _server(peer, None):
        cmd = [
            sys.executable,
            str(PEERS),
            "rr",
            peer,
            "--addr",
            srv.addr,
            "--seconds",
            str(seconds),
        ]
        r = _measure(benchmark, cmd)
        assert r["requests"] > 0


@pytest.mark.benchmark(group="net-big-1MiB")
@pytest.mark.parametrize("server", BIG_SERVERS)
def bench_big_go_client(benchmark: Any, go_binary: Path, server: str) -> None:
    _, _, n = _sizes(benchmark)
    for srv in _server(server, go_binary):
        cmd = [str(go_binary), "big", "-addr", srv.addr, "-n", str(n), "-size", str(1 << 20)]
        r = _measure(benchmark, cmd)
        assert r["frames"] == n


def _peak_rss_mb(pid: int) -> float:
    """The process's peak resident set (VmHWM), in MiB."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc status")


def idle_round(conns: int, hold: float, heartbeat: float) -> dict[str, Any]:
    """One netframe session server process holding ``conns`` connections from a client
    process, heartbeats every ``heartbeat`` seconds on both sides, idle for ``hold``
    seconds, then one request on each. Checked: every connection answered, none declared
    dead. Returns the client's figures and the server's peak RSS (``server_peak_rss_mb``)."""
    server = subprocess.Popen(
        [sys.executable, str(PEERS), "idle-server", "netframe", "--heartbeat", str(heartbeat)],
        stdout=subprocess.PIPE,
        text=True,
        env=ENV,
    )
    stats: list[dict[str, Any]] = []
    collector: threading.Thread | None = None
    try:
        assert server.stdout is not None
        line = server.stdout.readline()
        if not line.startswith("LISTEN "):
            raise RuntimeError(f"idle server did not start: {line!r}")
        addr = line.split()[1]
        out = server.stdout

        def collect() -> None:  # the server's stats lines, one per heartbeat interval
            stats.extend(json.loads(text) for text in out)

        collector = threading.Thread(target=collect, daemon=True)
        collector.start()
        cmd = [sys.executable, str(PEERS), "idle-clients", "netframe", "--addr", addr]
        cmd += ["--conns", str(conns), "--seconds", str(hold), "--heartbeat", str(heartbeat)]
        result = _run_client(cmd)
        peak_mb = _peak_rss_mb(server.pid)
    finally:
        server.kill()  # our own child, by its PID
        server.wait(timeout=30)
        if collector is not None:
            collector.join(timeout=30)  # the pipe is at its end: the thread finishes
        if server.stdout is not None:
            server.stdout.close()
    if result["answered"] != conns:
        raise AssertionError(f"{result['answered']} of {conns} connections answered")
    if max(s["connections"] for s in stats) != conns:
        raise AssertionError(f"the server held {max(s['connections'] for s in stats)}")
    if max(s["dead_peers"] for s in stats) != 0:
        raise AssertionError("the server declared live peers dead")
    result["server_peak_rss_mb"] = peak_mb
    return result


@pytest.mark.benchmark(group="net-idle-10k")
def bench_idle_connections(benchmark: Any) -> None:
    # Heartbeats every 5 s on both sides (long-connection servers use 10-60 s), idle for
    # 11 s: past the 10 s after which a silent peer would be declared dead.
    conns, hold, heartbeat = (200, 0.6, 0.2) if benchmark.disabled else IDLE_FULL
    result: dict[str, Any] = {}
    benchmark.pedantic(
        lambda: result.update(idle_round(conns, hold, heartbeat)), rounds=1, iterations=1
    )
    benchmark.extra_info.update(result)
    peak_mb = result["server_peak_rss_mb"]
    benchmark.extra_info.update(
        server_peak_rss_mb=round(peak_mb, 1),
        server_kb_per_conn=round(peak_mb * 1024 / conns, 1),
    )
