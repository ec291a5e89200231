"""A goroutine's wait for one outcome that someone else brings: the settle-once waiter.

Two uses. :func:`await_done` is how every awaiting form of a call-back operation waits
(a store's batch, ``Idempotency.run(one_step=True)``): the operation's one mechanism is
its callback form, and the awaiting form is this wait on it, in one place, so that the
waiter under it can be swapped for the runtime's own in one line. And the RPC layer's
race: an RPC caller waits for whichever comes first: its response, the loss of its
connection, or its deadline; a server's call with a deadline waits for the method's
reply or the deadline. A one-slot channel selected against a timer channel says that,
at the price of a channel, a select, a timer channel and their wakes on every call.
:class:`OneShot` says it with one park and one wake, through ``gosim.lowlevel``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from gosim import lowlevel

__all__ = ["OneShot", "await_done"]


def _expire(arg: tuple[OneShot, Any], now: float) -> None:
    waiter, expired = arg
    waiter.settle(expired)


class OneShot:
    """Made by the goroutine that will :meth:`wait`; settled once, by anyone.

    Any goroutine or timer of the same runtime may :meth:`settle` it: the first
    settle wins (its value is what :meth:`wait` returns) and wakes the waiter if it is
    parked; later ones change nothing and return False. A settle that comes before the
    wait (while the waiter was busy elsewhere) is kept, and the wait returns at once.
    """

    # gosim.lowlevel's fast-path hooks (state.rt, rt.curg, rt.goready, trap(PARK)):
    # current_g/park/ready would add a frame each.
    __slots__ = ("error", "g", "parked", "rt", "settled", "value")

    def __init__(self) -> None:
        rt = lowlevel.state.rt
        if rt is None or rt.curg is None:
            lowlevel.current_g()  # raises NotInRuntime
        assert rt is not None and rt.curg is not None
        self.rt: lowlevel.Runtime = rt
        self.g: lowlevel.G = rt.curg
        self.settled = False
        self.parked = False
        self.value: Any = None
        self.error: BaseException | None = None

    def done(self, result: Any, error: BaseException | None) -> None:
        """A call-back operation's ``done(result, error)``: settle with ``result``, or
        with ``error`` to be raised by :func:`await_done` (the first call wins)."""
        # settle(), inlined: this runs for every store operation awaited.
        if self.settled:
            return
        self.settled = True
        self.value = result
        self.error = error
        if self.parked:
            self.parked = False
            self.rt.goready(self.g, None)

    def settle(self, value: Any) -> bool:
        """Make ``value`` the outcome; False (nothing changed) when already settled."""
        if self.settled:
            return False
        self.settled = True
        self.value = value
        if self.parked:
            self.parked = False
            self.rt.goready(self.g, None)
        return True

    async def wait(
        self, deadline: float = math.inf, expired: Any = None, reason: str = "select"
    ) -> Any:
        """The outcome; ``expired`` when runtime-clock time ``deadline`` came first.

        Only the goroutine that made it may wait, once. An exception thrown into the
        wait (a cancellation) settles it, so nothing wakes a goroutine that has left.
        """
        if self.settled:
            return self.value
        timer = None
        if deadline != math.inf:
            timer = lowlevel.RuntimeTimer(_expire, (self, expired))
            lowlevel.add_timer(timer, deadline)
        self.parked = True
        self.g.waitreason = reason
        try:
            await lowlevel.trap(lowlevel.PARK)
        except BaseException:
            self.settled = True
            self.parked = False
            raise
        finally:
            if timer is not None and timer.armed:
                lowlevel.del_timer(timer)
        return self.value


async def await_done(start: Callable[..., None], *args: Any) -> Any:
    """Call ``start(*args, done)`` and wait for ``done(result, error)``; return ``result``
    or raise ``error``.

    The awaiting form of every call-back operation (see ``stores/_contract.py``): what
    ``start`` raises, this raises, and ``done`` must then never be called. ``done`` may
    come before ``start`` returns (the wait then returns at once) or later, from any
    goroutine of the runtime. An exception thrown into the wait (a cancellation) leaves
    it; the operation goes on, and its late ``done`` changes nothing.
    """
    waiter = OneShot()
    start(*args, waiter.done)
    if not waiter.settled:
        # wait() without a deadline, inlined (no coroutine of its own): this runs for
        # every store operation awaited.
        waiter.parked = True
        waiter.g.waitreason = "idempotency commit"
        try:
            await lowlevel.trap(lowlevel.PARK)
        except BaseException:
            waiter.settled = True
            waiter.parked = False
            raise
    if waiter.error is not None:
        raise waiter.error
    return waiter.value
