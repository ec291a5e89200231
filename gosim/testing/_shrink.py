"""Shrinking a failing plan: fewer faults, fewer decisions that differ from Go's order.

A plan's run is decided by a short list of edits to a default run: the decisions whose
index is not 0, the network resets, the partitions. Shrinking is greedy deletion of
chunks from those lists (halves, then quarters, down to single items, the reduction
step of delta debugging, Zeller and Hildebrandt 2002, and of hypothesis's shrinker),
followed by lowering each remaining index towards 1, repeated while it makes progress;
last, a plan that still keeps several decisions is tried against every plan of a single
differing decision (each decision of Go's order up to the plan's last differing one,
each index among the goroutines runnable there), since decisions that fail only
together can stand for one elsewhere.
A candidate is kept when its run fails with the same signature (the same kind of
failure and, for a panic, the same exception type), and is then *normalized*: replaced
by what its run actually did (the decisions it took, clamped where an index no longer
fitted, the resets it made), so decisions the run never reached drop out.

Every candidate is one run of the program, so the work is bounded by ``max_runs``. The
result never has more differing decisions or faults than the plan given, and fails as
it did.

Rejected: hypothesis's engine over a choice sequence. It shrinks a sequence of draws
well, but its shrinker ends with ``Flaky`` or a health check when a test is slow, its
database and example counts are per test rather than per exploration seed, and the
replay line would have to carry hypothesis's own encoding; the plan here is the
decisions themselves, which a reader can count.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, TypeVar

from ._plan import Plan

if TYPE_CHECKING:
    from ._explore import Invariant, Program

T = TypeVar("T")


def shrink(
    program: Program,
    plan: Plan,
    signature: tuple[str, str],
    invariant: Invariant | None,
    max_runs: int,
) -> tuple[Plan, int]:
    """The smallest plan found that still fails with ``signature``, and the runs used."""
    from ._explore import run_plan  # noqa: PLC0415 - the two modules use each other

    used = 0

    def attempt(candidate: Plan) -> Plan | None:
        nonlocal used
        if used >= max_runs:
            return None
        used += 1
        record = run_plan(program, candidate, invariant)
        if record.failure is None or record.failure.signature != signature:
            return None
        normal = candidate.with_choices(list(record.indices))
        if candidate.faults is not None:
            normal = replace(normal, resets=record.resets)
        return normal

    best = attempt(plan) or plan
    while used < max_runs:
        before = _size(best)
        if best.faults is not None:
            best = _delete_chunks(
                best,
                lambda p: list(p.resets or ()),
                lambda p, r: replace(p, resets=tuple(r)),
                attempt,
            )
            best = _delete_chunks(
                best,
                _kept_partitions,
                lambda p, q: replace(p, partitions=tuple(q)),
                attempt,
            )
        best = _delete_chunks(
            best, lambda p: list(p.choices), lambda p, c: p.with_choices(tuple(c)), attempt
        )
        best = _lower_indices(best, attempt)
        if _size(best) >= before:
            break
    if best.decisions >= 2 and used < max_runs:
        # Deletion keeps decisions that fail only together; one decision elsewhere may
        # do instead. Tried: every single decision of Go's order up to the plan's last
        # differing one, each index among the goroutines runnable there, earliest first.
        used += 1
        widths = run_plan(program, best.with_choices(()), invariant).widths
        best = _single_decision(best, widths, attempt)
    return best, used


def _single_decision(
    plan: Plan, widths: tuple[int, ...], attempt: Callable[[Plan], Plan | None]
) -> Plan:
    last = plan.choices[-1][0]
    for n, width in enumerate(widths[: last + 1]):
        for i in range(1, width):
            got = attempt(plan.with_choices(((n, i),)))
            if got is not None and _size(got) < _size(plan):
                return got
    return plan


def _kept_partitions(plan: Plan) -> list[int]:
    if plan.partitions is not None:
        return list(plan.partitions)
    return list(range(len((plan.faults or {}).get("partitions", ()))))


def _size(plan: Plan) -> tuple[int, int, int]:
    return (plan.nfaults, plan.decisions, sum(i for _, i in plan.choices))


def _delete_chunks(
    plan: Plan,
    items: Callable[[Plan], list[T]],
    rebuild: Callable[[Plan, list[T]], Plan],
    attempt: Callable[[Plan], Plan | None],
) -> Plan:
    """Delete chunks of ``items(plan)``: all of them, then halves, down to one at a time."""
    current = items(plan)
    size = len(current)
    while size >= 1 and current:
        i = 0
        while i < len(current):
            got = attempt(rebuild(plan, current[:i] + current[i + size :]))
            if got is not None and _size(got) < _size(plan):
                plan = got
                current = items(plan)
            else:
                i += size
        size //= 2
    return plan


def _lower_indices(plan: Plan, attempt: Callable[[Plan], Plan | None]) -> Plan:
    """Each remaining decision's index lowered towards 1 (0 is deleting it)."""
    k = 0
    while k < len(plan.choices):
        n, i = plan.choices[k]
        for lower in range(1, i):
            choices = (*plan.choices[:k], (n, lower), *plan.choices[k + 1 :])
            got = attempt(plan.with_choices(choices))
            if got is not None and _size(got) < _size(plan):
                plan = got
                break
        k += 1
    return plan
