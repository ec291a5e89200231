"""The runtime's errors: each says when it is raised and what to do about it.

Go's runtime stops the program on a fatal error or an unrecovered panic; gosim stops the
runtime and raises the error from :func:`gosim.run` (or from the ``open_runtime``
block): an exception that escaped a goroutine as itself, with Go's crash report as a
note, and the runtime's own errors (these) when the runtime stopped for a reason of its
own. Messages use Go's wording where Go has one, so a reader who knows Go's crash output
recognises them.
"""

from __future__ import annotations


class GosimError(Exception):
    """Base class of every error the gosim runtime raises on its own account."""


class Panic(GosimError):
    """Go's panic with a value that is not an exception: what ``gosim.panic(value)`` raises.

    :attr:`value` is the panic value (what Go's ``recover()`` returns), :attr:`goid` the
    goroutine that panicked (None outside one); ``str()`` is the value's text, so the
    crash report reads ``panic: <value>`` as Go's does.

    An exception is its own panic value and is never wrapped in this class: one that
    escapes a goroutine stops the runtime, and once it has stopped and every other
    goroutine has been closed, :func:`gosim.run` (or leaving ``open_runtime``) raises
    that exception itself, of its own type, with Go's crash report (``panic: ...``,
    ``goroutine N [running]:``, the function and who started it) added as a note
    (``add_note``, shown under its traceback). So ``except OSError`` around ``run``
    catches an ``OSError`` from a goroutine, as trio and asyncio deliver one; a
    ``Panic`` arrives the same way. To recover, catch the exception inside the
    goroutine, as a deferred ``recover()`` would in Go.
    """

    def __init__(self, value: object, goid: int | None = None) -> None:
        super().__init__(str(value))
        self.value = value
        self.goid = goid


class FatalError(GosimError):
    """Go's ``fatal error``: an unrecoverable misuse such as unlocking an unlocked mutex.

    It escapes the goroutine and stops the runtime, which raises it from
    :func:`gosim.run` with the crash report as a note, as Go's throw stops the program;
    do not catch it. Its message begins ``fatal error:``, which is
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
