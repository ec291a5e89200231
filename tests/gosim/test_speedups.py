"""The C accelerator (gosim._speedups) against the pure-Python reference.

The whole suite runs in both modes in CI (``.ci/run`` repeats it with
``GOSIM_PURE_PYTHON=1``). These tests add what a single mode cannot show: the two
implementations take the same schedule for the same seed, and the C awaitables behave
like the generators they replace where user code can see the difference.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import textwrap
import types
import weakref
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

import gosim
from gosim import Chan, go, lowlevel, net, recv, select
from gosim._core import _state as _sched
from gosim._core._accel import speedups
from gosim.sync import Cond, Mutex, Once, RWMutex, Semaphore, WaitGroup

needs_speedups = pytest.mark.skipif(
    speedups is None,
    reason="gosim._speedups is not built here or GOSIM_PURE_PYTHON=1 turned it off",
)

# A seeded program touching every path the C code takes over: unbuffered hand-offs,
# buffered channels with blocked senders, select wake-ups, close waking both queues,
# async iteration, spawns that overflow the local run queue, exits awaited by main.
_PROGRAM = textwrap.dedent(
    """
    import json, sys
    import gosim
    from gosim import Chan, go, recv, select, send

    async def main():
        log = []
        unbuf = Chan(0)
        small = Chan(2)
        results = Chan(1000)
        pdone = Chan(0)
        stop = Chan(0)
        sdone = Chan(0)

        async def producer(k):
            i = 0
            while True:
                idx, _, _ = await select(send(small, k * 1000 + i), recv(stop))
                if idx == 1:
                    break
                i += 1
            await pdone.send((k, i))

        async def selector(k):
            for _ in range(30):
                idx, v, ok = await select(recv(unbuf), send(unbuf, -k), recv(small))
                log.append((k, idx, v, ok))
            await sdone.send(k)

        async def ranger(ch):
            total = 0
            async for v in ch:
                total += v
            await results.send(("r", total))

        r = Chan(0)
        go(ranger, r)
        for k in range(3):
            go(producer, k)
        for k in range(4):
            go(selector, k)
        async def spawned(i):
            await results.send(("w", i))

        for i in range(300):
            go(spawned, i)
        for i in range(10):
            await r.send(i)
        r.close()
        finished = [await sdone.recv() for _ in range(4)]
        stop.close()
        finished += [await pdone.recv() for _ in range(3)]
        drained = [finished]
        while len(drained) < 1 + 300 + 1:
            v, ok = await results.recv2()
            drained.append(v)
        rest = []
        while True:
            v, ok, received = small.try_recv()
            if not received:
                break
            rest.append(v)
        parked = Chan(0)
        async def blocked_sender():
            try:
                await parked.send(1)
            except gosim.ChanError as e:
                log.append(str(e))
        async def blocked_receiver():
            log.append(await parked.recv2())
        go(blocked_sender)
        go(blocked_receiver)
        await gosim.sleep(0.01)
        parked.close()
        await gosim.sleep(0.01)
        # Spawns that stay in the local queue (no spill): idle Ps wake one at a time
        # (wakep, from the C runqput as from the Python one) and steal from it.
        ran_on = []
        joined = Chan(200)
        async def where(i):
            ran_on.append((i, gosim.lowlevel.current_runtime().curp.id))
            await joined.send(i)
        for i in range(200):
            go(where, i)
        for _ in range(200):
            await joined.recv()
        st = gosim.statistics()
        return {"log": log, "drained": drained, "rest": rest, "ran_on": ran_on,
                "switches": st.context_switches, "created": st.created,
                "steals": st.steals}

    out = gosim.run(main, procs=int(sys.argv[1]), seed=int(sys.argv[2]), virtual_time=True)
    print(json.dumps(out))
    """
)


def _run_program(pure: bool, procs: int, seed: int) -> str:
    env = dict(os.environ)
    env["GOSIM_PURE_PYTHON"] = "1" if pure else "0"
    proc = subprocess.run(
        [sys.executable, "-c", _PROGRAM, str(procs), str(seed)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@needs_speedups
@pytest.mark.parametrize(("procs", "seed"), [(1, 1), (2, 7), (4, 42), (64, 3)])
def test_c_and_python_take_the_same_schedule_for_a_seed(procs: int, seed: int) -> None:
    c_out = _run_program(pure=False, procs=procs, seed=seed)
    py_out = _run_program(pure=True, procs=procs, seed=seed)
    assert c_out == py_out
    assert '"switches"' in c_out
    if procs > 1:  # the last phase's goroutines ran on several Ps, some stolen
        out = json.loads(c_out)
        assert len({p for _, p in out["ran_on"]}) > 1 and out["steals"] > 0


@needs_speedups
def test_the_public_types_are_the_c_ones_when_built() -> None:
    assert gosim.Chan is speedups.Chan
    assert gosim.go is speedups.go
    assert repr(Chan(3)) == "<Chan len=0 cap=3>"
    assert Chan[int] is not None  # generic alias, as with the Python class


def test_a_receive_made_but_not_awaited_takes_nothing() -> None:
    async def main() -> list[Any]:
        ch: Chan[int] = Chan(2)
        await ch.send(1)
        op = ch.recv()  # never awaited: the value must stay in the channel
        with pytest.warns(RuntimeWarning, match="never awaited"):  # as a coroutine warns
            del op
        got = [await ch.recv()]
        await ch.send(2)
        got.append(await ch.recv())
        return got

    assert gosim.run(main) == [1, 2]


def test_an_awaited_operation_cannot_be_awaited_again() -> None:
    # As with a native coroutine, on both paths (the Python operations are coroutines;
    # they were generators, whose second await quietly gave None). Each kind of
    # channel operation that has its own awaitable: receives of every form, a send that
    # had to park. A send that completed when called returns a shared finished
    # awaitable: the operation is over by then, and awaiting that again is a no-op.
    # (select follows the same rule since issue 17: tests/gosim/test_select_paths.py.)
    async def main() -> None:
        ch: Chan[int] = Chan(1)
        await ch.send(1)
        ops: list[Any] = []
        op = ch.recv()
        assert await op == 1
        ops.append(op)
        await ch.send(2)
        op = ch.recv2()
        assert await op == (2, True)
        ops.append(op)
        await ch.send(3)
        it = aiter(ch)
        op = anext(it)
        assert await op == 3
        ops.append(op)

        async def receiver() -> None:
            await ch.recv()

        await ch.send(5)  # fills the buffer: the next send parks
        op = ch.send(6)
        go(receiver)
        await op
        ops.append(op)
        for op in ops:
            with pytest.raises(RuntimeError, match="cannot reuse already awaited"):
                await op

    gosim.run(main)


def test_yield_from_a_receive_in_a_generator_based_coroutine() -> None:
    @types.coroutine
    def legacy(ch: Chan[int]) -> Any:
        v = yield from ch.recv()
        return v * 10

    async def main() -> int:
        ch: Chan[int] = Chan(0)

        async def sender() -> None:
            await ch.send(4)

        go(sender)
        return await legacy(ch)  # type: ignore[no-any-return]

    assert gosim.run(main) == 40


def test_buffer_grows_past_its_first_allocation_and_keeps_fifo_order() -> None:
    async def main() -> list[int | None]:
        ch: Chan[int] = Chan(10_000)
        for i in range(5_000):
            await ch.send(i)
        out = [await ch.recv() for _ in range(2_500)]
        for i in range(5_000, 7_000):
            await ch.send(i)  # wraps around the ring
        while ch.len():
            out.append(await ch.recv())
        return out

    assert gosim.run(main) == list(range(7_000))


def test_huge_capacity_costs_what_it_holds() -> None:
    ch: Chan[int] = Chan(2**40)  # Go would allocate the buffer; here it grows on demand
    assert ch.cap() == 2**40
    assert ch.len() == 0
    with pytest.raises(ValueError, match="makechan: size out of range"):
        Chan(2**80)


def test_goroutines_left_parked_when_main_returns_keep_nothing_alive() -> None:
    # G records are not tracked by the cycle collector when the C accelerator is in use,
    # so the runtime must drop what they hold when it closes.
    class Marker:
        ch: Chan[int]

    refs: list[weakref.ref[Marker]] = []

    async def parked(m: Marker) -> None:
        m.ch = Chan(0)
        await m.ch.recv()  # never satisfied: main returns first

    async def main() -> None:
        m = Marker()
        refs.append(weakref.ref(m))
        go(parked, m)
        await gosim.sleep(0.001)

    for _ in range(3):
        gosim.run(main)
    gc.collect()
    assert [r() for r in refs] == [None, None, None]


# ------------------------------------------------------------------------------------
# Python code must not crash the interpreter through the records gosim.lowlevel reaches
# (issue 18). Each program runs in a child process, so a crash shows as a signal.

_RECORDS_CHILD = textwrap.dedent(
    """
    import sys
    from collections import deque
    import gosim
    from gosim import Chan, go, lowlevel, recv, select
    from gosim._core import _state as _sched

    def workload_after(mutate):
        # Mutate a record from inside a goroutine, then use every hot path on it.
        async def main():
            rt = lowlevel.current_runtime()
            records = {"g": lowlevel.current_g(), "p": rt.curp, "rt": rt}
            try:
                mutate(records)
            except (AttributeError, TypeError) as exc:
                print("refused:", exc)
            ch, sel = Chan(0), Chan(1)
            async def sender():
                await ch.send(1)
                await sel.send(2)
            for _ in range(3):
                go(sender)
            for _ in range(3):
                await ch.recv()
                await select(recv(sel), recv(None))
            await gosim.gosched()
            await gosim.sleep(0)
        try:
            gosim.run(main, procs=2)
        except BaseException as exc:  # any Python error is fine here; a crash is not
            if isinstance(exc, SystemError):
                raise
            print("raised:", type(exc).__name__)
        finally:
            _sched._state.rt = None

    def delete(name, field):
        return lambda records: delattr(records[name], field)

    def assign(name, field, value):
        return lambda records: setattr(records[name], field, value)

    cases = sys.argv[1].split(",")
    for case in cases:
        name, field, how = case.split(".")
        print(case, flush=True)
        if how == "del":
            workload_after(delete(name, field))
        else:
            value = {"none": None, "int": 7, "list": [], "dict": {}, "deque": deque(),
                     "obj": object()}[how]
            workload_after(assign(name, field, value))
    print("survived", flush=True)
    """
)

_OBJECT_FIELDS = {
    "g": ["coro", "elem", "fn", "p", "param", "waitreason"],
    "p": ["runnext", "runq", "timers", "gfree"],
    "rt": ["curg", "curp", "trace", "allg", "call_boxes", "gfree"],
}


def _run_records_child(cases: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", _RECORDS_CHILD, ",".join(cases)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@pytest.mark.parametrize("record", sorted(_OBJECT_FIELDS))
def test_deleting_a_record_field_never_crashes(record: str) -> None:
    # `del g.coro` and friends left a NULL that the C scheduler dereferenced (SIGSEGV);
    # `del rt.trace` gave SystemError. Deletion is refused now; the pure-Python records
    # allow it and fail later with an AttributeError, which is fine: no crash.
    cases = [f"{record}.{field}.del" for field in _OBJECT_FIELDS[record]]
    proc = _run_records_child(cases)
    assert proc.returncode == 0, (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])
    assert "survived" in proc.stdout
    if speedups is not None:
        assert proc.stdout.count("refused: cannot delete") == len(cases)


@pytest.mark.parametrize("value", ["none", "int", "list", "dict", "deque", "obj"])
def test_assigning_any_value_to_a_record_field_never_crashes(value: str) -> None:
    # The C code reads rt.allg as a dict, p.runq as a deque, p.gfree as a list...:
    # those are checked on assignment; the others take any value, and a wrong one ends
    # in a Python exception (a panic, a TypeError), never in a crash.
    cases = [f"{r}.{f}.{value}" for r, fields in _OBJECT_FIELDS.items() for f in fields]
    proc = _run_records_child(cases)
    assert proc.returncode == 0, (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])
    assert "survived" in proc.stdout


@needs_speedups
def test_the_current_runtime_slot_takes_only_a_runtime() -> None:
    # The C channel code reads the per-thread slot as a runtime record.
    with pytest.raises(TypeError, match="must be a runtime or None"):
        _sched._state.rt = object()  # type: ignore[assignment]
    assert _sched._state.rt is None


# ------------------------------------------------------------------------------------
# A goroutine that leaves a channel park without being woken (an exception thrown in,
# its coroutine closed) leaves every wait queue it was on (issue 18), on both paths.


class _Interrupt(Exception):
    pass


def _step_with_throw(g: Any, exc: BaseException) -> Any:
    """Throw exc into parked goroutine g as the driver steps one (rt.curg is g meanwhile)."""
    rt = lowlevel.current_runtime()
    me = rt.curg
    rt.curg = g
    try:
        return g.coro.throw(exc)
    finally:
        rt.curg = me


async def _interrupted_waiter(
    park: Callable[[], Awaitable[Any]], wake: Callable[[], Any], settle: float = 0.0
) -> list[Any]:
    """Park a goroutine with park(), throw into it (it catches and waits on another
    channel), then wake(): what did it see? ["interrupted", 9] when nothing woke it."""
    after: Chan[int] = Chan(0)
    got: list[Any] = []
    box: list[Any] = []

    async def waiter() -> None:
        box.append(lowlevel.current_g())
        try:
            await park()
        except _Interrupt:
            got.append("interrupted")
        got.append(await after.recv())

    go(waiter)
    await gosim.gosched()  # the waiter parks
    assert box[0].status == 4  # waiting
    assert _step_with_throw(box[0], _Interrupt()) == "park"  # now parked on `after`
    wake()
    if settle:
        await gosim.sleep(settle)
    await gosim.gosched()
    await gosim.gosched()
    await after.send(9)
    await gosim.gosched()
    return got


_PARK_KINDS = ["recv", "recv2", "anext", "send", "select-recv", "select-send"]


async def _park_on(kind: str, ch: Chan[int], other: Chan[int]) -> Any:
    if kind == "recv":
        return await ch.recv()
    if kind == "recv2":
        return await ch.recv2()
    if kind == "anext":
        return await anext(aiter(ch))
    if kind == "send":
        return await ch.send(5)
    if kind == "select-recv":
        return await select(recv(ch), recv(other))
    return await select(gosim.send(ch, 5), recv(other))


@pytest.mark.parametrize("kind", _PARK_KINDS)
def test_a_park_left_by_an_exception_leaves_the_wait_queues(kind: str) -> None:
    # The goroutine catches the exception and waits on another channel: a later
    # operation on the first channel must not pair with it (it was handed the value,
    # and through select the runtime's internal Sudog).
    async def main() -> list[Any]:
        ch: Chan[int] = Chan(0)
        other: Chan[int] = Chan(0)

        def operate_on_the_channels() -> None:
            assert (len(ch._recvq), len(ch._sendq), len(other._recvq)) == (0, 0, 0)  # type: ignore[attr-defined]
            if kind in ("send", "select-send"):
                assert ch.try_recv() == (None, False, False)  # nobody is sending any more
            else:
                assert not ch.try_send(7)  # nobody is receiving any more
            assert not other.try_send(8)

        return await _interrupted_waiter(lambda: _park_on(kind, ch, other), operate_on_the_channels)

    assert gosim.run(main, procs=1) == ["interrupted", 9]


@pytest.mark.parametrize("kind", _PARK_KINDS)
def test_a_park_left_by_closing_the_coroutine_leaves_the_wait_queues(kind: str) -> None:
    async def main() -> None:
        ch: Chan[int] = Chan(0)
        other: Chan[int] = Chan(0)
        box: list[Any] = []
        finished: list[str] = []

        async def waiter() -> None:
            box.append(lowlevel.current_g())
            try:
                await _park_on(kind, ch, other)
            finally:
                finished.append("closed")

        go(waiter)
        await gosim.gosched()
        box[0].coro.close()
        assert finished == ["closed"]
        assert (len(ch._recvq), len(ch._sendq), len(other._recvq)) == (0, 0, 0)  # type: ignore[attr-defined]
        assert not ch.try_send(7) and ch.try_recv() == (None, False, False)

    gosim.run(main, procs=1)


def test_a_live_channel_cannot_be_initialised_again() -> None:
    # C kept the buffer under the new capacity (len 2, cap 0); Python dropped the buffer
    # and orphaned any parked goroutine. Go has no re-make: both refuse.
    ch: Chan[int] = Chan(2)
    assert ch.try_send(1) and ch.try_send(2)
    with pytest.raises(TypeError, match="cannot be re-initialised"):
        ch.__init__(0)  # type: ignore[misc]
    assert (ch.len(), ch.cap(), ch.try_recv()) == (2, 2, (1, True, True))


_FUZZ_RECORDS = textwrap.dedent(
    """
    import signal
    from collections import deque
    from hypothesis import HealthCheck, given, settings, strategies as st
    import gosim
    from gosim import Chan, go, lowlevel, recv, select, send
    from gosim._core import _state as _sched

    FIELDS = {
        "g": ["coro", "elem", "fn", "p", "param", "waitreason", "goid", "parent", "status",
              "ok", "selectdone"],
        "p": ["runnext", "runq", "timers", "gfree", "id", "schedtick"],
        "rt": ["curg", "curp", "trace", "allg", "call_boxes", "gfree", "nswitch", "goidgen",
               "main_goexited"],
        "state": ["rt"],
    }
    VALUES = st.sampled_from(["none", "int", "huge", "negative", "str", "list", "dict",
                              "deque", "object", "true", "a_g", "a_p", "the_rt"])
    ACTIONS = st.lists(
        st.tuples(st.sampled_from(sorted(FIELDS)), st.integers(0, 10),
                  st.sampled_from(["del", "set"]), VALUES),
        min_size=1, max_size=3)

    def value(name, records):
        return {"none": None, "int": 3, "huge": 2**62, "negative": -5, "str": "x",
                "list": [], "dict": {}, "deque": deque(), "object": object(), "true": True,
                "a_g": records["g"], "a_p": records["p"], "the_rt": records["rt"]}[name]

    def timeout(signum, frame):
        raise TimeoutError("example took too long")

    signal.signal(signal.SIGALRM, timeout)

    @settings(max_examples=MAX_EXAMPLES, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(actions=ACTIONS, when=st.sampled_from(["first", "after_spawn", "in_child"]))
    def fuzz(actions, when):
        def mutate():
            rt = lowlevel.current_runtime()
            records = {"g": lowlevel.current_g(), "p": rt.curp, "rt": rt, "state": _sched._state}
            for name, i, how, v in actions:
                field = FIELDS[name][i % len(FIELDS[name])]
                try:
                    if how == "del":
                        delattr(records[name], field)
                    else:
                        setattr(records[name], field, value(v, records))
                except (AttributeError, TypeError, ValueError, OverflowError):
                    pass

        async def child(ch, out):
            if when == "in_child":
                mutate()
            v = await ch.recv()
            await out.send(v)

        async def main():
            if when == "first":
                mutate()
            ch, out, buf = Chan(0), Chan(0), Chan(2)
            for _ in range(2):
                go(child, ch, out)
            if when == "after_spawn":
                mutate()
            for i in range(2):
                await ch.send(i)
                await select(recv(out), send(buf, i))
            await gosim.gosched()
            await gosim.sleep(0)

        signal.alarm(20)
        try:
            gosim.run(main, procs=2)
        except SystemError:
            raise
        except BaseException:
            pass  # any Python error: a wrong field makes the runtime fail, not crash
        finally:
            signal.alarm(0)
            _sched._state.rt = None

    fuzz()
    print("survived")
    """
)


def test_fuzz_the_records_with_deletions_and_assignments() -> None:
    # Bounded: each example is one short runtime; a crash ends the child with a signal.
    proc = subprocess.run(
        [sys.executable, "-c", "MAX_EXAMPLES = 150\n" + _FUZZ_RECORDS],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, (proc.returncode, proc.stdout[-2000:], proc.stderr[-3000:])
    assert proc.stdout.split()[-1:] == ["survived"]


def test_a_sleep_left_by_an_exception_disarms_its_timer() -> None:
    # The same rule for the timer a sleep parks on: it must not wake the goroutine in
    # whatever it waits on next.
    async def main() -> list[Any]:
        after: Chan[int] = Chan(0)
        got: list[Any] = []
        box: list[Any] = []

        async def sleeper() -> None:
            box.append(lowlevel.current_g())
            try:
                await gosim.sleep(0.01)
            except _Interrupt:
                got.append("interrupted")
            got.append(await after.recv())

        go(sleeper)
        await gosim.gosched()
        assert _step_with_throw(box[0], _Interrupt()) == "park"
        await gosim.sleep(0.05)  # the sleep's timer would have fired by now
        assert got == ["interrupted"]
        await after.send(9)
        await gosim.gosched()
        return got

    assert gosim.run(main, procs=1, virtual_time=True) == ["interrupted", 9]


# ------------------------------------------------------------------------------------
# The same for the parks with wait queues of their own (lowlevel.ParkingLot and Waiter):
# A goroutine that leaves a park by an exception leaves the wait queue it was on.
#
# The locks, Cond, WaitGroup, Once, Semaphore and the simulated network park through their
# own wait queues (``lowlevel.ParkingLot``). When the park ends without a wake (an exception
# thrown into the goroutine, its coroutine closed), the entry must go, as the channels'
# does: else a later unlock, signal or arriving segment hands off to a goroutine that has
# gone on to wait elsewhere (and a starving Mutex hands it the lock, which is then lost).
# Each test throws into a parked goroutine as the driver would step it, lets it wait on
# another channel, then does the operation that would wake it.


def test_mutex_unlock_does_not_wake_a_waiter_that_left() -> None:
    async def main() -> tuple[list[Any], bool]:
        mu = Mutex()
        await mu.lock()
        got = await _interrupted_waiter(mu.lock, mu.unlock)
        return got, mu.try_lock()  # nobody took the lock on the departed waiter's behalf

    assert gosim.run(main, procs=1) == (["interrupted", 9], True)


def test_a_starving_mutex_does_not_hand_the_lock_to_a_waiter_that_left() -> None:
    async def main() -> tuple[list[Any], bool, int]:
        mu = Mutex()
        await mu.lock()
        mu._starving = True  # type: ignore[attr-defined] # the handoff path
        got = await _interrupted_waiter(mu.lock, mu.unlock)
        return got, mu.locked(), len(mu._waiters)  # type: ignore[attr-defined]

    assert gosim.run(main, procs=1) == (["interrupted", 9], False, 0)


@pytest.mark.parametrize("kind", ["rlock", "lock"])
def test_rwmutex_unlock_does_not_wake_a_waiter_that_left(kind: str) -> None:
    async def main() -> tuple[list[Any], bool]:
        rw = RWMutex()
        await rw.lock()
        got = await _interrupted_waiter(getattr(rw, kind), rw.unlock)
        return got, rw.try_lock()  # free: no reader or writer was counted in

    assert gosim.run(main, procs=1) == (["interrupted", 9], True)


def test_cond_signal_does_not_wake_a_waiter_that_left() -> None:
    async def main() -> list[Any]:
        mu = Mutex()
        cond = Cond(mu)

        async def wait() -> None:
            await mu.lock()
            await cond.wait()

        return await _interrupted_waiter(wait, cond.signal)

    assert gosim.run(main, procs=1) == ["interrupted", 9]


def test_waitgroup_done_does_not_wake_a_waiter_that_left() -> None:
    async def main() -> list[Any]:
        wg = WaitGroup()
        wg.add(1)
        return await _interrupted_waiter(wg.wait, wg.done)

    assert gosim.run(main, procs=1) == ["interrupted", 9]


def test_once_does_not_wake_a_waiter_that_left() -> None:
    async def main() -> list[Any]:
        once = Once()
        release: Chan[None] = Chan(0)

        async def slow() -> None:
            await release.recv()

        go(once.do, slow)
        await gosim.gosched()  # the first caller runs slow and waits in it

        async def second() -> None:
            await once.do(slow)

        def finish() -> None:
            assert release.try_send(None)

        return await _interrupted_waiter(second, finish)

    assert gosim.run(main, procs=1) == ["interrupted", 9]


def test_semaphore_release_does_not_wake_a_waiter_that_left() -> None:
    async def main() -> tuple[list[Any], bool]:
        sem = Semaphore(1)
        await sem.acquire()
        got = await _interrupted_waiter(sem.acquire, sem.release)
        return got, sem.try_acquire()  # the unit was not granted to the departed waiter

    assert gosim.run(main, procs=1) == (["interrupted", 9], True)


def test_sim_network_data_does_not_wake_a_reader_that_left() -> None:
    async def main() -> list[Any]:
        net.use_sim_network(net.SimNetwork(seed=1, latency=(0.001, 0.002)))
        ln = net.listen("sim", "server:1")
        accepted: Chan[Any] = Chan(1)

        async def accept() -> None:
            await accepted.send(await ln.accept())

        go(accept)
        client = await net.dial("sim", "server:1", local_host="c")
        server = await accepted.recv()
        assert server is not None

        async def read() -> None:
            await server.read(100)

        def write() -> None:
            go(client.write, b"hello")

        got = await _interrupted_waiter(read, write, settle=0.1)
        got.append(await server.read(100))  # the data waited for the next reader
        client.close()
        server.close()
        ln.close()
        return got

    assert gosim.run(main, procs=1, seed=1, virtual_time=True) == ["interrupted", 9, b"hello"]
