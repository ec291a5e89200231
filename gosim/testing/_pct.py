"""The choosers: who runs next at each scheduling decision of an explored run.

A chooser is what ``gosim.lowlevel.set_chooser`` takes: called at every switch where
two or more goroutines are runnable, with their goids in Go's order, it returns the
index of the one to run. Three are here, and every one records its answers, so that
whatever found a failure, the run is a plain list of indices (:class:`Recorder`), which
:class:`Replay` plays back and the shrinker edits.

* :class:`RandomWalk`: a uniformly random runnable goroutine at each decision.
* :class:`PCT`: probabilistic concurrency testing (Burckhardt, Kothari, Musuvathi,
  Nagarakatte, ASPLOS 2010). Every goroutine gets a random priority when first seen
  (``depth`` plus a uniform draw in [0, 1): distinct, and above every change point's);
  ``depth - 1`` change points are drawn among the first ``steps`` decisions; at every
  decision the highest-priority runnable goroutine runs, and at the i-th change point
  the one that would have run first drops to priority ``depth - 1 - i`` (lower than
  every initial priority, and than earlier drops), then the highest runs. A bug of
  depth d (d ordering constraints) is found by one run with probability at least
  ``1 / (n * k**(d-1))`` for n goroutines and k decisions. The decisions here are the
  points where a goroutine parks or yields (channel and lock waits, ``gosched``,
  preemption, exits, syscalls), which is where gosim switches; a channel operation that
  completes without waiting is no decision, as it cannot interleave.
* :class:`Replay`: the indices of a plan (default 0, Go's order), each clamped to the
  goroutines runnable then: a plan edited by the shrinker still names a goroutine.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping


class Recorder:
    """Wraps a chooser and keeps its answers (``indices``), one per decision, and how
    many goroutines each decision was among (``widths``)."""

    __slots__ = ("decide", "indices", "widths")

    def __init__(self, decide: Callable[[list[int]], int]) -> None:
        self.decide = decide
        self.indices: list[int] = []
        self.widths: list[int] = []

    def __call__(self, goids: list[int]) -> int:
        i = self.decide(goids)
        self.indices.append(i)
        self.widths.append(len(goids))
        return i


class RandomWalk:
    """A uniformly random runnable goroutine at every decision, from its own seed."""

    __slots__ = ("rng",)

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def __call__(self, goids: list[int]) -> int:
        return self.rng.randrange(len(goids))


class PCT:
    """Probabilistic concurrency testing of ``depth`` over about ``steps`` decisions;
    see the module docstring. Reproducible from ``seed``."""

    __slots__ = ("changes", "depth", "prio", "rng", "step")

    def __init__(self, seed: int, depth: int, steps: int) -> None:
        if depth < 1:
            raise ValueError(f"PCT depth must be at least 1, got {depth}")
        self.rng = random.Random(seed)
        self.depth = depth
        steps = max(steps, 1)
        # Change point decision number -> its rank i (0 first): the goroutine about to
        # run at that decision drops to depth - 1 - i.
        points = self.rng.sample(range(steps), min(depth - 1, steps))
        self.changes = {n: i for i, n in enumerate(sorted(points))}
        self.prio: dict[int, float] = {}
        self.step = 0

    def __call__(self, goids: list[int]) -> int:
        prio = self.prio
        for goid in goids:
            if goid not in prio:
                prio[goid] = self.depth + self.rng.random()
        best = max(range(len(goids)), key=lambda k: prio[goids[k]])
        rank = self.changes.get(self.step)
        self.step += 1
        if rank is not None:
            prio[goids[best]] = self.depth - 1 - rank
            best = max(range(len(goids)), key=lambda k: prio[goids[k]])
        return best


class Replay:
    """The indices of a plan, by decision number (absent: 0), clamped to the range."""

    __slots__ = ("choices", "step")

    def __init__(self, choices: Mapping[int, int]) -> None:
        self.choices = choices
        self.step = 0

    def __call__(self, goids: list[int]) -> int:
        i = self.choices.get(self.step, 0)
        self.step += 1
        return i if i < len(goids) else len(goids) - 1
