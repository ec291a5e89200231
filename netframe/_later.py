"""``Later``: a handler's reply that comes later, with no goroutine waiting for it.

Here alone because both the server's strategies (which settle a connection's reply
from it, :meth:`netframe._server.Server._start_pending`) and the C exchange loop
(which recognises its type) take it; it is a :class:`gosim.lowlevel.Waiter` and
nothing more.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any, Final

from gosim.lowlevel import WaitCancelled, Waiter, WaitReason

__all__ = ["Later"]


class Later(Waiter):
    """A reply that comes later, with no goroutine waiting for it.

    A handler whose work finishes elsewhere (in a batch that another goroutine
    commits, say) returns a ``Later`` and has that work call :meth:`reply` when it is
    done; the server sends the reply from there. A request that waits then costs no
    goroutine and no coroutines of its own, which in a small service cost more than the
    request's own work. Whatever else gets a Later (the inline
    strategy, a transport that does not know it) awaits it: it is awaitable, and the
    awaiting goroutine parks as ``netframe reply``.

    A Later is a :class:`gosim.lowlevel.Waiter` settled with the reply's bytes (its one
    consumer is the server's callback or the goroutine that awaits it). :meth:`reply`
    must be called exactly once, by a goroutine of the server's runtime (a callback
    that one runs included), with the reply's bytes, or None for no reply. Until then
    the request holds its ``max_in_flight`` slot, and a graceful shutdown waits for it
    as for a handler's goroutine: a Later never replied to holds its slot for the
    connection's life.
    """

    __slots__ = ()

    def reply(self, value: bytes | None) -> None:
        """Settle the reply (bytes, or None: none); RuntimeError if already settled.

        A reply to a Later whose awaiting goroutine has left (it was cancelled while
        waiting) is dropped: nobody is left to send it."""
        if not self.settle(value):
            try:
                self.result()
            except WaitCancelled:
                return
            raise RuntimeError("this Later has its reply already")

    def __await__(self) -> Generator[Any, Any, bytes | None]:
        # A plain generator around the wait: __await__ may not return the pure path's
        # wait, which is a (generator-based) coroutine.
        return (yield from self.wait(_HANDLER_REPLY))  # type: ignore[no-any-return]


_HANDLER_REPLY: Final = WaitReason.HANDLER_REPLY
