"""gosim programs that ``test_signal.py`` runs as child processes and sends signals to:
``python tests/gosim/signal_programs.py PROGRAM [IDLE]``. Each prints one line per step,
flushed, so the parent can send the next signal once the last one was seen."""

from __future__ import annotations

import signal
import sys

import gosim
from gosim import Chan, _internals, net
from gosim import signal as gosignal


def say(*parts: object) -> None:
    print(*parts, flush=True)


async def _accept_forever(ln: net.Listener) -> None:
    await ln.accept()  # nobody dials: parked in IO wait until the runtime ends


async def relay(idle: str) -> None:
    """Print every SIGUSR1 and SIGTERM received; SIGTERM ends the program. ``idle``:
    where the driver waits between signals: ``trio`` (nothing but the signal channel
    is waited on, so only the signal can wake the program) or ``netpoller`` (a
    goroutine parked on a socket: the driver blocks in the netpoller's epoll)."""
    ch = Chan[signal.Signals](1)
    gosignal.notify(ch, signal.SIGTERM, signal.SIGUSR1)
    if idle == "netpoller":
        ln = net.listen("tcp", "127.0.0.1:0")
        assert isinstance(ln, net.Listener)
        gosim.go(_accept_forever, ln)
    say("ready", "c" if _internals.speedups is not None else "python")
    while True:
        sig = await ch.recv()
        assert sig is not None
        say("got", sig.name)
        if sig == signal.SIGTERM:
            break
    gosignal.stop(ch)
    say("done")


async def stop_then_default(idle: str) -> None:
    """Receive one SIGUSR1, stop relaying, then wait: the next SIGUSR1 takes the
    default action, which ends the process."""
    ch = Chan[signal.Signals](1)
    gosignal.notify(ch, signal.SIGUSR1)
    say("ready", "c" if _internals.speedups is not None else "python")
    sig = await ch.recv()
    assert sig is not None
    say("got", sig.name)
    gosignal.stop(ch)
    assert signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL
    say("stopped")
    await gosim.time.sleep(60)
    say("still running")


if __name__ == "__main__":
    program = {"relay": relay, "stop_then_default": stop_then_default}[sys.argv[1]]
    gosim.run(program, sys.argv[2] if len(sys.argv) > 2 else "trio")
