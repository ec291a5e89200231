"""gosim.context: cancellation trees, deadlines on virtual time, values, causes."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import gosim
from gosim import Chan, context, go, recv, select


def vrun(main):  # type: ignore[no-untyped-def]
    return gosim.run(main, procs=2, seed=4, virtual_time=True)


def test_cancel_propagates_down_the_tree_once() -> None:
    async def main() -> tuple[object, ...]:
        root, cancel = context.with_cancel(context.background())
        child, _ = context.with_cancel(root)
        valued = context.with_value(child, "k", "v")
        grandchild, _ = context.with_timeout(valued, 100)
        sibling, _ = context.with_cancel(context.background())
        cancel()
        cancel()  # idempotent
        return (
            str(root.err()),
            str(child.err()),
            str(grandchild.err()),
            grandchild.value("k"),
            sibling.err(),
            child.done().closed if child.done() else None,  # type: ignore[union-attr]
        )

    assert vrun(main) == (
        "context canceled",
        "context canceled",
        "context canceled",
        "v",
        None,
        True,
    )


def test_done_channel_works_in_select_and_deadline_exceeded() -> None:
    async def main() -> tuple[int, str, float, bool]:
        ctx, cancel = context.with_timeout(context.background(), 2.0)
        start = gosim.now()
        i, _, _ = await select(recv(ctx.done()), recv(gosim.after(10)))
        elapsed = gosim.now() - start
        cancel()  # after the deadline: the error stays DeadlineExceeded
        return i, str(ctx.err()), elapsed, isinstance(ctx.err(), TimeoutError)

    i, err, elapsed, is_timeout = vrun(main)
    assert (i, err, is_timeout) == (0, "context deadline exceeded", True)
    assert elapsed == pytest.approx(2.0)


def test_child_deadline_never_later_than_parent() -> None:
    async def main() -> tuple[float, bool, float]:
        parent, _ = context.with_timeout(context.background(), 1.0)
        child, _ = context.with_timeout(parent, 5.0)
        d, ok = child.deadline()
        await select(recv(child.done()))
        return d - gosim.now(), ok, gosim.now()

    remaining, ok, now = vrun(main)
    assert ok and remaining == pytest.approx(0.0) and now == pytest.approx(1.0)


def test_cause_without_cancel_and_after_func() -> None:
    async def main() -> tuple[str, object, object, list[str], bool]:
        ctx, cancel = context.with_cancel_cause(context.background())
        detached = context.without_cancel(context.with_value(ctx, "user", "ann"))
        ran: list[str] = []

        async def cleanup() -> None:
            ran.append("cleanup")

        stop_other = context.after_func(ctx, cleanup)
        never = context.after_func(context.with_cancel(context.background())[0], cleanup)
        assert never() is True  # stopped before its context was done
        cancel(KeyError("db gone"))
        await gosim.sleep(0.001)
        return (
            repr(context.cause(ctx)),
            detached.err(),
            detached.value("user"),
            ran,
            stop_other(),
        )

    cause_repr, detached_err, user, ran, stopped_late = vrun(main)
    assert cause_repr == "KeyError('db gone')"
    assert detached_err is None and user == "ann"
    assert ran == ["cleanup"] and stopped_late is False


def test_background_is_never_done_and_nil_key_is_refused() -> None:
    async def main() -> None:
        assert context.background().done() is None
        assert context.background().err() is None
        assert context.todo().deadline() == (0.0, False)
        with pytest.raises(ValueError):
            context.with_value(context.background(), None, 1)

    vrun(main)


# ---------------------------------------------------------------- lazy deadline timers

_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("timeout"), st.integers(0, 20), st.integers(0, 12)),
        st.tuples(st.just("cancel_ctx"), st.integers(0, 20), st.just(0)),
        st.tuples(st.just("value"), st.integers(0, 20), st.just(0)),
        st.tuples(st.just("cancel"), st.integers(0, 20), st.just(0)),
        st.tuples(st.just("sleep"), st.just(0), st.integers(1, 5)),
        st.tuples(st.just("err"), st.integers(0, 20), st.just(0)),
        st.tuples(st.just("cause"), st.integers(0, 20), st.just(0)),
        st.tuples(st.just("wait_done"), st.integers(0, 20), st.just(0)),
        st.tuples(st.just("after"), st.integers(0, 20), st.just(0)),
    ),
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(ops=_OPS, seed=st.integers(0, 3))
# A deadline already passed under a parent cancelled at the same instant: Canceled.
@example(ops=[("cancel_ctx", 0, 0), ("cancel", 1, 0), ("timeout", 1, 0), ("err", 2, 0)], seed=0)
# A deadline passed at the making, the parent cancelled after it at the same virtual time:
# the child was already done, with its own error (the model once gave the parent's).
@example(ops=[("cancel_ctx", 0, 0), ("timeout", 1, 0), ("cancel", 1, 0), ("err", 2, 0)], seed=0)
def test_deadlines_behave_as_armed_timers_whoever_looks_and_when(
    ops: list[tuple[str, int, int]], seed: int
) -> None:
    """A deadline's timer is armed only when something may wait for it (done(), an
    after_func, a child), and err() reads the clock until then. Against a model of
    eager timers: every err() and cause() read, every wake of a done() waiter and every
    after_func start happens at the time and with the error the model says, for trees
    of timeouts, cancels and values, looked at in any order."""
    step = 0.1

    async def main() -> list[str]:
        nodes: list[tuple[context.Context, Any]] = [(context.background(), None)]
        parent_of: list[int | None] = [None]  # the model: parent, own deadline, cancel
        # Moments are (time, op index): a deadline passes at (time, -1), before any op
        # of that time runs (its timer fires first); a cancel or a creation happens at
        # (time, index of its op), so two things at one virtual time keep their order.
        own_deadline: list[tuple[float, int]] = [(math.inf, -1)]
        cancelled_at: list[tuple[float, int]] = [(math.inf, -1)]
        created_at: list[tuple[float, int]] = [(0.0, -1)]
        problems: list[str] = []
        pending: list[tuple[str, int, float]] = []  # (what, node, registered at)
        fired: Chan[tuple[str, int, float]] = Chan(200)
        never = (math.inf, -1)

        def model(i: int) -> tuple[tuple[float, int], str]:
            """The moment node i is cancelled (inf: never) and with which error, as
            Go's context does. A parent already done when the node is made decides it:
            Go's WithDeadline runs propagateCancel before it looks at its own deadline,
            so a deadline already passed under a cancelled parent reads Canceled; a
            parent cancelled later, even at the same virtual time, comes too late for a
            node whose deadline had passed at its making. After that the earliest
            moment wins, and ties go to the node's own deadline: its timer fires before
            any goroutine runs."""
            p = parent_of[i]
            pt, perr = (never, "") if p is None else model(p)
            if pt < created_at[i]:
                return pt, perr
            best: tuple[tuple[float, int], str] = (never, "")
            if own_deadline[i] < best[0]:
                best = (own_deadline[i], "context deadline exceeded")
            if cancelled_at[i] < best[0]:
                best = (cancelled_at[i], "context canceled")
            if pt < best[0]:
                best = (pt, perr)
            return best

        async def waiter(i: int, done: Any) -> None:
            await done.recv()
            await fired.send(("done", i, gosim.now()))

        for seq, (op, a, b) in enumerate(ops):
            now = gosim.now()
            moment = (now, seq)
            i = a % len(nodes)
            ctx = nodes[i][0]
            if op in ("timeout", "cancel_ctx", "value"):
                if op == "timeout":
                    child, cancel = context.with_timeout(ctx, b * step)
                    own = (now + b * step, -1)
                elif op == "cancel_ctx":
                    child, cancel = context.with_cancel(ctx)
                    own = never
                else:
                    child, cancel = context.with_value(ctx, "k", i), None
                    own = never
                nodes.append((child, cancel))
                parent_of.append(i)
                own_deadline.append(own)
                cancelled_at.append(never)
                created_at.append(moment)
            elif op == "cancel":
                cancel = nodes[i][1]
                if cancel is not None:
                    cancel()
                    if model(i)[0] > moment:
                        cancelled_at[i] = moment
            elif op == "sleep":
                await gosim.sleep(b * step)
            elif op in ("err", "cause"):
                got = ctx.err() if op == "err" else context.cause(ctx)
                t, err = model(i)
                want = err if t <= moment else None
                if (str(got) if got is not None else None) != want:
                    problems.append(f"{op} of {i} at {now}: {got} != {want}")
            elif op == "wait_done":
                done = ctx.done()
                if done is not None:
                    pending.append(("done", i, now))
                    go(waiter, i, done)
            else:

                async def after(i: int = i) -> None:
                    await fired.send(("after", i, gosim.now()))

                context.after_func(ctx, after)
                pending.append(("after", i, now))
        # Every deadline that will pass does within this sleep (the longest is 12 steps
        # after the last op); then each registration fired when the model says, or not.
        await gosim.sleep(20 * step)
        end = gosim.now()
        got: dict[tuple[str, int], list[float]] = {}
        while True:
            item, _, ok = fired.try_recv()
            if not ok:
                break
            got.setdefault((item[0], item[1]), []).append(item[2])
        for what, i, registered in pending:
            t = model(i)[0][0]
            times = got.get((what, i), [])
            if t > end:
                if times:
                    problems.append(f"{what} of {i} fired at {times[0]}, never cancelled")
                continue
            want = max(t, registered)
            if want not in times:
                problems.append(f"{what} of {i} at {times}, expected {want}")
            else:
                times.remove(want)
        return problems

    assert gosim.run(main, procs=2, seed=seed, virtual_time=True) == []
