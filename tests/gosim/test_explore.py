"""Schedule exploration (gosim.testing): the catalogue of seeded bugs is found, shrunk and
replayed to the same failure; a correct program is never failed; the chooser hook keeps
the runtime's guarantees.

The programs are in ``explore_programs.py`` (importable, for the replay command).
Every buggy one passes under Go's order, which an exploration's first run takes, so a
find here is the exploration's.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st

import gosim
from gosim import lowlevel
from gosim.testing import (
    InvariantFailed,
    Plan,
    ScheduleFailure,
    check,
    explore,
    explored,
    replay,
    run_plan,
)
from gosim.testing._pct import PCT, Replay

from . import explore_programs as ep
from . import trio_programs as tp

ROOT = Path(__file__).resolve().parents[2]

# name, invariant, the failure's kind, its exception's type (for a panic, the exception
# that escaped the goroutine: gosim.run raises it as itself)
CATALOGUE: list[tuple[str, Callable[[Any], object] | None, str, type[BaseException]]] = [
    ("lost_update", ep.two_increments, "invariant", InvariantFailed),
    ("check_then_act", None, "panic", AssertionError),
    ("lock_order", None, "deadlock", gosim.Deadlock),
    ("missed_wakeup", None, "deadlock", gosim.Deadlock),
    ("send_on_closed", None, "panic", gosim.SendOnClosedChannel),
    ("lease_takeover", ep.one_writer, "invariant", InvariantFailed),
]
RUNS = 60  # the bound: each bug is found within it for exploration seed 1
# Seed 1's run that failed, and the shrunk plan's decisions of the failing run's, per
# scheduler: the figures of the guide's catalogue (docs/guides/find-the-schedule.md).
SEED1: dict[tuple[str, str], tuple[int, int, int]] = {
    ("lost_update", "pct"): (14, 1, 11),
    ("lost_update", "random"): (3, 1, 9),
    ("check_then_act", "pct"): (14, 1, 11),
    ("check_then_act", "random"): (3, 1, 9),
    ("lock_order", "pct"): (14, 1, 11),
    ("lock_order", "random"): (3, 1, 9),
    ("missed_wakeup", "pct"): (5, 1, 10),
    ("missed_wakeup", "random"): (2, 1, 13),
    ("send_on_closed", "pct"): (5, 1, 9),
    ("send_on_closed", "random"): (2, 1, 2),
    ("lease_takeover", "pct"): (2, 1, 11),
    ("lease_takeover", "random"): (5, 1, 8),
}


@pytest.mark.parametrize("scheduler", ["pct", "random"])
@pytest.mark.parametrize(
    ("name", "invariant", "kind", "error"), CATALOGUE, ids=[c[0] for c in CATALOGUE]
)
def test_a_seeded_bug_is_found_shrunk_and_replayed(
    name: str,
    invariant: Callable[[Any], object] | None,
    kind: str,
    error: type[BaseException],
    scheduler: str,
) -> None:
    program = getattr(ep, name)
    assert run_plan(program, Plan(), invariant).failure is None  # Go's order passes

    result = explore(program, runs=RUNS, seed=1, scheduler=scheduler, invariant=invariant)  # type: ignore[arg-type]

    found = result.found
    assert found is not None, f"{name} not found in {RUNS} runs of {scheduler}"
    assert 1 < found.run == result.runs <= RUNS
    assert found.failure.kind == kind
    assert found.plan.decisions <= found.original.decisions
    assert 1 <= found.plan.decisions <= 20
    assert (found.run, found.plan.decisions, found.original.decisions) == SEED1[name, scheduler]
    # The plan is the replay: the same failure, message byte for byte.
    with pytest.raises(error) as caught:
        replay(found.plan.encode(), program, invariant)
    assert type(caught.value) is error
    # A panic's message is Go's crash report, noted on the exception; else its text.
    assert lowlevel.panic_report(caught.value) == found.failure.message
    # And the plan as found replays to a failure of the same kind.
    assert run_plan(program, found.original, invariant).failure.kind == kind  # type: ignore[union-attr]


PLAIN_TRIO_RUNS = 200


@pytest.mark.parametrize(
    ("name", "invariant"),
    [("lost_update", ep.two_increments), ("lease_takeover", ep.one_writer)],
)
def test_plain_trio_is_no_search_for_the_schedule(
    name: str, invariant: Callable[[Any], bool], record_property: Callable[[str, object], None]
) -> None:
    # The same logic on trio's primitives, run 200 times under trio's own scheduling.
    # Measured (trio 0.35, three rounds of 200): the lost update failed 97, 96 and 110
    # times, the lease takeover 102, 89 and 105. Trio reverses each batch of runnable
    # tasks with probability 1/2 (trio/_core/_run.py), and that one reordering is all
    # either bug needs, so plain trio hits them about every other run; but which runs
    # fail is trio's unseeded draw: a failure there has no replay and no shrunk
    # schedule. The rate is the figure, kept in the report (record_property), not a
    # check.
    found = explore(getattr(ep, name), runs=RUNS, seed=1, invariant=invariant).found
    assert found is not None and found.failure.kind == "invariant"

    program = getattr(tp, name)
    hits = 0
    for _ in range(PLAIN_TRIO_RUNS):
        result = trio.run(program, clock=trio.testing.MockClock(autojump_threshold=0))
        hits += not invariant(result)
    record_property(f"plain_trio_{name}_failures_of_{PLAIN_TRIO_RUNS}", hits)


def test_the_bystanders_decisions_are_shrunk_away() -> None:
    # A random walk differs from Go's order at most decisions; the bug needs one.
    found = explore(ep.lock_order, runs=RUNS, seed=1, scheduler="random").found
    assert found is not None
    assert found.original.decisions > 3
    assert found.plan.decisions == 1


def test_decisions_that_fail_only_together_give_way_to_one_that_fails_alone() -> None:
    # PCT's run here differs at decisions 0 and 1; deleting either passes, and the
    # greedy passes stop at two. One decision (the waiter's signaller first) suffices.
    found = explore(ep.missed_wakeup, runs=RUNS, seed=1, scheduler="pct").found
    assert found is not None
    assert found.plan.decisions == 1
    assert run_plan(ep.missed_wakeup, found.plan).failure.kind == "deadlock"  # type: ignore[union-attr]


def test_shrinking_can_be_turned_off() -> None:
    found = explore(ep.lock_order, runs=RUNS, seed=1, scheduler="random", shrink=False).found
    assert found is not None
    assert found.plan == found.original and found.shrink_runs == 0


@pytest.mark.parametrize("scheduler", ["pct", "random"])
def test_a_correct_program_is_never_failed(scheduler: str) -> None:
    program, invariant = ep.locked_update, ep.two_increments
    result = explore(program, runs=200, seed=1, scheduler=scheduler, invariant=invariant)  # type: ignore[arg-type]
    assert result.found is None and result.runs == 200


def test_an_exploration_is_reproducible_from_its_seed() -> None:
    a = explore(ep.send_on_closed, runs=RUNS, seed=7, scheduler="random").found
    b = explore(ep.send_on_closed, runs=RUNS, seed=7, scheduler="random").found
    assert a is not None and b is not None
    assert (a.run, a.original.encode(), a.plan.encode(), a.failure.message) == (
        b.run,
        b.original.encode(),
        b.plan.encode(),
        b.failure.message,
    )


def test_network_faults_are_found_and_shrunk() -> None:
    found = explore(ep.fragile_client, runs=RUNS, seed=1, faults=ep.NETWORK_FAULTS).found
    assert found is not None
    assert found.failure.kind == "panic"
    assert isinstance(found.failure.error, gosim.net.BrokenError)
    assert found.failure.signature == ("panic", "BrokenError")
    # The bug needs two resets on one client; the run found made more.
    assert found.plan.nfaults == 2 < found.original.nfaults == 4
    assert found.run == 3 and found.plan.decisions == 0  # the guide's catalogue
    assert found.plan.decisions <= found.original.decisions
    with pytest.raises(gosim.net.BrokenError) as caught:
        replay(found.plan.encode(), ep.fragile_client)
    assert lowlevel.panic_report(caught.value) == found.failure.message
    assert found.failure.message.startswith(f"panic: {caught.value}\n\ngoroutine ")
    # Without the resets the plan names, the same schedule passes.
    no_resets = dataclasses.replace(found.plan, resets=())
    assert run_plan(ep.fragile_client, no_resets).failure is None


def test_check_fails_a_test_with_the_replay_line() -> None:
    with pytest.raises(ScheduleFailure) as caught:
        check(ep.missed_wakeup, runs=RUNS, seed=1)
    text = str(caught.value)
    assert "all goroutines are asleep - deadlock!" in text
    plan = caught.value.found.plan.encode()
    line = f"python -m gosim.testing replay tests.gosim.explore_programs:missed_wakeup {plan}"
    assert text.endswith(line)
    check(ep.locked_update, runs=20, seed=1, invariant=ep.two_increments)


def test_explored_makes_a_test_function() -> None:
    test = explored(runs=RUNS, seed=1)(ep.lock_order)
    assert test.__name__ == "lock_order"
    with pytest.raises(ScheduleFailure):
        test()
    explored(runs=20, seed=1, invariant=ep.two_increments)(ep.locked_update)()


def _python(args: list[str], pure: bool = False) -> subprocess.CompletedProcess[str]:
    """``python *args`` from the tree's root, on the C accelerator or ``pure``-ly."""
    env = {k: v for k, v in os.environ.items() if k != "GOSIM_PURE_PYTHON"}
    if pure:
        env["GOSIM_PURE_PYTHON"] = "1"
    return subprocess.run(
        [sys.executable, *args],
        check=False,
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_replay_command_gives_the_same_failure() -> None:
    found = explore(ep.check_then_act, runs=RUNS, seed=1).found
    assert found is not None
    assert found.replay_line.startswith("python -m gosim.testing replay ")
    for pure in (False, True):
        proc = _python(found.replay_line.split()[1:], pure)
        assert (proc.returncode, proc.stderr) == (1, found.failure.message + "\n")
    # An invariant travels in the line too.
    found = explore(ep.lost_update, runs=RUNS, seed=1, invariant=ep.two_increments).found
    assert found is not None
    assert found.replay_line.endswith(" --invariant tests.gosim.explore_programs:two_increments")
    proc = _python(found.replay_line.split()[1:])
    assert (proc.returncode, proc.stderr) == (1, found.failure.message + "\n")


def test_the_replay_command_names_a_bad_plan() -> None:
    program = "tests.gosim.explore_programs:lock_order"
    proc = _python(["-m", "gosim.testing", "replay", program, "v2.x"])
    assert proc.returncode == 2
    assert "not a gosim schedule plan" in proc.stderr


def test_both_implementations_explore_the_same_runs() -> None:
    # The C accelerator and the pure-Python runtime: the same finds, plans, messages.
    code = (
        "from gosim.testing import explore\n"
        "from tests.gosim import explore_programs as ep\n"
        "for name in ('send_on_closed', 'lock_order', 'fragile_client'):\n"
        "    faults = ep.NETWORK_FAULTS if name == 'fragile_client' else None\n"
        "    program = getattr(ep, name)\n"
        "    f = explore(program, runs=60, seed=3, scheduler='random', faults=faults).found\n"
        "    print(f.run, f.original.encode(), f.plan.encode(), repr(f.failure.message))\n"
    )
    c, py = _python(["-c", code]), _python(["-c", code], pure=True)
    assert c.returncode == 0, c.stderr
    assert py.returncode == 0, py.stderr
    assert c.stdout == py.stdout
    assert c.stdout.count("\n") == 3


@given(
    seed=st.integers(0, 2**32 - 1),
    procs=st.integers(1, 8),
    choices=st.dictionaries(st.integers(0, 10**6), st.integers(1, 50), max_size=30),
    resets=st.none() | st.lists(st.integers(0, 10**4), max_size=10).map(tuple),
)
def test_a_plan_encodes_and_decodes_to_itself(
    seed: int, procs: int, choices: dict[int, int], resets: tuple[int, ...] | None
) -> None:
    faults = None if resets is None else {"reset_rate": 0.1, "latency": [0.001, 0.002]}
    plan = Plan(
        seed=seed, procs=procs, faults=faults, net_seed=seed ^ 5, resets=resets
    ).with_choices(tuple(sorted(choices.items())))
    text = plan.encode()
    assert text.startswith("v1.") and text.isascii() and " " not in text
    assert Plan.decode(text) == plan


@pytest.mark.parametrize("text", ["", "v1.", "v1.!!!", "v0.abc", "v1.eNqrVgpWslKqBQAJ9AJm"])
def test_a_damaged_plan_is_refused_by_name(text: str) -> None:
    with pytest.raises(ValueError, match="gosim schedule plan"):
        Plan.decode(text)


def test_pct_runs_the_highest_priority_and_drops_it_at_a_change_point() -> None:
    pct = PCT(seed=3, depth=1, steps=10)
    assert pct.changes == {}
    first = pct([4, 5, 6])
    # Depth 1: no change point, the same goroutine wins while it is runnable.
    assert all(pct([4, 5, 6]) == first for _ in range(20))
    pct = PCT(seed=3, depth=3, steps=10)
    assert len(pct.changes) == 2 and all(0 <= n < 10 for n in pct.changes)
    winners = [[4, 5, 6][pct([4, 5, 6])] for _ in range(10)]
    # Each change point drops the winner below everyone: two changes of winner at most.
    assert 1 <= len({w for w in winners}) <= 3
    assert sum(a != b for a, b in itertools.pairwise(winners)) <= 2


def test_replay_clamps_an_index_that_no_longer_fits() -> None:
    r = Replay({0: 5, 2: 1})
    assert [r([1, 2]), r([1, 2, 3]), r([1, 2, 3])] == [1, 0, 1]


# ------------------------------------------------------------------ the chooser hook


def test_a_chooser_of_zeros_keeps_gos_order() -> None:
    async def program(chooser: Callable[[list[int]], int] | None) -> list[tuple[int, int]]:
        if chooser is not None:
            await lowlevel.set_chooser(chooser)
        log: list[tuple[int, int]] = []
        done = gosim.Chan[None](3)

        async def worker(i: int) -> None:
            for k in range(3):
                log.append((i, k))
                await gosim.gosched()
            await done.send(None)

        for i in range(3):
            gosim.go(worker, i)
        for _ in range(3):
            await done.recv()
        return log

    asked: list[list[int]] = []

    def zeros(goids: list[int]) -> int:
        asked.append(goids)
        return 0

    plain = gosim.run(program, None, seed=1, procs=1, virtual_time=True)
    chosen = gosim.run(program, zeros, seed=1, procs=1, virtual_time=True)
    assert chosen == plain
    assert asked and all(len(g) >= 2 for g in asked)
    # Choosing the last every time is another order.
    last = gosim.run(program, lambda goids: len(goids) - 1, seed=1, procs=1, virtual_time=True)
    assert sorted(last) == sorted(plain) and last != plain


def test_a_chooser_needs_a_deterministic_runtime() -> None:
    async def program() -> None:
        await lowlevel.set_chooser(lambda goids: 0)

    with pytest.raises(RuntimeError, match="not deterministic"):
        gosim.run(program, procs=1)


def test_a_chooser_index_out_of_range_stops_the_run() -> None:
    async def program() -> None:
        await lowlevel.set_chooser(len)
        gosim.go(gosim.gosched)
        gosim.go(gosim.gosched)
        await gosim.gosched()

    with pytest.raises(ValueError, match=r"chooser returned 3, not an index in range\(3\)"):
        gosim.run(program, seed=1, procs=1, virtual_time=True)


def test_partitions_the_failure_does_not_need_are_shrunk_away() -> None:
    # Two partitions between hosts the program never uses: not needed, deleted.
    faults = {
        **ep.NETWORK_FAULTS,
        "partitions": [(0.0, 1.0, ["x"], ["y"]), (0.5, 2.0, ["y"], ["z"])],
    }
    found = explore(ep.fragile_client, runs=RUNS, seed=1, faults=faults).found
    assert found is not None
    assert found.original.partitions is None  # as found: every partition
    assert found.original.nfaults > found.plan.nfaults
    assert found.plan.partitions == ()
    with pytest.raises(gosim.net.BrokenError) as caught:
        replay(found.plan.encode(), ep.fragile_client)
    assert lowlevel.panic_report(caught.value) == found.failure.message
    assert found.failure.message.startswith(f"panic: {caught.value}\n\ngoroutine ")


def test_several_ps_are_explored_and_replayed() -> None:
    found = explore(ep.lock_order, runs=RUNS, seed=1, procs=2).found
    assert found is not None and found.plan.procs == 2
    assert found.failure.kind == "deadlock"
    with pytest.raises(gosim.Deadlock) as caught:
        replay(found.plan.encode(), ep.lock_order)
    assert str(caught.value) == found.failure.message
