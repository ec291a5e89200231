"""msgpack-rpc benchmarks, server and client in separate processes (issue 15).

Servers (``benchmarks/rpc_peers.py``, and ``benchmarks/go/rpc`` for Go): a lean Go
msgpack-rpc server over netframe session frames (the ceiling), idempotency.rpc on the
framed transport (``rpc``: a plain-function method; ``rpc-async``), on the plain stream
(``rpc-stream``), with idempotent methods over a durable SQLite store (``rpc-sqlite``;
``rpc-sqlite-one-step`` with the method declared ``one_step``), and aio-msgpack-rpc
(asyncio, plain stream). The Go load generator drives every one and checks every reply;
the server's CPU time is read from ``/proc`` around the run.

Rows: ``rr`` (100 connections, one call in flight each: echo of ``[1, "hello", [1, 2,
3]]``), ``inflight`` (one connection, 16 calls in flight), ``keyed`` (rr with a fresh
idempotency key per call against the SQLite store, then the same keys again: replays),
and the RPC layer's CPU cost per call over netframe's raw request/response (netframe's
raw server with a plain handler, ``benchmarks/net_peers.py``, driven by the Go frame
client). gRPC's asyncio server is not a row: a Go client speaking gRPC needs modules
this machine cannot download.

Reproduce::

    .venv/bin/python -m pytest benchmarks/bench_rpc.py --benchmark-json=rpc.json
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

from benchmarks.procs import Server, drive, find_go, gc_settings_env, go_build

HERE = Path(__file__).parent
PEERS = HERE / "rpc_peers.py"
NET_PEERS = HERE / "net_peers.py"
HAVE_GO = find_go() is not None
ENV = {**os.environ, "GOMAXPROCS": "1", **gc_settings_env()}


def _build(tmp: Path, name: str) -> Path:
    if not HAVE_GO:
        pytest.skip("Go toolchain not installed (CI installs golang-go)")
    return go_build(name, tmp / name)


@pytest.fixture(scope="module")
def go_rpc(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _build(tmp_path_factory.mktemp("gorpc"), "rpc")


@pytest.fixture(scope="module")
def go_net(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _build(tmp_path_factory.mktemp("gonet"), "net")


def server_cmd(kind: str, go_rpc: Path) -> list[str]:
    """The command line of RPC server ``kind`` (``go`` needs the Go binary)."""
    if kind == "go":
        return [str(go_rpc), "server", "-addr", "127.0.0.1:0"]
    return [sys.executable, str(PEERS), kind]


def _server(kind: str, go_rpc: Path) -> Server:
    return Server(server_cmd(kind, go_rpc), env=ENV)


def _drive(benchmark: Any, srv: Server, cmd: list[str]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    benchmark.pedantic(lambda: result.update(drive(srv, cmd, ENV)), rounds=1, iterations=1)
    result["server_cpu_us_per_call"] = round(result.pop("server_cpu_us_per_op", 0.0), 2)
    benchmark.extra_info.update(result)
    return result


def _seconds(benchmark: Any) -> str:
    return "0.2" if benchmark.disabled else "2"


STREAM = {"rpc-stream", "aio"}


@pytest.mark.benchmark(group="rpc-rr-100conns")
@pytest.mark.parametrize("server", ["go", "rpc", "rpc-async", "rpc-stream", "aio"])
def bench_rpc_rr(benchmark: Any, go_rpc: Path, server: str) -> None:
    srv = _server(server, go_rpc)
    try:
        cmd = [str(go_rpc), "rr", "-addr", srv.addr, "-seconds", _seconds(benchmark)]
        r = _drive(benchmark, srv, cmd + (["-stream"] if server in STREAM else []))
    finally:
        srv.stop()
    assert r["calls"] > 0


@pytest.mark.benchmark(group="rpc-inflight16-1conn")
@pytest.mark.parametrize("server", ["go", "rpc", "aio"])
def bench_rpc_inflight(benchmark: Any, go_rpc: Path, server: str) -> None:
    srv = _server(server, go_rpc)
    try:
        cmd = [str(go_rpc), "inflight", "-addr", srv.addr, "-conns", "1", "-depth", "16"]
        cmd += ["-seconds", _seconds(benchmark)]
        r = _drive(benchmark, srv, cmd + (["-stream"] if server in STREAM else []))
    finally:
        srv.stop()
    assert r["calls"] > 0


@pytest.mark.benchmark(group="rpc-keyed-100conns")
@pytest.mark.parametrize("server", ["rpc-sqlite", "rpc-sqlite-one-step", "rpc-memory"])
def bench_rpc_keyed_first_then_replayed(benchmark: Any, go_rpc: Path, server: str) -> None:
    calls = "5" if benchmark.disabled else "300"
    srv = _server(server, go_rpc)
    try:
        cmd = [str(go_rpc), "rr", "-addr", srv.addr, "-key", "-calls", calls]
        first = _drive(benchmark, srv, cmd)
        replay = drive(srv, cmd, ENV)
    finally:
        srv.stop()
    assert first["calls"] == replay["calls"] == 100 * int(calls)
    benchmark.extra_info.update(
        replay_calls_per_s=replay["calls_per_s"],
        replay_server_cpu_us_per_call=round(replay["server_cpu_us_per_op"], 2),
    )


@pytest.mark.benchmark(group="rpc-layer-cost")
@pytest.mark.parametrize("server", ["netframe-plain", "rpc"])
def bench_rpc_layer_cost(benchmark: Any, go_rpc: Path, go_net: Path, server: str) -> None:
    """Server CPU per call: the RPC server against netframe's raw request/response."""
    if server == "rpc":
        srv = _server("rpc", go_rpc)
        cmd = [str(go_rpc), "rr", "-addr", "", "-seconds", _seconds(benchmark)]
    else:
        srv = Server([sys.executable, str(NET_PEERS), "server", server], env=ENV)
        cmd = [str(go_net), "rr", "-addr", "", "-seconds", _seconds(benchmark)]
    try:
        cmd[3] = srv.addr
        _drive(benchmark, srv, cmd)
    finally:
        srv.stop()
