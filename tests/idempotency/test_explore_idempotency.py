"""Schedule exploration (gosim.testing) of the idempotency core misused: a claim
released twice and an effect committed without its record are found, shrunk and
replayed to the same failure, and the right use of the same API is never failed.

The programs are in ``explore_programs.py`` here (importable, for the replay command).
Each passes under Go's order, which an exploration's first run takes, so a find here
is the exploration's.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import gosim
from gosim.sync import WaitGroup
from gosim.testing import InvariantFailed, Plan, explore, replay, run_plan
from idempotency import Call, Idempotency, MemoryEffect, MemoryStore

from . import explore_programs as ep

ROOT = Path(__file__).resolve().parents[2]
RUNS = 60  # the bound: each bug is found within it for exploration seed 1

# Seed 1's run that failed, and the shrunk plan's decisions of the failing run's, per
# scheduler: the figures of the guide's catalogue (docs/guides/find-the-schedule.md).
SEED1: dict[tuple[str, str], tuple[int, int, int]] = {
    ("released_twice", "pct"): (6, 2, 5),
    ("released_twice", "random"): (5, 1, 7),
    ("effect_without_record", "pct"): (12, 1, 4),
    ("effect_without_record", "random"): (9, 1, 5),
}
CATALOGUE: list[tuple[str, Callable[[Any], bool]]] = [
    ("released_twice", ep.charged_once),
    ("effect_without_record", ep.debited_with_record),
]


@pytest.mark.parametrize("scheduler", ["pct", "random"])
@pytest.mark.parametrize(("name", "invariant"), CATALOGUE, ids=[c[0] for c in CATALOGUE])
def test_a_misuse_is_found_shrunk_and_replayed(
    name: str, invariant: Callable[[Any], bool], scheduler: str
) -> None:
    program = getattr(ep, name)
    assert run_plan(program, Plan(), invariant).failure is None  # Go's order passes

    result = explore(program, runs=RUNS, seed=1, scheduler=scheduler, invariant=invariant)  # type: ignore[arg-type]

    found = result.found
    assert found is not None, f"{name} not found in {RUNS} runs of {scheduler}"
    assert 1 < found.run == result.runs <= RUNS
    assert found.failure.kind == "invariant"
    assert 1 <= found.plan.decisions <= min(20, found.original.decisions)
    assert (found.run, found.plan.decisions, found.original.decisions) == SEED1[name, scheduler]
    with pytest.raises(InvariantFailed) as caught:
        replay(found.plan.encode(), program, invariant)
    assert str(caught.value) == found.failure.message
    assert run_plan(program, found.original, invariant).failure.kind == "invariant"  # type: ignore[union-attr]


def test_the_double_release_lets_both_deliveries_charge() -> None:
    found = explore(ep.released_twice, runs=RUNS, seed=1, invariant=ep.charged_once).found
    assert found is not None
    assert found.failure.message == "invariant failed: returned False for ['a', 'b']"


def test_the_lost_record_leaves_the_debit_applied_twice() -> None:
    found = explore(
        ep.effect_without_record, runs=RUNS, seed=1, invariant=ep.debited_with_record
    ).found
    assert found is not None
    assert found.failure.message == "invariant failed: returned False for (80, True)"
    assert found.plan.decisions == 1


async def _effect_in_the_record() -> tuple[int, bool]:
    """``effect_without_record`` done right: the MemoryStore runs the effect in the step
    that writes the record, so an outage of the link cannot split them."""
    store = MemoryStore()
    idem = Idempotency(store)
    balance = {"acct": 100}

    def debit(call: Call) -> MemoryEffect:
        def apply() -> int:
            balance["acct"] -= 10
            return balance["acct"]

        return MemoryEffect(apply)

    async def client() -> None:
        await gosim.gosched()
        await idem.run(caller=ep.CALLER, key=ep.KEY, request=("debit", ["acct", 10]), handler=debit)

    wg = WaitGroup()
    for _ in range(3):
        wg.go(client)
    await wg.wait()
    return balance["acct"], await store.get(ep.CALLER, ep.KEY) is not None


@pytest.mark.parametrize("scheduler", ["pct", "random"])
def test_the_effect_in_its_records_step_is_never_failed(scheduler: str) -> None:
    result = explore(
        _effect_in_the_record,
        runs=100,
        seed=1,
        scheduler=scheduler,  # type: ignore[arg-type]
        invariant=ep.debited_with_record,
    )
    assert result.found is None and result.runs == 100


def test_the_replay_command_gives_the_same_failure() -> None:
    found = explore(ep.released_twice, runs=RUNS, seed=1, invariant=ep.charged_once).found
    assert found is not None
    assert found.replay_line == (
        "python -m gosim.testing replay tests.idempotency.explore_programs:released_twice "
        f"{found.plan.encode()} --invariant tests.idempotency.explore_programs:charged_once"
    )
    for pure in (False, True):
        env = {k: v for k, v in os.environ.items() if k != "GOSIM_PURE_PYTHON"}
        if pure:
            env["GOSIM_PURE_PYTHON"] = "1"
        proc = subprocess.run(
            [sys.executable, *found.replay_line.split()[1:]],
            check=False,
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert (proc.returncode, proc.stderr) == (1, found.failure.message + "\n")
