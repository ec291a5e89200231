"""The group committer with operations that wait (``submit``) and operations that call
back (``submit_later``), mixed in any order: every operation is applied in exactly one
batch, its result reaches it exactly once and only after its batch was applied, and the
lead never stays taken."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gosim
from gosim import Chan, go
from idempotency.stores._batch import GroupCommitter, Op


class Recorder:
    """An apply_batch that answers each operation with its own args, and remembers."""

    def __init__(self, fail: bool = False) -> None:
        self.batches: list[list[int]] = []
        self.applied: set[int] = set()
        self.fail = fail

    def __call__(self, ops: list[Op]) -> None:
        ids = [op.args[0] for op in ops]
        if self.fail:
            raise RuntimeError("the whole batch failed")
        self.batches.append(ids)
        for op in ops:
            op.result = ("done", op.args[0])
        self.applied.update(ids)


@settings(max_examples=60, deadline=None)
@given(
    plan=st.lists(st.tuples(st.booleans(), st.integers(0, 3)), min_size=1, max_size=30),
    max_batch=st.integers(1, 6),
    seed=st.integers(0, 2**16),
)
def test_waiting_and_called_back_operations_mix(
    plan: list[tuple[bool, int]], max_batch: int, seed: int
) -> None:
    recorder = Recorder()
    committer = GroupCommitter(recorder, max_batch)
    results: dict[int, list[Any]] = {i: [] for i in range(len(plan))}

    async def main() -> bool:
        finished: Chan[None] = Chan(len(plan))

        def called_back(i: int, result: Any, error: BaseException | None) -> None:
            assert i in recorder.applied  # only after its batch was applied
            results[i].append(("later", result, error))
            finished.try_send(None)

        async def one(i: int, later: bool, delay: int) -> None:
            for _ in range(delay):
                await gosim.gosched()
            op = Op(0, (i,))
            if later:
                committer.submit_later(op, lambda r, e: called_back(i, r, e))
                return
            result = await committer.submit(op)
            assert i in recorder.applied
            results[i].append(("wait", result, None))
            finished.try_send(None)

        for i, (later, delay) in enumerate(plan):
            go(one, i, later, delay)
        for _ in plan:
            await finished.recv()
        await gosim.sleep(0.01)  # a leader started for nothing would show up now
        return committer._leading

    leading = gosim.run(main, procs=2, seed=seed, virtual_time=True)
    assert not leading
    for i, (later, _) in enumerate(plan):
        assert results[i] == [("later" if later else "wait", ("done", i), None)]
    applied = [i for batch in recorder.batches for i in batch]
    assert sorted(applied) == list(range(len(plan)))  # each in exactly one batch
    assert all(1 <= len(batch) <= max_batch for batch in recorder.batches)
    assert committer.operations == len(plan) and committer.batches == len(recorder.batches)


def test_a_failed_batch_gives_every_operation_its_error() -> None:
    recorder = Recorder(fail=True)
    committer = GroupCommitter(recorder, 10)

    async def main() -> list[Any]:
        got: Chan[Any] = Chan(4)

        async def waiting(i: int) -> None:
            try:
                await got.send(await committer.submit(Op(0, (i,))))
            except RuntimeError as exc:
                await got.send(str(exc))

        for i in range(2):
            committer.submit_later(Op(0, (i,)), lambda r, e: got.try_send(str(e)))
        for i in range(2, 4):
            go(waiting, i)
        return [await got.recv() for _ in range(4)]

    assert gosim.run(main, procs=2) == ["the whole batch failed"] * 4


class _NotAnException(BaseException):
    """What a handler run in a claim's callback may raise beyond Exception."""


@pytest.mark.parametrize("kind", [ValueError, _NotAnException])
def test_a_callback_that_raises_is_a_panic_after_the_others_have_their_results(
    kind: type[BaseException],
) -> None:
    recorder = Recorder()
    committer = GroupCommitter(recorder, 10)
    got: list[Any] = []

    def broken(result: Any, error: BaseException | None) -> None:
        raise kind("a bug in a callback")

    async def main() -> None:
        committer.submit_later(Op(0, (0,)), lambda r, e: got.append(r))
        committer.submit_later(Op(0, (1,)), broken)
        committer.submit_later(Op(0, (2,)), lambda r, e: got.append(r))
        while len(got) < 2:
            await gosim.sleep(0.01)
        await gosim.sleep(0.1)  # the panic's goroutine runs meanwhile

    # What escapes the callback's goroutine leaves gosim.run as itself.
    with pytest.raises(kind, match="a bug in a callback"):
        gosim.run(main, procs=2)
    assert got == [("done", 0), ("done", 2)]


# The committer's own thread, woken through the netpoller (not gosim.syscall).


def _sqlite_calls(path: Any, n: int, **run: Any) -> tuple[list[int], int, set[str]]:
    """n keyed calls at once through a SQLiteStore; their fences, the runtime's syscall
    count, and the names of the threads that applied the batches."""
    import sqlite3  # noqa: PLC0415
    import threading  # noqa: PLC0415

    from idempotency import Idempotency, SQLiteEffect, SQLiteStore  # noqa: PLC0415

    store = SQLiteStore(path)
    idem = Idempotency(store)
    threads: set[str] = set()

    def effect(conn: sqlite3.Connection) -> int:
        threads.add(threading.current_thread().name)
        return 1

    async def main() -> tuple[list[int], int]:
        fences: Chan[int] = Chan(n)

        async def one(i: int) -> None:
            out = await idem.run(
                caller="c", key=f"k{i}", request=("e", [i]),
                handler=lambda call: SQLiteEffect(effect), one_step=True,
            )  # fmt: skip
            await fences.send(out.fence)

        for i in range(n):
            go(one, i)
        got = [await fences.recv() for _ in range(n)]
        return got, gosim.statistics().syscalls

    got, syscalls = gosim.run(main, **run)
    store.close()
    return got, syscalls, threads


def test_batches_run_on_the_committers_thread_and_wake_through_the_netpoller(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from idempotency.stores import _batch  # noqa: PLC0415

    fences, syscalls, threads = _sqlite_calls(tmp_path / "a.db", 20, procs=2)
    assert sorted(fences) == list(range(1, 21))
    assert syscalls == 0  # no gosim.syscall: the thread wakes the leader by the netpoller
    assert len(threads) == 1 and next(iter(threads)).startswith("group commit")
    # A runtime whose schedule must be reproducible runs its batches inline instead.
    fences, syscalls, threads = _sqlite_calls(tmp_path / "b.db", 5, procs=2, seed=3)
    assert sorted(fences) == list(range(1, 6)) and syscalls > 0
    assert threads == {"MainThread"}
    # The thread ends once idle, and the next batch starts another.
    monkeypatch.setattr(_batch, "THREAD_IDLE", 0.01)
    from idempotency import SQLiteStore  # noqa: PLC0415

    store = SQLiteStore(tmp_path / "c.db")

    async def claims() -> list[int]:
        got = []
        for i in range(3):
            got.append((await store.claim("c", f"k{i}", b"\0" * 32, 60.0)).record.fence)
            await gosim.sleep(0.2)  # long past THREAD_IDLE: the thread has ended
            assert store._committer._thread is None  # type: ignore[attr-defined]
        return got

    assert gosim.run(claims, procs=2) == [1, 2, 3]
    store.close()


def test_a_runtime_that_ends_mid_batch_leaves_the_store_working_for_the_next(
    tmp_path: Any,
) -> None:
    # The batch's leader is closed with its runtime while the committer's thread still
    # applies the batch; the thread finishes it (its wake-up goes nowhere), and the next
    # runtime's calls get a wake-up of their own.
    import sqlite3  # noqa: PLC0415
    import threading  # noqa: PLC0415

    from idempotency import SQLiteStore  # noqa: PLC0415

    store = SQLiteStore(tmp_path / "m.db")
    with sqlite3.connect(tmp_path / "m.db") as conn:
        conn.execute("CREATE TABLE t (x INTEGER)")
    entered, release = threading.Event(), threading.Event()

    def slow(conn: sqlite3.Connection) -> None:
        entered.set()
        assert release.wait(30.0)  # bounded
        conn.execute("INSERT INTO t VALUES (1)")

    async def first() -> None:
        go(store.transact, slow)
        await gosim.syscall(entered.wait, 30.0)  # the batch is on the thread now
        # main returns: the runtime ends with the batch's leader parked in it

    gosim.run(first, procs=2)
    release.set()

    async def second() -> list[int]:
        fp = b"\0" * 32
        return [(await store.claim("c", f"k{i}", fp, 60.0)).record.fence for i in range(3)]

    assert gosim.run(second, procs=2) == [1, 2, 3]
    store.close()
    with sqlite3.connect(tmp_path / "m.db") as conn:
        assert conn.execute("SELECT x FROM t").fetchall() == [(1,)]  # it was committed


@pytest.mark.parametrize("seed", range(4))
def test_a_follower_closed_while_parked_is_not_readied_by_its_commit(seed: int) -> None:
    # A caller parked on its op's wait leaves it by an exception (its coroutine closed,
    # as at a runtime's end, or a cancellation thrown in): the op's waiter is cancelled
    # and the leader's settle after the commit readies nobody, while the other ops of
    # the batch get their results as usual.
    recorder = Recorder()
    committer = GroupCommitter(recorder, 8)

    async def main() -> tuple[Any, Any, bool, list[int]]:
        left = Op(0, (0,))
        coro = committer.submit(left)
        coro.send(None)  # parked on the op (the trap went to a driver that never saw it)
        try:
            coro.throw(KeyboardInterrupt())
        except KeyboardInterrupt:
            pass
        stayed = Op(1, (1,))
        got = await committer.submit(stayed)
        for _ in range(4):
            await gosim.gosched()  # a wrong ready of this goroutine would show by now
        try:
            gosim.lowlevel.Waiter.result(left)  # Op.result is the batch's answer field
        except gosim.lowlevel.WaitCancelled:
            cancelled = True
        else:
            cancelled = False
        return got, left.settle("again"), cancelled, sorted(recorder.applied)

    got, settled_again, cancelled, applied = gosim.run(main, procs=1 + seed % 2, seed=seed)
    assert got == ("done", 1)
    assert settled_again is False
    assert cancelled is True
    assert applied == [0, 1]  # the op that lost its caller was still applied
