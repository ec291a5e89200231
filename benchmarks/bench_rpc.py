"""msgpack-rpc benchmarks, server and client in separate processes (issue 15).

Servers (``benchmarks/rpc_peers.py``, and ``benchmarks/go/rpc`` for Go): a lean Go
msgpack-rpc server over netframe session frames (the ceiling), idempotency.rpc on the
framed transport (``rpc``: a plain-function method; ``rpc-async``), on the plain stream
(``rpc-stream``), with idempotent methods over a durable SQLite store (``rpc-sqlite``;
``rpc-sqlite-one-step`` with the method declared ``one_step``), a MemoryStore and a
RedisStore, and aio-msgpack-rpc (asyncio, plain stream). The keyed rows' peers besides
ours: the Go twin of the keyed server (``benchmarks/go/ledger``, durable and from
memory), the hand-written asyncio + msgpack + sqlite3 server (``rpc_peers.py
hand-written``), and our unkeyed call. The Go load generator drives every one and
checks every reply; the server's CPU time is read from ``/proc`` around the run.

Rows: ``rr`` (100 connections, one call in flight each: echo of ``[1, "hello", [1, 2,
3]]``), ``inflight`` (one connection, 16 calls in flight), ``keyed`` (rr with a fresh
idempotency key per call against every keyed peer, then the same keys again: replays),
and the RPC layer's CPU cost per call over netframe's raw request/response (netframe's
raw server with a plain handler, ``benchmarks/net_peers.py``, driven by the Go frame
client). gRPC's asyncio server is not a row: a Go client speaking gRPC needs modules
this machine cannot download.

Reproduce::

    .venv/bin/python -m pytest benchmarks/bench_rpc.py --benchmark-json=rpc.json
"""

from __future__ import annotations

import os
import shutil
import socket
import sqlite3
import struct
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest

from benchmarks.procs import (
    Server,
    cpu_seconds,
    drive,
    find_go,
    gc_settings_env,
    go_build,
    gopath_missing,
)

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


# The keyed tables' peers (issue 30): the Go twin of our keyed server (durable and from
# memory, benchmarks/go/ledger), ours through each store, what a user writes by hand
# (asyncio + msgpack + sqlite3, a transaction per call), and our unkeyed call (the
# transport under the keyed ones: the same client without keys).
KEYED = (
    "go-ledger",
    "go-ledger-memory",
    "rpc-sqlite",
    "rpc-sqlite-one-step",
    "rpc-memory",
    "rpc-redis",
    "hand-written",
    "rpc-nokey",
)
GO_LEDGER = {"go-ledger", "go-ledger-memory"}
# The ledger demo's transfer (``transfer(src, dst, 1)`` with a key, over 100 accounts):
# the Go twin durable and from memory, and the demo's own server.
TRANSFER = ("go-ledger", "go-ledger-memory", "demo")
ACCOUNTS = 100
# Seconds of first calls in a keyed round: the same for every peer, long enough that a
# fresh server's first calls (its files created, its caches cold) weigh little.
KEYED_SECONDS = 3.0
KEYED_SMOKE_SECONDS = 0.2


def keyed_server_cmd(
    kind: str,
    directory: Path,
    go_ledger: Path | None,
    redis_url: str | None,
    transfer: bool = False,
) -> list[str]:
    """The command line of keyed-table server ``kind``, its files in ``directory``
    (``transfer``: serving the ledger demo's transfer too)."""
    ledger = ["-accounts", str(ACCOUNTS)] if transfer else []
    if kind == "go-ledger":
        assert go_ledger is not None
        db = str(directory / "records.db")
        return [str(go_ledger), "server", "-store", "sqlite", "-db", db, *ledger]
    if kind == "go-ledger-memory":
        assert go_ledger is not None
        return [str(go_ledger), "server", "-store", "memory", *ledger]
    if kind == "demo":
        return [sys.executable, str(PEERS), kind, str(directory)]
    if kind == "hand-written":
        return [sys.executable, str(PEERS), kind, str(directory / "calls.db")]
    if kind == "rpc-redis":
        assert redis_url is not None
        return [sys.executable, str(PEERS), kind, redis_url, f"{directory.name}:"]
    if kind == "rpc-nokey":
        return [sys.executable, str(PEERS), "rpc"]
    return [sys.executable, str(PEERS), kind, str(directory)]


def keyed_round(
    kind: str,
    go_rpc: Path,
    go_ledger: Path | None,
    seconds: float,
    redis: tuple[str, int] | None = None,
    env: dict[str, str] | None = None,
    transfer: bool = False,
) -> dict[str, float]:
    """One round of a keyed table on a fresh server of ``kind``: 100 connections, one
    call in flight each, for ``seconds`` (the same for every peer), each call with a
    fresh key; then the keys every connection recorded again (its first ``min_calls``:
    every call a replay; ``rpc-nokey`` makes no second pass). Server CPU from /proc,
    per call; ``redis`` (url, pid): redis-server's CPU per call beside. Every reply is
    checked by the Go client. ``transfer``: the calls are the ledger demo's transfers
    (``TRANSFER``'s servers) instead of echo."""
    env = env or ENV
    with tempfile.TemporaryDirectory(prefix="keyed-") as tmp:
        directory = Path(tmp)
        url = None if redis is None else redis[0]
        srv = Server(keyed_server_cmd(kind, directory, go_ledger, url, transfer), env=env)
        try:
            cmd = [str(go_rpc), "rr", "-addr", srv.addr]
            if kind != "rpc-nokey":
                cmd.append("-key")
            if transfer:
                cmd += ["-transfer", str(ACCOUNTS)]
            redis_before = 0.0 if redis is None else cpu_seconds(redis[1])
            first = drive(srv, [*cmd, "-seconds", f"{seconds:g}"], env)
            redis_cpu = 0.0 if redis is None else cpu_seconds(redis[1]) - redis_before
            per_conn = int(first["min_calls"])
            if per_conn < 1:
                raise AssertionError(f"{kind}: a connection made no call in {seconds:g} s")
            replay = (
                drive(srv, [*cmd, "-calls", str(per_conn)], env) if kind != "rpc-nokey" else None
            )
        finally:
            srv.stop()
    if replay is not None and replay["calls"] != 100 * per_conn:
        raise AssertionError(f"{kind}: {replay['calls']} replays answered, want {100 * per_conn}")
    out = {
        "calls_per_s": first["calls_per_s"],
        "server_cpu_us_per_call": first["server_cpu_us_per_op"],
    }
    if replay is not None:
        out["replay_calls_per_s"] = replay["calls_per_s"]
        out["replay_server_cpu_us_per_call"] = replay["server_cpu_us_per_op"]
    if redis is not None:
        out["redis_cpu_us_per_call"] = redis_cpu * 1e6 / first["calls"]
    return out


def keyed_missing(kind: str) -> str | None:
    """Why keyed peer ``kind`` cannot run here (None: it can)."""
    if kind in GO_LEDGER:
        return gopath_missing("ledger")
    if kind == "rpc-redis" and shutil.which("redis-server") is None:
        return "redis-server is not installed (CI installs it with apt)"
    return None


@pytest.mark.benchmark(group="rpc-demo-transfer-100conns")
@pytest.mark.parametrize("server", TRANSFER)
def bench_demo_transfer_first_then_replayed(
    benchmark: Any, request: pytest.FixtureRequest, go_rpc: Path, server: str
) -> None:
    """The ledger demo's transfer: the Go twin against the demo's own server."""
    why = keyed_missing(server)
    if why is not None:
        pytest.skip(why)
    ledger = request.getfixturevalue("go_ledger") if server in GO_LEDGER else None
    seconds = KEYED_SMOKE_SECONDS if benchmark.disabled else KEYED_SECONDS
    result: dict[str, float] = {}
    benchmark.pedantic(
        lambda: result.update(keyed_round(server, go_rpc, ledger, seconds, transfer=True)),
        rounds=1,
        iterations=1,
    )
    benchmark.extra_info.update({k: round(v, 2) for k, v in result.items()})
    assert result["calls_per_s"] > 0


@pytest.fixture(scope="module")
def redis_proc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    from benchmarks.bench_idempotency import redis_process  # noqa: PLC0415

    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed (CI installs it with apt)")
    with redis_process(str(tmp_path_factory.mktemp("redis"))) as proc:
        yield proc


@pytest.mark.benchmark(group="rpc-keyed-100conns")
@pytest.mark.parametrize("server", KEYED)
def bench_rpc_keyed_first_then_replayed(
    benchmark: Any, request: pytest.FixtureRequest, go_rpc: Path, server: str
) -> None:
    why = keyed_missing(server)
    if why is not None:
        pytest.skip(why)
    ledger = request.getfixturevalue("go_ledger") if server in GO_LEDGER else None
    redis = request.getfixturevalue("redis_proc") if server == "rpc-redis" else None
    seconds = KEYED_SMOKE_SECONDS if benchmark.disabled else KEYED_SECONDS
    result: dict[str, float] = {}
    benchmark.pedantic(
        lambda: result.update(keyed_round(server, go_rpc, ledger, seconds, redis)),
        rounds=1,
        iterations=1,
    )
    benchmark.extra_info.update({k: round(v, 2) for k, v in result.items()})
    assert result["calls_per_s"] > 0


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


def _call(
    sock: socket.socket, msgid: int, params: list[Any], key: str, method: str = "echo"
) -> list[Any]:
    """One framed request with ``key``; its decoded reply (pings skipped)."""
    body = b"\x00" + msgpack.packb([0, msgid, method, params, {"key": key, "caller": "t"}])
    sock.sendall(struct.pack(">I", len(body)) + body)
    buf = b""
    while True:
        while len(buf) < 4 or len(buf) < 4 + struct.unpack(">I", buf[:4])[0]:
            chunk = sock.recv(65536)
            assert chunk, "the server closed the connection"
            buf += chunk
        n = struct.unpack(">I", buf[:4])[0]
        frame, buf = buf[4 : 4 + n], buf[4 + n :]
        if frame[:1] == b"\x00":
            reply: list[Any] = msgpack.unpackb(frame[1:])
            return reply


def check_keyed_protocol(addr: str) -> None:
    """The keyed server at ``addr`` answers as the tables assume: a first call with key
    k1 runs, the same key and request replays the outcome (``replayed``), the same key
    with another request gets ALREADY_EXISTS (KeyReused), a second key k2 runs."""
    host, port = addr.rsplit(":", 1)
    with socket.create_connection((host, int(port))) as sock:
        assert _call(sock, 1, [1, "a"], "k1") == [1, 1, None, [1, "a"]]
        assert _call(sock, 2, [1, "a"], "k1") == [1, 2, None, [1, "a"], {"replayed": True}]
        reused = _call(sock, 3, [2, "b"], "k1")
        assert reused[:2] == [1, 3] and reused[2][0] == 6 and reused[3] is None
        assert _call(sock, 4, [2, "b"], "k2") == [1, 4, None, [2, "b"]]


@pytest.mark.parametrize("server", ["go-ledger", "go-ledger-memory", "hand-written", "rpc-sqlite"])
def bench_keyed_peers_replay_and_refuse_a_reused_key(
    request: pytest.FixtureRequest, go_rpc: Path, server: str, tmp_path: Path
) -> None:
    """Every keyed peer keeps the protocol the tables compare: a first call runs, the same
    key and request replays the outcome (``replayed``), the same key with another
    request gets ALREADY_EXISTS (KeyReused); a durable peer's record is in its file."""
    why = keyed_missing(server)
    if why is not None:
        pytest.skip(why)
    ledger = request.getfixturevalue("go_ledger") if server in GO_LEDGER else None
    srv = Server(keyed_server_cmd(server, tmp_path, ledger, None), env=ENV)
    try:
        check_keyed_protocol(srv.addr)
    finally:
        srv.stop()
    files = {"go-ledger": "records.db", "hand-written": "calls.db", "rpc-sqlite": "records.db"}
    if server in files:
        table = "calls" if server == "hand-written" else "idempotency_records"
        with sqlite3.connect(tmp_path / files[server]) as db:
            keys = sorted(k for (k,) in db.execute(f"SELECT key FROM {table}"))
            mode = db.execute("PRAGMA journal_mode").fetchone()[0]
        assert keys == ["k1", "k2"] and mode == "wal"


@pytest.mark.parametrize("server", TRANSFER)
def bench_transfer_peers_move_money_once(
    request: pytest.FixtureRequest, go_rpc: Path, server: str, tmp_path: Path
) -> None:
    """The demo's transfer on the Go twin and on the demo's server: applied once (its
    fence the result, replayed), refused with INSUFFICIENT_FUNDS past the balance, a
    reused key refused; a durable peer's balances in its file."""
    why = keyed_missing(server)
    if why is not None:
        pytest.skip(why)
    ledger = request.getfixturevalue("go_ledger") if server in GO_LEDGER else None
    srv = Server(keyed_server_cmd(server, tmp_path, ledger, None, transfer=True), env=ENV)
    try:
        host, port = srv.addr.rsplit(":", 1)
        with socket.create_connection((host, int(port))) as sock:
            first = _call(sock, 1, [0, 1, 5], "t1", "transfer")
            assert first[:3] == [1, 1, None] and isinstance(first[3], int)
            again = _call(sock, 2, [0, 1, 5], "t1", "transfer")
            assert again == [1, 2, None, first[3], {"replayed": True}]
            refused = _call(sock, 3, [0, 1, 5000], "t2", "transfer")
            assert refused[2][0] == 9 and refused[3] is None
            reused = _call(sock, 4, [1, 0, 5], "t1", "transfer")
            assert reused[2][0] == 6
    finally:
        srv.stop()
    files = {"go-ledger": "records.db", "demo": "ledger.db"}
    if server in files:
        with sqlite3.connect(tmp_path / files[server]) as db:
            balances = dict(db.execute("SELECT id, balance FROM accounts WHERE id IN (0, 1)"))
        assert balances == {0: 995, 1: 1005}
