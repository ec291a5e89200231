"""gosim.signal: OS signals relayed to channels and contexts (Go's ``os/signal``).

The relaying from the OS is tested in child processes the test sends signals to by PID
(``signal_programs.py``), on the C accelerator and in pure Python, with the idle driver
waiting in trio and blocked in the netpoller; the rest in this process, with signals
raised in the main thread (``signal.raise_signal``: delivered to that thread alone)."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

import gosim
from gosim import Chan, context
from gosim import signal as gosignal

ROOT = Path(__file__).resolve().parents[2]
PROGRAMS = Path(__file__).with_name("signal_programs.py")
LINE_TIMEOUT = 60.0  # a bound for a loaded machine: a missing line fails, never hangs

Sig = signal.Signals


class Child:
    """A child process running one of ``signal_programs.py``, read line by line."""

    def __init__(self, program: str, idle: str, impl: str) -> None:
        env = {k: v for k, v in os.environ.items() if k != "GOSIM_PURE_PYTHON"}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
        if impl == "python":
            env["GOSIM_PURE_PYTHON"] = "1"
        self.proc = subprocess.Popen(
            [sys.executable, str(PROGRAMS), program, idle],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        self.buf = b""

    def line(self) -> str:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        while b"\n" not in self.buf:
            ready, _, _ = select.select([fd], [], [], LINE_TIMEOUT)
            assert ready, f"no line from the child within {LINE_TIMEOUT} s"
            chunk = os.read(fd, 4096)
            if not chunk:
                return self.buf.decode()  # end of output
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return line.decode()

    def kill(self, sig: int) -> None:
        os.kill(self.proc.pid, sig)

    def wait(self) -> tuple[int, str]:
        assert self.proc.stderr is not None
        code = self.proc.wait(timeout=LINE_TIMEOUT)
        return code, self.proc.stderr.read().decode()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for f in (self.proc.stdout, self.proc.stderr):
            if f is not None:
                f.close()


@pytest.fixture
def child() -> Iterator[list[Child]]:
    started: list[Child] = []
    yield started
    for c in started:
        c.close()


@pytest.mark.parametrize("impl", ["c", "python"])
@pytest.mark.parametrize("idle", ["trio", "netpoller"])
def test_every_signal_sent_to_the_process_is_received(
    child: list[Child], impl: str, idle: str
) -> None:
    """Each SIGUSR1 reaches the channel (the next is sent once the last was printed,
    so none finds the channel full), SIGTERM too, and the program then ends cleanly. With
    ``idle == "trio"`` main waits for nothing but the signal channel: without a relayed
    signal counting as a wake source, that is reported as a deadlock."""
    c = Child("relay", idle, impl)
    child.append(c)
    assert c.line() == f"ready {impl}"
    for _ in range(5):
        c.kill(signal.SIGUSR1)
        assert c.line() == "got SIGUSR1"
    c.kill(signal.SIGTERM)
    assert c.line() == "got SIGTERM"
    assert c.line() == "done"
    assert c.wait() == (0, "")


@pytest.mark.parametrize("impl", ["c", "python"])
@pytest.mark.parametrize("idle", ["trio"])
def test_after_stop_a_signal_takes_its_default_action(
    child: list[Child], impl: str, idle: str
) -> None:
    c = Child("stop_then_default", idle, impl)
    child.append(c)
    assert c.line() == f"ready {impl}"
    c.kill(signal.SIGUSR1)
    assert c.line() == "got SIGUSR1"
    assert c.line() == "stopped"
    c.kill(signal.SIGUSR1)  # no handler of the runtime's any more: SIG_DFL ends it
    code, _ = c.wait()
    assert code == -signal.SIGUSR1
    assert c.line() == ""  # it never printed "still running"


class Recorder:
    """A Python handler that records the signals it is given."""

    def __init__(self) -> None:
        self.got: list[int] = []

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        self.got.append(signum)


@pytest.fixture
def usr_handlers() -> Iterator[tuple[Recorder, Recorder]]:
    """SIGUSR1 and SIGUSR2 handled by recorders, as a program's own handlers would be
    (and no stray signal kills the test process); the previous handlers afterwards."""
    rec1, rec2 = Recorder(), Recorder()
    prev1 = signal.signal(signal.SIGUSR1, rec1)
    prev2 = signal.signal(signal.SIGUSR2, rec2)
    try:
        yield rec1, rec2
    finally:
        signal.signal(signal.SIGUSR1, prev1)
        signal.signal(signal.SIGUSR2, prev2)


def test_handlers_are_restored_when_run_ends(usr_handlers: tuple[Recorder, Recorder]) -> None:
    """The runtime's handlers are in place while main relays (the process's own
    handler gets nothing), and the previous ones are back once run returns, also when
    main did not stop relaying, and when the run ends in a panic."""
    rec1, rec2 = usr_handlers

    async def main(fail: bool) -> list[str]:
        ch = Chan[Sig](2)
        gosignal.notify(ch, signal.SIGUSR1)
        gosignal.notify(ch, signal.SIGUSR2)
        assert signal.getsignal(signal.SIGUSR1) is not rec1
        signal.raise_signal(signal.SIGUSR1)
        signal.raise_signal(signal.SIGUSR2)
        got = [(await ch.recv()), (await ch.recv())]
        if fail:
            raise ValueError("boom")
        return [s.name for s in got if s is not None]

    assert gosim.run(main, False) == ["SIGUSR1", "SIGUSR2"]
    assert signal.getsignal(signal.SIGUSR1) is rec1
    assert signal.getsignal(signal.SIGUSR2) is rec2
    with pytest.raises(ValueError, match="boom"):
        gosim.run(main, True)
    assert signal.getsignal(signal.SIGUSR1) is rec1
    assert signal.getsignal(signal.SIGUSR2) is rec2
    assert rec1.got == rec2.got == []
    signal.raise_signal(signal.SIGUSR1)
    assert rec1.got == [signal.SIGUSR1]


def test_stop_relays_what_was_caught_before_it_and_gives_the_handler_back(
    usr_handlers: tuple[Recorder, Recorder],
) -> None:
    """Go's Stop: a signal caught before stop returned reaches the channel (here it is
    caught, not yet relayed, when stop is called); after, the previous handler has it."""
    rec1, _ = usr_handlers

    async def main() -> tuple[Any, Any]:
        ch = Chan[Sig](1)
        gosignal.notify(ch, signal.SIGUSR1)
        signal.raise_signal(signal.SIGUSR1)  # caught by the handler; no switch since
        gosignal.stop(ch)
        first = ch.try_recv()
        signal.raise_signal(signal.SIGUSR1)
        return first, ch.try_recv()

    first, second = gosim.run(main)
    assert first == (signal.SIGUSR1, True, True)
    assert second == (None, False, False)
    assert rec1.got == [signal.SIGUSR1]


def test_a_full_channel_misses_the_signal_other_channels_get_their_copy(
    usr_handlers: tuple[Recorder, Recorder],
) -> None:
    async def main() -> tuple[list[Sig], list[Sig]]:
        small = Chan[Sig](1)
        big = Chan[Sig](3)
        gosignal.notify(small, signal.SIGUSR1)
        gosignal.notify(big, signal.SIGUSR1, signal.SIGUSR1)  # named twice: one copy
        for _ in range(3):
            gosignal.inject(signal.SIGUSR1)
        return [s for s in (small.try_recv()[0],) if s], [big.try_recv()[0] for _ in range(3)]

    small, big = gosim.run(main)
    assert small == [signal.SIGUSR1]
    assert big == [signal.SIGUSR1] * 3


def test_sigint_is_relayed_while_notified_and_interrupts_again_after_stop() -> None:
    """SIGINT notified goes to the channel, not to a KeyboardInterrupt; stopped, it
    raises KeyboardInterrupt from gosim.run again."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)

    async def main(got: list[str]) -> None:
        ch = Chan[Sig](1)
        gosignal.notify(ch, signal.SIGINT)
        signal.raise_signal(signal.SIGINT)
        sig = await ch.recv()
        assert sig is not None
        got.append(sig.name)
        gosignal.stop(ch)
        signal.raise_signal(signal.SIGINT)
        await gosim.time.sleep(30)  # the interrupt ends the run before
        got.append("slept")

    got: list[str] = []
    try:
        with pytest.raises(KeyboardInterrupt):
            gosim.run(main, got)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert got == ["SIGINT"]


def test_notify_context_is_cancelled_by_the_first_signal(
    usr_handlers: tuple[Recorder, Recorder],
) -> None:
    async def main() -> tuple[Any, ...]:
        ctx, stop = gosignal.notify_context(context.background(), signal.SIGUSR1)
        before = ctx.err()
        signal.raise_signal(signal.SIGUSR1)
        done = ctx.done()
        assert done is not None
        await done.recv()
        cause = context.cause(ctx)
        stop()
        # Stopped before any signal: cancelled with Canceled as its cause.
        ctx2, stop2 = gosignal.notify_context(context.background(), signal.SIGUSR2)
        stop2()
        return before, ctx.err(), cause, context.cause(ctx2)

    before, err, cause, cause2 = gosim.run(main)
    assert before is None
    assert isinstance(err, context.Canceled)
    assert isinstance(cause, gosignal.SignalReceived)
    assert cause.signal == signal.SIGUSR1
    assert str(cause) == "signal received: SIGUSR1"
    assert isinstance(cause2, context.Canceled)


def test_ignore_reset_and_ignored(usr_handlers: tuple[Recorder, Recorder]) -> None:
    rec1, rec2 = usr_handlers

    async def main() -> list[Any]:
        ch = Chan[Sig](2)
        gosignal.notify(ch, signal.SIGUSR1, signal.SIGUSR2)
        seen: list[Any] = [gosignal.ignored(signal.SIGUSR1)]
        gosignal.ignore(signal.SIGUSR1)  # no longer relayed, and ignored
        seen += [gosignal.ignored(signal.SIGUSR1), signal.getsignal(signal.SIGUSR1)]
        signal.raise_signal(signal.SIGUSR1)
        gosignal.reset(signal.SIGUSR1)
        seen.append(signal.getsignal(signal.SIGUSR1) is rec1)
        gosignal.reset()  # every signal: SIGUSR2 has its handler back too
        seen.append(signal.getsignal(signal.SIGUSR2) is rec2)
        signal.raise_signal(signal.SIGUSR2)
        seen.append(ch.try_recv()[2])  # nothing was relayed
        return seen

    assert gosim.run(main) == [False, True, signal.SIG_IGN, True, True, False]
    assert rec1.got == []
    assert rec2.got == [signal.SIGUSR2]


def test_bad_arguments_are_refused() -> None:
    async def main() -> list[str]:
        errors = []
        for args in [
            (None, signal.SIGUSR1),
            (Chan[Sig](0), signal.SIGUSR1),
            (Chan[Sig](1),),
            (Chan[Sig](1), signal.SIGKILL),
            (Chan[Sig](1), 12345),
        ]:
            try:
                gosignal.notify(*args)  # type: ignore[arg-type]
            except ValueError as exc:
                errors.append(str(exc))
        return errors

    assert gosim.run(main) == [
        "notify using nil channel",
        "notify: the channel is unbuffered, so a signal that arrives while no goroutine "
        "receives would be dropped: give it a buffer (Chan(1) for one signal)",
        "notify: name the signals (every signal at once, as Go allows, is not supported)",
        "notify: SIGKILL cannot be caught or ignored",
        "notify: 12345 is not a valid signal number",
    ]


def test_outside_the_main_thread_notify_says_why_it_cannot() -> None:
    async def main() -> None:
        gosignal.notify(Chan[Sig](1), signal.SIGUSR1)

    failure: list[BaseException] = []

    def in_thread() -> None:
        try:
            gosim.run(main)
        except BaseException as exc:
            failure.append(exc)

    t = threading.Thread(target=in_thread, name="worker")
    t.start()
    t.join()
    assert len(failure) == 1
    assert isinstance(failure[0], RuntimeError)
    assert "OS signals are handled in the main thread only" in str(failure[0])
    assert "'worker'" in str(failure[0])


def test_a_channel_closed_while_notified_fails_the_run(
    usr_handlers: tuple[Recorder, Recorder],
) -> None:
    async def main() -> None:
        ch = Chan[Sig](1)
        gosignal.notify(ch, signal.SIGUSR1)
        ch.close()
        signal.raise_signal(signal.SIGUSR1)
        await gosim.time.sleep(30)

    with pytest.raises(gosim.SendOnClosedChannel, match="call stop"):
        gosim.run(main)


@pytest.mark.parametrize("mode", ["virtual_time", "seed"])
def test_a_simulation_takes_signals_from_inject_only(
    usr_handlers: tuple[Recorder, Recorder], mode: str
) -> None:
    """No OS handler is installed in a reproducible runtime (the process's own handler
    still gets a real signal); inject delivers; and waiting for a signal there is a
    deadlock, as nothing real can arrive."""
    rec1, _ = usr_handlers
    kwargs: dict[str, Any] = {"virtual_time": True} if mode == "virtual_time" else {"seed": 3}

    async def main(wait_forever: bool) -> list[Any]:
        ch = Chan[Sig](1)
        gosignal.notify(ch, signal.SIGUSR1)
        seen: list[Any] = [signal.getsignal(signal.SIGUSR1) is rec1]
        signal.raise_signal(signal.SIGUSR1)
        await gosim.time.sleep(0.01)
        seen.append(ch.try_recv()[2])
        gosignal.inject(signal.SIGUSR1)
        seen.append(await ch.recv())
        if wait_forever:
            await ch.recv()
        return seen

    assert gosim.run(main, False, **kwargs) == [True, False, signal.SIGUSR1]
    assert rec1.got == [signal.SIGUSR1]
    with pytest.raises(gosim.Deadlock, match=r"goroutine 1 \[chan receive\]"):
        gosim.run(main, True, **kwargs)


def test_once_stopped_a_signal_is_no_wake_source_any_more(
    usr_handlers: tuple[Recorder, Recorder],
) -> None:
    """While relayed, waiting for a signal is no deadlock (the child-process tests show
    it); stopped, a goroutine left waiting on the channel is one again."""

    async def main() -> None:
        ch = Chan[Sig](1)
        gosignal.notify(ch, signal.SIGUSR1, signal.SIGUSR2)
        gosignal.reset(signal.SIGUSR2)
        gosignal.stop(ch)
        await ch.recv()

    with pytest.raises(gosim.Deadlock, match=r"goroutine 1 \[chan receive\]"):
        gosim.run(main)


def test_an_open_runtime_relays_and_gives_the_handler_back_on_leaving(
    usr_handlers: tuple[Recorder, Recorder],
) -> None:
    import trio  # noqa: PLC0415 -- only this test drives the runtime from trio

    rec1, _ = usr_handlers

    async def wait_for_one() -> str:
        ch = Chan[Sig](1)
        gosignal.notify(ch, signal.SIGUSR1)
        signal.raise_signal(signal.SIGUSR1)
        sig = await ch.recv()
        assert sig is not None
        return sig.name

    async def trio_main() -> str:
        async with gosim.open_runtime() as rt:
            name = await rt.call(wait_for_one)
            assert signal.getsignal(signal.SIGUSR1) is not rec1  # still relaying
        return name

    assert trio.run(trio_main) == "SIGUSR1"
    assert signal.getsignal(signal.SIGUSR1) is rec1
    assert rec1.got == []


def test_a_real_time_signal_the_enum_does_not_name_arrives_as_its_number() -> None:
    rt_sig = signal.SIGRTMIN + 2
    assert rt_sig not in {s.value for s in signal.Signals}

    async def main() -> tuple[Any, str]:
        ch: Chan[Any] = Chan(1)
        gosignal.notify(ch, rt_sig)
        gosignal.inject(rt_sig)
        got = await ch.recv()
        ctx, stop = gosignal.notify_context(context.background(), rt_sig)
        gosignal.inject(rt_sig)
        cause = str(context.cause(ctx))
        stop()
        gosignal.stop(ch)
        return got, cause

    assert gosim.run(main) == (rt_sig, f"signal received: signal {rt_sig}")
    assert signal.getsignal(rt_sig) == signal.SIG_DFL


def test_a_busy_driver_relays_within_a_few_hundred_switches(
    usr_handlers: tuple[Recorder, Recorder],
) -> None:
    """Two goroutines ping-pong and the driver never idles: the signal is relayed by
    its periodic duties (every 256 switches), not only when it idles."""

    async def echo(ping: Chan[int], pong: Chan[int]) -> None:
        async for v in ping:
            await pong.send(v)

    async def main() -> int | None:
        ch = Chan[Sig](1)
        gosignal.notify(ch, signal.SIGUSR1)
        ping: Chan[int] = Chan()
        pong: Chan[int] = Chan()
        gosim.go(echo, ping, pong)
        signal.raise_signal(signal.SIGUSR1)
        for i in range(2000):  # two switches a round
            if ch.try_recv()[2]:
                ping.close()
                return i
            await ping.send(i)
            await pong.recv()
        ping.close()
        return None

    rounds = gosim.run(main, procs=1)
    assert rounds is not None
    assert rounds <= 256
