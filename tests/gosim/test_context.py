"""gosim.context: cancellation trees, deadlines on virtual time, values, causes."""

from __future__ import annotations

import pytest

import gosim
from gosim import context, recv, select


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
