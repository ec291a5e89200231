"""A plan: everything a deterministic run's schedule depends on, as one short string.

A run of a program under exploration is decided by: the runtime's seed (select's case
order, steal victims), ``procs``, the scheduling decisions that differ from Go's order
(``lowlevel.set_chooser``: at the n-th decision with two or more runnable goroutines,
run the one at index i of the default order; every decision not listed takes index 0),
and, when the program uses the simulated network, the fault configuration (the keyword
arguments of :class:`gosim.net.SimNetwork`), its seed, and which of its faults are kept.

:meth:`Plan.encode` writes all of it as ``v1.`` and the URL-safe base64 of compressed
JSON: one token a command line or a test can carry, which :meth:`Plan.decode` reads
back. Decisions are stored sparsely (only the differing ones), so a shrunk plan is a
few bytes.
"""

from __future__ import annotations

import base64
import json
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

_PREFIX = "v1."


@dataclass(frozen=True)
class Plan:
    """One run's schedule and faults; see the module docstring.

    ``choices`` are ``(decision, index)`` pairs, sorted, with ``index > 0``: decision
    numbers count from 0 the switches at which the scheduler had two or more
    goroutines to choose from. ``resets`` (None: as the network's seed draws them) are
    the numbers of the simulated network's writes that reset; ``partitions`` (None:
    all) the indices of ``faults["partitions"]`` kept.
    """

    seed: int = 0
    procs: int = 1
    choices: tuple[tuple[int, int], ...] = ()
    faults: Mapping[str, Any] | None = None
    net_seed: int = 0
    resets: tuple[int, ...] | None = None
    partitions: tuple[int, ...] | None = None

    @property
    def decisions(self) -> int:
        """How many scheduling decisions differ from Go's order."""
        return len(self.choices)

    @property
    def nfaults(self) -> int:
        """How many faults are kept: resets named and partitions kept (resets left to
        the draw count as unknown, 0)."""
        nparts = len((self.faults or {}).get("partitions", ()))
        kept = nparts if self.partitions is None else len(self.partitions)
        return len(self.resets or ()) + kept

    def with_choices(self, decisions: list[int] | tuple[tuple[int, int], ...]) -> Plan:
        """This plan with its choices replaced: by ``(decision, index)`` pairs, or by a
        whole run's indices, one per decision (the zeros dropped)."""
        if decisions and isinstance(decisions[0], tuple):
            pairs = tuple(sorted(p for p in decisions if isinstance(p, tuple) and p[1]))
        else:
            pairs = tuple((n, i) for n, i in enumerate(decisions) if isinstance(i, int) and i)
        return replace(self, choices=pairs)

    def encode(self) -> str:
        """The plan as one URL-safe token (``v1.`` then base64); see :meth:`decode`."""
        body: dict[str, Any] = {"s": self.seed, "p": self.procs}
        if self.choices:
            body["c"] = [x for pair in self.choices for x in pair]
        if self.net_seed:
            body["n"] = self.net_seed
        if self.faults is not None:
            body["f"] = _jsonable(self.faults)
            if self.resets is not None:
                body["r"] = list(self.resets)
            if self.partitions is not None:
                body["q"] = list(self.partitions)
        raw = json.dumps(body, separators=(",", ":"), sort_keys=True).encode()
        return _PREFIX + base64.urlsafe_b64encode(zlib.compress(raw, 9)).decode().rstrip("=")

    @classmethod
    def decode(cls, text: str) -> Plan:
        """Read a plan written by :meth:`encode`; ``ValueError`` names what is wrong."""
        if not isinstance(text, str) or not text.startswith(_PREFIX):
            raise ValueError(f"not a gosim schedule plan (want 'v1.' then base64): {text!r:.80}")
        b64 = text[len(_PREFIX) :]
        try:
            raw = zlib.decompress(base64.urlsafe_b64decode(b64 + "=" * (-len(b64) % 4)))
            body = json.loads(raw)
            flat = body.get("c", [])
            choices = tuple((int(flat[i]), int(flat[i + 1])) for i in range(0, len(flat), 2))
            faults = body.get("f")
            plan = cls(
                seed=int(body["s"]),
                procs=int(body["p"]),
                choices=choices,
                faults=faults,
                net_seed=int(body.get("n", 0)),
                resets=None if body.get("r") is None else tuple(int(x) for x in body["r"]),
                partitions=None if body.get("q") is None else tuple(int(x) for x in body["q"]),
            )
        except (ValueError, KeyError, IndexError, TypeError, zlib.error) as exc:
            raise ValueError(f"a damaged gosim schedule plan: {text!r:.80} ({exc})") from None
        if plan.procs < 1 or any(i < 1 or n < 0 for n, i in plan.choices):
            raise ValueError(f"a damaged gosim schedule plan: {text!r:.80}")
        return plan

    def __str__(self) -> str:
        return self.encode()


def _jsonable(value: Any) -> Any:
    """Fault arguments as JSON: tuples, sets and frozensets become sorted lists where
    their order does not matter (a partition's host sets)."""
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (set, frozenset)):
        return sorted(_jsonable(v) for v in value)
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(f"fault argument {value!r} cannot be written into a plan (want JSON data)")
