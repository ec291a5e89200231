"""gosim.lowlevel's Waiter and ParkingLot: settle-once, deadlines, leaving by exception.

The ParkingLot is checked against a model by a hypothesis state machine whose rules run
in goroutines of a real runtime (``open_runtime`` in a thread of its own; each rule is
one ``rt.call``): goroutines really park, unparks really wake them, and a goroutine
interrupted while parked (an exception thrown in, as the driver would) must leave the
lot. The Waiter's deadlines run under virtual time. Both run on the C path and with
``GOSIM_PURE_PYTHON=1`` (and ``GOSIM_DEBUG=1``), as the whole suite does.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
import threading
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
)

import gosim
from gosim import Chan, _internals, go, lowlevel
from gosim._core._accel import speedups
from gosim.lowlevel import (
    ParkingLot,
    ParkingLotStatistics,
    Waiter,
    WaitReason,
    WaitTimeout,
)

needs_speedups = pytest.mark.skipif(
    speedups is None,
    reason="gosim._speedups is not built here or GOSIM_PURE_PYTHON=1 turned it off",
)


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


# ------------------------------------------------------------------ the Waiter


def test_the_first_settle_wins_and_later_ones_change_nothing() -> None:
    async def main() -> list[Any]:
        w = Waiter()
        got: list[Any] = [w.done(), w.settle(1), w.settle(2), w.fail(ValueError()), w.cancel()]
        got += [w.done(), w.result(), await w.wait(), await w.wait()]
        return got

    assert gosim.run(main, procs=1) == [False, True, False, False, False, True, 1, 1, 1]


def test_a_failed_waiter_raises_its_error_at_every_wait() -> None:
    async def main() -> int:
        w = Waiter()
        assert w.fail(KeyError("k"))
        assert not w.settle(3)
        raised = 0
        for _ in range(2):
            try:
                await w.wait()
            except KeyError:
                raised += 1
        with pytest.raises(KeyError):
            w.result()
        return raised

    assert gosim.run(main, procs=1) == 2


def test_a_parked_goroutine_gets_the_value_of_a_later_settle() -> None:
    async def main() -> list[Any]:
        w = Waiter()
        got: list[Any] = []

        async def waiter() -> None:
            got.append(await w.wait(WaitReason.RPC_REPLY))

        go(waiter)
        await gosim.gosched()
        assert not got and not w.done()
        assert w.settle("reply")
        await gosim.gosched()
        return got

    assert gosim.run(main, procs=1) == ["reply"]


def test_a_waiter_has_one_consumer() -> None:
    async def main() -> list[str]:
        w = Waiter()
        errors: list[str] = []

        async def waiter() -> None:
            await w.wait()

        go(waiter)
        await gosim.gosched()
        try:
            await w.wait()
        except RuntimeError:
            errors.append("second wait")
        try:
            w.on_settle(lambda arg, w: None)
        except RuntimeError:
            errors.append("callback")
        w.settle()
        await gosim.gosched()
        return errors

    assert gosim.run(main, procs=1) == ["second wait", "callback"]


def test_a_callback_consumer_runs_once_at_the_settle_or_at_once() -> None:
    async def main() -> list[Any]:
        calls: list[Any] = []
        w = Waiter()
        w.on_settle(lambda arg, w: calls.append((arg, w.result())), "a")
        assert calls == []
        w.settle(5)
        w.settle(6)
        late = Waiter()
        late.fail(ValueError("no"))
        late.on_settle(lambda arg, w: calls.append((arg, type(w._value).__name__)), "b")
        try:
            await w.wait()  # a settled waiter may still be read by a goroutine
        except RuntimeError:  # pragma: no cover - the failure this guards against
            calls.append("refused")
        return calls

    assert gosim.run(main, procs=1) == [("a", 5), ("b", "ValueError")]


def test_the_deadline_fails_the_wait_with_wait_timeout_at_that_virtual_time() -> None:
    async def main() -> tuple[float, bool, str]:
        w = Waiter()
        start = gosim.now()
        w.set_deadline(start + 2.5)
        try:
            await w.wait(WaitReason.TIMER_WAIT)
        except WaitTimeout as exc:
            return gosim.now() - start, isinstance(exc, TimeoutError), type(exc).__name__
        return -1.0, False, ""

    assert gosim.run(main, procs=1, virtual_time=True) == (2.5, True, "WaitTimeout")


def test_the_deadline_can_settle_with_a_value_instead() -> None:
    async def main() -> tuple[Any, float]:
        w = Waiter()
        w.set_deadline(gosim.now() + 1.0, expired="late")
        return await w.wait(), gosim.now()

    assert gosim.run(main, procs=1, virtual_time=True) == ("late", 1.0)


def test_a_settle_before_the_deadline_disarms_its_timer() -> None:
    async def main() -> tuple[Any, float, bool]:
        w = Waiter()
        w.set_deadline(gosim.now() + 10.0)

        async def settler() -> None:
            await gosim.sleep(1.0)
            w.settle("first")

        go(settler)
        got = await w.wait()
        armed = w._timer is not None and w._timer.armed
        # Nothing else is pending: a timer left armed would keep the program alive to 10 s.
        return got, gosim.now(), armed

    assert gosim.run(main, procs=1, virtual_time=True) == ("first", 1.0, False)


def test_a_moved_deadline_is_rechecked_before_it_expires() -> None:
    async def main() -> tuple[Any, float]:
        deadline = [gosim.now() + 1.0]
        w = Waiter()
        w.set_deadline(deadline[0], expired="idle", recheck=lambda: deadline[0])

        async def mover() -> None:
            await gosim.sleep(0.5)
            deadline[0] = gosim.now() + 3.0  # heard from the peer: wait on

        go(mover)
        return await w.wait(WaitReason.HEARTBEAT), gosim.now()

    assert gosim.run(main, procs=1, virtual_time=True) == ("idle", 3.5)


def test_set_deadline_inf_disarms_and_reset_makes_a_waiter_reusable() -> None:
    async def main() -> list[Any]:
        w = Waiter()
        w.set_deadline(gosim.now() + 1.0)
        w.set_deadline(math.inf)
        got: list[Any] = [w._timer is not None and w._timer.armed]
        w.settle(1)
        got.append(await w.wait())
        w.reset()
        got.append(w.done())
        w.set_deadline(gosim.now() + 2.0, expired=2)
        got.append(await w.wait())
        got.append(gosim.now())
        return got

    assert gosim.run(main, procs=1, virtual_time=True) == [False, 1, False, 2, 2.0]


def test_a_timer_callback_settles_a_waiter_on_the_driver() -> None:
    async def main() -> Any:
        w = Waiter()
        timer = lowlevel.RuntimeTimer(lambda waiter, now: waiter.settle(("timer", now)), w)
        lowlevel.add_timer(timer, gosim.now() + 4.0)
        return await w.wait()

    assert gosim.run(main, procs=1, virtual_time=True) == ("timer", 4.0)


def test_a_trio_task_of_the_runtime_settles_a_waiter() -> None:
    """A settle from trio code of the runtime's run (outside the driver's stepping, as
    in a trio call) hands the goroutine to the driver, as a syscall's return does."""

    async def main() -> list[Any]:
        w = Waiter()
        got: list[Any] = []

        async def waiter() -> None:
            got.append(await w.wait())

        async def from_trio() -> bool:
            assert _internals.state.rt is None  # not on the driver
            await trio.sleep(0)
            return w.settle("from trio")

        go(waiter)
        await gosim.gosched()
        got.append(await gosim.trio_call(from_trio))
        await gosim.gosched()
        return got

    assert gosim.run(main, procs=1) == [True, "from trio"]


def test_wait_outside_a_goroutine_raises_not_in_runtime() -> None:
    w = Waiter()
    with pytest.raises(gosim.NotInRuntime):
        w.wait().send(None)
    with pytest.raises(gosim.NotInRuntime):
        w.set_deadline(1.0)


# ------------------------------------------------------------ leaving by exception


def test_a_goroutine_interrupted_while_parked_leaves_lot_and_timer() -> None:
    async def main() -> list[Any]:
        lot = ParkingLot()
        w = Waiter()
        box: list[Any] = []
        after: Chan[int] = Chan()

        async def parked() -> None:
            box.append(lowlevel.current_g())
            w.set_deadline(gosim.now() + 5.0)
            lot.add(w)
            try:
                await w.wait()
            except _Interrupt:
                box.append("interrupted")
            box.append(await after.recv())

        go(parked)
        await gosim.gosched()
        assert len(lot) == 1 and w._timer is not None and w._timer.armed
        assert _step_with_throw(box[0], _Interrupt()) is _internals.PARK
        state = [len(lot), w._timer.armed, w.done(), lot.unpark("lost"), w.settle(1)]
        await after.send(9)
        await gosim.gosched()
        return [*state, box[1:]]

    assert gosim.run(main, procs=1, virtual_time=True) == [
        0,
        False,
        True,
        None,
        False,
        ["interrupted", 9],
    ]


def test_goroutines_closed_while_parked_at_shutdown_leave_nothing_behind() -> None:
    lot = ParkingLot()
    waiters: list[Waiter] = []

    async def main() -> None:
        async def parker(i: int) -> None:
            if i % 2:
                await lot.park(WaitReason.WAITER, i)
            else:
                w = Waiter(i)
                waiters.append(w)
                w.set_deadline(gosim.now() + 100.0)
                lot.add(w)
                await w.wait()

        for i in range(6):
            go(parker, i)
        await gosim.gosched()
        assert len(lot) == 6
        # main returns: the runtime closes the six parked coroutines

    gosim.run(main, procs=1, virtual_time=True)
    assert len(lot) == 0
    assert all(w.done() and w._timer is not None and not w._timer.armed for w in waiters)


# ---------------------------------------------------------------- dumps


def test_deadlock_dump_prints_the_typed_reasons_as_go_does() -> None:
    async def main() -> None:
        w = Waiter()

        async def rpc() -> None:
            await w.wait(WaitReason.RPC_REPLY)

        async def parked() -> None:
            await ParkingLot().park(WaitReason.COMMIT_WAIT)

        go(rpc)
        go(parked)
        await Waiter().wait(WaitReason.HEARTBEAT)

    with pytest.raises(gosim.Deadlock) as info:
        gosim.run(main, procs=1)
    dump = info.value.dump
    assert "goroutine 1 [heartbeat wait]:" in dump
    assert "goroutine 2 [rpc reply]:" in dump
    assert "goroutine 3 [idempotency commit]:" in dump
    assert "WaitReason" not in str(info.value)


def test_wait_reasons_are_go_s_strings() -> None:
    # The ones Go has, with Go's words (runtime2.go's waitReasonStrings).
    go_words = {
        "chan receive",
        "chan send",
        "chan receive (nil chan)",
        "chan send (nil chan)",
        "select",
        "select (no cases)",
        "sleep",
        "semacquire",
        "sync.Cond.Wait",
        "sync.Mutex.Lock",
        "sync.RWMutex.RLock",
        "sync.RWMutex.Lock",
        "sync.WaitGroup.Wait",
        "IO wait",
    }
    assert go_words <= {str(r) for r in WaitReason}
    assert f"[{WaitReason.SYNC_MUTEX_LOCK}]" == "[sync.Mutex.Lock]"
    assert isinstance(WaitReason.SLEEP, str) and str(WaitReason.SLEEP) == "sleep"


# ------------------------------------------------------------------ the ParkingLot


class _RuntimeThread:
    """A gosim runtime (one P) driven by trio in a thread; :meth:`call` runs one goroutine.

    A keeper goroutine waits in a trio call until :meth:`stop`: between calls every
    other goroutine may be parked, which is no deadlock while the test goes on.
    """

    def __init__(self) -> None:
        self._ready = threading.Event()
        self._stop: trio.Event | None = None
        self._token: Any = None
        self._handle: Any = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, daemon=True)
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError("the runtime thread did not start")

    def _main(self) -> None:
        async def top() -> None:
            self._stop = trio.Event()
            async with gosim.open_runtime(procs=1) as handle:
                self._handle = handle
                self._token = trio.lowlevel.current_trio_token()
                stop = self._stop

                async def keeper() -> None:
                    await gosim.trio_call(stop.wait)

                async def start_keeper() -> None:
                    go(keeper)
                    await gosim.gosched()

                await handle.call(start_keeper)
                self._ready.set()
                await self._stop.wait()

        try:
            trio.run(top)
        except BaseException as exc:  # reported by the test that stops it
            self.error = exc
            self._ready.set()

    def call(self, fn: Callable[[], Awaitable[Any]]) -> Any:
        return trio.from_thread.run(self._handle.call, fn, trio_token=self._token)

    def stop(self) -> None:
        assert self._stop is not None
        trio.from_thread.run_sync(self._stop.set, trio_token=self._token)
        self._thread.join(30)


class ParkingLotMachine(RuleBasedStateMachine):
    """Two lots, goroutines parked on them; every operation checked against a model.

    The model is, per lot, the ids of its parked goroutines in queue order, and per
    goroutine what it must have seen: ("woke", value), ("interrupted",) or
    ("cancelled",). Each rule runs as one goroutine; after it the woken ones have run.
    """

    def __init__(self) -> None:
        super().__init__()
        self.rt = _RuntimeThread()
        self.lots = [ParkingLot(), ParkingLot()]
        self.model: list[list[int]] = [[], []]
        self.expect: dict[int, tuple[Any, ...]] = {}
        self.seen: dict[int, tuple[Any, ...]] = {}
        self.gs: dict[int, Any] = {}
        self.exits: dict[int, Chan[None]] = {}
        self.next_id = 0

    def teardown(self) -> None:
        self.rt.stop()
        assert self.rt.error is None, self.rt.error

    def _run(self, body: Callable[[], Any]) -> Any:
        async def op() -> Any:
            out = body()
            for _ in range(3):  # let every goroutine this readied run to its next park
                await gosim.gosched()
            return out

        return self.rt.call(op)

    @rule(lot=st.integers(0, 1), front=st.booleans())
    def park(self, lot: int, front: bool) -> None:
        k = self.next_id
        self.next_id += 1
        exit_ch: Chan[None] = Chan()
        self.exits[k] = exit_ch
        parking = self.lots[lot]

        async def parker() -> None:
            self.gs[k] = lowlevel.current_g()
            try:
                v = await parking.park(WaitReason.WAITER, k, front)
                self.seen[k] = ("woke", v)
            except _Interrupt:
                self.seen[k] = ("interrupted",)
            except lowlevel.WaitCancelled:
                self.seen[k] = ("cancelled",)
            await exit_ch.recv()  # stays parked elsewhere, out of every lot

        self._run(lambda: go(parker))
        if front:
            self.model[lot].insert(0, k)
        else:
            self.model[lot].append(k)

    @rule(lot=st.integers(0, 1), value=st.integers())
    def unpark(self, lot: int, value: int) -> None:
        w = self._run(lambda: self.lots[lot].unpark(value))
        if not self.model[lot]:
            assert w is None
            return
        k = self.model[lot].pop(0)
        assert w is not None and w.data == k and w.done()
        self.expect[k] = ("woke", value)

    @rule(lot=st.integers(0, 1), value=st.integers())
    def unpark_all(self, lot: int, value: int) -> None:
        n = self._run(lambda: self.lots[lot].unpark_all(value))
        assert n == len(self.model[lot])
        for k in self.model[lot]:
            self.expect[k] = ("woke", value)
        self.model[lot] = []

    @rule(src=st.integers(0, 1), count=st.integers(0, 4))
    def repark(self, src: int, count: int) -> None:
        dst = 1 - src
        moved = self._run(lambda: self.lots[src].repark(self.lots[dst], count))
        take = self.model[src][:count]
        assert moved == len(take)
        self.model[src] = self.model[src][count:]
        self.model[dst].extend(take)

    @rule(src=st.integers(0, 1))
    def repark_all(self, src: int) -> None:
        dst = 1 - src
        moved = self._run(lambda: self.lots[src].repark_all(self.lots[dst]))
        assert moved == len(self.model[src])
        self.model[dst].extend(self.model[src])
        self.model[src] = []

    @precondition(lambda self: any(self.model))
    @rule(data=st.data())
    def interrupt(self, data: st.DataObject) -> None:
        """Throw into a parked goroutine, as the driver would: it must leave its lot."""
        parked = [k for m in self.model for k in m]
        k = data.draw(st.sampled_from(parked))
        trap = self._run(lambda: _step_with_throw(self.gs[k], _Interrupt()))
        assert trap is _internals.PARK  # now parked on its exit channel
        for m in self.model:
            if k in m:
                m.remove(k)
        self.expect[k] = ("interrupted",)

    @precondition(lambda self: any(self.model))
    @rule(lot=st.integers(0, 1))
    def cancel_head(self, lot: int) -> None:
        def cancel() -> bool:
            w = self.lots[lot].peek()
            return w is not None and w.cancel()

        cancelled = self._run(cancel)
        assert cancelled == bool(self.model[lot])
        if self.model[lot]:
            self.expect[self.model[lot].pop(0)] = ("cancelled",)

    @invariant()
    def lots_match_the_model(self) -> None:
        for lot, model in zip(self.lots, self.model, strict=True):
            assert [w.data for w in lot] == model
            assert len(lot) == len(model) and bool(lot) == bool(model)
            assert lot.statistics() == ParkingLotStatistics(waiters=len(model))
            assert all(not w.done() for w in lot)

    @invariant()
    def every_goroutine_saw_what_it_should(self) -> None:
        assert self.seen == self.expect


ParkingLotMachine.TestCase.settings = settings(
    max_examples=40, stateful_step_count=25, deadline=None
)
TestParkingLot = ParkingLotMachine.TestCase


def test_a_lot_never_hands_a_grant_to_a_waiter_whose_deadline_passed() -> None:
    async def main() -> tuple[list[Any], int]:
        lot = ParkingLot()
        got: list[Any] = []

        async def timed(i: int) -> None:
            w = Waiter(i)
            w.set_deadline(gosim.now() + 1.0)
            lot.add(w)
            try:
                got.append(await w.wait())
            except WaitTimeout:
                got.append(("timeout", i))

        async def plain(i: int) -> None:
            got.append(await lot.park(WaitReason.WAITER, i))

        go(timed, 0)
        go(plain, 1)
        await gosim.sleep(2.0)
        left = len(lot)
        lot.unpark("grant")
        await gosim.gosched()
        return got, left

    assert gosim.run(main, procs=1, virtual_time=True) == ([("timeout", 0), "grant"], 1)


# ------------------------------------------------- the C twin against the reference

_TWIN_PROGRAM = textwrap.dedent(
    """
    import json, sys
    import gosim
    from gosim import go
    from gosim.lowlevel import ParkingLot, Waiter, WaitCancelled, WaitReason, WaitTimeout

    def outcome(w):
        try:
            return ["value", w.result()]
        except Exception as exc:
            return ["error", type(exc).__name__]

    async def main():
        lots = [ParkingLot(), ParkingLot()]
        seen = []

        async def parker(k, lot, front, deadline):
            try:
                if deadline:
                    w = Waiter(k)
                    w.set_deadline(gosim.now() + deadline)
                    lots[lot].add(w, front)
                    v = await w.wait(WaitReason.RPC_REPLY)
                else:
                    v = await lots[lot].park(WaitReason.WAITER, k, front)
                seen.append([k, "woke", v, gosim.now()])
            except WaitTimeout:
                seen.append([k, "timeout", gosim.now()])
            except WaitCancelled:
                seen.append([k, "cancelled"])

        for k, op in enumerate(json.loads(sys.argv[1])):
            kind = op[0]
            if kind == "park":
                go(parker, k, op[1], op[2], op[3])
            elif kind == "callback":
                w = Waiter(k)
                w.on_settle(lambda arg, w: seen.append([arg, "callback", outcome(w)]), k)
                lots[op[1]].add(w, op[2])
            elif kind == "unpark":
                w = lots[op[1]].unpark(op[2])
                seen.append(["unpark", None if w is None else [w.data, outcome(w)]])
            elif kind == "unpark_all":
                seen.append(["all", lots[op[1]].unpark_all(op[2])])
            elif kind == "repark":
                seen.append(["repark", lots[op[1]].repark(lots[1 - op[1]], op[2])])
            elif kind == "cancel":
                w = lots[op[1]].peek()
                seen.append(["cancel", w is not None and w.cancel()])
            else:
                await gosim.sleep(op[1])
            await gosim.gosched()
            seen.append(["lots", [[w.data for w in lot] for lot in lots]])
        for lot in lots:
            lot.unpark_all("end")
        await gosim.gosched()
        print(json.dumps(seen))

    gosim.run(main, procs=1, seed=1, virtual_time=True)
    """
)

_LOT = st.integers(0, 1)
_TWIN_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("park"), _LOT, st.booleans(), st.sampled_from([0, 0, 1.5, 4])),
        st.tuples(st.just("callback"), _LOT, st.booleans()),
        st.tuples(st.just("unpark"), _LOT, st.integers(-5, 5)),
        st.tuples(st.just("unpark_all"), _LOT, st.integers(-5, 5)),
        st.tuples(st.just("repark"), _LOT, st.integers(0, 3)),
        st.tuples(st.just("cancel"), _LOT),
        st.tuples(st.just("sleep"), st.sampled_from([1.0, 2.0])),
    ),
    min_size=1,
    max_size=16,
)


def _run_twin(ops: list[Any], pure: bool) -> Any:
    env = dict(os.environ)
    env.pop("GOSIM_PURE_PYTHON", None)
    if pure:
        env["GOSIM_PURE_PYTHON"] = "1"
    res = subprocess.run(
        [sys.executable, "-c", _TWIN_PROGRAM, json.dumps(ops)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


@needs_speedups
@settings(max_examples=12, deadline=None)
@given(_TWIN_OPS)
def test_the_c_waiter_and_lot_see_what_the_reference_sees(ops: list[Any]) -> None:
    """One program of parks (plain, with deadlines, with callbacks), unparks, reparks,
    cancels and sleeps, run on the C twin and on the pure-Python reference: every
    observation (who woke with what, when, in what order, what is left queued) agrees."""
    c_seen = _run_twin(ops, pure=False)
    assert c_seen == _run_twin(ops, pure=True)
    assert any(entry[0] == "lots" for entry in c_seen)


def test_the_twin_types_are_the_ones_in_use() -> None:
    if speedups is None:
        assert Waiter.__mro__[1].__module__ == "gosim._core._wait"
    else:
        assert issubclass(Waiter, speedups.WaiterBase)
        assert issubclass(ParkingLot, speedups.ParkingLotBase)
    assert issubclass(ParkingLot, deque)


def test_park_takes_its_data_and_front_by_keyword_too() -> None:
    async def main() -> list[Any]:
        lot = ParkingLot()
        got: list[Any] = []

        async def parker(i: int, front: bool) -> None:
            got.append(await lot.park(WaitReason.WAITER, data=i, front=front))

        go(parker, 1, False)
        go(parker, 2, True)
        await gosim.gosched()
        order = [w.data for w in lot]
        lot.unpark_all("x")
        await gosim.gosched()
        return [order, got]

    assert gosim.run(main, procs=1) == [[2, 1], ["x", "x"]]
