"""The awaiting form of every call-back operation: :func:`await_done`, one wait on the
runtime's settle-once :class:`gosim.lowlevel.Waiter`.

A store's batch and ``Idempotency.run(one_step=True)`` have one mechanism, their
callback form ``start(..., done)``; their awaiting forms are this wait on it, in one
place. The RPC layer's races (a caller's response against its connection's loss and
its deadline; a server's method against the call's deadline) use the Waiter directly:
its settles say "first one wins", its deadline is one runtime timer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gosim.lowlevel import Waiter, WaitReason

__all__ = ["await_done"]

_COMMIT_WAIT = WaitReason.COMMIT_WAIT


class _Done(Waiter):
    """A Waiter that a call-back operation's ``done(result, error)`` settles."""

    __slots__ = ()

    def deliver(self, result: Any, error: BaseException | None) -> None:
        """Settle with ``result``, or fail with ``error`` (the first call wins)."""
        if error is None:
            self.settle(result)
        else:
            self.fail(error)


async def await_done(start: Callable[..., None], *args: Any) -> Any:
    """Call ``start(*args, done)`` and wait for ``done(result, error)``; return ``result``
    or raise ``error``.

    The awaiting form of every call-back operation (see ``stores/_contract.py``): what
    ``start`` raises, this raises, and ``done`` must then never be called. ``done`` may
    come before ``start`` returns (the wait then returns at once) or later, from any
    goroutine of the runtime. An exception thrown into the wait (a cancellation) leaves
    it (the waiter is cancelled); the operation goes on, and its late ``done`` changes
    nothing. The goroutine parks with the wait reason ``idempotency commit``.
    """
    w = _Done()
    start(*args, w.deliver)
    return await w.wait(_COMMIT_WAIT)
