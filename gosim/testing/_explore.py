"""Schedule exploration: run a program under many schedules until one breaks it.

:func:`explore` runs a gosim program (an async function of no arguments, as main) on a
deterministic runtime (``gosim.run(seed=..., virtual_time=True)``) again and again, each
time with a chooser (``gosim.lowlevel.set_chooser``, see :mod:`._pct`) deciding which
runnable goroutine runs at every switch and, when ``faults`` are given, a simulated
network with those faults (``gosim.net.SimNetwork``) installed before the program
starts. It stops at the first run that fails: a panic (an exception escaped a
goroutine and ``gosim.run`` raised it: an ``assert``, a send on a closed channel), a
:class:`gosim.Deadlock` (with its goroutine dump), or the ``invariant`` refusing the
program's result. That run is recorded as a :class:`~._plan.Plan` (the decisions that
differ from Go's order, the faults), shrunk (:mod:`._shrink`), and reported with one
replay line.

Guarantees:

* **Reproducible.** The same program, arguments and ``seed`` explore the same runs in the
  same order and report the same plan: every run's runtime seed, chooser seed and
  network seed are drawn from one ``random.Random(seed)``.
* **Replayable.** ``replay(plan, program)`` runs the plan's schedule and faults again and
  fails with the same failure, message byte for byte (goroutine ids, dumps), on either
  implementation of the scheduler (the C accelerator or ``GOSIM_PURE_PYTHON=1``): a
  chooser makes the driver take its Python inner loop on both, and the rest of the
  runtime already takes the same schedule for a seed on both.
* **Shrunk, same failure.** The reported plan fails with the same kind of failure (a
  panic of the same exception type, a deadlock, an invariant) as the run found, and
  has no more differing decisions and no more faults than it.

A program explored must be deterministic apart from gosim's choices: no wall clock, no
unseeded randomness, no state carried from one run to the next (build it inside main).
"""

from __future__ import annotations

import random
import sys
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

import gosim
from gosim import lowlevel
from gosim.net import SimNetwork, use_sim_network

from ._pct import PCT, RandomWalk, Recorder, Replay
from ._plan import Plan, _jsonable

Program = Callable[[], Awaitable[Any]]
Invariant = Callable[[Any], object]


class InvariantFailed(AssertionError):
    """The ``invariant`` given to :func:`explore` refused the program's result."""


@dataclass(frozen=True)
class Failure:
    """How a run failed: ``kind`` is ``"panic"``, ``"deadlock"`` or ``"invariant"``,
    ``message`` the failure's text (the same bytes on replay: for a panic, Go's crash
    report, which the runtime noted on the exception), ``error`` the exception (the
    one that escaped a goroutine, the ``Deadlock`` or the :class:`InvariantFailed`)."""

    kind: Literal["panic", "deadlock", "invariant"]
    message: str
    error: BaseException

    @property
    def signature(self) -> tuple[str, str]:
        """What the shrinker keeps: the kind, and for a panic its exception's type."""
        if self.kind == "panic":
            return (self.kind, type(self.error).__name__)
        cause = self.error.__cause__
        return (self.kind, type(cause).__name__ if cause is not None else "")


@dataclass(frozen=True)
class RunRecord:
    """One run of a plan: its failure (None: it passed), every decision's index and
    the number of goroutines it was among, the simulated network's resets, main's
    result (None after a failure)."""

    failure: Failure | None
    indices: tuple[int, ...]
    widths: tuple[int, ...]
    resets: tuple[int, ...] | None
    result: Any = None


def run_plan(program: Program, plan: Plan, invariant: Invariant | None = None) -> RunRecord:
    """Run ``program`` once under ``plan`` (its decisions replayed, the rest Go's order)."""
    return _run(program, plan, Replay(dict(plan.choices)), invariant)


def _run(
    program: Program,
    plan: Plan,
    decide: Callable[[list[int]], int],
    invariant: Invariant | None,
) -> RunRecord:
    recorder = Recorder(decide)
    networks: list[SimNetwork] = []

    async def main() -> Any:
        if plan.faults is not None:
            networks.append(_network(plan))
            use_sim_network(networks[0])
        await lowlevel.set_chooser(recorder)
        return await program()

    failure: Failure | None = None
    result: Any = None
    try:
        result = gosim.run(main, seed=plan.seed, procs=plan.procs, virtual_time=True)
    except gosim.Deadlock as exc:
        failure = Failure("deadlock", str(exc), exc)
    except Exception as exc:  # it escaped a goroutine: the program panicked
        failure = Failure("panic", lowlevel.panic_report(exc), exc)
    else:
        if invariant is not None:
            try:
                ok = invariant(result)
            except AssertionError as exc:
                err = InvariantFailed(f"invariant failed: {exc}")
                err.__cause__ = exc
                failure = Failure("invariant", str(err), err)
            else:
                if ok is False:
                    err = InvariantFailed(f"invariant failed: returned False for {result!r:.200}")
                    failure = Failure("invariant", str(err), err)
    resets = tuple(networks[0].resets_made) if networks else None
    return RunRecord(
        failure,
        tuple(recorder.indices),
        tuple(recorder.widths),
        resets,
        None if failure else result,
    )


def _network(plan: Plan) -> SimNetwork:
    kwargs = dict(plan.faults or {})
    parts = list(kwargs.pop("partitions", ()))
    if plan.partitions is not None:
        parts = [parts[i] for i in plan.partitions if i < len(parts)]
    resets = None if plan.resets is None else frozenset(plan.resets)
    return SimNetwork(seed=plan.net_seed, partitions=parts, resets=resets, log=None, **kwargs)


@dataclass(frozen=True)
class Found:
    """A failing schedule: ``failure`` as replayed from ``plan`` (the shrunk plan),
    ``original`` the plan as found, ``run`` the run's number (from 1), ``shrink_runs``
    the runs the shrinker took."""

    failure: Failure
    plan: Plan
    original: Plan
    run: int
    shrink_runs: int
    replay_line: str

    def __str__(self) -> str:
        return (
            f"{self.failure.message}\n\n"
            f"found by exploration run {self.run}; the schedule kept "
            f"{self.plan.decisions} of {self.original.decisions} differing decisions and "
            f"{self.plan.nfaults} of {self.original.nfaults} faults; replay it with:\n"
            f"    {self.replay_line}"
        )


@dataclass(frozen=True)
class Exploration:
    """What :func:`explore` did: ``runs`` made, and the failure ``found`` (None when
    every run passed)."""

    runs: int
    found: Found | None


def explore(
    program: Program,
    *,
    runs: int = 100,
    seed: int = 0,
    scheduler: Literal["random", "pct"] = "pct",
    depth: int = 3,
    faults: Mapping[str, Any] | None = None,
    invariant: Invariant | None = None,
    procs: int = 1,
    shrink: bool = True,
    max_shrink_runs: int = 1000,
) -> Exploration:
    """Run ``program`` under up to ``runs`` schedules; stop at the first failure.

    ``scheduler``: ``"pct"`` (probabilistic concurrency testing of ``depth``: ``depth - 1``
    priority change points) or ``"random"`` (a uniformly random runnable goroutine at
    every decision). Run 1 always takes Go's own order, the schedule ``gosim.run`` would
    take. ``faults``: keyword arguments of :class:`gosim.net.SimNetwork` (``latency``,
    ``reset_rate``, ``partitions``, ``bandwidth``; JSON data, as they go into the plan):
    each run installs a network with them and a seed of its own. ``invariant``: called
    with main's result; an ``AssertionError`` from it, or ``False``, is a failure.
    ``procs``: the runtime's Ps (with more than one, a decision orders what the P in
    turn could take: its own queues and the global queue; steals stay seeded draws).
    The failure found is shrunk (up to ``max_shrink_runs`` runs) unless ``shrink`` is
    False. See the module docstring for what is guaranteed.
    """
    if scheduler not in ("random", "pct"):
        raise ValueError(f"scheduler must be 'random' or 'pct', got {scheduler!r}")
    if runs < 1:
        raise ValueError(f"runs must be at least 1, got {runs}")
    if procs < 1:
        raise ValueError(f"procs must be at least 1, got {procs}")
    jfaults = None if faults is None else _jsonable(faults)
    rng = random.Random(seed)
    steps = 1  # PCT's k: the most decisions a run has taken so far
    for n in range(1, runs + 1):
        plan = Plan(
            seed=rng.getrandbits(32),
            procs=procs,
            faults=jfaults,
            net_seed=rng.getrandbits(32) if jfaults is not None else 0,
        )
        chooser_seed = rng.getrandbits(32)
        decide: Callable[[list[int]], int]
        if n == 1:
            decide = Replay({})
        elif scheduler == "pct":
            decide = PCT(chooser_seed, depth, steps)
        else:
            decide = RandomWalk(chooser_seed)
        record = _run(program, plan, decide, invariant)
        steps = max(steps, len(record.indices))
        if record.failure is None:
            continue
        found = replace(plan.with_choices(list(record.indices)), resets=record.resets)
        return Exploration(
            n, _report(program, found, record.failure, n, invariant, shrink, max_shrink_runs)
        )
    return Exploration(runs, None)


def _report(
    program: Program,
    original: Plan,
    failure: Failure,
    run: int,
    invariant: Invariant | None,
    shrink: bool,
    max_shrink_runs: int,
) -> Found:
    from ._shrink import shrink as shrink_plan  # noqa: PLC0415 - the two modules use each other

    plan, used = original, 0
    if shrink:
        plan, used = shrink_plan(program, original, failure.signature, invariant, max_shrink_runs)
    final = run_plan(program, plan, invariant)
    if final.failure is None or final.failure.signature != failure.signature:
        # Cannot happen for a deterministic program: the shrinker kept only plans that
        # failed so. A program that is not deterministic gets the plan as found.
        plan = original
        final = run_plan(program, plan, invariant)
    assert final.failure is not None, "the program is not deterministic: its failure did not replay"
    return Found(final.failure, plan, original, run, used, replay_line(program, plan, invariant))


def replay_line(program: Program, plan: Plan, invariant: Invariant | None = None) -> str:
    """The one line that replays ``plan``: a shell command when ``program`` (and the
    invariant) can be imported by name, else the Python call."""
    target = _importable(program)
    inv = None if invariant is None else _importable(invariant)
    if target is not None and (invariant is None or inv is not None):
        extra = f" --invariant {inv}" if inv is not None else ""
        return f"python -m gosim.testing replay {target} {plan.encode()}{extra}"
    name = getattr(program, "__qualname__", "program")
    extra = ""
    if invariant is not None:
        extra = f", {getattr(invariant, '__qualname__', 'invariant')}"
    return f"gosim.testing.replay({plan.encode()!r}, {name}{extra})"


def _importable(fn: Any) -> str | None:
    module = getattr(fn, "__module__", None)
    qualname = getattr(fn, "__qualname__", None)
    if not module or not qualname or "<" in qualname or module == "__main__":
        return None
    obj: Any = sys.modules.get(module)
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
    program = getattr(obj, "__gosim_program__", obj)
    return f"{module}:{qualname}" if program is fn or obj is fn else None


def replay(plan: Plan | str, program: Program, invariant: Invariant | None = None) -> Any:
    """Run ``program`` under ``plan`` (a :class:`Plan` or its encoded string) and
    return main's result, or raise the run's failure: the exception that escaped a
    goroutine (with the same crash report as a note), the ``Deadlock`` or the
    :class:`InvariantFailed` the exploration reported, with the same message."""
    if isinstance(plan, str):
        plan = Plan.decode(plan)
    record = run_plan(program, plan, invariant)
    if record.failure is not None:
        raise record.failure.error
    return record.result


class ScheduleFailure(AssertionError):
    """:func:`check` found a schedule that breaks the program; the message ends with
    the replay line. ``found`` has the details."""

    def __init__(self, found: Found) -> None:
        super().__init__(str(found))
        self.found = found


def check(program: Program, **options: Any) -> Exploration:
    """:func:`explore` for a test: raise :class:`ScheduleFailure` (an
    ``AssertionError``, which pytest reports with the replay line) if a run fails."""
    result = explore(program, **options)
    if result.found is not None:
        raise ScheduleFailure(result.found)
    return result


def explored(**options: Any) -> Callable[[Program], Callable[[], None]]:
    """Decorate a gosim program into a test function that runs :func:`check` on it with
    ``options``. The replay command names the test function; it replays the program."""

    def decorate(program: Program) -> Callable[[], None]:
        def test() -> None:
            check(program, **options)

        test.__name__ = getattr(program, "__name__", "test")
        test.__qualname__ = getattr(program, "__qualname__", test.__name__)
        test.__module__ = getattr(program, "__module__", test.__module__)
        test.__doc__ = program.__doc__
        test.__gosim_program__ = program  # type: ignore[attr-defined]
        return test

    return decorate
