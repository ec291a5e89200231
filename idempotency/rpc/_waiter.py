"""A goroutine's wait for the first of several possible outcomes (the RPC layer's race).

An RPC caller waits for whichever comes first: its response, the loss of its
connection, or its deadline; a server's call with a deadline waits for the method's
reply or the deadline. A one-slot channel selected against a timer channel says that,
at the price of a channel, a select, a timer channel and their wakes on every call.
:class:`OneShot` says it with one park and one wake, through ``gosim.lowlevel``.
"""

from __future__ import annotations

import math
from typing import Any

from gosim import lowlevel


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
    __slots__ = ("g", "parked", "rt", "settled", "value")

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

    async def wait(self, deadline: float = math.inf, expired: Any = None) -> Any:
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
        self.g.waitreason = "select"
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
