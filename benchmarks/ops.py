"""One gosim workload, N operations, for counting instructions with callgrind.

Wall-clock timings on this shared machine move by 2x between runs (the same build's
ping-pong took 455 ns and 790 ns minutes apart), so a before/after check of a hot path
counts instructions instead, which do not depend on the load:

    valgrind --tool=callgrind --callgrind-out-file=/dev/null \
        .venv/bin/python benchmarks/ops.py pingpong 1000      # and again with 6000

and takes (Ir(6000) - Ir(1000)) / 5000 as the instructions per operation (interpreter
start-up cancels out). A third argument sets ``procs`` (default: ``gosim.run``'s, the
CPU count), to count what a number of Ps costs. Operations: pingpong (a round trip on
unbuffered channels), buffered (an item through Chan(1024)), select2 (a select over two
channels fed by two goroutines; 2N selects), ring (a hop of a token round 1,000
goroutines on unbuffered channels), spawn (go + WaitGroup), mutex (an uncontended lock
and unlock). Each is its twin in benchmarks/bench_core.py, minus the timing. The parking
paths of gosim.sync and gosim.time (no timing twin): mutexc (a contended Mutex: two
goroutines, each lock, gosched, unlock), cond (a Cond ping-pong: N signal-and-wait
hand-offs), rwmutex (a writer and a reader alternating through a held RWMutex), sleep (N
sleeps, by 100 goroutines that wake together, under virtual time).
"""

from __future__ import annotations

import sys

import gosim
import gosim.time
from gosim import Chan, go, recv, select
from gosim.sync import Cond, Mutex, RWMutex, WaitGroup

N = int(sys.argv[2]) if len(sys.argv) > 2 else 1000


async def buffered():
    ch = Chan(1024)
    done = Chan()

    async def prod():
        for i in range(N):
            await ch.send(i)
        ch.close()

    async def cons():
        async for _ in ch:
            pass
        await done.send(None)

    go(prod)
    go(cons)
    await done.recv()


async def pingpong():
    a, b = Chan(), Chan()

    async def echo():
        for _ in range(N):
            v = await a.recv()
            await b.send(v)

    go(echo)
    for i in range(N):
        await a.send(i)
        await b.recv()


async def select2():
    a, b = Chan(), Chan()

    async def feed(c, n):
        for i in range(n):
            await c.send(i)

    go(feed, a, N)
    go(feed, b, N)
    for _ in range(2 * N):
        await select(recv(a), recv(b))


RING = 1000  # as in benchmarks/bench_core.py


async def ring():
    chans = [Chan(0) for _ in range(RING)]
    done = Chan(1)

    async def node(inbox, outbox):
        async for v in inbox:
            if v == 0:
                await done.send(None)
            else:
                await outbox.send(v - 1)

    for i in range(RING):
        go(node, chans[i], chans[(i + 1) % RING])
    await chans[0].send(N)
    await done.recv()
    for ch in chans:
        ch.close()


async def spawn():
    wg = WaitGroup()

    async def w():
        wg.done()

    for _ in range(N):
        wg.add(1)
        go(w)
    await wg.wait()


async def mutex():
    m = Mutex()
    for _ in range(N):
        await m.lock()
        m.unlock()


async def mutexc():
    m = Mutex()
    wg = WaitGroup()

    async def w():
        for _ in range(N // 2):
            await m.lock()
            await gosim.gosched()
            m.unlock()
        wg.done()

    wg.add(2)
    go(w)
    go(w)
    await wg.wait()


async def cond():
    m = Mutex()
    c = Cond(m)
    turn = [0]
    wg = WaitGroup()

    async def player(me):
        await m.lock()
        for _ in range(N // 2):
            while turn[0] != me:
                await c.wait()
            turn[0] = 1 - me
            c.signal()
        m.unlock()
        wg.done()

    wg.add(2)
    go(player, 0)
    go(player, 1)
    await wg.wait()


async def rwmutex():
    rw = RWMutex()
    wg = WaitGroup()

    async def writer():
        for _ in range(N // 2):
            await rw.lock()
            await gosim.gosched()
            rw.unlock()
        wg.done()

    async def reader():
        for _ in range(N // 2):
            await rw.rlock()
            await gosim.gosched()
            rw.runlock()
        wg.done()

    wg.add(2)
    go(writer)
    go(reader)
    await wg.wait()


SLEEPERS = 100


async def sleep():
    wg = WaitGroup()

    async def sleeper():
        for _ in range(N // SLEEPERS):
            await gosim.time.sleep(0.001)
        wg.done()

    wg.add(SLEEPERS)
    for _ in range(SLEEPERS):
        go(sleeper)
    await wg.wait()


if __name__ == "__main__":
    WORKLOADS = {
        "buffered": buffered,
        "pingpong": pingpong,
        "select2": select2,
        "ring": ring,
        "spawn": spawn,
        "mutex": mutex,
        "mutexc": mutexc,
        "cond": cond,
        "rwmutex": rwmutex,
        "sleep": sleep,
    }
    procs = int(sys.argv[3]) if len(sys.argv) > 3 else None  # None: gosim.run's default
    gosim.run(WORKLOADS[sys.argv[1]], procs=procs, virtual_time=sys.argv[1] == "sleep")
