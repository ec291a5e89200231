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

``extra_info['calls_per_s']`` is the figure. Reproduce::

    .venv/bin/python -m pytest benchmarks/bench_postgres.py --benchmark-json=pg.json

The Postgres store's I/O parks the batch's goroutine on gosim's netpoller (psycopg's
async API); SQLite's runs on an OS thread a batch.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import pytest

import gosim
from idempotency import Call, Idempotency, SQLiteStore
from idempotency.stores import Store

GOROUTINES = 100


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


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    try:
        from tests.idempotency.conftest import PG_BIN, PostgresServer  # noqa: PLC0415
    except ImportError as exc:
        pytest.skip(f"needs the tests' PostgreSQL fixture and psycopg: {exc}")
    if PG_BIN is None:
        pytest.skip("PostgreSQL is not installed (.ci/run installs it with apt)")
    server = PostgresServer()
    server.start()
    try:
        yield server
    finally:
        server.destroy()


def _cluster_cpu(server: Any) -> float:
    """CPU seconds (user + system) of every process of the cluster so far: the
    postmaster's children, found through ``/proc``."""
    with open(os.path.join(server.data, "postmaster.pid")) as f:
        postmaster = int(f.readline())
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


def _postgres_run(server: Any, n: int, group: bool) -> tuple[float, float, float]:
    """Calls/s, this process's CPU us a call, the cluster's CPU us a call."""
    from idempotency import PostgresStore  # noqa: PLC0415 -- needs psycopg

    store = PostgresStore(
        server.dsn, schema=f"b{time.monotonic_ns()}", group_commit=group, sweep_every=0
    )
    cpu0, db0 = time.process_time(), _cluster_cpu(server)
    seconds = gosim.run(_load, store, n, "pg")
    cpu, db = time.process_time() - cpu0, _cluster_cpu(server) - db0
    store.close()
    return n / seconds, cpu / n * 1e6, db / n * 1e6


@pytest.mark.parametrize("mode", ["group", "per-call"])
def bench_postgres_group_commit(benchmark: Any, cluster: Any, mode: str) -> None:
    n = 400 if benchmark.disabled else (4000 if mode == "group" else 1000)
    benchmark.group = "idem-postgres"
    rates: list[float] = []

    def once() -> None:
        rates.append(_postgres_run(cluster, n, mode == "group")[0])

    benchmark.pedantic(once, rounds=1 if benchmark.disabled else 3, iterations=1)
    benchmark.extra_info["calls_per_s"] = sorted(rates)[len(rates) // 2]


@pytest.mark.parametrize("store", ["postgres", "sqlite"])
def bench_server_cpu_per_call(benchmark: Any, cluster: Any, store: str) -> None:
    n = 400 if benchmark.disabled else 4000
    benchmark.group = "idem-postgres-cpu"
    rows: list[tuple[float, float, float]] = []

    def once() -> None:
        if store == "postgres":
            rows.append(_postgres_run(cluster, n, True))
            return
        with tempfile.TemporaryDirectory(prefix="bench-pg-") as directory:
            sqlite = SQLiteStore(os.path.join(directory, "s.db"))
            cpu0 = time.process_time()
            seconds = gosim.run(_load, sqlite, n, "s")
            cpu = time.process_time() - cpu0
            sqlite.close()
        rows.append((n / seconds, cpu / n * 1e6, 0.0))

    benchmark.pedantic(once, rounds=1 if benchmark.disabled else 3, iterations=1)
    rate, cpu, db = sorted(rows)[len(rows) // 2]
    benchmark.extra_info["calls_per_s"] = rate
    benchmark.extra_info["server_cpu_us_per_call"] = cpu
    if store == "postgres":
        benchmark.extra_info["database_cpu_us_per_call"] = db
