"""Group commit: concurrent goroutines' store operations share one transaction.

A durable commit costs an fsync (about 250 us here: SQLite in WAL mode with
``synchronous=FULL`` commits about 3,900 single-row transactions/s, and about 86,000
rows/s in transactions of 100). A Redis round trip costs a syscall hop and a network
exchange. Both costs are per batch, not per row, so operations that arrive while a
batch is being written wait and go together in the next one.

Protocol (leader/follower, as in database group commit):

1. A goroutine appends its operation to ``pending``. If no batch is in flight it becomes
   the **leader** and yields once (``gosched``), so that goroutines already runnable can
   append theirs; otherwise it parks (``idempotency commit``).
2. The leader takes up to ``max_batch`` pending operations and runs them in one
   ``gosim.syscall`` (the blocking store call runs on an OS thread, so other goroutines
   keep running and keep appending). ``apply_batch`` sets each operation's result or
   error and never raises for one operation's failure.
3. After the call returns -- the commit is durable -- the leader readies every follower
   of the batch with its result. Replies therefore leave only after their commit.
4. If its own operation was in the batch the leader returns; if operations are pending
   it hands the lead to the first of them (readied with ``lead=True``), else it clears
   the in-flight flag. No background goroutine exists: nothing to start or stop, and a
   store with no callers costs nothing.

An operation may instead come with a callback (:meth:`GroupCommitter.submit_later`):
no goroutine waits for it, and the leader calls ``done(result, error)`` where it would
have readied the waiter. When no batch is in flight such an operation starts a leader
goroutine of its own, which leads until nothing is pending; a leader that would hand
the lead to such an operation starts one too. A callback costs a call where a waiting
goroutine costs its spawn, its park, its wake and the resumption of every coroutine
between it and the committer.

Alternatives rejected: a committer goroutine per store (its lifetime would have to
follow runtimes that start and stop under the store, and its wake-up costs a switch per
batch), and a timer-based batch window (it adds latency when there is no concurrency;
here a lone call commits at once and batching grows exactly with the load).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import gosim
from gosim import go, lowlevel

__all__ = ["GroupCommitter", "Op", "raise_when_awaited"]


class Op:
    """One store operation in flight: what to do, and once done its result or error."""

    __slots__ = ("args", "done", "error", "g", "kind", "result")

    def __init__(self, kind: int, args: tuple[Any, ...]) -> None:
        self.kind = kind
        self.args = args
        self.result: Any = None
        self.error: BaseException | None = None
        self.g: lowlevel.G | None = None
        self.done: Callable[[Any, BaseException | None], None] | None = None

    def take(self) -> Any:
        if self.error is not None:
            err, self.error = self.error, None
            raise err
        return self.result


class GroupCommitter:
    """Runs operations in batches through ``apply_batch`` (see the module docstring).

    ``apply_batch(ops)`` runs on an OS thread and must set ``op.result`` or ``op.error``
    for each op; a lock keeps batches one at a time even when a runtime was torn down
    while a batch was still running on its thread.
    """

    def __init__(self, apply_batch: Callable[[list[Op]], None], max_batch: int) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be at least 1, not {max_batch}")
        self.max_batch = max_batch
        self._apply_batch = apply_batch
        self._thread_lock = threading.Lock()
        self._pending: list[Op] = []
        # Invariant: True exactly while a leader goroutine of ``_rt`` runs a batch or is
        # being handed the lead; then every op in ``_pending`` has its goroutine parked.
        self._leading = False
        self._rt: lowlevel.Runtime | None = None
        self.operations = 0
        self.batches = 0
        self.largest_batch = 0

    def _run(self, batch: list[Op]) -> None:
        with self._thread_lock:
            self._apply_batch(batch)

    def _runtime(self) -> lowlevel.Runtime:
        # gosim.lowlevel's fast-path hooks (state, trap, the runtime's goready) rather
        # than current_runtime/current_g/park/ready: four frames fewer an operation.
        rt = lowlevel.state.rt
        if rt is None:
            rt = lowlevel.current_runtime()  # raises NotInRuntime
        if self._rt is not rt:
            # A new runtime: whatever the last one left (a leader closed mid-batch when
            # its runtime ended) is gone with its goroutines.
            self._rt = rt
            self._pending = []
            self._leading = False
        return rt

    def submit_later(self, op: Op, done: Callable[[Any, BaseException | None], None]) -> None:
        """Run ``op`` in the next batch without waiting for it: ``done(result, error)``
        is called once its batch has committed, by the goroutine that led the batch.

        ``done`` must not block and should not raise: an exception from it is a panic
        of a goroutine of its own, once the batch's other operations have their
        results."""
        self._runtime()
        op.done = done
        self._pending.append(op)
        if not self._leading:
            self._leading = True
            go(self._lead)

    async def _lead(self) -> None:
        """A leader with no operation of its own: leads until nothing is pending."""
        rt = self._runtime()
        pending = self._pending
        try:
            await gosim.gosched()  # as submit's leader: let the runnable add theirs
            while pending:
                await self._commit(rt, pending, None)
        finally:
            self._leading = False

    async def _commit(self, rt: lowlevel.Runtime, pending: list[Op], own: Op | None) -> bool:
        """Take a batch from ``pending``, apply it, and hand every operation but ``own``
        its result; whether ``own`` was in it."""
        batch = pending[: self.max_batch]
        del pending[: len(batch)]
        try:
            await gosim.syscall(self._run, batch)
        except Exception as exc:  # apply_batch failed as a whole (a bug): tell all
            for o in batch:
                if o.error is None:
                    o.error = exc
        self.operations += len(batch)
        self.batches += 1
        self.largest_batch = max(self.largest_batch, len(batch))
        mine = False
        failed: list[BaseException] = []
        for o in batch:
            if o is own:
                mine = True
            elif o.done is not None:
                try:
                    o.done(o.result, o.error)
                except Exception as bug:  # a bug in the callback: after the others
                    failed.append(bug)
            else:
                assert o.g is not None
                rt.goready(o.g, False)
        for error in failed:
            go(_reraise, error)
        return mine

    async def submit(self, op: Op) -> Any:
        """Run ``op`` in the next batch; return its result or raise its error."""
        rt = self._runtime()
        pending = self._pending
        pending.append(op)
        if self._leading:
            g = rt.curg
            assert g is not None
            g.waitreason = "idempotency commit"
            op.g = g
            if not await lowlevel.trap(lowlevel.PARK):
                if op.error is None:
                    return op.result
                return op.take()
        self._leading = True
        handed_off = False
        try:
            # Let the goroutines that are runnable now (typically the followers just
            # readied with the last batch's replies) add their operations first: without
            # this yield the new leader would take a batch of one, and batches would
            # alternate between 1 and all-but-one.
            await gosim.gosched()
            while not await self._commit(rt, pending, op):
                pass
            if pending:
                nxt = pending[0]
                if nxt.g is None:  # a callback's operation: a leader of its own
                    go(self._lead)
                else:
                    rt.goready(nxt.g, True)
                handed_off = True
        finally:
            if not handed_off:
                self._leading = False
        return op.take()


async def _reraise(exc: BaseException) -> None:
    raise exc


async def raise_when_awaited(exc: Exception) -> Any:
    """An awaitable that raises ``exc`` when awaited: what a store method that returns
    the committer's coroutine (rather than being a coroutine itself, one frame fewer an
    operation) returns for a refusal, so the error comes at the await as before."""
    raise exc
