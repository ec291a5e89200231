"""Go's ``os/signal`` on gosim: OS signals relayed to channels and contexts.

A program that waits for SIGTERM (here it sends itself one)::

    import os
    import signal

    import gosim
    from gosim import Chan
    from gosim import signal as gosignal


    async def main() -> signal.Signals:
        sigs = Chan[signal.Signals](1)
        gosignal.notify(sigs, signal.SIGTERM, signal.SIGINT)
        os.kill(os.getpid(), signal.SIGTERM)  # as a supervisor stopping the service
        sig = await sigs.recv()  # a server would shut down here
        gosignal.stop(sigs)
        return sig


    assert gosim.run(main) == signal.SIGTERM

:func:`notify` relays the named signals to a channel; each channel and each signal may
be named several times (each call adds signals to a channel's set, and every channel
that wants a signal gets its own copy). As in Go, a signal is sent without blocking: when
the channel's buffer is full it is **dropped** for that channel, so the channel must be
buffered (``Chan(1)`` for one signal is enough: a second copy of a pending signal adds
nothing); an unbuffered channel is refused (Go's ``vet`` refuses it too). :func:`stop`
ends the relaying to a channel: once it returns, the channel receives no more, and a
signal caught before it returned was relayed. :func:`ignore` ignores signals,
:func:`reset` gives them back their previous handling, and :func:`notify_context` is a
context cancelled by the first of the signals (Go's ``NotifyContext``; its
:func:`gosim.context.cause` is a :class:`SignalReceived` naming the signal).

Where Go differs, in the terms of a Python program:

* The "default behaviour" a signal goes back to is the handler the process had before
  the runtime took it (for SIGINT, usually trio's or Python's ``KeyboardInterrupt``).
  Every handler the runtime replaced is put back when nothing relays or ignores that
  signal any more, and when the runtime ends (``gosim.run`` returns or raises).
* The signals are named: relaying every signal (Go's ``Notify(c)``) or ignoring every
  signal (``Ignore()``) is refused. SIGKILL and SIGSTOP cannot be caught.
* CPython runs signal handlers in the main thread only: relaying from the OS needs the
  runtime to run there (else RuntimeError, naming the thread).
* A signal is relayed by the runtime's driver: within 256 goroutine switches while it
  is busy, at once while it idles, and within 50 ms while it is blocked in the
  netpoller. While a signal is relayed from the OS, a program that only waits for it
  is not deadlocked (as in Go).

In a reproducible runtime (``gosim.run(..., seed=N)`` or ``virtual_time=True``) no OS
handler is installed and nothing is changed for the process: a real signal arrives at
a real time, which a replay could not reproduce. :func:`notify` and the rest work the
same, and signals come from :func:`inject`, which a test calls to play the signal
(it works on the real clock too); waiting for a signal is then no wake source, so a
simulation whose goroutines all wait for one is deadlocked.
"""

from __future__ import annotations

import signal as _os
from collections.abc import Callable

from gosim import Chan, _internals, context
from gosim._core._exceptions import GosimError, SendOnClosedChannel
from gosim.lowlevel import RuntimeVar, signal_number

__all__ = [
    "SignalReceived",
    "ignore",
    "ignored",
    "inject",
    "notify",
    "notify_context",
    "reset",
    "stop",
]


class SignalReceived(GosimError):
    """The cause of a :func:`notify_context` context's cancellation: ``signal``
    arrived (``signal received: SIGTERM``)."""

    def __init__(self, sig: _os.Signals | int) -> None:
        super().__init__(f"signal received: {_name(sig)}")
        self.signal = sig


def _name(sig: _os.Signals | int) -> str:
    return sig.name if isinstance(sig, _os.Signals) else f"signal {sig}"


def _as_signal(signum: int) -> _os.Signals | int:
    """The member of :class:`signal.Signals` for ``signum``; the number itself for a
    real-time signal the enum does not name (``SIGRTMIN + 2``)."""
    try:
        return _os.Signals(signum)
    except ValueError:
        return signum


class _ContextTarget:
    """What :func:`notify_context` registers in a channel's place: a send cancels."""

    __slots__ = ("cancel",)

    def __init__(self, cancel: Callable[[BaseException | None], None]) -> None:
        self.cancel = cancel

    def try_send(self, sig: _os.Signals | int) -> bool:
        self.cancel(SignalReceived(sig))
        return True


_Target = Chan[_os.Signals] | _ContextTarget


class _Relays:
    """Go's ``handlers``: which signals each channel wants, and how many want each."""

    __slots__ = ("handlers", "ref")

    def __init__(self) -> None:
        # In registration order: a signal reaches the channels in the order they were
        # first notified, the same on every run.
        self.handlers: dict[_Target, set[int]] = {}
        self.ref: dict[int, int] = {}

    def process(self, signum: int) -> None:
        """Send ``signum`` to every channel that wants it, without blocking (Go's
        ``process``); a full channel misses it."""
        sig = _as_signal(signum)
        for target, want in list(self.handlers.items()):
            if signum in want:
                try:
                    target.try_send(sig)  # type: ignore[arg-type]
                except SendOnClosedChannel:
                    raise SendOnClosedChannel(
                        f"send on closed channel: gosim.signal relayed {_name(sig)} to a "
                        "channel closed while notified (call stop(ch) before closing it)"
                    ) from None

    def remove(self, signum: int) -> None:
        """No channel wants ``signum`` any more."""
        for target, want in list(self.handlers.items()):
            if signum in want:
                want.discard(signum)
                if not want:
                    del self.handlers[target]
        self.ref.pop(signum, None)


_RELAYS: RuntimeVar[_Relays] = RuntimeVar("gosim.signal")


def _relays() -> _Relays:
    relays = _RELAYS.get()
    if relays is None:
        relays = _Relays()
        _RELAYS.set(relays)
        _internals.signal_queue().relay = relays.process
    return relays


def _numbers(sigs: tuple[int, ...], what: str) -> list[int]:
    if not sigs:
        raise ValueError(
            f"{what}: name the signals (every signal at once, as Go allows, is not supported)"
        )
    return [signal_number(s, what) for s in sigs]


def _add(target: _Target, nums: list[int], what: str) -> None:
    relays = _relays()
    queue = _internals.signal_queue()
    for n in nums:
        want = relays.handlers.get(target)
        if want is not None and n in want:
            continue
        if not relays.ref.get(n):
            queue.enable(n, what)  # first: a refusal (not the main thread) changes nothing
        relays.handlers.setdefault(target, set()).add(n)
        relays.ref[n] = relays.ref.get(n, 0) + 1


def _stop(target: _Target) -> None:
    queue = _internals.signal_queue()
    queue.flush()  # what was caught before stop reaches the channel (Go's Stop)
    relays = _relays()
    want = relays.handlers.pop(target, None)
    if want is None:
        return
    for n in sorted(want):
        relays.ref[n] -= 1
        if not relays.ref[n]:
            del relays.ref[n]
            queue.disable(n)


def notify(ch: Chan[_os.Signals], *sigs: int) -> None:
    """Relay the signals ``sigs`` to ``ch`` (Go's ``signal.Notify``).

    ``ch`` receives :class:`signal.Signals` members (a real-time signal the enum
    does not name, as ``SIGRTMIN + 2``, as its number). The relay never blocks: a signal
    that finds ``ch`` full is dropped for it, so ``ch`` must be buffered (ValueError
    otherwise, and for a None channel, no signal, an invalid signal, SIGKILL or
    SIGSTOP). Calling it again adds signals to ``ch``'s set; several channels each get
    their own copy. On the real clock the runtime's handler replaces the signal's
    previous one (RuntimeError unless the runtime runs in the main thread), until
    :func:`stop`, :func:`reset` or the end of the runtime; in a reproducible runtime
    only :func:`inject` delivers (see the module's notes).
    """
    if ch is None:
        raise ValueError("notify using nil channel")
    nums = _numbers(sigs, "notify")
    if ch.cap() == 0:
        raise ValueError(
            "notify: the channel is unbuffered, so a signal that arrives while no "
            "goroutine receives would be dropped: give it a buffer (Chan(1) for one signal)"
        )
    _add(ch, nums, "notify")


def stop(ch: Chan[_os.Signals]) -> None:
    """Stop relaying signals to ``ch`` (Go's ``signal.Stop``).

    Once it returns, ``ch`` receives no more signals; one caught before it returned
    was relayed to ``ch``. A signal no channel wants any more gets its previous handler
    back. A channel never notified is no error.
    """
    _stop(ch)


def ignore(*sigs: int) -> None:
    """Ignore the signals ``sigs`` (``SIG_IGN``) and stop relaying them to any channel
    (Go's ``signal.Ignore``). In a reproducible runtime nothing changes for the process;
    the signals are no longer relayed, and :func:`ignored` says True."""
    nums = _numbers(sigs, "ignore")
    relays = _relays()
    queue = _internals.signal_queue()
    for n in nums:
        relays.remove(n)
        queue.ignore(n, "ignore")


def ignored(sig: int) -> bool:
    """Whether ``sig`` is ignored now: by :func:`ignore`, or (on the real clock) by the
    process's handler, as after ``nohup`` (Go's ``signal.Ignored``)."""
    return _internals.signal_queue().is_ignored(signal_number(sig, "ignored"))


def reset(*sigs: int) -> None:
    """Undo :func:`notify` and :func:`ignore` for the signals ``sigs``, or with none for
    every signal the runtime relays or ignores: no channel receives them, and each has
    its previous handler back (Go's ``signal.Reset``)."""
    relays = _relays()
    queue = _internals.signal_queue()
    if sigs:
        nums = [signal_number(s, "reset") for s in sigs]
    else:
        nums = sorted(set(relays.ref) | queue.ignored)
    queue.flush()  # as stop: what was caught before reaches its channels
    for n in nums:
        relays.remove(n)
        queue.disable(n)


def inject(sig: int) -> None:
    """Deliver ``sig`` now, as if the process had caught it: every channel notified for
    it gets it (after the signals caught before), none when nothing relays it (no
    handler runs). For tests, above all in a reproducible runtime, where it is the only
    source of signals. Called from a goroutine."""
    _internals.signal_queue().inject(signal_number(sig, "inject"))


def notify_context(
    parent: context.Context, *sigs: int
) -> tuple[context.Context, context.CancelFunc]:
    """A child of ``parent`` cancelled by the first of the signals ``sigs`` to arrive,
    by the returned ``stop`` or with ``parent``, whichever comes first (Go's
    ``signal.NotifyContext``). After a signal, :func:`gosim.context.cause` is a
    :class:`SignalReceived` naming it (``err()`` is ``Canceled``).

    ``stop`` cancels the context and stops relaying (as :func:`stop`); until it is
    called the signals stay diverted from their previous handling, even once the
    context is done, so call it as soon as the work under the context ends. No
    goroutine is started: the relay cancels the context itself.
    """
    nums = _numbers(sigs, "notify_context")
    ctx, cancel = context.with_cancel_cause(parent)
    target = _ContextTarget(cancel)
    _add(target, nums, "notify_context")

    def stop_() -> None:
        cancel(None)
        _stop(target)

    return ctx, stop_
