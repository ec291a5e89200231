"""The runtime's errors: each says when it is raised and what to do about it.

Go's runtime stops the program on a fatal error or an unrecovered panic; gosim stops the
runtime and raises one of these from :func:`gosim.run` (or from the ``open_runtime``
block). Messages use Go's wording where Go has one, so a reader who knows Go's crash
output recognises them.
"""

from __future__ import annotations


class GosimError(Exception):
    """Base class of every error the gosim runtime raises on its own account."""


class Panic(GosimError):
    """An exception escaped a goroutine: Go's unrecovered panic.

    Raised by :func:`gosim.run` (and on leaving ``open_runtime``) after the runtime has
    stopped and every other goroutine has been closed. The exception that escaped is
    ``__cause__``; :attr:`goid` names the goroutine. To recover, catch the exception
    inside the goroutine, as a deferred ``recover()`` would in Go.
    """

    def __init__(self, goid: int, message: str) -> None:
        super().__init__(message)
        self.goid = goid


class FatalError(GosimError):
    """Go's ``fatal error``: an unrecoverable misuse such as unlocking an unlocked mutex.

    It escapes the goroutine and stops the runtime (a Panic with this as its cause),
    as Go's throw does; do not catch it. Its message begins ``fatal error:``, which is
    also the first line of the crash report, as in Go.
    """


class Deadlock(GosimError):
    """No goroutine can run and nothing can wake one: Go's fatal deadlock error.

    The message begins ``all goroutines are asleep - deadlock!`` and, like Go's crash
    dump, lists each goroutine with its state and wait reason
    (``goroutine 1 [chan receive]:``). The fix is in the program: some send has no
    receiver, some lock is never unlocked, some ``WaitGroup`` is never done.
    :attr:`dump` holds the goroutine listing alone.
    """

    def __init__(self, message: str, dump: str) -> None:
        super().__init__(message)
        self.dump = dump


class ChanError(GosimError):
    """A misuse of a channel that Go answers with a panic; subclasses carry Go's text."""


class SendOnClosedChannel(ChanError):
    """``send on closed channel``: a send (or a ready select send case) on a closed channel."""


class CloseOfClosedChannel(ChanError):
    """``close of closed channel``: a channel may be closed once; close it from its one sender."""


class CloseOfNilChannel(ChanError):
    """``close of nil channel``: closing the nil channel (``None``) is a program error."""


class NotInRuntime(RuntimeError):
    """A goroutine-only operation was called outside a running gosim goroutine.

    ``go``, channel operations that block, ``sleep`` and the like need the scheduler:
    call them from a goroutine started by :func:`gosim.run`, ``rt.call`` or ``go``.
    """


class WaitTimeout(GosimError, TimeoutError):
    """A ``gosim.lowlevel.Waiter``'s deadline came before anything settled it.

    A ``TimeoutError`` too, so code that catches the built-in catches it.
    """


class WaitCancelled(GosimError):
    """The outcome of a ``gosim.lowlevel.Waiter`` withdrawn before it was settled: by
    :meth:`~gosim.lowlevel.Waiter.cancel`, or by its goroutine leaving the wait by an
    exception (its coroutine closed at shutdown, an error thrown in)."""


class RuntimeInternalError(AssertionError):
    """An internal invariant of the runtime failed (Go's ``throw``): a bug in gosim.

    The message names the function whose precondition broke. Please report it with the
    program that triggered it; running with ``seed=`` makes it reproducible.
    """


def throw(message: str) -> RuntimeInternalError:
    """Build the error for a broken runtime invariant; use as ``raise throw("runqput: ...")``."""
    return RuntimeInternalError(message)
