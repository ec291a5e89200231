"""Small gosim programs with real concurrency bugs (and one without), for
``test_explore.py`` and the replay command: module-level, so that
``python -m gosim.testing replay tests.gosim.explore_programs:NAME PLAN`` finds them.

Each buggy one passes under Go's own order (the first run of an exploration) and fails
only under another interleaving. Each also runs bystanders (:func:`bystanders`):
goroutines that only yield, so that a run has many decisions and a random one differs
from Go's order in many of them, most irrelevant to the bug: the shrinker's work.
"""

from __future__ import annotations

from typing import Any

import gosim
from gosim import net
from gosim.sync import Cond, Mutex, WaitGroup


def bystanders(wg: WaitGroup, n: int = 3, steps: int = 4) -> None:
    """Start ``n`` goroutines that yield ``steps`` times each and touch nothing."""

    async def bystander() -> None:
        for _ in range(steps):
            await gosim.gosched()

    for _ in range(n):
        wg.go(bystander)


async def lost_update() -> int:
    """Two increments of a counter, one of them read, yield, write: returns the count,
    which the invariant wants to be 2."""
    state = {"n": 0}
    wg = WaitGroup()
    bystanders(wg)

    async def slow_increment() -> None:
        v = state["n"]
        await gosim.gosched()  # any wait between the read and the write
        state["n"] = v + 1

    async def increment() -> None:
        state["n"] += 1

    wg.go(slow_increment)
    wg.go(increment)
    await wg.wait()
    return state["n"]


def two_increments(n: int) -> bool:
    """The invariant of :func:`lost_update` and :func:`locked_update`."""
    return n == 2


async def locked_update() -> int:
    """:func:`lost_update` with a Mutex around both updates: correct."""
    state = {"n": 0}
    mu = Mutex()
    wg = WaitGroup()
    bystanders(wg)

    async def slow_increment() -> None:
        async with mu:
            v = state["n"]
            await gosim.gosched()
            state["n"] = v + 1

    async def increment() -> None:
        async with mu:
            state["n"] += 1

    wg.go(slow_increment)
    wg.go(increment)
    await wg.wait()
    return state["n"]


async def check_then_act() -> None:
    """Two callers of get-or-create on a map, which checks, computes, then stores:
    both can create."""
    cache: dict[str, str] = {}
    created: list[str] = []
    wg = WaitGroup()
    bystanders(wg)

    async def get_or_create(who: str, compute_waits: bool) -> None:
        if "k" not in cache:
            if compute_waits:
                await gosim.gosched()
            created.append(who)
            cache["k"] = who

    wg.go(get_or_create, "a", True)
    wg.go(get_or_create, "b", False)
    await wg.wait()
    assert len(created) == 1, f"created twice: {created}"


async def lock_order() -> None:
    """Two goroutines take two Mutexes in opposite orders: a deadlock."""
    m1, m2 = Mutex(), Mutex()
    wg = WaitGroup()
    bystanders(wg)

    async def one() -> None:
        await m1.lock()
        await gosim.gosched()
        await m2.lock()
        m2.unlock()
        m1.unlock()

    async def two() -> None:
        await m2.lock()
        await m1.lock()
        m1.unlock()
        m2.unlock()

    wg.go(one)
    wg.go(two)
    await wg.wait()


async def missed_wakeup() -> None:
    """A Cond waited on with no predicate: a signal sent before the wait is lost."""
    mu = Mutex()
    cond = Cond(mu)
    wg = WaitGroup()
    bystanders(wg)

    async def signaller() -> None:
        async with mu:
            cond.signal()

    async def waiter() -> None:
        async with mu:
            await cond.wait()  # should be: while not ready: await cond.wait()

    wg.go(signaller)
    wg.go(waiter)
    await wg.wait()


async def send_on_closed() -> None:
    """A closer closes the channel a producer still sends on."""
    ch = gosim.Chan[int](0)
    wg = WaitGroup()
    bystanders(wg)

    async def closer() -> None:
        gosim.close(ch)

    async def producer() -> None:
        await ch.send(1)

    gosim.go(closer)
    gosim.go(producer)
    async for _ in ch:
        pass
    await wg.wait()


#: The simulated network's faults :func:`fragile_client` is explored under.
NETWORK_FAULTS = {"latency": (0.001, 0.005), "reset_rate": 0.05}
CLIENTS = 6


async def fragile_client() -> None:
    """Six echo clients over the simulated network, each allowed one reconnection in
    all: the second reset a client sees is a panic (``BrokenError``). Only faults break
    it, and only two on one client."""
    ln = net.listen("sim", "server:1")

    async def handle(c: net.SimConn) -> None:
        try:
            while data := await c.read(4096):
                await c.write(data)
        except net.BrokenError:
            pass
        c.close()

    async def serve() -> None:
        while True:
            try:
                c = await ln.accept()
            except net.ClosedError:
                return
            gosim.go(handle, c)

    async def client(k: int) -> None:
        resets = 0
        conn: net.SimConn | None = None
        for i in range(4):
            msg = b"<%d.%d>" % (k, i)
            while True:
                try:
                    if conn is None:
                        conn = await net.dial("sim", "server:1", local_host=f"c{k}")
                    await conn.write(msg)
                    assert await conn.read_exactly(len(msg)) == msg
                    break
                except net.BrokenError:
                    resets += 1
                    if resets > 1:
                        raise  # the bug: the retry budget should not run out
                    conn.close()
                    conn = None

    gosim.go(serve)
    wg = WaitGroup()
    for k in range(CLIENTS):
        wg.go(client, k)
    await wg.wait()
    ln.close()


#: The lease :func:`lease_takeover`'s writers hold, in (virtual) seconds.
LEASE = 1.0


async def lease_takeover() -> list[tuple[str, str]]:
    """A writer holds a lease of one second; another waits it out, takes the lease over
    and writes. The holder checks its lease against the clock, then waits for the disk
    (a Mutex a compactor may hold for longer than the lease) and writes without checking
    again: when the compactor takes the disk first, the holder's write lands past its
    lease, after the takeover. Returns the writes as (writer, lease holder then), which
    :func:`one_writer` wants equal."""
    lease: dict[str, Any] = {"holder": "a", "until": LEASE}
    disk = Mutex()
    log: list[tuple[str, str]] = []
    wg = WaitGroup()
    bystanders(wg)

    async def write(who: str) -> None:
        async with disk:
            log.append((who, lease["holder"]))

    async def holder() -> None:
        if gosim.now() < lease["until"]:
            await write("a")  # the bug: the check above is stale once the disk waits

    async def compactor() -> None:
        async with disk:
            await gosim.sleep(1.5 * LEASE)

    async def contender() -> None:
        await gosim.sleep(LEASE)  # the lease has run out: take it over
        lease.update(holder="b", until=gosim.now() + LEASE)
        await write("b")

    wg.go(holder)
    wg.go(compactor)
    wg.go(contender)
    await wg.wait()
    return log


def one_writer(log: list[tuple[str, str]]) -> bool:
    """The invariant of :func:`lease_takeover`: every write by the lease's holder then."""
    return all(who == held for who, held in log)
