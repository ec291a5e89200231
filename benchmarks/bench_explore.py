"""Schedule exploration (``gosim.testing``) on the catalogue of seeded bugs, and virtual
time on a sparse network workload.

Run: ``pytest benchmarks/bench_explore.py --benchmark-json=explore.json`` (the figures
are in each item's ``extra_info``); ``--benchmark-disable`` runs every case once at a
small size (3 exploration seeds, 20 connections for 30 simulated seconds), as CI's
smoke pass does.

Groups:

* ``explore-runs-to-failure`` (one item per bug of ``tests/gosim/explore_programs.py``
  and ``tests/idempotency/explore_programs.py``): ``explore`` with the random walk and
  with PCT over ``SEEDS`` (20) exploration seeds, up to ``CAP`` (1,000) runs each, not
  shrunk. ``extra_info``: per scheduler the median and worst run of the first failure
  (``random_median``, ``random_worst``, ``pct_median``, ``pct_worst``; run 1 is always
  Go's own order, which every bug passes, so 2 is the best possible), and
  ``within_100``: the issue's goal, every seed's bug found within 100 runs by at least
  one of the two. PCT runs at the bug's depth ``d`` (``depth``: the fewest ordering
  constraints between events that make it fail in every schedule that keeps them, by
  reading the program), so that its
  bound applies: one run finds it with probability at least ``1 / (n * k**(d - 1))``
  (``pct_bound``) for ``n`` goroutines (``n``: the goroutines that were ever runnable
  at a decision of the Go-order run, main and bystanders included) and ``k`` decisions
  (``k``: the Go-order run's decisions; the exploration's own ``k`` is the most any of
  its runs took, about the same). ``pct_rate`` is the observed rate: the fraction of
  ``RATE_SAMPLES`` (400) independent PCT runs that fail (each the second run of an
  exploration of two, after Go's order, so with that ``k``), and ``pct_bound_met``
  compares it with the bound (20 geometric samples of runs-to-failure would estimate
  a rate of 0.15 only to about a fifth). The client whose
  retries run out under resets is a fault, not an ordering: it has no depth, and both
  schedulers are driven by the same fault draws.
* ``explore-shrink``: the same explorations shrunk (the random walk's, whose runs differ
  from Go's order in the most decisions, and PCT's at depth 3, the default).
  ``extra_info``: the found run's differing decisions (``found_decisions_median``,
  ``found_decisions_worst``) and faults, the shrunk plan's (``shrunk_decisions_*``,
  ``shrunk_faults_*``), the runs the shrinker took (``shrink_runs_*``), and
  ``within_20``: the goal, every shrunk plan at most 20 decisions. Every shrunk plan is
  replayed and must fail with the message found.
* ``virtual-time``: idle netframe connections on gosim's simulated network under
  ``gosim.run(..., seed=1, virtual_time=True)``: a netframe ``Server`` and ``N``
  netframe ``Client`` connections whose only traffic is the heartbeat (a ping every
  ``HEARTBEAT`` = 5 s from each client, a pong from the server). ``extra_info``:
  ``simulated_s``, ``wall_s`` (the steady phase, after every connection is up),
  ``sim_per_wall`` (the goal: at least 100), ``frames`` (pings and pongs),
  ``wall_us_per_frame``, ``hour_wall_s`` (the wall time one simulated hour would take at
  that rate), ``setup_wall_s`` (connecting all ``N``). Each size runs a simulated
  duration scaled to keep its frames about equal (an hour at 100 connections, 360 s
  at 1,000, 36 s at 10,000): virtual time skips the idle time for nothing, so the wall
  time is the heartbeats' work, proportional to ``N / HEARTBEAT`` frames per simulated
  second, and ``sim_per_wall`` falls as ``1 / N``.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

import gosim
import netframe
from gosim import lowlevel, net
from gosim.sync import WaitGroup
from gosim.testing import Exploration, explore, replay
from tests.gosim import explore_programs as ep
from tests.idempotency import explore_programs as ip

SEEDS = 20
CAP = 1000  # runs per exploration; a bug not found within them counts as CAP + 1
GOAL_RUNS = 100
RATE_SAMPLES = 400  # independent PCT runs per bug for its observed rate
GOAL_DECISIONS = 20


@dataclass(frozen=True)
class Bug:
    name: str
    program: Callable[[], Any]
    invariant: Callable[[Any], object] | None = None
    faults: dict[str, Any] | None = None
    # The fewest ordering constraints that make it fail (None: a fault, not an order).
    depth: int | None = None


CATALOGUE = [
    # The read before the quick increment, the quick increment before the write.
    Bug("lost_update", ep.lost_update, ep.two_increments, depth=2),
    # The same shape: a's check before b's, b's store before a's.
    Bug("check_then_act", ep.check_then_act, depth=2),
    # one's m1 before two's m1, two's m2 before one's m2.
    Bug("lock_order", ep.lock_order, depth=2),
    # The signal before the wait.
    Bug("missed_wakeup", ep.missed_wakeup, depth=1),
    # The close before the send.
    Bug("send_on_closed", ep.send_on_closed, depth=1),
    # The compactor takes the disk before the holder.
    Bug("lease_takeover", ep.lease_takeover, ep.one_writer, depth=1),
    # The other worker's claim after the first one's release (before it, the key is
    # busy and the claim waits) and before its forget. (PCT at depth 1 finds it too,
    # when the priorities happen to order both, but the one constraint is not enough in
    # every schedule, which is what depth counts.)
    Bug("released_twice", ip.released_twice, ip.charged_once, depth=2),
    # The outage starts before the record's flight ends and ends after it.
    Bug("effect_without_record", ip.effect_without_record, ip.debited_with_record, depth=2),
    Bug("fragile_client", ep.fragile_client, faults=ep.NETWORK_FAULTS),
]
IDS = [b.name for b in CATALOGUE]


def _seeds(benchmark: Any) -> range:
    return range(3 if benchmark.disabled else SEEDS)


def _explorations(
    bug: Bug, scheduler: str, seeds: range, *, depth: int = 3, shrink: bool, runs: int = CAP
) -> list[Exploration]:
    return [
        explore(
            bug.program,
            runs=runs,
            seed=seed,
            scheduler=scheduler,  # type: ignore[arg-type]
            depth=depth,
            faults=bug.faults,
            invariant=bug.invariant,
            shrink=shrink,
        )
        for seed in seeds
    ]


def _first_failures(found: list[Exploration]) -> list[int]:
    return [e.runs if e.found is not None else CAP + 1 for e in found]


def _goroutines_and_decisions(program: Callable[[], Any]) -> tuple[int, int]:
    """PCT's n and k for ``program``: the goroutines runnable at some decision of its
    Go-order run, and that run's decisions."""
    seen: set[int] = set()
    decisions = [0]

    def chooser(goids: list[int]) -> int:
        seen.update(goids)
        decisions[0] += 1
        return 0

    async def main() -> None:
        await lowlevel.set_chooser(chooser)
        await program()

    gosim.run(main, seed=0, procs=1, virtual_time=True)
    return len(seen), decisions[0]


def runs_to_failure(bug: Bug, scheduler: str, seeds: range) -> list[int]:
    """The run of the first failure of each exploration seed (``CAP + 1``: not found),
    with ``scheduler`` (PCT at the bug's depth, 3 for a fault); every seed must find it."""
    found = _explorations(bug, scheduler, seeds, depth=bug.depth or 3, shrink=False)
    assert all(e.found is not None for e in found), f"{bug.name}: not found by {scheduler}"
    return _first_failures(found)


def pct_bound(bug: Bug) -> float:
    """PCT's guarantee for a bug of depth d: at least ``1 / (n * k**(d - 1))`` a run."""
    assert bug.depth is not None
    n, k = _goroutines_and_decisions(bug.program)
    return 1 / (n * k ** (bug.depth - 1))


@pytest.mark.parametrize("bug", CATALOGUE, ids=IDS)
def bench_runs_to_failure(benchmark: Any, bug: Bug) -> None:
    benchmark.group = "explore-runs-to-failure"
    seeds = _seeds(benchmark)
    got: dict[str, list[int]] = {}

    def both() -> None:
        got["random"] = runs_to_failure(bug, "random", seeds)
        got["pct"] = runs_to_failure(bug, "pct", seeds)

    benchmark.pedantic(both, rounds=1, iterations=1)
    info = benchmark.extra_info
    info["seeds"] = len(seeds)
    for scheduler, first in got.items():
        info[f"{scheduler}_median"] = statistics.median(first)
        info[f"{scheduler}_worst"] = max(first)
        info[f"{scheduler}_all"] = first
    per_seed_best = [min(a, b) for a, b in zip(got["random"], got["pct"], strict=True)]
    info["within_100"] = max(per_seed_best) <= GOAL_RUNS
    if bug.depth is not None:
        n, k = _goroutines_and_decisions(bug.program)
        info.update(depth=bug.depth, n=n, k=k, pct_bound=pct_bound(bug))
        samples = 20 if benchmark.disabled else RATE_SAMPLES
        info["pct_rate"] = pct_rate(bug, samples)
        info["pct_rate_samples"] = samples
        info["pct_bound_met"] = info["pct_rate"] >= info["pct_bound"]


def pct_rate(bug: Bug, samples: int) -> float:
    """The fraction of ``samples`` independent PCT runs at the bug's depth that fail:
    each exploration of two runs (seeds 0, 1, ...) makes Go's order, then one PCT run
    with ``k`` = the Go-order run's decisions."""
    found = _explorations(bug, "pct", range(samples), depth=bug.depth or 3, shrink=False, runs=2)
    return sum(e.found is not None for e in found) / samples


def shrunk(bug: Bug, scheduler: str, seeds: range) -> dict[str, list[int]]:
    """Each exploration seed's failure, found with ``scheduler`` (PCT at depth 3, the
    default) and shrunk; every shrunk plan replayed, which must fail with the message
    found. Per seed: the found run's differing decisions and faults, the shrunk plan's,
    and the runs the shrinker took."""
    finds = [e.found for e in _explorations(bug, scheduler, seeds, shrink=True)]
    assert all(f is not None for f in finds), f"{bug.name}: not found by {scheduler}"
    figures: dict[str, list[int]] = {
        "found_decisions": [f.original.decisions for f in finds if f],
        "shrunk_decisions": [f.plan.decisions for f in finds if f],
        "found_faults": [f.original.nfaults for f in finds if f],
        "shrunk_faults": [f.plan.nfaults for f in finds if f],
        "shrink_runs": [f.shrink_runs for f in finds if f],
    }
    for f in finds:
        assert f is not None
        try:
            replay(f.plan, bug.program, bug.invariant)
        except Exception as exc:  # the run's failure: a panic, deadlock or invariant
            assert lowlevel.panic_report(exc) == f.failure.message
        else:
            raise AssertionError(f"{bug.name}: the shrunk plan {f.plan} passed")
    return figures


@pytest.mark.parametrize("scheduler", ["random", "pct"])
@pytest.mark.parametrize("bug", CATALOGUE, ids=IDS)
def bench_shrunk_replay(benchmark: Any, bug: Bug, scheduler: str) -> None:
    benchmark.group = "explore-shrink"
    seeds = _seeds(benchmark)
    got: list[dict[str, list[int]]] = []
    benchmark.pedantic(lambda: got.append(shrunk(bug, scheduler, seeds)), rounds=1, iterations=1)
    info = benchmark.extra_info
    info["seeds"] = len(seeds)
    for name, values in got[0].items():
        info[f"{name}_median"] = statistics.median(values)
        info[f"{name}_worst"] = max(values)
    info["within_20"] = max(got[0]["shrunk_decisions"]) <= GOAL_DECISIONS


# ------------------------------------------------------------------ virtual time

HEARTBEAT = 5.0
HOSTS = 100  # client hosts the connections dial from


def sparse(connections: int, seconds: float) -> dict[str, float]:
    """``connections`` idle netframe connections with heartbeats on the simulated
    network for ``seconds`` of virtual time, from seed 1; the steady phase's figures."""
    out: dict[str, float] = {}

    async def main() -> None:
        net.use_sim_network(net.SimNetwork(seed=1, log=None))
        server = netframe.Server(
            lambda payload: None, heartbeat_interval=HEARTBEAT, max_connections=connections
        )
        gosim.go(server.serve, net.listen("sim", "server:1"))
        wg = WaitGroup()
        for k in range(connections):

            async def dial(host: str = f"c{k % HOSTS}") -> Any:
                return await net.dial("sim", "server:1", local_host=host)

            client = netframe.Client(dial, heartbeat_interval=HEARTBEAT, rng=random.Random(k))
            wg.go(client.connect)
        await wg.wait()
        out["setup_wall_s"] = time.perf_counter() - start
        before = server.statistics()
        t0, w0 = gosim.now(), time.perf_counter()
        await gosim.sleep(seconds)
        out["wall_s"] = time.perf_counter() - w0
        out["simulated_s"] = gosim.now() - t0
        after = server.statistics()
        assert after.connections == connections, after
        assert after.dead_peers == after.heartbeats_missed == 0, after
        frames = after.frames_received + after.frames_sent
        out["frames"] = frames - before.frames_received - before.frames_sent

    start = time.perf_counter()
    gosim.run(main, seed=1, virtual_time=True)
    # Every client pings about once a heartbeat and is answered: the workload ran.
    assert out["frames"] >= connections * (2 * seconds / HEARTBEAT - 4), out
    return out


@pytest.mark.parametrize("connections", [100, 1_000, 10_000])
def bench_virtual_time(benchmark: Any, connections: int) -> None:
    benchmark.group = "virtual-time"
    seconds = 3600.0 * 100 / connections
    if benchmark.disabled:
        connections, seconds = 20, 30.0
    got: list[dict[str, float]] = []
    benchmark.pedantic(lambda: got.append(sparse(connections, seconds)), rounds=1, iterations=1)
    out = got[0]
    ratio = out["simulated_s"] / out["wall_s"]
    benchmark.extra_info.update(
        out,
        connections=connections,
        heartbeat_s=HEARTBEAT,
        sim_per_wall=ratio,
        wall_us_per_frame=out["wall_s"] / out["frames"] * 1e6,
        hour_wall_s=3600.0 / ratio,
        goal_met=ratio >= 100,
    )
