"""Idempotent calls through each store, side by side in one run (issue 14).

* ``sqlite``: 100 goroutines with distinct keys and a trivial handler through
  ``SQLiteStore`` (WAL, ``synchronous=FULL``: every commit fsynced), with group commit
  and with one transaction per store operation (``group_commit=False``); op = one call.
* ``replay``: the same load through the group-committed store, first calls then the same
  keys again (replays); op = one call.
* ``redis``: the same load through ``RedisStore`` against a local redis-server of the
  benchmark's own (127.0.0.1, free port, no persistence); op = one call.
* ``memory``: one goroutine, distinct keys: ``Idempotency.run`` over ``MemoryStore``
  against awaiting the handler directly; op = one call, the difference is the overhead.
* ``sqlite_raw``: the ceiling under the SQLite figure, with no idempotency code: plain
  ``sqlite3`` transactions of 1 and of 50 upserted rows (a completion batch at 100
  goroutines) in the same file settings; op = one row. A call needs a durable row of
  its own, so rows/s in transactions of 50 bounds calls/s.
* ``redis_raw``: the ceiling under the Redis figure: ``RedisStore``'s batches (100
  claims, then their 100 completions) applied in a plain loop, without the scheduler;
  op = one call. ``extra_info['server_us_per_call']`` is redis-server's own time for a
  call's Lua (its ``INFO commandstats``), which bounds calls/s from the server's side.

``extra_info['calls_per_s']`` / ``extra_info['ns_per_call']`` are the figures. Reproduce::

    .venv/bin/python -m pytest benchmarks/bench_idempotency.py --benchmark-json=idem.json

Wall-clock figures on a shared machine move by 2x between minutes; the instructions a
call costs do not. Run as a script, this file runs one workload of N calls for
callgrind, and ``(Ir(N2) - Ir(N1)) / (N2 - N1)`` is the count per call (start-up cancels
out; the redis-server process is not traced)::

    for n in 2000 12000; do
      PYTHONHASHSEED=0 valgrind --tool=callgrind --callgrind-out-file=/dev/null \
          .venv/bin/python benchmarks/bench_idempotency.py sqlite $n 2>&1 | grep Collected
    done

Workloads: ``direct``, ``memory`` (one goroutine), ``sqlite``, ``sqlite-txn``
(``group_commit=False``) and ``redis`` (100 goroutines, distinct keys).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import gosim
from idempotency import Call, Idempotency, MemoryStore, SQLiteStore
from idempotency.stores import Store

GOROUTINES = 100


def _calls(benchmark: Any, full: int) -> int:
    return 400 if benchmark.disabled else full


async def _trivial(call: Call) -> int:
    return 1


async def _load(store: Store, n: int, tag: str, replay_too: bool) -> tuple[float, float]:
    """``n`` calls from GOROUTINES goroutines with distinct keys; seconds for the first
    pass, and for a second pass over the same keys (replays) when asked."""
    idem = Idempotency(store)
    done: gosim.Chan[None] = gosim.Chan(GOROUTINES)
    per = n // GOROUTINES

    async def worker(w: int) -> None:
        for i in range(per):
            await idem.run(
                caller="bench", key=f"{tag}-{w}-{i}", request=("op", [w, i]), handler=_trivial
            )
        await done.send(None)

    times = []
    for _ in range(2 if replay_too else 1):
        t0 = time.perf_counter()
        for w in range(GOROUTINES):
            gosim.go(worker, w)
        for _ in range(GOROUTINES):
            await done.recv()
        times.append(time.perf_counter() - t0)
    return times[0], times[-1]


def sqlite_rate(directory: str, mode: str, n: int) -> float:
    """Calls/s of ``n`` calls through a fresh durable SQLite store in ``directory``, with
    group commit (``mode`` "group-commit") or one transaction per operation."""
    path = os.path.join(directory, f"{mode}-{time.monotonic_ns()}.db")
    store = SQLiteStore(path, group_commit=mode == "group-commit")
    first, _ = gosim.run(_load, store, n, mode, False)
    store.close()
    return n / first


def replay_rates(directory: str, n: int) -> tuple[float, float]:
    """Calls/s of ``n`` first calls, then of the same keys again (replays), through a
    fresh group-committed SQLite store."""
    path = os.path.join(directory, f"replay-{time.monotonic_ns()}.db")
    store = SQLiteStore(path)
    first, replay = gosim.run(_load, store, n, "r", True)
    store.close()
    return n / first, n / replay


def redis_rate(url: str, n: int) -> float:
    """Calls/s of ``n`` calls through ``RedisStore`` at ``url`` (a fresh key prefix)."""
    from idempotency import RedisStore  # noqa: PLC0415 -- needs redis-py

    store = RedisStore(url, prefix=f"b{time.monotonic_ns()}:")
    first, _ = gosim.run(_load, store, n, "redis", False)
    store.close()
    return n / first


@contextlib.contextmanager
def redis_server(directory: str) -> Iterator[str]:
    """A redis-server of our own on 127.0.0.1 (a free port, no persistence); its URL.
    Killed by its PID on exit, and with this process if it dies first."""
    with redis_process(directory) as (url, _pid):
        yield url


@contextlib.contextmanager
def redis_process(directory: str) -> Iterator[tuple[str, int]]:
    """:func:`redis_server`'s server, with its PID (to read its CPU time)."""
    server = shutil.which("redis-server")
    if server is None:
        raise FileNotFoundError("redis-server is not installed (.ci/run installs it with apt)")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    setpriv = shutil.which("setpriv")  # the server dies with the benchmark process
    die_with_parent = [setpriv, "--pdeathsig", "KILL"] if setpriv else []
    proc = subprocess.Popen(
        [*die_with_parent, server, "--bind", "127.0.0.1", "--port", str(port),
         "--dir", directory, "--save", "", "--appendonly", "no", "--loglevel", "warning"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("redis-server did not start") from None
                time.sleep(0.02)
        yield f"redis://127.0.0.1:{port}/0", proc.pid
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


async def _memory(n: int, direct: bool) -> float:
    keys = [f"k{i}" for i in range(n)]
    args = [1, 2]
    if direct:
        t0 = time.perf_counter()
        for _key in keys:
            await _trivial(None)  # type: ignore[arg-type]
        return time.perf_counter() - t0
    idem = Idempotency(MemoryStore())
    t0 = time.perf_counter()
    for key in keys:
        await idem.run(caller="bench", key=key, request=("op", args), handler=_trivial)
    return time.perf_counter() - t0


def memory_ns_per_call(n: int, direct: bool) -> float:
    """ns a call: ``Idempotency.run`` over MemoryStore, or the handler awaited directly."""
    seconds: float = gosim.run(_memory, n, direct)
    return seconds / n * 1e9


# ------------------------------------------------------------------ the pytest items


@pytest.fixture(scope="module")
def tmpdir_module() -> Iterator[str]:
    d = tempfile.mkdtemp(prefix="bench-idem-")
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _median_of(benchmark: Any, one: Callable[[], float], rounds: int) -> float:
    got: list[float] = []
    benchmark.pedantic(
        lambda: got.append(one()), rounds=1 if benchmark.disabled else rounds, iterations=1
    )
    return sorted(got)[len(got) // 2]


@pytest.mark.parametrize("mode", ["group-commit", "txn-per-op"])
def bench_sqlite(benchmark: Any, mode: str, tmpdir_module: str) -> None:
    n = _calls(benchmark, 20_000 if mode == "group-commit" else 2_000)
    benchmark.group = "idem-sqlite-durable"
    rate = _median_of(benchmark, lambda: sqlite_rate(tmpdir_module, mode, n), 3)
    benchmark.extra_info["calls_per_s"] = rate


@pytest.mark.parametrize("phase", ["first", "replay"])
def bench_replay(benchmark: Any, phase: str, tmpdir_module: str) -> None:
    n = _calls(benchmark, 20_000)
    benchmark.group = "idem-sqlite-replay"
    which = 0 if phase == "first" else 1
    rate = _median_of(benchmark, lambda: replay_rates(tmpdir_module, n)[which], 3)
    benchmark.extra_info["calls_per_s"] = rate


@pytest.fixture(scope="module")
def redis_url(tmpdir_module: str) -> Iterator[str]:
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed (.ci/run installs it with apt)")
    with redis_server(tmpdir_module) as url:
        yield url


def bench_redis(benchmark: Any, redis_url: str) -> None:
    n = _calls(benchmark, 20_000)
    benchmark.group = "idem-redis"
    benchmark.extra_info["calls_per_s"] = _median_of(benchmark, lambda: redis_rate(redis_url, n), 3)


_UPSERT = (
    "INSERT INTO t (caller, key, payload) VALUES ('bench', ?, x'01')"
    " ON CONFLICT (caller, key) DO UPDATE SET payload = excluded.payload"
)


@pytest.mark.parametrize("rows", [1, 50])
def bench_sqlite_raw(benchmark: Any, rows: int, tmpdir_module: str) -> None:
    benchmark.group = "idem-sqlite-durable"
    seconds = 0.3 if benchmark.disabled else 3.0
    rates: list[float] = []

    def once() -> None:
        path = os.path.join(tmpdir_module, f"raw-{time.monotonic_ns()}.db")
        conn = sqlite3.connect(path, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute(
            "CREATE TABLE t (caller TEXT, key TEXT, payload BLOB,"
            " PRIMARY KEY (caller, key)) WITHOUT ROWID"
        )
        done = 0
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            conn.execute("BEGIN IMMEDIATE")
            conn.executemany(_UPSERT, [(f"k{done + i}",) for i in range(rows)])
            conn.execute("COMMIT")
            done += rows
        rates.append(done / (time.perf_counter() - t0))
        conn.close()

    benchmark.pedantic(once, rounds=1 if benchmark.disabled else 3, iterations=1)
    benchmark.extra_info["rows_per_s"] = sorted(rates)[len(rates) // 2]


def _taken(op: Any) -> Any:
    """An operation's result as ``apply_batch`` left it, or its error raised."""
    if op.error is not None:
        raise op.error
    return op.result


def bench_redis_raw(benchmark: Any, redis_url: str) -> None:
    import redis  # noqa: PLC0415 -- needs redis-py

    from idempotency import RedisStore  # noqa: PLC0415
    from idempotency._keys import fingerprint  # noqa: PLC0415
    from idempotency.stores import Completion  # noqa: PLC0415
    from idempotency.stores._batch import Op  # noqa: PLC0415

    benchmark.group = "idem-redis"
    seconds = 0.3 if benchmark.disabled else 3.0
    rates: list[float] = []
    server_us: list[float] = []
    fp = fingerprint("op", [1, 2])
    done_payload = Completion(True, b"\x01", None, 86400.0, 1 << 20)
    admin = redis.Redis.from_url(redis_url)

    def lua_us() -> float:
        stats = admin.info("commandstats").get("cmdstat_evalsha", {"usec": 0})
        return float(stats["usec"])

    def once() -> None:
        store = RedisStore(redis_url, prefix=f"raw{time.monotonic_ns()}:")
        done = 0
        us0 = lua_us()
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            claims = [Op(0, ("bench", f"k{done + i}", fp, 60.0)) for i in range(GOROUTINES)]
            store._apply_batch(claims)
            completions = [
                Op(1, ("bench", f"k{done + i}", _taken(c).record.fence, done_payload))
                for i, c in enumerate(claims)
            ]
            store._apply_batch(completions)
            for c in completions:
                _taken(c)
            done += GOROUTINES
        rates.append(done / (time.perf_counter() - t0))
        server_us.append((lua_us() - us0) / done)
        store.close()

    benchmark.pedantic(once, rounds=1 if benchmark.disabled else 3, iterations=1)
    benchmark.extra_info["calls_per_s"] = sorted(rates)[len(rates) // 2]
    benchmark.extra_info["server_us_per_call"] = sorted(server_us)[len(server_us) // 2]
    admin.close()


@pytest.mark.parametrize("path", ["direct", "memory-store"])
def bench_memory(benchmark: Any, path: str) -> None:
    n = _calls(benchmark, 100_000)
    benchmark.group = "idem-memory"
    ns = _median_of(benchmark, lambda: memory_ns_per_call(n, path == "direct"), 5)
    benchmark.extra_info["ns_per_call"] = ns


def main(argv: list[str]) -> None:
    """``WORKLOAD N``: run N calls of one workload (see the module docstring)."""
    workload, n = argv[0], int(argv[1])
    directory = tempfile.mkdtemp(prefix="bench-idem-")
    try:
        if workload in ("direct", "memory"):
            gosim.run(_memory, n, workload == "direct")
        elif workload in ("sqlite", "sqlite-txn"):
            sqlite = SQLiteStore(os.path.join(directory, "s.db"), group_commit=workload == "sqlite")
            gosim.run(_load, sqlite, n, "s", False)
            sqlite.close()
        elif workload == "redis":
            from idempotency import RedisStore  # noqa: PLC0415 -- needs redis-py

            with redis_server(directory) as url:
                store = RedisStore(url)
                gosim.run(_load, store, n, "r", False)
                store.close()
        else:
            raise SystemExit(f"unknown workload {workload!r}")
    finally:
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
