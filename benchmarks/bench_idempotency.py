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

``extra_info['calls_per_s']`` / ``extra_info['ns_per_call']`` are the figures. Reproduce::

    .venv/bin/python -m pytest benchmarks/bench_idempotency.py --benchmark-json=idem.json
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
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
        yield f"redis://127.0.0.1:{port}/0"
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
    seconds: float = gosim.run(_memory, n, direct, procs=1)
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


@pytest.mark.parametrize("path", ["direct", "memory-store"])
def bench_memory(benchmark: Any, path: str) -> None:
    n = _calls(benchmark, 100_000)
    benchmark.group = "idem-memory"
    ns = _median_of(benchmark, lambda: memory_ns_per_call(n, path == "direct"), 5)
    benchmark.extra_info["ns_per_call"] = ns
