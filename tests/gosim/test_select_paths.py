"""``select`` on both paths: the C ``SelectOp`` (gosim/_speedups_select.c.h) and the pure-Python
reference (``gosim._select.py_select``) must choose the same cases, leave the same queue
states and raise the same errors; neither may leak a reference or a queued Sudog.

With the accelerator built, both implementations run in one process (the reference
drives the C channels through their Python-visible API, as the pure path does), so a
hypothesis property compares them on random programs; a subprocess run with
``GOSIM_PURE_PYTHON=1`` compares the C path with the whole pure-Python runtime.
"""

from __future__ import annotations

import gc
import json
import os
import random
import subprocess
import sys
import textwrap
import tracemalloc
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gosim
from gosim import Chan, go, lowlevel, select
from gosim import _select as sel
from gosim._core._accel import speedups
from gosim._core._exceptions import RuntimeInternalError

needs_speedups = pytest.mark.skipif(
    speedups is None,
    reason="gosim._speedups is not built here or GOSIM_PURE_PYTHON=1 turned it off",
)

# (select, recv, send) of each implementation present in this process.
IMPLS: dict[str, tuple[Any, Any, Any]] = {"py": (sel.py_select, sel.py_recv, sel.py_send)}
if speedups is not None:
    IMPLS["c"] = (speedups.select, speedups.recv, speedups.send)


def _queues(chans: list[Any]) -> list[tuple[int, int, int]]:
    return [(len(c), len(c._recvq), len(c._sendq)) for c in chans]


# ------------------------------------------------------------------------------------
# Random programs: goroutines doing selects (recv, send, nil cases, default) and plain
# operations on a few channels, one P, seeded. Every outcome and the final queue state
# are recorded; the C and the Python select must give the same record.

_OP = st.one_of(
    st.tuples(
        st.just("select"),
        st.lists(
            st.tuples(st.sampled_from(["recv", "send", "nil"]), st.integers(0, 2)),
            min_size=0,
            max_size=4,
        ),
        st.booleans(),
    ),
    st.tuples(st.just("send"), st.integers(0, 2), st.just(False)),
    st.tuples(st.just("recv"), st.integers(0, 2), st.just(False)),
    st.tuples(st.just("close"), st.integers(0, 2), st.just(False)),
    st.tuples(st.just("yield"), st.just(0), st.just(False)),
)
_PROGRAMS = st.tuples(
    st.lists(st.integers(0, 2), min_size=3, max_size=3),  # capacities
    st.lists(st.lists(_OP, min_size=1, max_size=6), min_size=1, max_size=4),  # goroutines
    st.integers(0, 2**32 - 1),  # seed
)


def _run_program(impl: str, caps: list[int], gs: list[list[Any]], seed: int) -> list[Any]:
    select, recv, send = IMPLS[impl]
    log: list[Any] = []

    async def worker(k: int, ops: list[Any], chans: list[Any]) -> None:
        for n, (what, arg, default) in enumerate(ops):
            try:
                if what == "select":
                    cases = [
                        recv(chans[c])
                        if kind == "recv"
                        else send(chans[c], (k, n))
                        if kind == "send"
                        else recv(None)
                        for kind, c in arg
                    ]
                    if not cases and not default:
                        continue  # select {} would block this goroutine for good
                    log.append((k, n, await select(*cases, default=default)))
                elif what == "send":
                    await chans[arg].send((k, n))
                elif what == "recv":
                    log.append((k, n, await chans[arg].recv2()))
                elif what == "close":
                    chans[arg].close()
                else:
                    await gosim.gosched()
            except gosim.ChanError as e:
                log.append((k, n, type(e).__name__))

    async def main() -> None:
        chans: list[Chan[Any]] = [Chan(c) for c in caps]
        for k, ops in enumerate(gs):
            go(worker, k, ops, chans)
        for _ in range(30):
            await gosim.gosched()
        log.append(("queues", _queues(chans)))
        log.append(("waiting", gosim.num_goroutine()))
        # Release the goroutines still parked: main returning closes their coroutines,
        # which takes their sudogs out of the queues on both paths.
        for c in chans:
            if not c.closed:
                c.close()
        for _ in range(10):
            await gosim.gosched()
        log.append(("after close", _queues(chans)))

    gosim.run(main, procs=1, seed=seed, virtual_time=True)
    record: list[Any] = json.loads(json.dumps(log, default=repr))
    return record


@needs_speedups
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_PROGRAMS)
def test_c_and_python_select_agree_on_random_programs(program: Any) -> None:
    caps, gs, seed = program
    assert _run_program("c", caps, gs, seed) == _run_program("py", caps, gs, seed)


_CROSS_MODE = textwrap.dedent(
    """
    import json, random, sys
    sys.path.insert(0, sys.argv[2])
    from test_select_paths import _run_program, IMPLS
    impl = "c" if "c" in IMPLS else "py"
    rnd = random.Random(int(sys.argv[1]))
    out = []
    for _ in range(20):
        caps = [rnd.randint(0, 2) for _ in range(3)]
        gs = []
        for _ in range(rnd.randint(1, 4)):
            ops = []
            for n in range(rnd.randint(1, 6)):
                what = rnd.choice(["select", "select", "send", "recv", "close", "yield"])
                if what == "select":
                    arg = [(rnd.choice(["recv", "send", "nil"]), rnd.randint(0, 2))
                           for _ in range(rnd.randint(0, 4))]
                    ops.append((what, arg, rnd.random() < 0.3))
                else:
                    ops.append((what, rnd.randint(0, 2), False))
            gs.append(ops)
        out.append(_run_program(impl, caps, gs, rnd.randint(0, 2**32 - 1)))
    print(json.dumps(out))
    """
)


def _cross_mode(pure: bool, seed: int) -> Any:
    env = dict(os.environ, GOSIM_PURE_PYTHON="1" if pure else "0")
    proc = subprocess.run(
        [sys.executable, "-c", _CROSS_MODE, str(seed), os.path.dirname(__file__)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@needs_speedups
@pytest.mark.parametrize("seed", [1, 2])
def test_the_c_select_and_the_pure_python_runtime_agree(seed: int) -> None:
    # The whole pure-Python runtime (Python channels, Python Sudog, Python driver)
    # against the C one on the same generated programs and seeds.
    assert _cross_mode(pure=False, seed=seed) == _cross_mode(pure=True, seed=seed)


# ------------------------------------------------------------------------------------
# Errors and the awaitable's protocol, on both implementations.


@pytest.mark.parametrize("impl", sorted(IMPLS))
def test_a_select_is_awaited_once(impl: str) -> None:
    select, recv, _ = IMPLS[impl]

    async def main() -> str:
        ch: Chan[int] = Chan(1)
        assert ch.try_send(1)
        op = select(recv(ch))
        assert await op == (0, 1, True)
        with pytest.raises(RuntimeError, match="cannot reuse already awaited"):
            await op
        return "ok"

    assert gosim.run(main, procs=1) == "ok"


@pytest.mark.parametrize("impl", sorted(IMPLS))
def test_a_select_never_awaited_warns_and_takes_nothing(impl: str) -> None:
    select, recv, _ = IMPLS[impl]
    ch: Chan[int] = Chan(1)
    assert ch.try_send(1)
    with pytest.warns(RuntimeWarning, match="never awaited"):
        op = select(recv(ch))
        del op
        gc.collect()
    assert ch.try_recv() == (1, True, True)


@pytest.mark.parametrize("impl", sorted(IMPLS))
def test_select_errors_are_the_same(impl: str) -> None:
    select, recv, send = IMPLS[impl]

    async def main() -> list[str]:
        out: list[str] = []
        closed: Chan[int] = Chan(0)
        closed.close()
        for cases in ([("x", closed, None)], [(0, "not a chan", None)], ["junk"], [(0, closed)]):
            try:
                await select(*cases)
            except TypeError as e:
                out.append(str(e))
        with pytest.raises(gosim.SendOnClosedChannel, match="send on closed channel"):
            await select(send(closed, 1))
        with pytest.raises(TypeError, match="recv case needs a Chan or None, got int"):
            recv(3)
        with pytest.raises(TypeError, match="send case needs a Chan or None, got str"):
            send("x", 1)
        with pytest.raises(TypeError):
            await select(default=True, other=1)
        # a bad case after a ready one in poll order is not looked at: (0, 1) first...
        assert await select(recv(closed), recv(None)) == (0, None, False)
        return out

    assert gosim.run(main, procs=1) == [sel._BAD_CASE] * 4


@pytest.mark.parametrize("impl", sorted(IMPLS))
def test_a_select_that_would_block_outside_a_goroutine_says_so(impl: str) -> None:
    select, recv, send = IMPLS[impl]
    ch: Chan[int] = Chan(1)
    op = select(recv(ch))
    with pytest.raises(gosim.NotInRuntime, match="select would block"):
        op.send(None)
    assert ch.try_send(5)
    op = select(recv(ch), send(None, 1))
    with pytest.raises(StopIteration) as stop:
        op.send(None)  # ready: completes without a runtime (the order from random.random)
    assert stop.value.value == (0, 5, True)
    op = select(recv(ch), default=True)
    with pytest.raises(StopIteration) as stop:
        op.send(None)
    assert stop.value.value == (-1, None, False)


@pytest.mark.parametrize("impl", sorted(IMPLS))
def test_a_select_woken_without_a_case_that_fired_throws(impl: str) -> None:
    # Only a broken runtime (or a caller driving the coroutine by hand) does this; it
    # must not return garbage, and the sudogs must leave the queues.
    select, recv, _ = IMPLS[impl]

    async def main() -> list[Any]:
        a: Chan[int] = Chan(0)
        b: Chan[int] = Chan(0)
        box: list[Any] = []
        out: list[Any] = []

        async def waiter() -> None:
            box.append(lowlevel.current_g())
            try:
                await select(recv(a), recv(b))
            except RuntimeInternalError as e:
                out.append(str(e))

        go(waiter)
        await gosim.gosched()
        g = box[0]
        rt = lowlevel.current_runtime()
        me, rt.curg = rt.curg, g
        try:
            with pytest.raises(StopIteration):
                g.coro.send("not a sudog")
        finally:
            rt.curg = me
        out.append(_queues([a, b]))
        out.append(g.goid)
        return out

    out = gosim.run(main, procs=1)
    assert out[0] == f"select: goroutine {out[2]} woken without a case that fired"
    assert out[1] == [(0, 0, 0), (0, 0, 0)]


@pytest.mark.parametrize("impl", sorted(IMPLS))
@pytest.mark.parametrize("cases", [0, 1])
def test_a_select_that_blocks_forever_woken_by_hand_throws(impl: str, cases: int) -> None:
    select, recv, _ = IMPLS[impl]

    async def main() -> tuple[list[str], int, str]:
        box: list[Any] = []
        out: list[str] = []

        async def waiter() -> None:
            box.append(lowlevel.current_g())
            try:
                await select(*[recv(None)] * cases)
            except RuntimeInternalError as e:
                out.append(str(e))

        go(waiter)
        await gosim.gosched()
        g = box[0]
        goid, reason = g.goid, g.waitreason
        rt = lowlevel.current_runtime()
        me, rt.curg = rt.curg, g
        try:
            with pytest.raises(StopIteration):
                g.coro.send(None)
        finally:
            rt.curg = me
        return out, goid, reason

    out, goid, reason = gosim.run(main, procs=1)
    assert out == [f"select: goroutine {goid} woken from a select that blocks forever"]
    assert reason == ("select" if cases else "select (no cases)")


# ------------------------------------------------------------------------------------
# Sudogs: visible from Python while parked, gone from every queue however the select
# ends (fired, exception thrown in, coroutine closed).


@pytest.mark.parametrize("impl", sorted(IMPLS))
@pytest.mark.parametrize("ending", ["fired", "thrown", "closed"])
def test_a_parked_selects_sudogs_leave_every_queue(impl: str, ending: str) -> None:
    select, recv, send = IMPLS[impl]

    async def main() -> Any:
        a: Chan[int] = Chan(0)
        b: Chan[Any] = Chan(0)
        c: Chan[int] = Chan(0)
        box: list[Any] = []
        got: list[Any] = []

        async def waiter() -> None:
            box.append(lowlevel.current_g())
            try:
                got.append(await select(recv(a), send(b, "v"), recv(None), recv(c)))
            except KeyError:
                got.append("thrown")

        go(waiter)
        await gosim.gosched()
        g = box[0]
        sgs = [a._recvq[0], b._sendq[0], c._recvq[0]]
        seen = [
            (s.issel, s.g is g, s.ch is ch, s.caseidx, s.elem, s.ok)
            for s, ch in zip(sgs, (a, b, c), strict=True)
        ]
        assert g.waitreason == "select"
        if ending == "fired":
            assert b.try_recv() == ("v", True, True)
            await gosim.gosched()
        elif ending == "thrown":
            rt = lowlevel.current_runtime()
            me, rt.curg = rt.curg, g
            try:
                with pytest.raises(StopIteration):
                    g.coro.throw(KeyError("x"))
            finally:
                rt.curg = me
        else:
            g.coro.close()
        assert g.selectdone is False
        return seen, got, _queues([a, b, c])

    seen, got, queues = gosim.run(main, procs=1)
    assert seen == [
        (True, True, True, 0, None, True),
        (True, True, True, 1, "v", True),
        (True, True, True, 3, None, True),
    ]
    assert got == {"fired": [(1, None, True)], "thrown": ["thrown"], "closed": []}[ending]
    assert queues == [(0, 0, 0)] * 3


@pytest.mark.parametrize("impl", sorted(IMPLS))
def test_a_send_case_woken_by_close_raises(impl: str) -> None:
    select, recv, send = IMPLS[impl]

    async def main() -> list[Any]:
        a: Chan[int] = Chan(0)
        other: Chan[int] = Chan(0)
        out: list[Any] = []

        async def waiter() -> None:
            try:
                await select(send(a, 1), recv(other))
            except gosim.SendOnClosedChannel as e:
                out.append(str(e))

        go(waiter)
        await gosim.gosched()
        a.close()
        await gosim.gosched()
        out.append(_queues([a, other]))
        return out

    assert gosim.run(main, procs=1) == ["send on closed channel", [(0, 0, 0), (0, 0, 0)]]


# ------------------------------------------------------------------------------------
# No leaks: many selects, parked and immediate, leave every refcount where it was and
# the traced memory flat.


@pytest.mark.parametrize("impl", sorted(IMPLS))
def test_many_selects_leak_no_reference_and_no_memory(impl: str) -> None:
    select, recv, send = IMPLS[impl]
    sentinel = object()

    async def rounds(n: int, a: Any, b: Any, out: Any) -> None:
        async def feed(ch: Any) -> None:
            for _ in range(n):
                await ch.send(sentinel)

        go(feed, a)
        go(feed, b)
        idle: Chan[Any] = Chan(0)  # nobody sends on it: its case never fires
        for _ in range(2 * n):
            _, v, ok = await select(recv(a), recv(b), recv(None))
            assert v is sentinel and ok
            # a send case parked, then taken; a default that fires
            await select(send(out, sentinel), recv(None))
            assert await select(recv(idle), default=True) == (-1, None, False)

    def run(n: int, a: Any, b: Any, out: Any) -> None:
        async def main() -> None:
            async def drain() -> None:
                for _ in range(2 * n):
                    assert await out.recv() is sentinel

            go(drain)
            await rounds(n, a, b, out)

        gosim.run(main, procs=1)

    a: Chan[Any] = Chan(0)
    b: Chan[Any] = Chan(0)
    out: Chan[Any] = Chan(0)
    run(200, a, b, out)  # warm the free lists and caches
    gc.collect()
    before = [sys.getrefcount(x) for x in (a, b, out, sentinel)]
    tracemalloc.start()
    try:
        run(200, a, b, out)
        gc.collect()
        first, _ = tracemalloc.get_traced_memory()
        run(2000, a, b, out)
        gc.collect()
        second, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert [sys.getrefcount(x) for x in (a, b, out, sentinel)] == before
    assert _queues([a, b, out]) == [(0, 0, 0)] * 3
    # 10x the selects: anything kept per select would show as hundreds of kilobytes.
    assert second - first < 64 * 1024, (first, second)


class _FixedRandom(random.Random):
    """An rng whose random() always gives one value: the poll order is then known."""

    def __init__(self, value: float) -> None:
        super().__init__(0)
        self.value = value

    def random(self) -> float:
        return self.value


@pytest.mark.parametrize("impl", sorted(IMPLS))
@pytest.mark.parametrize(("draw", "first"), [(0.1, 0), (0.9, 1)])
def test_the_poll_order_is_drawn_from_the_runtimes_rng(impl: str, draw: float, first: int) -> None:
    select, recv, _ = IMPLS[impl]

    async def main() -> Any:
        lowlevel.current_runtime().rng = _FixedRandom(draw)
        a: Chan[str] = Chan(1)
        b: Chan[str] = Chan(1)
        assert a.try_send("a") and b.try_send("b")
        return await select(recv(a), recv(b))

    assert gosim.run(main, procs=1) == (first, "ab"[first], True)


@needs_speedups
def test_an_rng_out_of_range_is_refused_not_obeyed() -> None:
    async def main() -> None:
        lowlevel.current_runtime().rng = _FixedRandom(1.0)
        chans: list[Chan[int]] = [Chan(1) for _ in range(3)]
        with pytest.raises(ValueError, match=r"outside \[0, 1\)"):
            await select(*(gosim.recv(c) for c in chans))

    gosim.run(main, procs=1)
