"""gosim.sync with Go's behaviour: starvation mode on and off under the 1 ms rule,
writer preference, misuse messages, wait reasons in deadlock dumps, no lost wakeups."""

from __future__ import annotations

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import gosim
from gosim import Chan, context, go
from gosim.lowlevel import can_spin as _can_spin
from gosim.sync import (
    Cond,
    ErrGroup,
    FatalError,
    Mutex,
    Once,
    Pool,
    RWMutex,
    Semaphore,
    SyncPanic,
    WaitGroup,
)


def vrun(main, *args, procs=2, seed=1):  # type: ignore[no-untyped-def]
    return gosim.run(main, *args, procs=procs, seed=seed, virtual_time=True)


def test_mutex_protects_a_counter_across_yields() -> None:
    async def main() -> int:
        mu = Mutex()
        wg = WaitGroup()
        total = 0

        async def worker() -> None:
            nonlocal total
            for _ in range(100):
                async with mu:
                    v = total
                    await gosim.gosched()  # a preemption point inside the critical section
                    total = v + 1

        for _ in range(10):
            wg.go(worker)
        await wg.wait()
        return total

    assert vrun(main, procs=3) == 1000


def test_starvation_mode_switches_on_after_1ms_and_off_when_the_last_waiter_is_served() -> None:
    async def main() -> list[tuple[str, bool]]:
        mu = Mutex()
        log: list[tuple[str, bool]] = []
        await mu.lock()
        started: Chan[None] = Chan(3)

        async def waiter(name: str) -> None:
            await started.send(None)
            await mu.lock()
            log.append((name, mu.starving))
            await gosim.sleep(0.002)  # hold it 2 ms: the next waiter starves
            mu.unlock()

        go(waiter, "a")
        go(waiter, "b")
        for _ in range(2):
            await started.recv()
        await gosim.sleep(0.002)  # both waiters queue for 2 ms
        mu.unlock()  # normal mode: the first waiter is woken to compete...
        await mu.lock()  # ...and main, already running, barges in first
        log.append(("main", mu.starving))
        await gosim.sleep(0.002)  # the woken waiter finds it taken after > 1 ms: starving
        mu.unlock()  # starvation mode: handed straight to that waiter
        await gosim.sleep(0.01)
        await mu.lock()
        log.append(("end", mu.starving))
        mu.unlock()
        return log

    log = vrun(main, procs=1)
    assert log[0][0] == "main" and log[-1][0] == "end"
    assert [starving for _, starving in log] == [
        False,  # main barged in normal mode
        True,  # the first waiter got it by handoff and another still waits: starving
        False,  # the last waiter was served: back to normal mode
        False,
    ]


def test_two_contenders_do_not_keep_the_mutex_in_starvation_mode() -> None:
    """Go's handoff yields to the waiter, which sees it is the last one and ends the
    mode; so with 2 ms holds the two alternate in pairs (a handoff, then a re-take in
    normal mode), and starvation mode is off for every other acquisition."""

    async def main() -> tuple[list[int], list[bool]]:
        mu = Mutex()
        order: list[int] = []
        modes: list[bool] = []
        wg = WaitGroup()

        async def worker(ident: int) -> None:
            for _ in range(20):
                await mu.lock()
                order.append(ident)
                modes.append(mu.starving)
                await gosim.sleep(0.002)
                mu.unlock()
            wg.done()

        wg.add(2)
        go(worker, 0)
        go(worker, 1)
        await wg.wait()
        return order, modes

    order, modes = vrun(main, procs=1)
    middle = order[4:30]
    assert all(middle[i] == middle[i + 1] != middle[i + 2] for i in range(0, len(middle) - 2, 2)), (
        order
    )
    assert not any(modes), modes  # each handoff ends the mode before the new owner runs


def test_unlock_of_unlocked_mutex_is_a_fatal_error() -> None:
    async def main() -> None:
        Mutex().unlock()

    with pytest.raises(FatalError) as info:
        vrun(main)
    assert str(info.value) == "fatal error: sync: unlock of unlocked mutex"
    # A throw's crash report begins with its own line, as Go's does.
    assert info.value.__notes__[0].startswith(f"{info.value}\n\ngoroutine 1 [running]:")


def test_rwmutex_writer_preference() -> None:
    async def main() -> list[str]:
        rw = RWMutex()
        log: list[str] = []
        await rw.rlock()

        async def writer() -> None:
            await rw.lock()
            log.append("writer")
            rw.unlock()

        async def late_reader() -> None:
            await rw.rlock()
            log.append("late reader")
            rw.runlock()

        go(writer)
        await gosim.sleep(0.001)  # the writer waits for our read lock
        go(late_reader)
        await gosim.sleep(0.001)  # a pending writer blocks new readers
        log.append("first reader done")
        rw.runlock()
        await gosim.sleep(0.001)
        return log

    assert vrun(main) == ["first reader done", "writer", "late reader"]


def test_rwmutex_misuse_messages() -> None:
    async def runlock() -> None:
        RWMutex().runlock()

    async def unlock() -> None:
        RWMutex().unlock()

    for fn, msg in (
        (runlock, "RUnlock of unlocked RWMutex"),
        (unlock, "Unlock of unlocked RWMutex"),
    ):
        with pytest.raises(FatalError) as info:
            vrun(fn)
        assert str(info.value) == f"fatal error: sync: {msg}"


def test_waitgroup_misuse_messages() -> None:
    async def negative() -> None:
        WaitGroup().done()

    with pytest.raises(SyncPanic) as info:
        vrun(negative)
    assert str(info.value) == "sync: negative WaitGroup counter"

    async def reused() -> None:
        wg = WaitGroup()
        wg.add(1)

        async def waiter() -> None:
            await wg.wait()

        go(waiter)
        await gosim.sleep(0.001)
        wg.done()  # the waiter is released but has not returned yet...
        wg.add(1)  # ...so reusing the group now is Go's misuse, which the waiter detects
        await gosim.sleep(0.001)

    with pytest.raises(SyncPanic) as info:
        vrun(reused)
    assert str(info.value) == "sync: WaitGroup is reused before previous Wait has returned"


def test_wait_reasons_show_in_deadlock_dumps() -> None:
    async def main() -> None:
        mu = Mutex()
        await mu.lock()
        wg = WaitGroup()
        wg.add(1)
        cond = Cond(Mutex())

        async def locker() -> None:
            await mu.lock()

        async def condwait() -> None:
            await cond.locker.lock()
            await cond.wait()

        go(locker)
        go(condwait)
        await wg.wait()

    with pytest.raises(gosim.Deadlock) as info:
        vrun(main, procs=1)
    dump = str(info.value)
    assert "goroutine 1 [sync.WaitGroup.Wait]:" in dump
    assert "goroutine 2 [sync.Mutex.Lock]:" in dump
    assert "goroutine 3 [sync.Cond.Wait]:" in dump


def test_once_runs_once_and_a_raising_function_counts_as_done() -> None:
    async def main() -> tuple[int, int]:
        once = Once()
        calls = 0

        async def init() -> None:
            nonlocal calls
            calls += 1
            await gosim.sleep(0.01)

        wg = WaitGroup()
        for _ in range(5):
            wg.go(once.do, init)
        await wg.wait()
        failing = Once()
        raised = 0

        def boom() -> None:
            nonlocal raised
            raised += 1
            raise ValueError("boom")

        with pytest.raises(ValueError):
            await failing.do(boom)
        await failing.do(boom)  # done already: not called again
        return calls, raised

    assert vrun(main) == (1, 1)


def test_cond_signal_and_broadcast() -> None:
    async def main() -> list[int]:
        mu = Mutex()
        cond = Cond(mu)
        ready = 0
        woke: list[int] = []
        wg = WaitGroup()

        async def waiter(i: int) -> None:
            async with mu:
                while ready < i:
                    await cond.wait()
                woke.append(i)

        for i in (1, 2, 2):
            # One at a time, so the waiters queue on cond in this order: which of
            # several goroutines started together waits first is not defined, in Go
            # either (signal wakes the one that waited longest).
            wg.go(waiter, i)
            await gosim.sleep(0.0001)
        async with mu:
            ready = 1
            cond.signal()
        await gosim.sleep(0.001)
        async with mu:
            ready = 2
            cond.broadcast()
        await wg.wait()
        return woke

    assert vrun(main) == [1, 2, 2]


def test_pool_per_p_private_shared_and_steal() -> None:
    async def main() -> dict[str, int]:
        pool: Pool[list[int]] = Pool(new=list)
        a = pool.get()
        b = pool.get()
        assert a is not None and b is not None
        pool.put(a)
        pool.put(b)
        assert pool.get() is a  # private slot first
        assert pool.get() is b  # then the shared list
        pool.put(a)
        pool.put(b)
        got: Chan[object] = Chan(1)

        async def elsewhere() -> None:
            await got.send(pool.get())

        gosim.gomaxprocs(2)
        go(elsewhere)
        await got.recv()
        return pool.stats

    stats = vrun(main, procs=2)
    assert stats["new"] == 2 and stats["private"] >= 1 and stats["shared"] >= 1


def test_errgroup_first_error_cancels_the_context() -> None:
    async def main() -> tuple[str, str, int]:
        group, ctx = ErrGroup.with_context(context.background())
        finished = 0

        async def slow() -> None:
            nonlocal finished
            i, _, _ = await gosim.select(gosim.recv(ctx.done()), gosim.recv(gosim.after(10)))
            finished += i == 0

        async def fails() -> None:
            await gosim.sleep(0.5)
            raise KeyError("first")

        async def fails_later() -> None:
            await gosim.sleep(1)
            raise KeyError("second")

        for fn in (slow, slow, fails, fails_later):
            await group.go(fn)
        err = await group.wait()
        return repr(err), str(ctx.err()), finished

    assert vrun(main) == ("KeyError('first')", "context canceled", 2)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(1, 8), procs=st.integers(1, 4))
def test_no_lost_wakeups_under_many_schedules(seed: int, n: int, procs: int) -> None:
    async def main() -> int:
        mu = Mutex()
        sem = Semaphore(2)
        wg = WaitGroup()
        count = 0

        async def worker(k: int) -> None:
            nonlocal count
            for i in range(5):
                await sem.acquire()
                async with mu:
                    count += 1
                    if (k + i) % 3 == 0:
                        await gosim.sleep(0.0005 * k)
                sem.release()
                await gosim.gosched()

        for k in range(n):
            wg.go(worker, k)
        await wg.wait()
        return count

    assert vrun(main, procs=procs, seed=seed) == 5 * n


class SemaphoreMachine(RuleBasedStateMachine):
    """Semaphore against a model: FIFO grants, no barging, units conserved."""

    def __init__(self) -> None:
        super().__init__()
        self.size = 5
        self.held: list[int] = []  # units each finished acquire holds
        self.queue: list[int] = []  # sizes of parked acquirers, FIFO
        self.ops: list[tuple[str, int]] = []

    @rule(n=st.integers(1, 5))
    def acquire(self, n: int) -> None:
        self.ops.append(("acquire", n))
        if not self.queue and self.size - sum(self.held) >= n:
            self.held.append(n)
        else:
            self.queue.append(n)

    @precondition(lambda self: bool(self.held))
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        idx = data.draw(st.integers(0, len(self.held) - 1))
        n = self.held.pop(idx)
        self.ops.append(("release", n))
        while self.queue and self.size - sum(self.held) >= self.queue[0]:
            self.held.append(self.queue.pop(0))

    @invariant()
    def runtime_agrees(self) -> None:
        ops = list(self.ops)

        async def main() -> tuple[int, int]:
            sem = Semaphore(5)
            for kind, n in ops:
                if kind == "acquire":
                    if sem.try_acquire(n) is False:
                        go(sem.acquire, n)
                        await gosim.sleep(0.001)
                else:
                    sem.release(n)
                    await gosim.sleep(0.001)
            return sem._cur, len(sem._waiters)

        try:
            cur, waiting = vrun(main, procs=1)
        except gosim.Deadlock:  # parked acquirers left at the end are fine
            return
        assert (cur, waiting) == (sum(self.held), len(self.queue))


SemaphoreMachine.TestCase.settings = settings(
    max_examples=25, stateful_step_count=12, deadline=None
)
TestSemaphoreMachine = SemaphoreMachine.TestCase


def test_spinning_rule_in_the_schedulers_terms() -> None:
    """Go's canSpin: more than one P, another P running (neither idle nor spinning),
    this P's queue empty, < 4 spins."""

    async def noop() -> None:
        pass

    async def main() -> tuple[bool, bool, bool, bool, bool]:
        rt = gosim.lowlevel.current_runtime()
        idle = _can_spin(0)  # the other Ps are idle: spinning cannot help
        go(noop)  # now this P's own queue holds work: park instead, let it run
        own_queue = _can_spin(0)
        await gosim.gosched()  # run it
        other = rt.pidle[-1]
        rt.wakep()  # another P looks for work: spinning, not running yet
        spinning_only = _can_spin(0)
        other.runq.append(gosim._internals.G())  # a placeholder: removed before any switch
        rt.resetspinning(other)  # it found work: it runs
        other_p_busy = _can_spin(0)
        too_many = _can_spin(4)
        other.runq.clear()
        return idle, own_queue, spinning_only, other_p_busy, too_many

    assert vrun(main, procs=3) == (False, False, False, True, False)

    async def one_p() -> bool:
        go(noop)
        return _can_spin(0)

    assert vrun(one_p, procs=1) is False


def test_pool_steals_from_another_ps_shared_list() -> None:
    async def main() -> dict[str, int]:
        pool: Pool[str] = Pool()
        for item in ("a", "b", "c"):
            pool.put(item)  # P0: private "a", shared ["c", "b"]
        rt = gosim.lowlevel.current_runtime()
        home = rt.curp
        rt.curp = rt.allp[1]  # look at the pool as a goroutine on P1 would
        try:
            stolen = pool.get()
        finally:
            rt.curp = home
        assert stolen == "b"  # the tail of P0's shared list
        return pool.stats

    stats = vrun(main, procs=2)
    assert stats["stolen"] == 1


# ------------------------------------------------ errgroup and semaphore, x/sync's rules


def test_errgroup_set_limit_follows_x_sync() -> None:
    """x/sync/errgroup's SetLimit: a negative n removes the limit at any time; a new
    limit while goroutines hold the old one panics naming their count; setting one
    while unlimited goroutines run is allowed (they hold no token)."""

    async def main() -> list[str]:
        log: list[str] = []
        gate: Chan[None] = Chan()

        async def blocked() -> None:
            await gate.recv()

        g = ErrGroup()
        g.set_limit(2)
        await g.go(blocked)
        try:
            g.set_limit(3)
        except SyncPanic as exc:
            log.append(str(exc))
        g.set_limit(-1)  # allowed while running
        await g.go(blocked)
        g.set_limit(1)  # the unlimited goroutines hold no token
        log.append(f"try_go at the limit: {g.try_go(blocked)}")
        log.append(f"try_go over the limit: {g.try_go(blocked)}")
        gate.close()
        log.append(f"wait: {await g.wait()}")
        return log

    assert vrun(main) == [
        "errgroup: modify limit while 1 goroutines in the group are still active",
        "try_go at the limit: True",
        "try_go over the limit: False",
        "wait: None",
    ]


def test_errgroup_try_go_starts_only_under_the_limit() -> None:
    async def main() -> tuple[list[bool], int]:
        g = ErrGroup()
        g.set_limit(2)
        ran = 0

        async def work() -> None:
            nonlocal ran
            await gosim.sleep(0.01)
            ran += 1

        started = [g.try_go(work) for _ in range(3)]
        await g.wait()
        started.append(g.try_go(work))  # the slots are free again
        await g.wait()
        return started, ran

    assert vrun(main) == ([True, True, False, True], 3)


def test_errgroup_go_without_await_is_loud() -> None:
    """ErrGroup.go must be awaited (it blocks at the limit); forgetting it must not look
    like success: wait() raises instead of returning None with nothing run."""

    async def main() -> None:
        g = ErrGroup()

        async def work() -> None:
            pass

        g.go(work)  # the mistake: no await
        await g.wait()

    with pytest.raises(SyncPanic) as info:
        vrun(main)
    assert "not awaited" in str(info.value)


def test_semaphore_acquire_gives_up_when_the_context_is_done() -> None:
    """x/sync/semaphore's Acquire(ctx, n): a done context fails the call, even when
    the units are free; a waiter that gives up leaves the queue and lets those behind
    it in; without cancellation it acquires as before."""

    async def main() -> list[str]:
        log: list[str] = []
        sem = Semaphore(2)
        done_ctx, cancel = context.with_cancel(context.background())
        cancel()
        try:
            await sem.acquire(1, ctx=done_ctx)
        except context.Canceled as exc:
            log.append(f"done before: {exc}; held {sem._cur}")

        await sem.acquire(2)
        ctx, _ = context.with_timeout(context.background(), 0.01)
        try:
            await sem.acquire(2, ctx=ctx)
        except context.DeadlineExceeded as exc:
            log.append(f"blocked then timed out: {exc}; waiters {len(sem._waiters)}")

        # A big waiter at the head gives up: the small one behind it gets in.
        big_ctx, cancel_big = context.with_cancel(context.background())
        got_small: Chan[str] = Chan(1)

        async def big() -> None:
            try:
                await sem.acquire(2, ctx=big_ctx)
            except context.Canceled:
                pass

        async def small() -> None:
            await sem.acquire(1, ctx=context.background())
            await got_small.send("small acquired")

        sem.release(1)  # one unit free: the big waiter (2) still blocks
        go(big)
        await gosim.sleep(0.001)
        go(small)
        await gosim.sleep(0.001)
        log.append(f"small blocked behind big: {got_small.len() == 0}")
        cancel_big()
        log.append(str(await got_small.recv()))

        doomed_ctx, cancel_doomed = context.with_timeout(context.background(), 0.01)
        try:
            await sem.acquire(3, ctx=doomed_ctx)  # more than the size: waits for ctx
        except context.DeadlineExceeded:
            log.append("more than the size: waited for the context")
        cancel_doomed()
        return log

    assert vrun(main) == [
        "done before: context canceled; held 0",
        "blocked then timed out: context deadline exceeded; waiters 0",
        "small blocked behind big: True",
        "small acquired",
        "more than the size: waited for the context",
    ]


def test_semaphore_units_granted_after_the_context_finished_go_back() -> None:
    """If the units and the context's end arrive together, the context wins and the
    units are returned (x/sync: "pretend we didn't")."""

    async def main() -> tuple[str, int, int]:
        sem = Semaphore(1)
        await sem.acquire()
        ctx, cancel = context.with_cancel(context.background())
        result: Chan[str] = Chan(1)

        async def waiter() -> None:
            try:
                await sem.acquire(1, ctx=ctx)
                await result.send("acquired")
            except context.Canceled:
                await result.send("canceled")

        go(waiter)
        await gosim.sleep(0.001)
        sem.release()  # grants the unit to the waiter...
        cancel()  # ...and its context ends before it runs
        outcome = await result.recv()
        assert outcome is not None
        return outcome, sem._cur, len(sem._waiters)

    assert vrun(main) == ("canceled", 0, 0)


def test_once_value_and_once_func_follow_go() -> None:
    """Go 1.21's OnceValue/OnceFunc: one call of f, its value for every caller,
    concurrent callers wait for it, and a panic is re-raised on every call."""

    async def main() -> tuple[list[int], int, list[str], int]:
        calls = 0

        async def compute() -> int:
            nonlocal calls
            calls += 1
            await gosim.sleep(0.01)
            return 42

        get = gosim.sync.once_value(compute)
        results: list[int] = []
        wg = WaitGroup()

        async def user() -> None:
            results.append(await get())

        for _ in range(3):
            wg.go(user)
        await wg.wait()
        results.append(await get())

        failures = 0

        def broken() -> None:
            nonlocal failures
            failures += 1
            raise KeyError("once")

        f = gosim.sync.once_func(broken)
        raised = []
        for _ in range(2):
            try:
                await f()
            except KeyError as exc:
                raised.append(repr(exc))
        return results, calls, raised, failures

    assert vrun(main) == ([42, 42, 42, 42], 1, ["KeyError('once')", "KeyError('once')"], 1)
