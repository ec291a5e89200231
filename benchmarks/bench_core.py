"""The gosim core against trio, asyncio, gevent and Go, five workloads side by side.

Run: ``pytest benchmarks/bench_core.py --benchmark-json=core.json`` (real timings), then
``python benchmarks/report_core.py core.json`` prints the per-op table and gosim's
ratios. ``--benchmark-disable`` runs every case once at a small size (the CI smoke run);
``BENCH_CORE_QUICK=1`` uses the small sizes with timing on.

Groups (one per workload; each op is what ``ns_per_op`` is per):

* ``spawn-join`` (op = a spawn): 100,000 goroutines, each doing trivial work (``i * 2``)
  and signalling done on a channel with room for all; join = receive all 100,000.
* ``pingpong`` (op = a round trip): two goroutines, two unbuffered channels.
* ``buffered`` (op = an item): one producer, one consumer, a channel of capacity 1024.
* ``ring`` (op = a hop): 1,000 goroutines on unbuffered channels pass a token that
  counts down the hops left.
* ``select2`` (op = a select that received): one goroutine selects over two unbuffered
  channels fed by two producers, dropping a channel (Go's nil) once it is closed.

Peers, and what stands in where a library lacks the Go construct:

* ``gosim``: the public API (``run``, ``go``, ``Chan``, ``select``, ``recv``) as users
  run it: ``gosim.run``'s default ``procs`` (the CPU count); ``gosim-p1`` beside it with
  ``procs=1``. ``BENCH_CORE_GOSIM_PROCS=default,1,8`` picks the ``procs`` measured
  (``default`` is ``gosim``, a number N is ``gosim-pN``). Skipped with "gosim core not
  available" until ``gosim`` exports that API. gosim runs Python on one core whatever
  ``procs`` is: its Ps take turns on the driver's thread.
* ``go`` (item id ``go-subprocess``) and ``go-p1``: ``benchmarks/go/core``
  (``testing.B``), compiled once per session with ``go test -c`` and run once per
  workload in a subprocess, ``go`` with Go's default ``GOMAXPROCS`` (the CPU count, as a
  Go user runs it), ``go-p1`` with ``GOMAXPROCS=1``.
* ``gevent``: greenlets, ``gevent.queue.Channel`` (a rendezvous, so unbuffered) and
  ``gevent.queue.Queue(maxsize)``. It runs in-process without monkey patching: nothing
  is patched, the hub only runs while a gevent round switches into it, and trio,
  asyncio and ``subprocess`` are unaffected (gevent resets its SIGCHLD handling unless
  patched), so a subprocess would only add noise.
* ``asyncio``: tasks and ``asyncio.Queue``. asyncio has no rendezvous queue:
  ``Queue(1)`` stands in for an unbuffered channel.
* ``trio``: tasks in a nursery and ``trio.open_memory_channel``.

``select2`` has no direct equivalent outside gosim and Go; each peer uses its
idiomatic way to wait on either of two queues: asyncio keeps one pending ``get`` task
per queue and waits with ``asyncio.wait(FIRST_COMPLETED)``; gevent does the same with
getter greenlets and ``gevent.wait(count=1)``; trio tries ``receive_nowait`` on both
(in random order, as Go's select polls) and otherwise races two ``receive`` calls in a
nursery, keeping a value that both racers got for the next select.

How per-op times are taken (``extra_info``, what ``report_core.py`` reads): every peer
the same way (issue 30), as a mean over at least ``MEASURE_SECONDS`` (0.3 s) of measured
work, which is how ``testing.B`` times Go, and by CPU time: on this shared 2-core
machine the wall clock also counts the time a process waited for a core (at a load
average of 7 the two differ threefold), and a short sample dodges that wait more often
than a long one.

* Python peers: a round starts its runtime (``gosim.run``, ``trio.run``,
  ``asyncio.run``, a gevent greenlet) and runs ``n`` ops; the measured phase (the part
  Go's benchmark times after ``b.ResetTimer``: no runtime start, no ring construction or
  teardown) is timed inside the runtime by the wall clock and by the thread's CPU time.
  A figure sums the phases of as many rounds as reach 0.3 s of wall clock and divides
  by their ops (:func:`timed`).
* Go: ``core_test.go`` reports the process's CPU time (every thread's: GC workers,
  sysmon) over the timed work as ``cpu-ns/op`` beside ``testing.B``'s wall-clock ns/op,
  ``-test.benchtime=300ms`` (b.N counts single ops, so both are per op).
  pytest-benchmark's own stats of a Go item time the ``go test`` subprocess (process
  start and calibration included) and are *not* per-op comparable.

``ns_per_op`` is the median CPU figure of ``COUNT`` (3) figures, ``ns_per_op_min`` the
fastest, ``wall_ns_per_op`` the median wall-clock figure; every figure is kept
(``cpu_ns_per_op_all``, ``wall_ns_per_op_all``).

Every round checks its answer (sums, counts, the ring's last node), so a runtime that
loses or duplicates a value fails instead of reporting a time.
"""

from __future__ import annotations

import asyncio
import os
import random
import statistics
import subprocess
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gevent
import gevent.queue
import pytest
import trio

import gosim
from benchmarks.procs import find_go, go_build, go_env, go_version, parse_go_bench

# The public names the gosim workloads use; the gosim cases run once all exist.
GOSIM_API = ("run", "go", "Chan", "select", "recv")
GOSIM_READY = all(hasattr(gosim, name) for name in GOSIM_API)
# gosim.run's procs measured: None is the default (the CPU count), as users run it.
GOSIM_PROCS: tuple[int | None, ...] = tuple(
    None if p == "default" else int(p)
    for p in os.environ.get("BENCH_CORE_GOSIM_PROCS", "default,1").split(",")
)
# Go's GOMAXPROCS of each Go peer: None leaves Go's default, the CPU count.
GO_PEERS: dict[str, int | None] = {"go": None, "go-p1": 1}

GO_DIR = Path(__file__).parent / "go" / "core"
GO = find_go()

RING = 1000  # goroutines in the ring; must match RingSize in benchmarks/go/core/core.go
BUFFER = 1024  # capacity of the buffered channel
QUICK = os.environ.get("BENCH_CORE_QUICK", "") not in ("", "0")

# Every peer is timed the same way (issue 30): a figure is the mean over at least
# MEASURE_SECONDS of measured work, which is how testing.B times Go (b.N ops run for at
# least -benchtime); a Python peer's figure sums the measured phases of as many rounds of
# n ops as that takes. Figures are CPU time (see the module docstring); COUNT of them
# per peer, their median reported.
MEASURE_SECONDS = float(os.environ.get("BENCH_CORE_SECONDS", "0.3"))
COUNT = 3

# Go: the same duration as -benchtime; the smoke run uses a fixed small b.N.
GO_BENCHTIME = f"{MEASURE_SECONDS * 1000:g}ms"
GO_COUNT = COUNT
GO_SMOKE_BENCHTIME = "1000x"


@dataclass(frozen=True)
class Workload:
    """One group: its size, the unit of one op, and its twin in core_test.go."""

    group: str
    unit: str
    n: int  # ops per round in a timed run
    quick_n: int  # ops per round under --benchmark-disable or BENCH_CORE_QUICK
    go_bench: str
    expect: Callable[[int], object]  # the answer a correct round returns for n ops


def _sum_below(n: int) -> int:
    return n * (n - 1) // 2


WORKLOADS = {
    "spawn-join": Workload(
        "spawn-join", "spawn", 100_000, 2_000, "BenchmarkSpawnJoin", lambda n: n * (n - 1)
    ),
    "pingpong": Workload("pingpong", "round trip", 20_000, 500, "BenchmarkPingPong", lambda n: n),
    "buffered": Workload(
        "buffered", "item", 50_000, 5_000, "BenchmarkBuffered", lambda n: (n, _sum_below(n))
    ),
    "ring": Workload("ring", "hop", 20_000, 2_500, "BenchmarkRing", lambda n: n % RING),
    "select2": Workload(
        "select2", "select", 20_000, 500, "BenchmarkSelect2", lambda n: (n, _sum_below(n))
    ),
}

# A measured phase: (wall-clock seconds, CPU seconds of this thread, where every Python
# peer runs; the harness's progress display has a thread of its own).
Phase = tuple[float, float]
# A round: run the workload for n ops in a fresh runtime; return (answer, phase).
Round = Callable[[int], tuple[object, Phase]]


def _now() -> Phase:
    return time.perf_counter(), time.thread_time()


def _since(t0: Phase) -> Phase:
    """The phase since ``t0``: on a loaded machine the wall clock also counts the time
    this process waited for a core; the CPU time does not."""
    return time.perf_counter() - t0[0], time.thread_time() - t0[1]


# ============================================================================== gosim
# Written against the public contract in shared/DESIGN.md. Names are looked up on the
# module at call time so this file imports while the core is still being written.
# Channels are typed Any here: ``Chan[int].recv`` is ``int | None`` (the zero value of a
# closed channel), and narrowing it in the loop would add work the peers do not do.


async def _gosim_spawn_worker(done: Any, i: int) -> None:
    await done.send(i * 2)


async def _gosim_spawn_join(n: int) -> tuple[object, Phase]:
    go = gosim.go
    done: Any = gosim.Chan[int](n)
    t0 = _now()
    for i in range(n):
        go(_gosim_spawn_worker, done, i)
    total = 0
    for _ in range(n):
        total += await done.recv()
    return total, _since(t0)


async def _gosim_ponger(ping: Any, pong: Any) -> None:
    async for v in ping:
        await pong.send(v + 1)


async def _gosim_pingpong(n: int) -> tuple[object, Phase]:
    ping: Any = gosim.Chan[int](0)
    pong: Any = gosim.Chan[int](0)
    gosim.go(_gosim_ponger, ping, pong)
    t0 = _now()
    v = 0
    for _ in range(n):
        await ping.send(v)
        v = await pong.recv()
    phase = _since(t0)
    ping.close()
    return v, phase


async def _gosim_produce(ch: Any, lo: int, hi: int) -> None:
    for i in range(lo, hi):
        await ch.send(i)
    ch.close()


async def _gosim_buffered(n: int) -> tuple[object, Phase]:
    ch: Any = gosim.Chan[int](BUFFER)
    t0 = _now()
    gosim.go(_gosim_produce, ch, 0, n)
    count = total = 0
    async for v in ch:
        count += 1
        total += v
    return (count, total), _since(t0)


async def _gosim_ring_node(idx: int, inbox: Any, outbox: Any, done: Any) -> None:
    async for v in inbox:
        if v == 0:
            await done.send(idx)
        else:
            await outbox.send(v - 1)


async def _gosim_ring(n: int) -> tuple[object, Phase]:
    chans: list[Any] = [gosim.Chan[int](0) for _ in range(RING)]
    done: Any = gosim.Chan[int](1)
    for i in range(RING):
        gosim.go(_gosim_ring_node, i, chans[i], chans[(i + 1) % RING], done)
    t0 = _now()
    await chans[0].send(n)
    last = await done.recv()
    phase = _since(t0)
    for ch in chans:
        ch.close()
    return last, phase


async def _gosim_select2(n: int) -> tuple[object, Phase]:
    select, recv = gosim.select, gosim.recv
    a: Any = gosim.Chan[int](0)
    b: Any = gosim.Chan[int](0)
    t0 = _now()
    gosim.go(_gosim_produce, a, 0, n // 2)
    gosim.go(_gosim_produce, b, n // 2, n)
    count = total = 0
    while a is not None or b is not None:
        i, v, ok = await select(recv(a), recv(b))
        if not ok:  # closed: stop selecting on it, as Go code sets it to nil
            if i == 0:
                a = None
            else:
                b = None
            continue
        count += 1
        total += v
    return (count, total), _since(t0)


def _gosim_round(
    main: Callable[[int], Coroutine[Any, Any, tuple[object, Phase]]], procs: int | None
) -> Round:
    def run(n: int) -> tuple[object, Phase]:
        result: tuple[object, Phase] = gosim.run(main, n, procs=procs)
        return result

    return run


# =============================================================================== trio


async def _trio_spawn_worker(done: trio.MemorySendChannel[int], i: int) -> None:
    await done.send(i * 2)


async def _trio_spawn_join(n: int) -> tuple[object, Phase]:
    tx, rx = trio.open_memory_channel[int](n)
    t0 = _now()
    total = 0
    async with trio.open_nursery() as nursery:
        for i in range(n):
            nursery.start_soon(_trio_spawn_worker, tx, i)
        for _ in range(n):
            total += await rx.receive()
    return total, _since(t0)


async def _trio_ponger(
    ping: trio.MemoryReceiveChannel[int], pong: trio.MemorySendChannel[int]
) -> None:
    async for v in ping:
        await pong.send(v + 1)


async def _trio_pingpong(n: int) -> tuple[object, Phase]:
    ping_tx, ping_rx = trio.open_memory_channel[int](0)
    pong_tx, pong_rx = trio.open_memory_channel[int](0)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_trio_ponger, ping_rx, pong_tx)
        t0 = _now()
        v = 0
        for _ in range(n):
            await ping_tx.send(v)
            v = await pong_rx.receive()
        phase = _since(t0)
        ping_tx.close()
    return v, phase


async def _trio_produce(tx: trio.MemorySendChannel[int], lo: int, hi: int) -> None:
    async with tx:
        for i in range(lo, hi):
            await tx.send(i)


async def _trio_buffered(n: int) -> tuple[object, Phase]:
    tx, rx = trio.open_memory_channel[int](BUFFER)
    t0 = _now()
    count = total = 0
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_trio_produce, tx, 0, n)
        async for v in rx:
            count += 1
            total += v
    return (count, total), _since(t0)


async def _trio_ring_node(
    idx: int,
    inbox: trio.MemoryReceiveChannel[int],
    outbox: trio.MemorySendChannel[int],
    done: trio.MemorySendChannel[int],
) -> None:
    async for v in inbox:
        if v == 0:
            await done.send(idx)
        else:
            await outbox.send(v - 1)


async def _trio_ring(n: int) -> tuple[object, Phase]:
    pairs = [trio.open_memory_channel[int](0) for _ in range(RING)]
    done_tx, done_rx = trio.open_memory_channel[int](1)
    async with trio.open_nursery() as nursery:
        for i in range(RING):
            nursery.start_soon(_trio_ring_node, i, pairs[i][1], pairs[(i + 1) % RING][0], done_tx)
        t0 = _now()
        await pairs[0][0].send(n)
        last = await done_rx.receive()
        phase = _since(t0)
        for tx, _ in pairs:  # every node's inbox ends: its only sender is closed
            tx.close()
    return last, phase


class _TrioSelect2:
    """Select over two trio receive channels: ``receive_nowait`` on each in random
    order, else race two ``receive`` calls in a nursery. Both racers can get a value
    before the cancel lands (trio hands a value to a waiting receiver directly), so a
    second value is kept and returned by the next call rather than lost."""

    def __init__(
        self, a: trio.MemoryReceiveChannel[int], b: trio.MemoryReceiveChannel[int]
    ) -> None:
        self.chans: list[trio.MemoryReceiveChannel[int] | None] = [a, b]
        self.kept: list[tuple[int, int | None]] = []

    def _nowait(self, i: int) -> tuple[int, int | None] | None:
        ch = self.chans[i]
        if ch is None:
            return None
        try:
            return i, ch.receive_nowait()
        except trio.WouldBlock:
            return None
        except trio.EndOfChannel:
            return i, None

    async def _race(self, nursery: trio.Nursery, i: int, got: list[tuple[int, int | None]]) -> None:
        ch = self.chans[i]
        assert ch is not None
        try:
            v: int | None = await ch.receive()
        except trio.EndOfChannel:
            v = None
        got.append((i, v))
        nursery.cancel_scope.cancel()

    async def select(self) -> tuple[int, int | None]:
        """(index, value); value None means that channel is closed, and it is dropped."""
        if self.kept:
            return self._drop_closed(self.kept.pop())
        first = random.getrandbits(1)
        for i in (first, 1 - first):
            hit = self._nowait(i)
            if hit is not None:
                return self._drop_closed(hit)
        got: list[tuple[int, int | None]] = []
        async with trio.open_nursery() as nursery:
            for i in (0, 1):
                if self.chans[i] is not None:
                    nursery.start_soon(self._race, nursery, i, got)
        self.kept.extend(got[1:])
        return self._drop_closed(got[0])

    def _drop_closed(self, hit: tuple[int, int | None]) -> tuple[int, int | None]:
        if hit[1] is None:
            self.chans[hit[0]] = None
        return hit

    def live(self) -> bool:
        return bool(self.kept) or any(ch is not None for ch in self.chans)


async def _trio_select2(n: int) -> tuple[object, Phase]:
    a_tx, a_rx = trio.open_memory_channel[int](0)
    b_tx, b_rx = trio.open_memory_channel[int](0)
    sel = _TrioSelect2(a_rx, b_rx)
    t0 = _now()
    count = total = 0
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_trio_produce, a_tx, 0, n // 2)
        nursery.start_soon(_trio_produce, b_tx, n // 2, n)
        while sel.live():
            _, v = await sel.select()
            if v is not None:
                count += 1
                total += v
    return (count, total), _since(t0)


def _trio_round(main: Callable[[int], Coroutine[Any, Any, tuple[object, Phase]]]) -> Round:
    return lambda n: trio.run(main, n)


# ============================================================================ asyncio
# None is the end-of-stream sentinel: asyncio.Queue cannot be closed.


async def _asyncio_spawn_worker(done: asyncio.Queue[int], i: int) -> None:
    await done.put(i * 2)


async def _asyncio_spawn_join(n: int) -> tuple[object, Phase]:
    done: asyncio.Queue[int] = asyncio.Queue(n)
    t0 = _now()
    total = 0
    async with asyncio.TaskGroup() as tg:
        for i in range(n):
            tg.create_task(_asyncio_spawn_worker(done, i))
        for _ in range(n):
            total += await done.get()
    return total, _since(t0)


async def _asyncio_ponger(ping: asyncio.Queue[int | None], pong: asyncio.Queue[int]) -> None:
    while (v := await ping.get()) is not None:
        await pong.put(v + 1)


async def _asyncio_pingpong(n: int) -> tuple[object, Phase]:
    ping: asyncio.Queue[int | None] = asyncio.Queue(1)
    pong: asyncio.Queue[int] = asyncio.Queue(1)
    async with asyncio.TaskGroup() as tg:
        tg.create_task(_asyncio_ponger(ping, pong))
        t0 = _now()
        v = 0
        for _ in range(n):
            await ping.put(v)
            v = await pong.get()
        phase = _since(t0)
        await ping.put(None)
    return v, phase


async def _asyncio_produce(q: asyncio.Queue[int | None], lo: int, hi: int) -> None:
    for i in range(lo, hi):
        await q.put(i)
    await q.put(None)


async def _asyncio_buffered(n: int) -> tuple[object, Phase]:
    q: asyncio.Queue[int | None] = asyncio.Queue(BUFFER)
    t0 = _now()
    count = total = 0
    async with asyncio.TaskGroup() as tg:
        tg.create_task(_asyncio_produce(q, 0, n))
        while (v := await q.get()) is not None:
            count += 1
            total += v
    return (count, total), _since(t0)


async def _asyncio_ring_node(
    idx: int,
    inbox: asyncio.Queue[int | None],
    outbox: asyncio.Queue[int | None],
    done: asyncio.Queue[int],
) -> None:
    while (v := await inbox.get()) is not None:
        if v == 0:
            await done.put(idx)
        else:
            await outbox.put(v - 1)


async def _asyncio_ring(n: int) -> tuple[object, Phase]:
    queues: list[asyncio.Queue[int | None]] = [asyncio.Queue(1) for _ in range(RING)]
    done: asyncio.Queue[int] = asyncio.Queue(1)
    async with asyncio.TaskGroup() as tg:
        for i in range(RING):
            tg.create_task(_asyncio_ring_node(i, queues[i], queues[(i + 1) % RING], done))
        t0 = _now()
        await queues[0].put(n)
        last = await done.get()
        phase = _since(t0)
        for q in queues:  # all empty now: the token stopped at the node that sent on done
            q.put_nowait(None)
    return last, phase


async def _asyncio_select2(n: int) -> tuple[object, Phase]:
    queues: list[asyncio.Queue[int | None]] = [asyncio.Queue(1), asyncio.Queue(1)]
    t0 = _now()
    count = total = 0
    async with asyncio.TaskGroup() as tg:
        tg.create_task(_asyncio_produce(queues[0], 0, n // 2))
        tg.create_task(_asyncio_produce(queues[1], n // 2, n))
        # One pending get per live queue survives across selects, so nothing is lost.
        pending = {asyncio.create_task(q.get()): i for i, q in enumerate(queues)}
        while pending:
            done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            task = next(iter(done))
            i = pending.pop(task)
            v = task.result()
            if v is None:  # closed: drop it
                continue
            count += 1
            total += v
            pending[asyncio.create_task(queues[i].get())] = i
    return (count, total), _since(t0)


def _asyncio_round(main: Callable[[int], Coroutine[Any, Any, tuple[object, Phase]]]) -> Round:
    return lambda n: asyncio.run(main(n))


# ============================================================================= gevent
# No monkey patching; None is the end-of-stream sentinel.


def _gevent_spawn_join(n: int) -> tuple[object, Phase]:
    done: gevent.queue.Queue = gevent.queue.Queue(n)
    t0 = _now()
    for i in range(n):
        gevent.spawn(done.put, i * 2)
    total = 0
    for _ in range(n):
        total += done.get()
    return total, _since(t0)


def _gevent_ponger(ping: gevent.queue.Channel, pong: gevent.queue.Channel) -> None:
    while (v := ping.get()) is not None:
        pong.put(v + 1)


def _gevent_pingpong(n: int) -> tuple[object, Phase]:
    ping, pong = gevent.queue.Channel(), gevent.queue.Channel()
    ponger = gevent.spawn(_gevent_ponger, ping, pong)
    t0 = _now()
    v = 0
    for _ in range(n):
        ping.put(v)
        v = pong.get()
    phase = _since(t0)
    ping.put(None)
    ponger.get()
    return v, phase


def _gevent_produce(q: Any, lo: int, hi: int) -> None:
    for i in range(lo, hi):
        q.put(i)
    q.put(None)


def _gevent_buffered(n: int) -> tuple[object, Phase]:
    q: gevent.queue.Queue = gevent.queue.Queue(BUFFER)
    t0 = _now()
    gevent.spawn(_gevent_produce, q, 0, n)
    count = total = 0
    while (v := q.get()) is not None:
        count += 1
        total += v
    return (count, total), _since(t0)


def _gevent_ring_node(
    idx: int, inbox: gevent.queue.Channel, outbox: gevent.queue.Channel, done: gevent.queue.Queue
) -> None:
    while (v := inbox.get()) is not None:
        if v == 0:
            done.put(idx)
        else:
            outbox.put(v - 1)


def _gevent_ring(n: int) -> tuple[object, Phase]:
    chans = [gevent.queue.Channel() for _ in range(RING)]
    done: gevent.queue.Queue = gevent.queue.Queue(1)
    nodes = [
        gevent.spawn(_gevent_ring_node, i, chans[i], chans[(i + 1) % RING], done)
        for i in range(RING)
    ]
    t0 = _now()
    chans[0].put(n)
    last = done.get()
    phase = _since(t0)
    for ch in chans:  # a rendezvous: each put waits for its node to take the sentinel
        ch.put(None)
    gevent.joinall(nodes, raise_error=True)
    return last, phase


def _gevent_select2(n: int) -> tuple[object, Phase]:
    chans = [gevent.queue.Channel(), gevent.queue.Channel()]
    t0 = _now()
    gevent.spawn(_gevent_produce, chans[0], 0, n // 2)
    gevent.spawn(_gevent_produce, chans[1], n // 2, n)
    count = total = 0
    # One pending getter greenlet per live channel survives across selects.
    pending = {gevent.spawn(ch.get): i for i, ch in enumerate(chans)}
    while pending:
        ready = gevent.wait(list(pending), count=1)
        getter = ready[0]
        i = pending.pop(getter)
        v = getter.get()
        if v is None:  # closed: drop it
            continue
        count += 1
        total += v
        pending[gevent.spawn(chans[i].get)] = i
    return (count, total), _since(t0)


def _gevent_round(main: Callable[[int], tuple[object, Phase]]) -> Round:
    # Run in a greenlet of its own, as the other peers run inside their runtime; get()
    # re-raises whatever the round raised.
    def run(n: int) -> tuple[object, Phase]:
        result: tuple[object, Phase] = gevent.spawn(main, n).get()
        return result

    return run


# ============================================================================ drivers

PYTHON_ROUNDS: dict[str, dict[str, Round]] = {
    "spawn-join": {
        "trio": _trio_round(_trio_spawn_join),
        "asyncio": _asyncio_round(_asyncio_spawn_join),
        "gevent": _gevent_round(_gevent_spawn_join),
    },
    "pingpong": {
        "trio": _trio_round(_trio_pingpong),
        "asyncio": _asyncio_round(_asyncio_pingpong),
        "gevent": _gevent_round(_gevent_pingpong),
    },
    "buffered": {
        "trio": _trio_round(_trio_buffered),
        "asyncio": _asyncio_round(_asyncio_buffered),
        "gevent": _gevent_round(_gevent_buffered),
    },
    "ring": {
        "trio": _trio_round(_trio_ring),
        "asyncio": _asyncio_round(_asyncio_ring),
        "gevent": _gevent_round(_gevent_ring),
    },
    "select2": {
        "trio": _trio_round(_trio_select2),
        "asyncio": _asyncio_round(_asyncio_select2),
        "gevent": _gevent_round(_gevent_select2),
    },
}

GOSIM_MAINS = {
    "spawn-join": _gosim_spawn_join,
    "pingpong": _gosim_pingpong,
    "buffered": _gosim_buffered,
    "ring": _gosim_ring,
    "select2": _gosim_select2,
}


def gosim_peer(procs: int | None) -> str:
    """The peer name of gosim at ``procs``: ``gosim`` for the default, else ``gosim-pN``."""
    return "gosim" if procs is None else f"gosim-p{procs}"


def round_for(workload: str, peer: str) -> Round:
    """One round of ``workload`` on Python peer ``peer`` (gosim, gosim-pN, trio, ...)."""
    if peer.startswith("gosim"):
        procs = None if peer == "gosim" else int(peer.removeprefix("gosim-p"))
        return _gosim_round(GOSIM_MAINS[workload], procs)
    return PYTHON_ROUNDS[workload][peer]


@dataclass(frozen=True)
class Timed:
    """A figure of :func:`timed`: ns of CPU and of wall clock per op, over ``rounds``."""

    cpu_ns: float
    wall_ns: float
    rounds: int


def timed(one: Round, n: int, want: object, seconds: float) -> Timed:
    """Rounds of ``n`` ops of ``one`` until their measured phases add up to ``seconds``
    of wall clock (at least one round), each answer checked: the Python twin of
    testing.B's b.N loop over ``-benchtime``, with the CPU time beside the wall clock as
    core_test.go reports it."""
    wall = cpu = 0.0
    rounds = 0
    while rounds == 0 or wall < seconds:
        got, (w, c) = one(n)
        if got != want:
            raise AssertionError(f"answer {got!r}, want {want!r}")
        wall += w
        cpu += c
        rounds += 1
    ops = rounds * n
    return Timed(cpu / ops * 1e9, wall / ops * 1e9, rounds)


def _quick(benchmark: Any) -> bool:
    return QUICK or bool(benchmark.disabled)


def _run_python(benchmark: Any, wl: Workload, peer: str) -> None:
    """Time one Python peer on one workload and record its per-op figures: GO_COUNT
    figures of at least MEASURE_SECONDS of measured work each, as Go's."""
    one = round_for(wl.group, peer)
    n = wl.quick_n if _quick(benchmark) else wl.n
    want = wl.expect(n)
    figures: list[Timed] = []
    seconds = 0.0 if benchmark.disabled else MEASURE_SECONDS / (10 if QUICK else 1)
    if benchmark.disabled:  # a single untimed call, one round
        benchmark.pedantic(lambda: figures.append(timed(one, n, want, seconds)))
    else:
        one(n)  # warm-up
        benchmark.pedantic(
            lambda: figures.append(timed(one, n, want, seconds)), rounds=COUNT, iterations=1
        )
    cpu, wall = [f.cpu_ns for f in figures], [f.wall_ns for f in figures]
    _record(benchmark, wl, peer, cpu, wall, f"{seconds:g} s")
    benchmark.extra_info.update(ops=n, rounds=sum(f.rounds for f in figures))


def _record(
    benchmark: Any, wl: Workload, peer: str, cpu: list[float], wall: list[float], seconds: str
) -> None:
    info = benchmark.extra_info
    info.update(workload=wl.group, peer=peer, unit=wl.unit)
    info["ns_per_op"] = statistics.median(cpu)
    info["ns_per_op_min"] = min(cpu)
    info["cpu_ns_per_op_all"] = cpu
    info["wall_ns_per_op"] = statistics.median(wall)
    info["wall_ns_per_op_all"] = wall
    info["timing"] = (
        f"ns_per_op: CPU time of the measured work per op, median of {len(cpu)} means over "
        f">= {seconds} of wall clock each; wall_ns_per_op: the same by the clock"
    )


# ================================================================================= Go


@pytest.fixture(scope="session")
def go_test_binary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``go test -c`` once per session (compiling is not part of any measurement)."""
    return go_build("core", tmp_path_factory.mktemp("bench_core_go") / "core.test", test=True)


def go_round(
    binary: Path, wl: Workload, benchtime: str, count: int, gomaxprocs: int | None = 1
) -> list[tuple[float, float]]:
    """Run the workload's testing.B benchmark ``count`` times in one process with
    ``GOMAXPROCS=gomaxprocs`` (None: Go's default, the CPU count); of each run, (CPU ns
    per op, wall-clock ns per op): the process's CPU time over the timed work, which
    core_test.go reports as ``cpu-ns/op``, and testing.B's ns/op (b.N counts single
    ops, so both are per op)."""
    argv = [
        str(binary),
        "-test.run=^$",
        f"-test.bench=^{wl.go_bench}$",
        f"-test.benchtime={benchtime}",
        f"-test.count={count}",
    ]
    proc = subprocess.run(
        argv,
        cwd=GO_DIR,
        env=go_env(gomaxprocs),
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    )
    # testing.B names a result Name-N at GOMAXPROCS=N > 1; parse_go_bench drops the -N
    name = wl.go_bench.removeprefix("Benchmark")
    found = parse_go_bench(proc.stdout)
    cpu = parse_go_bench(proc.stdout, "cpu-ns/op").get(name, [])
    if list(found) != [name] or len(cpu) != len(found[name]):
        raise AssertionError(f"no {wl.go_bench} result with cpu-ns/op in Go output:\n{proc.stdout}")
    return [(c, wall) for (c, _), (wall, _) in zip(cpu, found[name], strict=True)]


def _run_go(benchmark: Any, wl: Workload, binary: Path, peer: str) -> None:
    """Run the workload's testing.B benchmark at the peer's GOMAXPROCS and record its ns/op."""
    smoke = bool(benchmark.disabled)
    # BENCH_CORE_QUICK: the Python peers' shorter duration, for Go too
    benchtime = f"{MEASURE_SECONDS * 100:g}ms" if QUICK else GO_BENCHTIME
    benchtime = GO_SMOKE_BENCHTIME if smoke else benchtime
    outputs: list[list[tuple[float, float]]] = []
    benchmark.pedantic(
        lambda: outputs.append(
            go_round(binary, wl, benchtime, 1 if smoke else GO_COUNT, GO_PEERS[peer])
        ),
        rounds=1,
        iterations=1,
    )
    runs = outputs[-1]
    _record(benchmark, wl, peer, [c for c, _ in runs], [w for _, w in runs], benchtime)
    benchmark.extra_info.update(rounds=len(runs), go_version=go_version())


# ============================================================================ the items


def _peers() -> list[Any]:
    gosim_skip = pytest.mark.skipif(not GOSIM_READY, reason="gosim core not available")
    go_marks = [pytest.mark.go, pytest.mark.skipif(GO is None, reason="`go` is not installed")]
    return [
        *(pytest.param(gosim_peer(p), marks=gosim_skip) for p in GOSIM_PROCS),
        pytest.param("go", marks=go_marks, id="go-subprocess"),
        pytest.param("go-p1", marks=go_marks, id="go-p1-subprocess"),
        "gevent",
        "asyncio",
        "trio",
    ]


def _bench(request: pytest.FixtureRequest, benchmark: Any, workload: str, peer: str) -> None:
    wl = WORKLOADS[workload]
    if peer in GO_PEERS:
        _run_go(benchmark, wl, request.getfixturevalue("go_test_binary"), peer)
    else:
        _run_python(benchmark, wl, peer)


@pytest.mark.benchmark(group="spawn-join")
@pytest.mark.parametrize("peer", _peers())
def bench_spawn_join(request: pytest.FixtureRequest, benchmark: Any, peer: str) -> None:
    _bench(request, benchmark, "spawn-join", peer)


@pytest.mark.benchmark(group="pingpong")
@pytest.mark.parametrize("peer", _peers())
def bench_pingpong(request: pytest.FixtureRequest, benchmark: Any, peer: str) -> None:
    _bench(request, benchmark, "pingpong", peer)


@pytest.mark.benchmark(group="buffered")
@pytest.mark.parametrize("peer", _peers())
def bench_buffered(request: pytest.FixtureRequest, benchmark: Any, peer: str) -> None:
    _bench(request, benchmark, "buffered", peer)


@pytest.mark.benchmark(group="ring")
@pytest.mark.parametrize("peer", _peers())
def bench_ring(request: pytest.FixtureRequest, benchmark: Any, peer: str) -> None:
    _bench(request, benchmark, "ring", peer)


@pytest.mark.benchmark(group="select2")
@pytest.mark.parametrize("peer", _peers())
def bench_select2(request: pytest.FixtureRequest, benchmark: Any, peer: str) -> None:
    _bench(request, benchmark, "select2", peer)
