"""The runtime's contract: run, go, deadlock and panic reports, goexit, main return,
syscalls, trio calls, open_runtime, gomaxprocs, stats and schedtrace."""

from __future__ import annotations

import gc
import io
import json
import threading
import time

import pytest
import trio

import gosim
import gosim.lowlevel
from gosim import Chan, go, recv, select


def test_run_returns_main_result_and_passes_args() -> None:
    async def main(a: int, b: int) -> int:
        return a + b

    assert gosim.run(main, 2, 3, procs=1) == 5


def test_goroutine_only_calls_outside_runtime_raise() -> None:
    async def f() -> None:
        pass

    with pytest.raises(gosim.NotInRuntime):
        go(f)
    with pytest.raises(gosim.NotInRuntime):
        gosim.statistics()
    with pytest.raises(gosim.NotInRuntime):
        gosim.goid()


def test_go_rejects_plain_functions() -> None:
    def not_async() -> None:
        pass

    async def main() -> str:
        with pytest.raises(TypeError, match="must be an async function"):
            go(not_async)  # type: ignore[arg-type]
        return "ok"

    assert gosim.run(main, procs=1) == "ok"


def test_goid_and_num_goroutine() -> None:
    async def main() -> tuple[int, int, int]:
        ch: Chan[int] = Chan()

        async def child() -> None:
            await ch.send(gosim.goid())

        go(child)
        child_id = await ch.recv()
        assert child_id is not None
        before = gosim.num_goroutine()
        return gosim.goid(), child_id, before

    assert gosim.run(main, procs=1) == (1, 2, 1)


@pytest.mark.parametrize("procs", [1, 3])
def test_deadlock_reports_go_message_and_wait_reasons(procs: int) -> None:
    async def sender(ch: Chan[int]) -> None:
        await ch.send(1)
        await ch.send(2)  # nobody receives the second value

    async def selector() -> None:
        await select(recv(Chan()), recv(Chan()))

    async def nothing() -> None:
        await select()

    async def main() -> None:
        ch: Chan[int] = Chan()
        go(sender, ch)
        go(selector)
        go(nothing)
        await ch.recv()
        await Chan[int]().recv()

    with pytest.raises(gosim.Deadlock) as info:
        gosim.run(main, procs=procs)
    msg = str(info.value)
    assert msg.startswith("all goroutines are asleep - deadlock!\n\n")
    assert "goroutine 1 [chan receive]:" in msg
    assert "goroutine 2 [chan send]:" in msg
    assert "goroutine 3 [select]:" in msg
    assert "goroutine 4 [select (no cases)]:" in msg
    assert "test_runtime.test_deadlock_reports_go_message_and_wait_reasons.<locals>.sender" in msg
    assert info.value.dump.startswith("goroutine 1 [chan receive]:")


def test_sleeping_is_not_a_deadlock() -> None:
    async def main() -> str:
        await gosim.sleep(0.01)
        return "woke"

    assert gosim.run(main, procs=1) == "woke"


def test_panic_stops_runtime_names_goroutine_and_runs_finally_blocks() -> None:
    cleaned: list[str] = []

    async def bystander(ch: Chan[int]) -> None:
        try:
            await ch.recv()
        finally:
            cleaned.append("bystander")

    async def bad() -> None:
        raise ValueError("boom")

    async def main() -> None:
        go(bystander, Chan[int]())
        await gosim.sleep(0.001)  # the bystander parks in its receive
        go(bad)
        await gosim.sleep(10)
        raise AssertionError("main must not resume after a panic")

    with pytest.raises(ValueError) as info:  # the exception itself, not a wrapper
        gosim.run(main, procs=2)
    assert str(info.value) == "boom"
    (report,) = info.value.__notes__  # Go's crash report, as a note
    assert report.startswith("panic: boom\n")  # Go prints the error's message
    assert "goroutine 3 [running]:" in report
    assert "created by tests.gosim.test_runtime." in report
    assert report.endswith(" in goroutine 1")
    assert gosim.lowlevel.panic_report(info.value) == report
    assert cleaned == ["bystander"]


def test_channel_misuse_in_a_goroutine_is_a_panic() -> None:
    async def main() -> None:
        ch: Chan[int] = Chan(1)
        ch.close()
        await ch.send(1)

    with pytest.raises(gosim.SendOnClosedChannel) as info:
        gosim.run(main, procs=1)
    assert str(info.value) == "send on closed channel"
    assert info.value.__notes__[0].startswith("panic: send on closed channel\n\ngoroutine 1 ")


def test_main_return_closes_other_goroutines() -> None:
    log: list[str] = []

    async def worker(ch: Chan[int]) -> None:
        try:
            while True:
                await ch.recv()
                log.append("got")
        finally:
            log.append("closed")

    async def main() -> int:
        ch: Chan[int] = Chan()
        go(worker, ch)
        await ch.send(1)
        return gosim.num_goroutine()

    assert gosim.run(main, procs=1) == 2
    assert log == ["got", "closed"]


def test_goexit_runs_finally_and_main_goexit_ends_in_go_deadlock_message() -> None:
    log: list[str] = []

    async def quitter() -> None:
        try:
            gosim.goexit()
        finally:
            log.append("quitter finally")

    async def main() -> None:
        go(quitter)
        await gosim.sleep(0.001)
        try:
            gosim.goexit()
        finally:
            log.append("main finally")

    with pytest.raises(
        gosim.Deadlock, match=r"^no goroutines \(main called runtime.Goexit\) - deadlock!$"
    ):
        gosim.run(main, procs=1)
    assert log == ["quitter finally", "main finally"]


def test_hundred_thousand_goroutines_park_at_once_and_all_release() -> None:
    n = 100_000

    async def waiter(gate: Chan[None], done: Chan[int]) -> None:
        await gate.recv()
        await done.send(1)

    async def main() -> tuple[int, int, int]:
        gate: Chan[None] = Chan()
        done: Chan[int] = Chan(n)
        for _ in range(n):
            go(waiter, gate, done)
        while done.len() == 0 and gosim.num_goroutine() < n + 1:
            await gosim.gosched()
        await gosim.sleep(0.001)  # let every waiter reach its receive
        parked = gosim.num_goroutine()
        gate.close()  # releases every parked receiver at once
        total = 0
        for _ in range(n):
            total += await done.recv() or 0
        await gosim.sleep(0.001)
        return parked, total, gosim.num_goroutine()

    parked, total, remaining = gosim.run(main, procs=2)
    assert parked == n + 1
    assert total == n
    assert remaining == 1


def test_blocking_syscall_does_not_stop_other_goroutines() -> None:
    # The syscall blocks its OS thread until another goroutine has run and set the
    # event: if the syscall stopped the scheduler, the wait would time out.
    ran = threading.Event()

    async def other() -> None:
        for _ in range(10):
            await gosim.gosched()
        ran.set()

    async def main() -> tuple[bool, int, int]:
        go(other)
        ok = await gosim.syscall(ran.wait, 30)
        s = gosim.statistics()
        return ok, s.syscalls, s.handoffs

    ok, syscalls, handoffs = gosim.run(main, procs=1)
    assert ok is True
    assert syscalls == 1
    assert handoffs == 1


def test_syscall_errors_propagate_to_the_caller() -> None:
    def fails() -> None:
        raise OSError("disk on fire")

    async def main() -> str:
        with pytest.raises(OSError, match="disk on fire"):
            await gosim.syscall(fails)
        return "handled"

    assert gosim.run(main, procs=1) == "handled"


def test_virtual_time_stands_still_while_a_syscall_runs() -> None:
    """Virtual time without a seed: syscalls run on threads for real time, and the clock
    must not jump past one that is running (Go's synctest: a goroutine in a syscall is
    not durably blocked). Two overlapping syscalls hold it until the last returns; then
    timers fire at their virtual times, and a user's MockClock gets its autojump back."""
    returned: list[float] = []

    async def call(seconds: float) -> None:
        await gosim.syscall(time.sleep, seconds)
        returned.append(gosim.now())

    async def main() -> tuple[list[float], float]:
        t0 = gosim.now()
        go(call, 0.2)
        go(call, 0.3)
        await gosim.sleep(1.0)
        return [t - t0 for t in returned], gosim.now() - t0

    at, slept = gosim.run(main, procs=2, virtual_time=True)
    assert at == [0.0, 0.0]  # no virtual time passed while they ran
    assert slept == 1.0

    async def under_trio() -> float:
        from trio.testing import MockClock  # noqa: PLC0415

        clock = trio.lowlevel.current_clock()
        assert isinstance(clock, MockClock)
        async with gosim.open_runtime(procs=1) as rt:
            await rt.call(gosim.syscall, time.sleep, 0.05)
        assert clock.autojump_threshold == 0.5
        return clock.autojump_threshold

    from trio.testing import MockClock  # noqa: PLC0415

    assert trio.run(under_trio, clock=MockClock(autojump_threshold=0.5)) == 0.5


def test_trio_call_runs_trio_code_and_returns_its_result() -> None:
    async def trio_side(x: int) -> int:
        await trio.sleep(0.001)
        return x * 2

    async def trio_fails() -> None:
        await trio.sleep(0)
        raise KeyError("nope")

    async def main() -> int:
        with pytest.raises(KeyError):
            await gosim.trio_call(trio_fails)
        return await gosim.trio_call(trio_side, 21)

    assert gosim.run(main, procs=2) == 42


def test_awaiting_trio_directly_in_a_goroutine_is_a_clear_error() -> None:
    async def main() -> None:
        await trio.sleep(0)

    with pytest.raises(TypeError, match=r"gosim\.trio_call"):
        gosim.run(main, procs=1)


def test_open_runtime_calls_from_trio() -> None:
    async def double(x: int) -> int:
        ch: Chan[int] = Chan()

        async def helper() -> None:
            await ch.send(x * 2)

        go(helper)
        v = await ch.recv()
        assert v is not None
        return v

    async def fails() -> None:
        raise LookupError("from the goroutine")

    async def trio_main() -> list[int]:
        async with gosim.open_runtime(procs=2) as rt:
            with pytest.raises(LookupError):
                await rt.call(fails)
            results: list[int] = []

            async def one(i: int) -> None:
                results.append(await rt.call(double, i))

            async with trio.open_nursery() as nursery:
                for i in range(20):
                    nursery.start_soon(one, i)
            return sorted(results)

    assert trio.run(trio_main) == [2 * i for i in range(20)]


def test_open_runtime_panic_is_raised_from_the_call() -> None:
    async def bad() -> None:
        raise RuntimeError("inner")

    async def caller() -> None:
        go(bad)
        await gosim.sleep(1)

    async def trio_main() -> None:
        async with gosim.open_runtime(procs=1) as rt:
            await rt.call(caller)

    with pytest.raises(RuntimeError) as info:
        trio.run(trio_main)
    assert str(info.value) == "inner"
    assert "[running]:\ntests.gosim.test_runtime." in info.value.__notes__[0]


def test_gomaxprocs_resizes_and_keeps_work() -> None:
    async def main() -> tuple[int, int, int, int]:
        done: Chan[int] = Chan(100)

        async def work(i: int) -> None:
            await gosim.gosched()
            await done.send(i)

        for i in range(100):
            go(work, i)
        before = gosim.gomaxprocs(4)
        during = gosim.statistics().procs
        shrunk_from = gosim.gomaxprocs(1)
        total = 0
        for _ in range(100):
            total += await done.recv() or 0
        return before, during, shrunk_from, total

    assert gosim.run(main, procs=2) == (2, 4, 4, sum(range(100)))


def test_gomaxprocs_rejects_bad_values() -> None:
    async def main() -> int:
        with pytest.raises(ValueError):
            gosim.gomaxprocs(-1)
        return gosim.gomaxprocs()

    assert gosim.run(main, procs=3) == 3
    with pytest.raises(ValueError):
        gosim.run(main, procs=0)


def test_stats_counts_creation_switches_and_steals() -> None:
    async def main() -> gosim.SchedStatistics:
        done: Chan[None] = Chan(1000)

        async def work() -> None:
            for _ in range(3):
                await gosim.gosched()
            await done.send(None)

        for _ in range(1000):
            go(work)
        for _ in range(1000):
            await done.recv()

        # 200 more that never touch the global queue: they sit in this P's local queue
        # (it holds 256), so the idle Ps can only get work by stealing half of it.
        async def signal() -> None:
            await done.send(None)

        for _ in range(200):
            go(signal)
        for _ in range(200):
            await done.recv()
        return gosim.statistics()

    s = gosim.run(main, procs=4, seed=7, virtual_time=True)
    assert s.created == 1201
    assert s.procs == 4 and len(s.local_runq) == 4
    assert s.context_switches >= 4 * 1000
    assert s.steals > 0 and s.goroutines_stolen >= s.steals
    with pytest.raises(AttributeError):
        s.created = 0  # type: ignore[misc]


def test_tight_loop_of_ready_operations_is_preempted() -> None:
    # Deterministic mode counts operations: 50,000 default-selects make several slices.
    async def spinner(stop: Chan[None], done: Chan[None]) -> None:
        for _ in range(50_000):
            i, _, _ = await select(recv(stop), default=True)
            if i == 0:
                return
        await done.send(None)

    async def main() -> int:
        done: Chan[None] = Chan()
        go(spinner, Chan[None](), done)
        await done.recv()
        return gosim.statistics().preemptions

    assert gosim.run(main, procs=1, seed=1, virtual_time=True) >= 4


def test_schedtrace_prints_go_sched_line() -> None:
    out = io.StringIO()

    async def main() -> None:
        gosim.schedtrace(0.5, file=out)
        await gosim.sleep(1.2)
        gosim.schedtrace(None)

    gosim.run(main, procs=2, seed=3, virtual_time=True)
    lines = out.getvalue().splitlines()
    assert len(lines) == 3  # at 0 ms, 500 ms and 1000 ms
    assert lines[0].startswith("SCHED 0ms: gomaxprocs=2 idleprocs=")
    assert lines[1].startswith("SCHED 500ms: ")
    assert "runqueue=0 [" in lines[2]


def test_trace_exports_chrome_json_with_a_track_per_goroutine_named_by_its_function() -> None:
    trace = gosim.Trace(process="ping-pong", pid=7)

    async def pinger(ch: Chan[int]) -> None:
        for i in range(3):
            await ch.send(i)

    async def main() -> None:
        ch: Chan[int] = Chan()
        go(pinger, ch)
        for _ in range(3):
            await ch.recv()

    gosim.run(main, procs=2, seed=1, virtual_time=True, trace=trace)
    kinds = {e[2] for e in trace.events}
    assert {"go", "run", "park", "ready", "exit"} <= kinds
    events = json.loads(trace.to_chrome_json())["traceEvents"]
    assert {e["pid"] for e in events} == {7}
    meta = [e for e in events if e["ph"] == "M"]
    assert [e["args"]["name"] for e in meta if e["name"] == "process_name"] == ["ping-pong"]
    tracks = {e["tid"]: e["args"]["name"] for e in meta if e["name"] == "thread_name"}
    test = "test_trace_exports_chrome_json_with_a_track_per_goroutine_named_by_its_function"
    here = f"{__name__}.{test}.<locals>"
    assert tracks == {1: f"G1 {here}.main", 2: f"G2 {here}.pinger"}
    slices = [e for e in events if e["ph"] == "X"]
    # Each goroutine's runs on its own track, labelled with its function and the P.
    assert {(e["tid"], e["name"]) for e in slices} == {
        (1, f"{here[len(__name__) + 1 :]}.main"),
        (2, f"{here[len(__name__) + 1 :]}.pinger"),
    }
    assert all(e["args"]["p"] in (0, 1) and e["dur"] > 0 for e in slices)
    assert sum(1 for e in slices if e["tid"] == 2) >= 2  # parked on a send, then exited
    # Times are the virtual clock's: the same seed exports the same bytes.
    again = gosim.Trace(process="ping-pong", pid=7)
    gosim.run(main, procs=2, seed=1, virtual_time=True, trace=again)
    assert again.to_chrome_json() == trace.to_chrome_json()


def test_traces_of_several_processes_merge_into_one_perfetto_file() -> None:
    async def main() -> None:
        await gosim.sleep(0.001)

    docs = []
    for pid, name in ((100, "server"), (200, "client 0")):
        trace = gosim.Trace(process=name, pid=pid, wall_clock=True)
        before = time.time()
        gosim.run(main, procs=1, trace=trace)
        after = time.time()
        events = trace.to_chrome_events()
        assert all(before * 1e6 - 1e6 <= e["ts"] <= after * 1e6 + 1e6 for e in events if "ts" in e)
        docs.append(trace.to_chrome_json())
    merged = json.loads(gosim.Trace.merge_chrome_json(docs))["traceEvents"]
    processes = {e["pid"]: e["args"]["name"] for e in merged if e["name"] == "process_name"}
    assert processes == {100: "server", 200: "client 0"}
    assert {e["pid"] for e in merged if e["ph"] == "X"} == {100, 200}


def test_virtual_time_makes_an_hour_of_sleep_instant() -> None:
    async def main() -> float:
        start = gosim.now()
        await gosim.sleep(3600)
        return gosim.now() - start

    t0 = time.perf_counter()
    assert gosim.run(main, procs=1, virtual_time=True) == pytest.approx(3600)
    assert time.perf_counter() - t0 < 30  # not a timing assertion: an hour would hang


def test_run_paces_the_young_gc_and_restores_it() -> None:
    before = gc.get_threshold()

    async def main() -> tuple[int, ...]:
        return gc.get_threshold()

    during = gosim.run(main, procs=1)
    assert during[0] == max(before[0], 10_000)
    assert gc.get_threshold() == before
    assert gosim.run(main, procs=1, gc_young_threshold=None) == before


def test_runtimes_in_several_threads_do_not_see_each_other() -> None:
    # The scheduler a goroutine's channel operations reach is per OS thread.
    results: dict[int, int] = {}

    def one(k: int) -> None:
        async def main() -> int:
            a: Chan[int] = Chan()
            b: Chan[int] = Chan()

            async def pong() -> None:
                async for v in a:
                    await b.send(v + 1)

            go(pong)
            total = 0
            for i in range(5_000):
                await a.send(i)
                total += await b.recv() or 0
            return total

        results[k] = gosim.run(main, procs=2)

    threads = [threading.Thread(target=one, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert results == {k: sum(range(1, 5_001)) for k in range(4)}


def test_new_goroutine_runs_on_an_idle_p_soon_after_its_creator_blocks() -> None:
    # Go's newproc calls wakep: an idle P picks the new goroutine up while two others
    # keep the creator's P busy passing values through runnext.
    async def main() -> int:
        ran: list[int] = []
        ping: Chan[int] = Chan()
        pong: Chan[int] = Chan()

        async def echo() -> None:
            async for v in ping:
                await pong.send(v)

        async def marker() -> None:
            ran.append(1)

        go(echo)
        await ping.send(0)
        await pong.recv()
        go(marker)
        for i in range(40):
            await ping.send(i)
            await pong.recv()
            if ran:
                return i
        return -1

    assert gosim.run(main, procs=2, seed=11, virtual_time=True) in (0, 1)


def test_a_goroutine_returning_from_a_syscall_goes_back_to_its_idle_p() -> None:
    # Go's exitsyscall: reacquire the old P when it is idle, rather than the global queue.
    def syscall_then_run_ps(seed: int) -> tuple[int, int]:
        trace = gosim.Trace()

        async def main() -> None:
            await gosim.syscall(time.sleep, 0.01)

        gosim.run(main, procs=4, seed=seed, trace=trace)
        mine = [(e[2], e[3]) for e in trace.events if e[4] == 1 and e[2] in ("syscall", "run")]
        i = next(k for k, (kind, _) in enumerate(mine) if kind == "syscall")
        return mine[i][1], mine[i + 1][1]

    for seed in range(5):
        before, after = syscall_then_run_ps(seed)
        assert after == before


def test_a_runtime_var_holds_one_value_per_runtime() -> None:
    var: gosim.lowlevel.RuntimeVar[list[int]] = gosim.lowlevel.RuntimeVar("test.var")

    async def main(n: int) -> tuple[list[int] | None, list[int] | None]:
        before = var.get()
        var.set([n])

        async def child(done: Chan[list[int] | None]) -> None:
            await done.send(var.get())  # every goroutine of the runtime sees it

        done: Chan[list[int] | None] = Chan()
        go(child, done)
        return before, await done.recv()

    assert gosim.run(main, 1) == (None, [1])
    assert gosim.run(main, 2) == (None, [2])  # a new runtime starts without it
    with pytest.raises(gosim.NotInRuntime):
        var.get()
    assert repr(var) == "<RuntimeVar name='test.var'>"


def test_the_runtime_keeps_few_enough_instance_attributes_for_a_shared_key_dict() -> None:
    """CPython 3.11 stops sharing an instance dict's keys past 30 attributes, and every
    read of a runtime field then becomes a hashed lookup (the pure-Python scheduler paid
    2-5% for it): hot fields are slots, and the rest must stay few."""

    async def main() -> int:
        return len(vars(gosim.lowlevel.current_runtime()))

    assert gosim.run(main) <= 30


def test_an_exception_from_a_goroutine_arrives_as_itself() -> None:
    err = ValueError("from a goroutine")

    async def worker() -> None:
        raise err

    async def main() -> None:
        go(worker)
        await gosim.sleep(1)

    with pytest.raises(ValueError) as info:
        gosim.run(main, procs=1)
    assert info.value is err  # the same object, not a copy or a wrapper
    (report,) = err.__notes__
    assert report.startswith("panic: from a goroutine\n\ngoroutine 2 [running]:\n")


def test_panic_with_a_value_raises_panic_carrying_it() -> None:
    async def main() -> None:
        gosim.panic("text")

    with pytest.raises(gosim.Panic) as info:
        gosim.run(main, procs=1)
    assert info.value.value == "text"
    assert info.value.goid == 1
    assert str(info.value) == "text"
    assert info.value.__notes__ == [
        "panic: text\n\ngoroutine 1 [running]:\n"
        + (
            "tests.gosim.test_runtime.test_panic_with_a_value_raises_panic_carrying_it.<locals>.main(...)"
        )
    ]


def test_panic_with_an_exception_raises_it_and_can_be_recovered() -> None:
    async def main() -> tuple[object, str]:
        try:
            gosim.panic(42)
        except gosim.Panic as p:  # Go: a deferred recover() returns the value
            recovered = p.value
        try:
            gosim.panic(KeyError("k"))
        except KeyError as exc:
            return recovered, str(exc)
        raise AssertionError("panic returned")

    assert gosim.run(main, procs=1) == (42, "'k'")
    with pytest.raises(gosim.Panic) as info:
        gosim.panic("outside")  # outside a goroutine, as Go's panic anywhere
    assert info.value.goid is None
