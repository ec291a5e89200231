"""The RPC layer's race on gosim's Waiter (a reply, a lost link or the deadline: the first
settle wins, whoever brings it and whenever) and await_done, the awaiting form of every
call-back operation."""

from __future__ import annotations

import math
from typing import Any

import pytest

import gosim
from gosim import go, lowlevel
from gosim.lowlevel import Waiter, WaitReason
from idempotency._waiter import await_done

EXPIRED = object()


def vrun(main: Any) -> Any:
    return gosim.run(main, procs=2, seed=1, virtual_time=True)


def race(w: Waiter, deadline: float, expired: Any = None) -> Any:
    """The client's wait for a reply: the deadline, then the park as an RPC reply."""
    if deadline != math.inf:
        w.set_deadline(deadline, expired)
    return w.wait(WaitReason.RPC_REPLY)


def test_a_settle_while_parked_wakes_the_waiter_and_later_ones_change_nothing() -> None:
    async def main() -> tuple[Any, bool, bool, float]:
        w = Waiter()
        results: list[bool] = []

        async def settler() -> None:
            await gosim.sleep(0.5)
            results.append(w.settle("reply"))
            results.append(w.settle("second"))

        go(settler)
        start = gosim.now()
        got = await race(w, start + 10.0, EXPIRED)
        return got, results[0], results[1], gosim.now() - start

    got, first, second, waited = vrun(main)
    assert (got, first, second) == ("reply", True, False)
    assert waited == pytest.approx(0.5)


def test_a_settle_before_the_wait_is_kept_and_the_wait_returns_at_once() -> None:
    async def main() -> tuple[Any, float, int]:
        w = Waiter()
        w.settle("early")
        start = gosim.now()
        got = await race(w, start + 10.0, EXPIRED)
        # no timer was left behind: the runtime has nothing to wake for
        return got, gosim.now() - start, lowlevel.current_runtime().timers.narmed

    assert vrun(main) == ("early", 0.0, 0)


def test_the_deadline_settles_it_with_expired_and_a_late_settle_is_refused() -> None:
    async def main() -> tuple[Any, float, bool]:
        w = Waiter()
        start = gosim.now()
        got = await race(w, start + 0.25, EXPIRED)
        return got, gosim.now() - start, w.settle("late")

    got, waited, late = vrun(main)
    assert got is EXPIRED
    assert waited == pytest.approx(0.25)
    assert late is False


def test_a_settled_wait_leaves_no_armed_timer_and_no_deadline_arms_none() -> None:
    async def main() -> tuple[int, int, int]:
        w = Waiter()

        async def settler() -> None:
            armed.append(lowlevel.current_runtime().timers.narmed)
            w.settle(1)

        armed: list[int] = []
        go(settler)
        await race(w, gosim.now() + 60.0, EXPIRED)
        after = lowlevel.current_runtime().timers.narmed
        w2 = Waiter()

        async def settler2() -> None:
            armed.append(lowlevel.current_runtime().timers.narmed)
            w2.settle(2)

        go(settler2)
        await race(w2, math.inf)
        return armed[0], after, armed[1]

    assert vrun(main) == (1, 0, 0)


def test_a_cancelled_wait_settles_it_so_nothing_wakes_a_goroutine_that_left() -> None:
    async def main() -> tuple[bool, bool, str]:
        w = Waiter()
        coro = race(w, gosim.now() + 60.0, EXPIRED)
        # Drive the wait by hand up to its park, then throw into it as a cancellation
        # would: the waiter leaves, and a settle afterwards must not ready it.
        coro.send(None)
        try:
            coro.throw(KeyboardInterrupt())
        except KeyboardInterrupt:
            pass
        return w.done(), w.settle("after"), str(lowlevel.current_runtime().timers.narmed)

    assert vrun(main) == (True, False, "0")


def test_only_inside_a_goroutine() -> None:
    with pytest.raises(gosim.NotInRuntime):
        race(Waiter(), 1.0).send(None)


@pytest.mark.parametrize("seed", range(16))
def test_a_method_that_ends_with_its_context_cannot_answer_before_the_deadline(
    seed: int,
) -> None:
    # The context's timer wakes the method, which then returns at once; the server's
    # race must still answer DEADLINE_EXCEEDED (its timer fires in the same pass, before
    # the method's goroutine runs), on every schedule the seeds give.
    from gosim import context, recv, select  # noqa: PLC0415
    from idempotency.rpc import Server, Status  # noqa: PLC0415
    from idempotency.rpc._protocol import CallMeta, Response, decode, encode_request  # noqa: PLC0415

    async def main() -> tuple[Any, int, int]:
        srv = Server(heartbeat_interval=None)

        @srv.method(pass_context=True)
        async def wait_for_cancel(ctx: context.Context) -> str:
            done = ctx.done()
            assert done is not None
            await select(recv(done), recv(gosim.after(60.0)))
            return "ended with the context"

        payload = encode_request(7, "wait_for_cancel", [], CallMeta(None, None, 100, 1))
        reply = await srv.dispatcher.handle_payload(payload)
        await gosim.sleep(0.01)  # the method's goroutine finishes its late reply
        msg = decode(reply)
        assert isinstance(msg, Response)
        stats = srv.statistics()
        answer = msg.error[0] if msg.error else msg.result
        return answer, stats.deadline_exceeded, stats.late_completions

    assert gosim.run(main, procs=1 + seed % 2, seed=seed, virtual_time=seed % 4 < 2) == (
        Status.DEADLINE_EXCEEDED,
        1,
        1,
    )


# await_done: the awaiting form of every call-back operation, in one place.


def test_await_done_returns_the_result_or_raises_the_error_whenever_done_comes() -> None:
    def at_once(value: Any, done: Any) -> None:
        done(value, None)

    def later(value: Any, done: Any) -> None:
        async def settle() -> None:
            await gosim.sleep(0.5)
            done(None, KeyError(value))
            done("again", None)  # the first call wins

        go(settle)

    async def main() -> tuple[Any, str, float]:
        got = await await_done(at_once, "now")
        start = gosim.now()
        with pytest.raises(KeyError) as raised:
            await await_done(later, "later")
        return got, raised.value.args[0], gosim.now() - start

    got, error, waited = vrun(main)
    assert (got, error) == ("now", "later")
    assert waited == pytest.approx(0.5)


def test_await_done_raises_what_start_raises() -> None:
    def refuse(done: Any) -> None:
        raise ValueError("refused before it began")

    async def main() -> None:
        with pytest.raises(ValueError, match="refused"):
            await await_done(refuse)

    vrun(main)


def test_await_done_left_by_an_exception_ignores_its_late_done() -> None:
    dones: list[Any] = []

    async def main() -> tuple[bool, int]:
        coro = await_done(dones.append)
        coro.send(None)  # up to its park: the operation has its done
        try:
            coro.throw(KeyboardInterrupt())  # as a cancellation would
        except KeyboardInterrupt:
            pass
        (done,) = dones
        done("late", None)  # the operation ends after its waiter left: nothing wakes
        waiter = done.__self__
        # cancelled by the leaving wait: the late done did not settle it
        with pytest.raises(lowlevel.WaitCancelled):
            waiter.result()
        return waiter.done(), lowlevel.current_runtime().timers.narmed

    assert vrun(main) == (True, 0)
