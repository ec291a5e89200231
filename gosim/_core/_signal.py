"""Signals: Go's runtime ``sigqueue`` for one runtime (``rt.signals``).

``gosim.signal`` keeps which channels want which signals (Go's ``os/signal``); this
module is the runtime's half: the OS handlers, the queue of signals caught and not yet
relayed, and the driver's part in relaying them.

How a signal travels
--------------------
CPython runs a Python signal handler in the main thread only, between two bytecodes of
whatever it was doing: a goroutine's step, the driver's own bookkeeping, trio's loop. So
the handler (:meth:`SignalQueue._handler`) touches nothing of the scheduler: it appends
the signal number to ``pending`` (a ``deque``: one append is atomic against the
driver's ``popleft``) and asks trio, through its token's ``run_sync_soon`` (made to be
called from a signal handler), to run ``rt.wake``, which cuts an idle wait in trio
short. The driver relays what is pending (:meth:`SignalQueue.flush`, which calls the
``relay`` the upper layer set) at safe points: when it idles (``_schedule._idle``,
before it decides whether anything can still wake a goroutine) and every
``PERIODIC_MASK + 1`` switches (``_schedule._periodic``). A signal is thus relayed
within 256 switches of a busy driver, at once to an idle driver waiting in trio, and
within ``IDLE_TRIO_INTERVAL`` (50 ms) to one blocked in the netpoller's epoll (Python
retries that wait after running the handler; the wait is cut at that interval).

While a signal is relayed from the OS, the driver counts it as a wake source, as Go's
signal-receiving M in a blocking sleep keeps ``checkdead`` quiet: a program that waits
only for a signal is not deadlocked.

In a reproducible runtime (seeded, or on a virtual clock) no OS handler is installed: a
real signal arrives at a real time, which a replay cannot reproduce, and a virtual clock
would race past it. Signals then come only from :meth:`SignalQueue.inject`, and they
are no wake source (a simulation whose goroutines wait only for a signal is deadlocked).

The previous handler of every signal the runtime took is kept and put back when the
runtime stops relaying or ignoring it, and when the runtime ends (``close_all``).
"""

from __future__ import annotations

import signal
import threading
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import trio

if TYPE_CHECKING:
    from gosim._core._runtime import Runtime

# Signals no process can catch or ignore.
_UNCATCHABLE = frozenset({signal.SIGKILL, signal.SIGSTOP})


def signal_number(sig: int, what: str) -> int:
    """``sig`` as a number that can be relayed, or ValueError naming what was wrong."""
    if isinstance(sig, bool) or not isinstance(sig, int):
        raise TypeError(f"{what}: a signal is a signal.Signals or an int, got {sig!r}")
    if sig not in signal.valid_signals():
        raise ValueError(f"{what}: {sig!r} is not a valid signal number")
    if sig in _UNCATCHABLE:
        raise ValueError(f"{what}: {signal.Signals(sig).name} cannot be caught or ignored")
    return int(sig)


class SignalQueue:
    """The signals of one runtime: OS handlers, caught signals, the relay.

    Invariants: ``saved`` holds the handler each signal had before this runtime first
    took it, exactly for the signals whose OS handler is this runtime's (relayed or
    ignored); ``nwake`` is the number of signals relayed from the OS (0 in a
    reproducible runtime), the driver's wake sources besides timers, I/O and trio.
    """

    __slots__ = ("_os", "_token", "ignored", "nwake", "pending", "relay", "relayed", "rt", "saved")

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.pending: deque[int] = deque()
        #: Called on the driver, or in the goroutine that flushes, with each signal
        #: number caught: the upper layer's ``process`` (``gosim.signal``).
        self.relay: Callable[[int], None] | None = None
        self.relayed: set[int] = set()
        self.ignored: set[int] = set()
        self.saved: dict[int, Any] = {}
        self.nwake = 0
        self._os: bool | None = None  # decided on first use: OS handlers or injection only
        self._token: trio.lowlevel.TrioToken | None = None

    def from_os(self) -> bool:
        """Whether real OS signals are handled: False in a reproducible runtime."""
        if self._os is None:
            rt = self.rt
            virtual = rt.virtual_jump is not None or hasattr(
                trio.lowlevel.current_clock(), "autojump_threshold"
            )
            self._os = not (rt.deterministic or virtual)
        return self._os

    def _take(self, sig: int, handler: Any, what: str) -> None:
        """Install ``handler`` for ``sig``, keeping the handler it replaces."""
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError(
                f"{what}: OS signals are handled in the main thread only, and this "
                f"runtime runs in thread {threading.current_thread().name!r}: start "
                "gosim.run from the main thread (or use gosim.signal.inject in tests)"
            )
        if sig not in self.saved:
            prev = signal.getsignal(sig)
            owner = getattr(prev, "__self__", None)
            if isinstance(owner, SignalQueue) and owner is not self:
                raise RuntimeError(
                    f"{what}: {signal.Signals(sig).name} is already relayed by another "
                    "gosim runtime of this process"
                )
            if self._token is None:
                self._token = trio.lowlevel.current_trio_token()
            signal.signal(sig, handler)
            self.saved[sig] = prev
        else:
            signal.signal(sig, handler)

    def _give_back(self, sig: int) -> None:
        prev = self.saved.pop(sig)
        # A handler installed from C reads back as None and cannot be reinstalled from
        # Python; the default action is the nearest to it.
        signal.signal(sig, signal.SIG_DFL if prev is None else prev)

    def enable(self, sig: int, what: str) -> None:
        """Relay ``sig`` from now on (Go's ``signal_enable``)."""
        if sig in self.relayed:
            return
        if self.from_os():
            self._take(sig, self._handler, what)
            self.nwake += 1
        self.ignored.discard(sig)
        self.relayed.add(sig)

    def disable(self, sig: int) -> None:
        """Stop relaying or ignoring ``sig``: its previous handler is back (Go's
        ``signal_disable``). A signal caught before is relayed first, and one caught
        while the handler is put back is raised again for the previous handler (as
        trio's signal receiver does): each is either relayed or met by the previous
        handler, never lost in between."""
        self.flush()
        self._drop(sig)
        if sig in self.saved:
            self._give_back(sig)
        self.flush()

    def ignore(self, sig: int, what: str) -> None:
        """Ignore ``sig`` from now on (Go's ``signal_ignore``)."""
        self.flush()
        self._drop(sig)
        if self.from_os():
            self._take(sig, signal.SIG_IGN, what)
        self.ignored.add(sig)

    def is_ignored(self, sig: int) -> bool:
        """Whether ``sig`` is ignored: by this runtime, or (from the OS) by its handler."""
        if sig in self.ignored:
            return True
        return bool(self.from_os() and signal.getsignal(sig) is signal.SIG_IGN)

    def _drop(self, sig: int) -> None:
        if sig in self.relayed:
            self.relayed.discard(sig)
            if self.from_os():
                self.nwake -= 1
        self.ignored.discard(sig)

    def inject(self, sig: int) -> None:
        """Relay ``sig`` now, in the caller, as if the process had caught it (after
        the signals caught before). A signal that is not relayed is dropped: no
        handler runs."""
        self.flush()
        if self.relay is not None and sig in self.relayed:
            self.relay(sig)

    def flush(self) -> None:
        """Relay every signal caught from the OS, oldest first; on the driver or in a
        goroutine. One that is no longer relayed (its handler was put back after it was
        caught) is raised again for the handler now in place."""
        pending = self.pending
        while pending:
            sig = pending.popleft()
            if sig in self.relayed:
                if self.relay is not None:
                    self.relay(sig)
            elif sig not in self.saved:
                signal.raise_signal(sig)

    def _handler(self, signum: int, frame: Any) -> None:
        # Runs between two bytecodes of anything on the main thread: only an atomic
        # append, and a wake-up through trio's signal-safe entry queue.
        self.pending.append(signum)
        token = self._token
        if token is not None:
            try:
                token.run_sync_soon(self.rt.wake, idempotent=True)
            except trio.RunFinishedError:
                pass

    def close(self) -> None:
        """The runtime ends: every handler it replaced is put back."""
        for sig in list(self.saved):
            self._give_back(sig)
        self.relayed.clear()
        self.ignored.clear()
        self.pending.clear()
        self.nwake = 0
        self.relay = None
