"""Channels: Go's ``hchan`` on the gosim scheduler.

A channel is a FIFO buffer of capacity ``cap`` (0 for unbuffered) and two wait queues:
receivers parked on an empty channel (``recvq``) and senders parked on a full one
(``sendq``). Go's rules, in the order ``chansend`` / ``chanrecv`` apply them:

send(v)
  1. closed: panic ``send on closed channel``;
  2. a receiver is waiting (the buffer is then empty): hand v to it directly and ready it;
  3. room in the buffer: append v;
  4. otherwise park in ``sendq`` with v until a receiver takes it (or close panics us).
recv()
  1. a sender is waiting (so the buffer is full, or unbuffered): take the buffer's head
     and move the sender's value to the tail (unbuffered: take the sender's value); ready it;
  2. the buffer has values: take the head;
  3. closed (and drained): the zero value, ``ok`` False;
  4. otherwise park in ``recvq`` until a sender hands a value (or close wakes us).

Invariants (Go's ``hchan``): ``recvq`` non-empty implies the buffer is empty;
``sendq`` non-empty implies the buffer is full; a closed channel has an empty ``sendq``.

The fast path (steps 1-3) completes inside the calling coroutine: no trap, no trip to
the driver. Parked waiters are the G itself for plain operations and a Sudog for select
cases; a select's sudogs on other channels are skipped once one of its cases has fired
(``g.selectdone``) and removed by the select when it resumes.

A park that ends without a wake (an exception thrown into the goroutine, its coroutine
closed) takes the waiter out of its queue on the way out, as Go's ``selectgo`` dequeues
the sudogs that were not woken: a later operation on the channel must not pair with a
goroutine that has gone on to wait elsewhere.

Each operation's awaitable is awaited once, as a coroutine is: a second ``await``
raises RuntimeError, and one dropped unawaited warns (RuntimeWarning). The exception is
a send that completed when ``send`` was called: it returns a shared finished awaitable.
``select``'s awaitable follows the same rule (gosim/_select.py).
A channel is made once: ``__init__`` on a live channel raises TypeError (Go has no
re-make, and a new capacity under buffered values and parked waiters means nothing).

The zero value is ``None`` (Python has no typed zero values).

This class is the reference implementation. When the C accelerator is built,
``gosim.Chan`` is its twin in ``gosim/_speedups_chan.c.h`` (same rules, same queues, the
buffer a ring that grows on demand up to ``cap``); keep the two in step.
"""

from __future__ import annotations

import asyncio
import sys
from collections import deque
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from gosim import _internals
from gosim._core._exceptions import (
    CloseOfClosedChannel,
    CloseOfNilChannel,
    NotInRuntime,
    SendOnClosedChannel,
)
from gosim._internals import G, Sudog, speedups
from gosim._internals import state as _state
from gosim._internals import trap as _trap
from gosim.lowlevel import WAIT_CHAN_RECEIVE, WAIT_CHAN_SEND

T = TypeVar("T")

_PARK = _internals.PARK
_PREEMPT = _internals.PREEMPT

# The op budget, one rule for every channel operation (send, recv, recv2, __anext__
# here; select in gosim/_select.py, which spends this same countdown; the C twins spend
# one countdown too): an awaited operation that *returns* without parking
# spends one unit, inside a runtime or not (outside one, _preempt_point finds no
# runtime and only refills). One that raises (send on a closed channel, the end of an
# ``async for``) or parks spends none; try_send and try_recv spend none. At zero the
# runtime checks whether the running goroutine has used up its slice (cooperative
# preemption). Each runtime starts with a full countdown (its driver refills it through
# _internals.set_op_budget_refill's hook), so a seed's schedule does not depend on what
# ran before. tests/gosim/test_chan_budget.py holds every path to this rule.
_budget = _internals.OP_BUDGET


class _NoLoop:
    """The one thing asyncio's C Future asks of its loop when made and resolved."""

    def get_debug(self) -> bool:
        return False


def _completed_awaitable() -> Awaitable[None]:
    """An awaitable that is already finished with None, awaited entirely in C.

    A resolved ``asyncio.Future`` (the C implementation) answers ``await`` through its
    C iterator's ``am_send`` with no Python frame and no StopIteration: measured here at
    40-60 ns, against 80-100 ns for a Python class whose ``__await__`` is a C iterator
    and 110-130 ns for finishing a generator. It is made once, with no event loop (it
    never schedules a callback), and shared by every send that completes at once.
    """
    fut: asyncio.Future[None] = asyncio.Future(loop=_NoLoop())  # type: ignore[arg-type]
    fut.set_result(None)
    return fut


_DONE = _completed_awaitable()


def _refill_budget() -> None:
    global _budget
    _budget = _internals.OP_BUDGET


if speedups is None:
    _internals.set_op_budget_refill(_refill_budget)  # each runtime starts with a full budget


async def _preempt_point() -> None:
    """Refill the budget; yield the processor if the running G has used up its slice."""
    global _budget
    _budget = _internals.OP_BUDGET
    rt = _state.rt
    if rt is not None and rt.preempt_check():
        await _trap(_PREEMPT)


def _leave_queue(q: deque[Any], w: Any) -> None:
    """Take waiter ``w`` out of wait queue ``q`` after its park ended without a wake.

    An exception thrown into the parked goroutine, or its coroutine closed: as Go's
    selectgo/chanrecv cleanup dequeues the sudogs that were not woken, so that a later
    operation on the channel does not hand its value to whatever the G waits on next.
    Absent when a waker dequeued it just before the exception came.
    """
    try:
        q.remove(w)
    except ValueError:
        pass


def _dequeue(q: deque[Any]) -> Any:
    """Pop the first waiter that can still be served (skip fired selects); None if none."""
    while q:
        w = q.popleft()
        if w.issel:
            g = w.g
            if g.selectdone:
                continue
            g.selectdone = True
        return w
    return None


class Chan(Generic[T]):
    """A Go channel: ``Chan[int](0)`` is unbuffered, ``Chan[int](16)`` holds 16 values.

    Operations block (park the goroutine) as Go's do. ``send`` on a closed channel and
    closing twice raise :class:`gosim.ChanError` subclasses with Go's messages. Values
    are delivered in FIFO order; blocked senders and receivers are served in arrival
    order. ``async for v in ch`` receives until the channel is closed and drained.
    """

    __slots__ = ("__weakref__", "_buf", "_cap", "_closed", "_recvq", "_sendq")

    def __init__(self, cap: int = 0) -> None:
        if hasattr(self, "_closed"):
            # Go's make gives a new channel; there is no re-make. Re-running __init__ on
            # a live channel would drop its buffered values and orphan its parked waiters.
            raise TypeError("Chan.__init__: a channel cannot be re-initialised")
        if not isinstance(cap, int) or isinstance(cap, bool):
            raise TypeError(f"makechan: size must be an int, got {type(cap).__name__}")
        if cap < 0 or cap > sys.maxsize:
            raise ValueError("makechan: size out of range")
        self._cap = cap
        self._buf: deque[T] = deque()
        # Invariant: _recvq non-empty => _buf empty; _sendq non-empty => len(_buf) == _cap.
        self._recvq: deque[Any] = deque()  # parked receivers: G or Sudog
        self._sendq: deque[Any] = deque()  # parked senders: G or Sudog, value in .elem
        self._closed = False

    def __repr__(self) -> str:
        state = " closed" if self._closed else ""
        return f"<Chan len={len(self._buf)} cap={self._cap}{state}>"

    # ---------------------------------------------------------------- send

    def send(self, value: T) -> Awaitable[None]:
        """Send ``value``; block until a receiver takes it or there is buffer room.

        ``await ch.send(v)`` at once: the operation starts when ``send`` is called (a send
        that can complete does so then, without a coroutine frame, and returns a shared
        finished awaitable). An awaitable for a send that must wait is awaited once: a
        second ``await`` raises RuntimeError, as for a coroutine.
        """
        global _budget
        if self.try_send(value):
            _budget -= 1
            if _budget <= 0:
                return _preempt_point()
            return _DONE
        return self._send_park(value)

    async def _send_park(self, value: T) -> None:
        global _budget
        rt = _state.rt
        if rt is None or rt.curg is None:
            raise NotInRuntime("chan send would block outside a gosim goroutine")
        # The awaitable may be awaited later than ``send`` made it, after a receiver came
        # or room was made: complete now if the send can (the C twin re-checks too).
        # (Ordered so that the common case, an unbuffered send awaited at once, costs two
        # attribute tests.)
        if (
            self._recvq or self._closed or (self._cap and len(self._buf) < self._cap)
        ) and self.try_send(value):
            _budget -= 1
            if _budget <= 0:
                await _preempt_point()
            return
        g = rt.curg
        g.elem = value
        g.waitreason = WAIT_CHAN_SEND
        q = self._sendq
        q.append(g)
        try:
            sent = await _trap(_PARK)
        except BaseException:
            g.elem = None
            _leave_queue(q, g)
            raise
        g.elem = None
        if not sent:
            raise SendOnClosedChannel("send on closed channel")

    def try_send(self, value: T) -> bool:
        """Send without blocking: True when sent, False when it would block.

        ``select`` with one send case and ``default``. Raises on a closed channel.
        """
        if self._closed:
            raise SendOnClosedChannel("send on closed channel")
        w = _dequeue(self._recvq) if self._recvq else None
        if w is not None:
            rt = _state.rt
            if rt is None:
                raise NotInRuntime("chan send: waking a receiver needs the runtime")
            if w.issel:
                w.elem = value
                w.ok = True
                rt.goready(w.g, w)
            else:
                w.ok = True
                rt.goready(w, value)
            return True
        if len(self._buf) < self._cap:
            self._buf.append(value)
            return True
        return False

    # ---------------------------------------------------------------- recv

    async def recv(self) -> T | None:
        """Receive a value; block until one is available. ``None`` once closed and drained.

        The awaitable is awaited once: a second ``await`` raises RuntimeError.
        """
        global _budget
        v, _, received = self.try_recv()
        if received:
            _budget -= 1
            if _budget <= 0:
                await _preempt_point()
            return v
        v, _ = await self._park_receiver()
        return v

    async def recv2(self) -> tuple[T | None, bool]:
        """Go's ``v, ok := <-ch``: ``ok`` is False once the channel is closed and drained."""
        global _budget
        v, ok, received = self.try_recv()
        if received:
            _budget -= 1
            if _budget <= 0:
                await _preempt_point()
            return v, ok
        return await self._park_receiver()

    async def _park_receiver(self) -> tuple[T | None, bool]:
        """Park the calling goroutine on the receive queue until a sender hands it a
        value or a close wakes it: ``(value, ok)``, as ``recv2``."""
        rt = _state.rt
        if rt is None or rt.curg is None:
            raise NotInRuntime("chan receive would block outside a gosim goroutine")
        g = rt.curg
        g.waitreason = WAIT_CHAN_RECEIVE
        g.ok = True
        q = self._recvq
        q.append(g)
        try:
            v = await _trap(_PARK)
        except BaseException:
            _leave_queue(q, g)
            raise
        return v, g.ok

    def try_recv(self) -> tuple[T | None, bool, bool]:
        """Receive without blocking: ``(value, ok, received)``.

        ``received`` is False when it would block; ``ok`` is False for a closed, drained
        channel (then ``received`` is True, as a select case on it would fire).
        """
        buf = self._buf
        if buf:
            v = buf.popleft()
            if self._sendq:
                self._take_sender_into_buf()
            return v, True, True
        w = _dequeue(self._sendq) if self._sendq else None
        if w is not None:
            rt = _state.rt
            if rt is None:
                raise NotInRuntime("chan receive: waking a sender needs the runtime")
            v = w.elem
            if w.issel:
                rt.goready(w.g, w)
            else:
                rt.goready(w, True)
            return v, True, True
        if self._closed:
            return None, False, True
        return None, False, False

    def _take_sender_into_buf(self) -> None:
        # The buffer was full with senders waiting: the head was just taken, so move the
        # first waiting sender's value to the tail and ready it (Go's recv on a full chan).
        w = _dequeue(self._sendq)
        if w is None:
            return
        self._buf.append(w.elem)
        rt = _state.rt
        assert rt is not None
        if w.issel:
            rt.goready(w.g, w)
        else:
            rt.goready(w, True)

    # ---------------------------------------------------------------- close

    def close(self) -> None:
        """Close the channel: receivers drain the buffer, then get the zero value.

        Every parked receiver wakes with ``(None, ok=False)``; every parked sender wakes
        and panics ``send on closed channel``, as in Go. Closing twice raises
        :class:`CloseOfClosedChannel`.
        """
        if self._closed:
            raise CloseOfClosedChannel("close of closed channel")
        self._closed = True
        if not self._recvq and not self._sendq:
            return
        rt = _state.rt
        if rt is None:
            raise NotInRuntime("close: waking parked goroutines needs the runtime")
        # Go gathers all waiters into a list, then readies them in order.
        woken: list[tuple[G, Any]] = []
        while True:
            w = _dequeue(self._recvq)
            if w is None:
                break
            w.ok = False
            if w.issel:
                w.elem = None
                woken.append((w.g, w))
            else:
                woken.append((w, None))
        while True:
            w = _dequeue(self._sendq)
            if w is None:
                break
            w.ok = False
            woken.append((w.g, w) if w.issel else (w, False))
        for g, param in woken:
            rt.goready(g, param)

    # --------------------------------------------------------------- queries

    def len(self) -> int:
        """Values buffered now (Go's ``len(ch)``)."""
        return len(self._buf)

    def cap(self) -> int:
        """The buffer's capacity (Go's ``cap(ch)``); 0 for unbuffered."""
        return self._cap

    def __len__(self) -> int:
        return len(self._buf)

    def _clear_buf(self) -> int:
        """Drop every buffered value; return how many there were (timer channels)."""
        n = len(self._buf)
        self._buf.clear()
        return n

    def __bool__(self) -> bool:
        # A channel is a handle, not a container: `if ch:` means "not nil" as in Go,
        # whatever is buffered (without this, an empty channel would be falsy via len).
        return True

    @property
    def closed(self) -> bool:
        """True once ``close`` has been called (Go has no such query; for tests and dumps)."""
        return self._closed

    def __aiter__(self) -> Chan[T]:
        return self

    async def __anext__(self) -> T:
        """``recv2`` for ``async for``: the next value; StopAsyncIteration once the
        channel is closed and drained (which, raising, spends no op budget)."""
        global _budget
        v, ok, received = self.try_recv()
        if received:
            if not ok:
                raise StopAsyncIteration
            _budget -= 1
            if _budget <= 0:
                await _preempt_point()
            return v  # type: ignore[return-value]
        v, ok = await self._park_receiver()
        if not ok:
            raise StopAsyncIteration
        return v  # type: ignore[return-value]


if not TYPE_CHECKING and speedups is not None:
    # The C implementation of this class (gosim/_speedups_chan.c.h), same contract.
    Chan = speedups.Chan
    _DONE = speedups.DONE


def close(ch: Chan[Any] | None) -> None:
    """Go's ``close(ch)``, which also accepts the nil channel (``None``) and panics on it."""
    if ch is None:
        raise CloseOfNilChannel("close of nil channel")
    ch.close()


__all__ = ["Chan", "Sudog", "close"]
