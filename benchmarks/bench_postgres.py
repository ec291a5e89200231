"""PostgresStore beside SQLiteStore, in one run (issue 32).

* ``postgres-group`` / ``postgres-per-call``: 100 goroutines with distinct keys and a
  trivial handler through ``Idempotency.run`` over ``PostgresStore`` (a cluster of the
  benchmark's own: 127.0.0.1, ``fsync`` and ``synchronous_commit`` on), with group
  commit and with one transaction per store operation (``group_commit=False``), on the
  same server and settings; op = one call. The issue asks for group commit at least 8x
  the other.
* ``cpu``: the same load through ``PostgresStore`` and through ``SQLiteStore``
  (``synchronous=FULL``); ``extra_info['server_cpu_us_per_call']`` is this process's
  CPU time (user + system: the application server's) per call, and for Postgres
  ``extra_info['database_cpu_us_per_call']`` the cluster's processes' CPU per call
  (from ``/proc``). The issue asks for the server's within 1.5x SQLite's.
* ``demo``: the ledger demo's server processes (``python -m idempotency.demo server``,
  as ``--store postgres --servers N`` starts them: one port, ``SO_REUSEPORT``) over one
  cluster, driven by the Go load generator's transfers (100 connections, a key per
  call); the servers' CPU per transfer from ``/proc``, all of them summed. The issue
  asks for 2 servers' no higher than 1 server's.
* ``keyed``: the project's keyed RPC server (``rpc_peers.py rpc-postgres``, echo over
  ``PostgresStore``; ``rpc-postgres-one-step`` with echo declared ``one_step``) against
  its Go twin over the same table (``benchmarks/go/ledger -store postgres``, and
  ``-one-step``), each a process of its own with a fresh schema, under the Go load
  generator's keyed calls (100 connections, a fresh key per call, every reply checked);
  server CPU per call from ``/proc``, and the cluster's. Each mode of ours has a twin
  sending the same statements in as many round trips and commits per batch; the issue
  asks for ours within 1.5x its twin's CPU per call (two-step) and 1.2x (one-step).

* ``hot``: the same demo servers (``rpc_peers.py hot``), 1 and 2 of them on one port,
  over a ledger of 20 accounts (hot rows: every batch of one server shares accounts
  with the other's), ``transfer`` two-step and one-step, under the Go load generator's
  transfers for the same duration; the servers' CPU per transfer (all summed), and the
  longest any transaction of theirs waited for a lock (PostgreSQL's own log of lock
  waits: ``log_lock_waits`` with the sessions' ``deadlock_timeout`` at 10 ms, so every
  wait past 10 ms is logged with its length when it ends) and the deadlocks PostgreSQL
  detected. Issue 42 asks for 2 servers' CPU per charge beside 1 server's, no
  deadlock, and no wait past 100 ms.

``extra_info['calls_per_s']`` is the figure. Reproduce::

    .venv/bin/python -m pytest benchmarks/bench_postgres.py --benchmark-json=pg.json

The functions here are the rounds of ``python -m benchmarks --only postgres`` too
(``benchmarks/suites.py``). The Postgres store's I/O parks the batch's goroutine on
gosim's netpoller (psycopg's async API); SQLite's runs on an OS thread a batch.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest

import gosim
from benchmarks.procs import (
    Server,
    drive,
    find_go,
    gc_settings_env,
    go_build,
    gopath_missing,
    run_json,
)
from idempotency import Call, Idempotency, SQLiteStore
from idempotency.stores import Store
from idempotency.stores.pgcluster import PG_BIN, PostgresCluster

GOROUTINES = 100
#: The ledger's accounts in the demo's rounds (as the rpc suite's demo row).
ACCOUNTS = 100
PEERS = Path(__file__).parent / "rpc_peers.py"
#: The keyed rounds' servers: the Go twin of the keyed server over PostgreSQL in each of
#: our two modes, and ours in each (two-step: claim and completion commit apart).
KEYED = ("go-ledger-postgres", "go-ledger-postgres-one-step", "rpc-postgres",
         "rpc-postgres-one-step")  # fmt: skip
GO_TWINS = frozenset({"go-ledger-postgres", "go-ledger-postgres-one-step"})


def missing() -> str | None:
    """Why the PostgreSQL rounds cannot run here (None: they can)."""
    if PG_BIN is None:
        return "PostgreSQL is not installed (.ci/run installs it with apt)"
    try:
        import psycopg  # noqa: F401, PLC0415
    except ImportError:
        return "PostgresStore needs psycopg 3 (pip install -e '.[postgres]')"
    return None


@contextlib.contextmanager
def cluster() -> Iterator[PostgresCluster]:
    """A throwaway cluster of this process's own (``idempotency.stores.pgcluster``), stopped
    and removed at the end (its watchdog stops it if this process dies first)."""
    why = missing()
    if why is not None:
        raise RuntimeError(why)
    server = PostgresCluster()
    server.start()
    try:
        yield server
    finally:
        server.destroy()


async def _trivial(call: Call) -> int:
    return 1


async def _load(store: Store, n: int, tag: str) -> float:
    """``n`` calls from GOROUTINES goroutines with distinct keys; seconds taken."""
    idem = Idempotency(store)
    done: gosim.Chan[None] = gosim.Chan(GOROUTINES)
    per = n // GOROUTINES

    async def worker(w: int) -> None:
        for i in range(per):
            await idem.run(
                caller="bench", key=f"{tag}-{w}-{i}", request=("op", [w, i]), handler=_trivial
            )
        await done.send(None)

    t0 = time.perf_counter()
    for w in range(GOROUTINES):
        gosim.go(worker, w)
    for _ in range(GOROUTINES):
        await done.recv()
    return time.perf_counter() - t0


def cluster_cpu(server: PostgresCluster) -> float:
    """CPU seconds (user + system) of every process of the cluster so far: the
    postmaster and its children, found through ``/proc``."""
    postmaster = server.postmaster_pid()
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(pid) == postmaster or int(fields[1]) == postmaster:
            total += (int(fields[11]) + int(fields[12])) / tick
    return total


def postgres_round(server: PostgresCluster, n: int, group: bool) -> tuple[float, float, float]:
    """``n`` calls through a fresh ``PostgresStore`` (a schema of its own) on ``server``,
    with group commit or one transaction per store operation: calls/s, this process's CPU
    us a call, the cluster's CPU us a call."""
    from idempotency import PostgresStore  # noqa: PLC0415 -- needs psycopg

    store = PostgresStore(
        server.dsn, schema=f"b{time.monotonic_ns()}", group_commit=group, sweep_every=0
    )
    cpu0, db0 = time.process_time(), cluster_cpu(server)
    seconds = gosim.run(_load, store, n, "pg")
    cpu, db = time.process_time() - cpu0, cluster_cpu(server) - db0
    store.close()
    return n / seconds, cpu / n * 1e6, db / n * 1e6


def sqlite_round(directory: str, n: int) -> tuple[float, float]:
    """The same load through a fresh durable ``SQLiteStore`` (WAL, ``synchronous=FULL``,
    group commit) in ``directory``: calls/s and this process's CPU us a call."""
    path = os.path.join(directory, f"s{time.monotonic_ns()}.db")
    store = SQLiteStore(path)
    cpu0 = time.process_time()
    seconds = gosim.run(_load, store, n, "s")
    cpu = time.process_time() - cpu0
    store.close()
    for suffix in ("", "-wal", "-shm"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path + suffix)
    return n / seconds, cpu / n * 1e6


class _Counters:
    """Reads a demo server's stdout as it comes (a JSON line of its counters every half
    second: so a long round never fills the pipe and stalls the server), keeping the
    latest line's store counters and when it came."""

    def __init__(self, srv: Server) -> None:
        assert srv.proc.stdout is not None
        self._out = srv.proc.stdout
        self._cond = threading.Condition()
        self.latest: dict[str, Any] = {}
        self.at = 0.0
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        for line in self._out:
            with contextlib.suppress(ValueError, AttributeError):
                counters = json.loads(line)["server"]
                with self._cond:
                    self.latest, self.at = counters, time.monotonic()
                    self._cond.notify_all()

    def after(self, moment: float, timeout: float = 2.0) -> dict[str, Any]:
        """The first counters printed after ``moment`` (the latest when none came in
        ``timeout`` seconds)."""
        with self._cond:
            self._cond.wait_for(lambda: self.at > moment, timeout)
            return dict(self.latest)


def demo_round(
    server: PostgresCluster, go_rpc: Path, servers: int, calls: int, env: dict[str, str]
) -> dict[str, float]:
    """The ledger demo over ``server``: a fresh ledger of ACCOUNTS accounts under a schema
    of its own, ``servers`` demo server processes on one port (``SO_REUSEPORT`` when
    more than one, as ``python -m idempotency.demo --servers N`` runs them), then the Go
    load generator's transfers: 100 connections, ``calls`` keyed transfers each, every
    reply checked. Transfers/s, the servers' CPU us per transfer (``/proc``, all summed),
    the cluster's, and the store operations per commit (the servers' own counters, as
    the demo reports them)."""
    from idempotency.demo._ledger import LedgerSpec, create_ledger  # noqa: PLC0415

    spec = LedgerSpec("postgres", url=server.dsn, prefix=f"bench_demo_{time.monotonic_ns()}")
    create_ledger(spec, ACCOUNTS)
    cmd = [sys.executable, "-m", "idempotency.demo", "server", *spec.args(),
           "--heartbeat", "10", "--max-connections", "1000"]  # fmt: skip
    reuse = ["--reuse-port"] if servers > 1 else []
    started: list[tuple[Server, _Counters]] = []
    try:
        for i in range(servers):
            addr = "127.0.0.1:0" if i == 0 else started[0][0].addr
            srv = Server([*cmd, "--addr", addr, *reuse], env=env)
            started.append((srv, _Counters(srv)))
        before, db0 = sum(s.cpu_seconds() for s, _ in started), cluster_cpu(server)
        load = [str(go_rpc), "rr", "-addr", started[0][0].addr, "-calls", str(calls), "-key",
                "-transfer", str(ACCOUNTS)]  # fmt: skip
        r = run_json(load, env)
        cpu = sum(s.cpu_seconds() for s, _ in started) - before
        db = cluster_cpu(server) - db0
        ended = time.monotonic()
        # the servers' own counters since they started: the round's store work alone
        counters = [c.after(ended) for _, c in started]
        dead = [s.stderr_tail() for s, _ in started if s.proc.poll() is not None]
    finally:
        for srv, reader in started:
            if srv.proc.poll() is None:
                srv.proc.kill()  # our own child, by its PID
            srv.proc.wait(timeout=30)
            reader.thread.join(timeout=10)
            srv.stop()
        server.sql(f'DROP SCHEMA IF EXISTS "{spec.prefix}" CASCADE')
    if dead:
        raise RuntimeError(f"a demo server died during the round: {dead[0]}")
    want = 100 * calls
    if r["calls"] != want:
        raise AssertionError(f"{r['calls']} transfers answered, want {want}")
    ops = sum(c.get("store_ops", 0) for c in counters)
    batches = sum(c.get("store_batches", 0) for c in counters)
    return {
        "calls_per_s": r["calls_per_s"],
        "server_cpu_us_per_call": cpu * 1e6 / want,
        "database_cpu_us_per_call": db * 1e6 / want,
        "store_ops_per_commit": ops / batches if batches else 0.0,
    }


#: The hot-rows rounds' ledger: every transfer is between two of these accounts.
HOT_ACCOUNTS = 20
#: The hot-rows servers' sessions log every lock wait longer than this (their
#: ``deadlock_timeout``, a superuser's setting: the throwaway cluster's user is one).
LOCK_LOG_MS = 10
_WAITED = re.compile(rb"acquired \S+ on .* after ([0-9.]+) ms")


def hot_round(
    server: PostgresCluster,
    go_rpc: Path,
    servers: int,
    one_step: bool,
    seconds: float,
    env: dict[str, str],
) -> dict[str, float]:
    """The ledger demo's ``transfer`` over a fresh ledger of HOT_ACCOUNTS accounts:
    ``servers`` server processes on one port (``SO_REUSEPORT``), the Go load generator's
    100 connections for ``seconds``, every reply checked. Transfers/s, the servers' CPU
    us per transfer (``/proc``, all summed), the longest lock wait any of their
    transactions logged (0 when none passed LOCK_LOG_MS), and the deadlocks PostgreSQL
    detected in the round."""
    from idempotency.demo._ledger import (  # noqa: PLC0415
        LedgerSpec,
        create_ledger,
        postgres_deadlocks,
    )

    schema = f"bench_hot_{time.monotonic_ns()}"
    spec = LedgerSpec("postgres", url=server.dsn, prefix=schema)
    create_ledger(spec, HOT_ACCOUNTS)
    options = f"-c deadlock_timeout={LOCK_LOG_MS}ms -c log_lock_waits=on"
    dsn = f"{server.dsn}?options={urllib.parse.quote(options)}"
    log = Path(server.dir) / "log"
    log_from = log.stat().st_size
    deadlocks0 = postgres_deadlocks(spec)  # the demo's own count, as its report shows
    cmd = [sys.executable, str(PEERS), "hot", dsn, schema,
           "one-step" if one_step else "two-step"]  # fmt: skip
    started: list[Server] = []
    try:
        for i in range(servers):
            started.append(Server([*cmd, "127.0.0.1:0" if i == 0 else started[0].addr], env=env))
        before = sum(s.cpu_seconds() for s in started)
        load = [str(go_rpc), "rr", "-addr", started[0].addr, "-seconds", f"{seconds:g}",
                "-key", "-transfer", str(HOT_ACCOUNTS)]  # fmt: skip
        r = run_json(load, env)
        cpu = sum(s.cpu_seconds() for s in started) - before
        dead = [s.stderr_tail() for s in started if s.proc.poll() is not None]
    finally:
        for srv in started:
            srv.stop()
        server.sql(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    if dead:
        raise RuntimeError(f"a hot-rows server died during the round: {dead[0]}")
    if r["min_calls"] < 1:
        raise AssertionError(f"a connection made no transfer in {seconds:g} s")
    with log.open("rb") as f:
        f.seek(log_from)
        logged = f.read()
    waits = [float(m) for m in _WAITED.findall(logged)]
    return {
        "calls_per_s": r["calls_per_s"],
        "server_cpu_us_per_call": cpu * 1e6 / r["calls"],
        "longest_lock_wait_ms": max(waits, default=0.0),
        "deadlocks": float(postgres_deadlocks(spec) - deadlocks0),
    }


def keyed_missing(kind: str) -> str | None:
    """Why keyed server ``kind`` cannot run here (None: it can): PostgreSQL and psycopg,
    Go for the load generator, and for the twin Debian's Go with lib/pq."""
    why = missing()
    if why is None and find_go() is None:
        why = "Go toolchain not installed (CI installs golang-go)"
    if why is None and kind in GO_TWINS:
        why = gopath_missing("ledger")
    return why


def keyed_server_cmd(kind: str, dsn: str, schema: str, go_ledger: Path | None) -> list[str]:
    """The command line of keyed server ``kind`` over the cluster at ``dsn``, its records
    under ``schema`` (each server creates its tables there, as PostgresStore does)."""
    if kind in GO_TWINS:
        assert go_ledger is not None
        one_step = ["-one-step"] if kind.endswith("-one-step") else []
        return [str(go_ledger), "server", "-addr", "127.0.0.1:0", "-store", "postgres",
                "-dsn", dsn, "-schema", schema, *one_step]  # fmt: skip
    return [sys.executable, str(PEERS), kind, dsn, schema]


def keyed_round(
    server: PostgresCluster,
    kind: str,
    go_rpc: Path,
    go_ledger: Path | None,
    seconds: float,
    env: dict[str, str],
) -> dict[str, float]:
    """One keyed round on a fresh server of ``kind`` over ``server``, its records under a
    schema of its own (dropped after): the Go load generator's 100 connections, one call
    in flight each, for ``seconds`` (the same for every peer), each call with a fresh
    key, every reply checked. Calls/s, the server's CPU us per call (``/proc``, around
    the load alone: not its start-up) and the cluster's."""
    schema = f"bench_keyed_{time.monotonic_ns()}"
    srv = Server(keyed_server_cmd(kind, server.dsn, schema, go_ledger), env=env)
    try:
        db0 = cluster_cpu(server)
        load = [str(go_rpc), "rr", "-addr", srv.addr, "-seconds", f"{seconds:g}", "-key"]
        r = drive(srv, load, env)
        db = cluster_cpu(server) - db0
        if srv.proc.poll() is not None:
            raise RuntimeError(f"{kind} died during the round: {srv.stderr_tail()}")
    finally:
        srv.stop()
        server.sql(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    if r["min_calls"] < 1:
        raise AssertionError(f"{kind}: a connection made no call in {seconds:g} s")
    return {
        "calls_per_s": r["calls_per_s"],
        "server_cpu_us_per_call": r["server_cpu_us_per_op"],
        "database_cpu_us_per_call": db * 1e6 / r["calls"],
    }


@pytest.fixture(scope="module")
def pg() -> Iterator[PostgresCluster]:
    why = missing()
    if why is not None:
        pytest.skip(why)
    with cluster() as server:
        yield server


@pytest.mark.parametrize("mode", ["group", "per-call"])
def bench_postgres_group_commit(benchmark: Any, pg: PostgresCluster, mode: str) -> None:
    n = 400 if benchmark.disabled else (4000 if mode == "group" else 1000)
    benchmark.group = "idem-postgres"
    rates: list[float] = []

    def once() -> None:
        rates.append(postgres_round(pg, n, mode == "group")[0])

    benchmark.pedantic(once, rounds=1 if benchmark.disabled else 3, iterations=1)
    benchmark.extra_info["calls_per_s"] = sorted(rates)[len(rates) // 2]


@pytest.mark.parametrize("store", ["postgres", "sqlite"])
def bench_server_cpu_per_call(benchmark: Any, pg: PostgresCluster, store: str) -> None:
    n = 400 if benchmark.disabled else 4000
    benchmark.group = "idem-postgres-cpu"
    rows: list[tuple[float, float, float]] = []

    def once() -> None:
        if store == "postgres":
            rows.append(postgres_round(pg, n, True))
            return
        with tempfile.TemporaryDirectory(prefix="bench-pg-") as directory:
            rows.append((*sqlite_round(directory, n), 0.0))

    benchmark.pedantic(once, rounds=1 if benchmark.disabled else 3, iterations=1)
    rate, cpu, db = sorted(rows)[len(rows) // 2]
    benchmark.extra_info["calls_per_s"] = rate
    benchmark.extra_info["server_cpu_us_per_call"] = cpu
    if store == "postgres":
        benchmark.extra_info["database_cpu_us_per_call"] = db


@pytest.fixture(scope="module")
def go_rpc(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from benchmarks.procs import find_go  # noqa: PLC0415

    if find_go() is None:
        pytest.skip("Go toolchain not installed (CI installs golang-go)")
    return go_build("rpc", tmp_path_factory.mktemp("gorpc") / "rpc")


@pytest.mark.parametrize("servers", [1, 2])
def bench_demo_servers(benchmark: Any, pg: PostgresCluster, go_rpc: Path, servers: int) -> None:
    """The ledger demo's servers over one Postgres: server CPU per transfer, all summed."""
    calls = 5 if benchmark.disabled else 100
    benchmark.group = "idem-postgres-demo"
    env = {**os.environ, **gc_settings_env()}
    result: dict[str, float] = {}
    benchmark.pedantic(
        lambda: result.update(demo_round(pg, go_rpc, servers, calls, env)),
        rounds=1,
        iterations=1,
    )
    benchmark.extra_info.update({k: round(v, 2) for k, v in result.items()})
    assert result["calls_per_s"] > 0


@pytest.mark.parametrize("one_step", [False, True], ids=["two-step", "one-step"])
@pytest.mark.parametrize("servers", [1, 2])
def bench_hot_rows(
    benchmark: Any, pg: PostgresCluster, go_rpc: Path, servers: int, one_step: bool
) -> None:
    """Transfers on 20 hot accounts, 1 and 2 servers: CPU per transfer, lock waits."""
    from benchmarks.bench_rpc import KEYED_SECONDS, KEYED_SMOKE_SECONDS  # noqa: PLC0415

    seconds = KEYED_SMOKE_SECONDS if benchmark.disabled else KEYED_SECONDS
    benchmark.group = "idem-postgres-hot"
    env = {**os.environ, **gc_settings_env()}
    result: dict[str, float] = {}
    benchmark.pedantic(
        lambda: result.update(hot_round(pg, go_rpc, servers, one_step, seconds, env)),
        rounds=1,
        iterations=1,
    )
    benchmark.extra_info.update({k: round(v, 2) for k, v in result.items()})
    assert result["calls_per_s"] > 0
    assert result["deadlocks"] == 0


def _keyed_peer(request: pytest.FixtureRequest, kind: str) -> Path | None:
    """Skip when ``kind`` cannot run here; the twin's binary when it is one."""
    why = keyed_missing(kind)
    if why is not None:
        pytest.skip(why)
    return request.getfixturevalue("go_ledger") if kind in GO_TWINS else None


@pytest.mark.parametrize("server", KEYED)
def bench_keyed_calls_over_postgres(
    benchmark: Any, request: pytest.FixtureRequest, pg: PostgresCluster, go_rpc: Path, server: str
) -> None:
    """Our keyed server over PostgresStore and its Go twin: server CPU per call."""
    from benchmarks.bench_rpc import KEYED_SECONDS, KEYED_SMOKE_SECONDS  # noqa: PLC0415

    ledger = _keyed_peer(request, server)
    seconds = KEYED_SMOKE_SECONDS if benchmark.disabled else KEYED_SECONDS
    benchmark.group = "idem-postgres-keyed"
    env = {**os.environ, "GOMAXPROCS": "1", **gc_settings_env()}
    result: dict[str, float] = {}
    benchmark.pedantic(
        lambda: result.update(keyed_round(pg, server, go_rpc, ledger, seconds, env)),
        rounds=1,
        iterations=1,
    )
    benchmark.extra_info.update({k: round(v, 2) for k, v in result.items()})
    assert result["calls_per_s"] > 0


@pytest.mark.parametrize("server", KEYED)
def bench_keyed_postgres_peers_record_replay_and_refuse(
    request: pytest.FixtureRequest, pg: PostgresCluster, go_rpc: Path, server: str
) -> None:
    """Every keyed peer over PostgreSQL keeps the protocol the row compares (a first
    call runs, the same key and request replays, the same key with another request gets
    ALREADY_EXISTS), and leaves completed records that PostgresStore itself reads back:
    the outcome's msgpack, fencing tokens that grow with each claim."""
    from benchmarks.bench_rpc import check_keyed_protocol  # noqa: PLC0415
    from idempotency import PostgresStore  # noqa: PLC0415

    ledger = _keyed_peer(request, server)
    schema = f"check_{time.monotonic_ns()}"
    env = {**os.environ, "GOMAXPROCS": "1", **gc_settings_env()}
    srv = Server(keyed_server_cmd(server, pg.dsn, schema, ledger), env=env)
    try:
        check_keyed_protocol(srv.addr)
    finally:
        srv.stop()
    store = PostgresStore(pg.dsn, schema=schema)
    try:
        held = [gosim.run(store.inspect, "t", key) for key in ("k1", "k2")]
    finally:
        store.close()
        pg.sql(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    records = [h.record for h in held if h is not None]
    assert len(records) == 2 and all(h.state == "COMPLETED" for h in held if h is not None)
    assert [msgpack.unpackb(r.payload) for r in records if r.payload is not None] == [
        [1, "a"],
        [2, "b"],
    ]
    assert all(r.ok for r in records) and 0 < records[0].fence < records[1].fence
