"""gosim: Go's concurrency model and runtime machinery on trio.

General layout: ``gosim._core`` is the self-contained scheduler (stdlib and trio only);
``_chan``, ``_select`` and ``time`` build on it; ``atomic``, ``spin`` and ``mem`` are
independent of the scheduler. This file only re-exports: the public names below are the
contract that the design (``docs/design/index.md``) describes. A producer and a consumer
on an unbuffered channel::

    import gosim
    from gosim import Chan, go


    async def producer(ch: Chan[int]) -> None:
        for i in range(3):
            await ch.send(i)
        ch.close()


    async def main() -> list[int]:
        ch = Chan[int](0)
        go(producer, ch)
        return [v async for v in ch]


    assert gosim.run(main) == [0, 1, 2]
"""

from gosim import lowlevel as lowlevel
from gosim import time as time
from gosim._chan import Chan as Chan
from gosim._chan import close as close
from gosim._core._exceptions import ChanError as ChanError
from gosim._core._exceptions import CloseOfClosedChannel as CloseOfClosedChannel
from gosim._core._exceptions import CloseOfNilChannel as CloseOfNilChannel
from gosim._core._exceptions import Deadlock as Deadlock
from gosim._core._exceptions import GosimError as GosimError
from gosim._core._exceptions import NotInRuntime as NotInRuntime
from gosim._core._exceptions import Panic as Panic
from gosim._core._exceptions import RuntimeInternalError as RuntimeInternalError
from gosim._core._exceptions import SendOnClosedChannel as SendOnClosedChannel
from gosim._internals import RuntimeHandle as RuntimeHandle
from gosim._internals import SchedStatistics as SchedStatistics
from gosim._internals import Trace as Trace
from gosim._malloc import free as free
from gosim._malloc import heap as heap
from gosim._malloc import malloc as malloc
from gosim._malloc import use_heap as use_heap
from gosim._select import recv as recv
from gosim._select import select as select
from gosim._select import send as send
from gosim.lowlevel import go as go
from gosim.lowlevel import goexit as goexit
from gosim.lowlevel import goid as goid
from gosim.lowlevel import gomaxprocs as gomaxprocs
from gosim.lowlevel import gosched as gosched
from gosim.lowlevel import num_goroutine as num_goroutine
from gosim.lowlevel import open_runtime as open_runtime
from gosim.lowlevel import panic as panic
from gosim.lowlevel import run as run
from gosim.lowlevel import schedtrace as schedtrace
from gosim.lowlevel import statistics as statistics
from gosim.lowlevel import syscall as syscall
from gosim.lowlevel import trio_call as trio_call
from gosim.time import Ticker as Ticker
from gosim.time import Timer as Timer
from gosim.time import after as after
from gosim.time import after_func as after_func
from gosim.time import now as now
from gosim.time import sleep as sleep

__all__ = [
    "Chan",
    "ChanError",
    "CloseOfClosedChannel",
    "CloseOfNilChannel",
    "Deadlock",
    "GosimError",
    "NotInRuntime",
    "Panic",
    "RuntimeHandle",
    "RuntimeInternalError",
    "SchedStatistics",
    "SendOnClosedChannel",
    "Ticker",
    "Timer",
    "Trace",
    "after",
    "after_func",
    "close",
    "free",
    "go",
    "goexit",
    "goid",
    "gomaxprocs",
    "gosched",
    "heap",
    "malloc",
    "now",
    "num_goroutine",
    "open_runtime",
    "panic",
    "recv",
    "run",
    "schedtrace",
    "select",
    "send",
    "sleep",
    "statistics",
    "syscall",
    "trio_call",
    "use_heap",
]


def _fixup_module_metadata() -> None:
    # Tracebacks and reprs say gosim.Chan, not gosim._chan.Chan (as trio does).
    for name in __all__:
        obj = globals()[name]
        if getattr(obj, "__module__", "").startswith("gosim."):
            try:
                obj.__module__ = "gosim"
            except (AttributeError, TypeError):
                pass


_fixup_module_metadata()
