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


def test_a_callback_that_raises_is_a_panic_after_the_others_have_their_results() -> None:
    recorder = Recorder()
    committer = GroupCommitter(recorder, 10)
    got: list[Any] = []

    def broken(result: Any, error: BaseException | None) -> None:
        raise ValueError("a bug in a callback")

    async def main() -> None:
        committer.submit_later(Op(0, (0,)), lambda r, e: got.append(r))
        committer.submit_later(Op(0, (1,)), broken)
        committer.submit_later(Op(0, (2,)), lambda r, e: got.append(r))
        while len(got) < 2:
            await gosim.sleep(0.01)
        await gosim.sleep(0.1)  # the panic's goroutine runs meanwhile

    with pytest.raises(gosim.Panic, match="a bug in a callback"):
        gosim.run(main, procs=2)
    assert got == [("done", 0), ("done", 2)]
