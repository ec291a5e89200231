"""Group commit: concurrent goroutines' store operations share one transaction.

A durable commit costs an fsync (about 250 us here: SQLite in WAL mode with
``synchronous=FULL`` commits about 3,900 single-row transactions/s, and about 86,000
rows/s in transactions of 100). A Redis round trip costs a syscall hop and a network
exchange. Both costs are per batch, not per row, so operations that arrive while a
batch is being written wait and go together in the next one.

Protocol (one mechanism: the callback):

1. An operation comes with a callback, ``done(result, error)``
   (:meth:`GroupCommitter.submit_later`), and is appended to ``pending``. If no batch is
   in flight a **leader** goroutine is started; before every batch it yields
   (``gosched``), so that goroutines already runnable can append theirs.
2. The leader takes up to ``max_batch`` pending operations and runs them in one
   ``gosim.syscall`` (the blocking store call runs on an OS thread, so other goroutines
   keep running and keep appending). ``apply_batch`` sets each operation's result or
   error and never raises for one operation's failure.
3. After the call returns -- the commit is durable -- the leader calls every
   operation's ``done``. Replies therefore leave only after their commit.
4. The leader goes on while operations are pending, then ends. No goroutine lives
   between batches: nothing to start or stop, and a store with no callers costs nothing.

:meth:`GroupCommitter.submit` is the awaiting form and nothing more: a wait on a
settle-once waiter (``idempotency._waiter.await_done``) that ``done`` settles. A
callback costs a call where a waiting goroutine costs its park, its wake and the
resumption of every coroutine between it and the committer; a caller that has nothing
else to do pays only the park and the wake.

Alternatives rejected: a committer goroutine per store (its lifetime would have to
follow runtimes that start and stop under the store, and its wake-up costs a switch per
batch), and a timer-based batch window (it adds latency when there is no concurrency;
here a lone call commits at once and batching grows exactly with the load).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Coroutine
from typing import Any

import gosim
from gosim import go, lowlevel

from .._waiter import await_done

__all__ = ["GroupCommitter", "Op", "raise_when_awaited"]


class Op:
    """One store operation in flight: what to do, and once done its result or error."""

    __slots__ = ("args", "done", "error", "kind", "result")

    def __init__(self, kind: int, args: tuple[Any, ...]) -> None:
        self.kind = kind
        self.args = args
        self.result: Any = None
        self.error: BaseException | None = None
        self.done: Callable[[Any, BaseException | None], None] | None = None


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
        # Invariant: True exactly while a leader goroutine of ``_rt`` runs (it takes
        # every operation appended to ``_pending`` before it ends).
        self._leading = False
        self._rt: lowlevel.Runtime | None = None
        self.operations = 0
        self.batches = 0
        self.largest_batch = 0

    def _run(self, batch: list[Op]) -> None:
        with self._thread_lock:
            self._apply_batch(batch)

    def submit_later(self, op: Op, done: Callable[[Any, BaseException | None], None]) -> None:
        """Run ``op`` in the next batch without waiting for it: ``done(result, error)``
        is called once its batch has committed, by the goroutine that led the batch.

        ``done`` must not block and should not raise: an exception from it is a panic
        of a goroutine of its own, once the batch's other operations have their
        results."""
        # gosim.lowlevel's fast-path hook (state.rt) rather than current_runtime.
        rt = lowlevel.state.rt
        if rt is None:
            rt = lowlevel.current_runtime()  # raises NotInRuntime
        if self._rt is not rt:
            # A new runtime: whatever the last one left (a leader closed mid-batch when
            # its runtime ended) is gone with its goroutines.
            self._rt = rt
            self._pending = []
            self._leading = False
        op.done = done
        self._pending.append(op)
        if not self._leading:
            self._leading = True
            go(self._lead)

    def submit(self, op: Op) -> Coroutine[Any, Any, Any]:
        """Run ``op`` in the next batch; awaited, its result or its error raised. (The
        wait's coroutine itself, not a coroutine around it: one frame fewer.)"""
        return await_done(self.submit_later, op)

    async def _lead(self) -> None:
        """Lead batches until nothing is pending (see the module docstring)."""
        pending = self._pending
        try:
            while True:
                # Before every batch, let the goroutines that are runnable now (typically
                # the callers just answered with the last batch's replies) add their
                # operations first: without this yield batches would alternate between
                # a few and all the rest.
                await gosim.gosched()
                if not pending:
                    return
                await self._commit(pending)
        finally:
            if pending is self._pending:  # not a runtime that replaced it
                self._leading = False

    async def _commit(self, pending: list[Op]) -> None:
        """Take a batch from ``pending``, apply it, and call every operation's ``done``."""
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
        failed: list[BaseException] = []
        for o in batch:
            assert o.done is not None
            try:
                o.done(o.result, o.error)
            except Exception as bug:  # a bug in the callback: after the others
                failed.append(bug)
        for error in failed:
            go(_reraise, error)


async def _reraise(exc: BaseException) -> None:
    raise exc


async def raise_when_awaited(exc: Exception) -> Any:
    """An awaitable that raises ``exc`` when awaited: what a store method that returns
    the committer's coroutine (rather than being a coroutine itself, one frame fewer an
    operation) returns for a refusal, so the error comes at the await as before."""
    raise exc
