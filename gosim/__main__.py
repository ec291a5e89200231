"""A short tour of gosim: ``python -m gosim``.

Runs a few classic Go programs on the runtime and prints what they show: a pipeline of
goroutines, a concurrent prime sieve, select with a timeout, a ticker, a blocking call
on an OS thread, and the scheduler's statistics with Go's ``SCHED`` line. It shows gosim
alone; ``python -m netframe`` tours the framing layer built on it.
"""

from __future__ import annotations

import time as _wall

import gosim
from gosim import Chan, go, recv, select


async def generate(ch: Chan[int]) -> None:
    i = 2
    while True:
        await ch.send(i)
        i += 1


async def filter_multiples(src: Chan[int], dst: Chan[int], prime: int) -> None:
    while True:
        i = await src.recv()
        assert i is not None
        if i % prime != 0:
            await dst.send(i)


async def prime_sieve(n: int) -> list[int]:
    """The sieve from Go's tour: a chain of filter goroutines, one per prime found."""
    ch: Chan[int] = Chan()
    go(generate, ch)
    primes = []
    for _ in range(n):
        prime = await ch.recv()
        assert prime is not None
        primes.append(prime)
        nxt: Chan[int] = Chan()
        go(filter_multiples, ch, nxt, prime)
        ch = nxt
    return primes


async def squares(n: int, out: Chan[int]) -> None:
    for i in range(n):
        await out.send(i * i)
    out.close()


async def main() -> None:
    print("gosim tour: Go's concurrency model on trio\n")

    out: Chan[int] = Chan(4)
    go(squares, 6, out)
    print("pipeline (for v := range ch):", [v async for v in out])

    print("prime sieve, 15 chained goroutines:", await prime_sieve(15))

    slow: Chan[str] = Chan()

    async def reply_later() -> None:
        await gosim.sleep(0.2)
        await slow.send("late reply")

    go(reply_later)
    i, v, _ = await select(recv(slow), recv(gosim.after(0.05)))
    print("select with a 50 ms timeout:", "timed out" if i == 1 else v)
    print("  ...then the reply arrives:", await slow.recv())

    ticker = gosim.Ticker(0.01)
    ticks = 0
    deadline = gosim.after(0.055)
    while True:
        i, _, _ = await select(recv(ticker.c), recv(deadline))
        if i == 1:
            break
        ticks += 1
    ticker.stop()
    print(f"ticker every 10 ms for 55 ms: {ticks} ticks")

    start = gosim.now()
    done: Chan[None] = Chan()
    counted = 0

    async def count() -> None:
        nonlocal counted
        for _ in range(1000):
            counted += 1
            await gosim.gosched()
        await done.send(None)

    go(count)
    await gosim.syscall(_wall.sleep, 0.05)  # blocks an OS thread, not the runtime
    await done.recv()
    print(
        f"a 50 ms blocking syscall while another goroutine yielded {counted} times "
        f"({(gosim.now() - start) * 1000:.0f} ms)"
    )

    s = gosim.statistics()
    print(
        f"\nstats: procs={s.procs} goroutines={s.goroutines} created={s.created} "
        f"switches={s.context_switches} steals={s.steals} syscalls={s.syscalls} "
        f"handoffs={s.handoffs} timers_fired={s.timers_fired}"
    )
    gosim.schedtrace(1.0)  # prints Go's SCHED line now, then every second
    gosim.schedtrace(None)
    print("\nthe sieve's filter goroutines are still blocked; main returning ends them, as in Go.")


if __name__ == "__main__":
    gosim.run(main)
