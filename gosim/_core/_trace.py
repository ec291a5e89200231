"""The runtime's event trace: what ran where and when, for replay checks and Perfetto.

Events are tuples ``(seq, time, kind, p, goid, a, b)`` appended by the scheduler:
``go`` (a = parent goid), ``run``, ``park``, ``ready``, ``gosched``, ``preempt``,
``exit``, ``steal`` (a = victim P, b = goroutines stolen), ``syscall``, ``timer``.
Time is the runtime clock, so under ``virtual_time`` a seeded run writes the same bytes
every time (:meth:`Trace.to_bytes`). :meth:`Trace.to_chrome_json` exports the Chrome
trace format with one track per P, openable in Perfetto or ``chrome://tracing``.
"""

from __future__ import annotations

import json
from typing import Any

Event = tuple[int, float, str, int, int, int, int]


class Trace:
    """Collects the scheduler's events; pass one to ``gosim.run(..., trace=Trace())``."""

    def __init__(self) -> None:
        self.events: list[Event] = []

    def emit(self, rt: Any, kind: str, p: int, goid: int, a: int, b: int) -> None:
        self.events.append((len(self.events), rt.now(), kind, p, goid, a, b))

    def to_bytes(self) -> bytes:
        """One line per event; identical between two seeded virtual-time runs."""
        return "".join(
            f"{s} {t!r} {k} p{p} g{g} {a} {b}\n" for s, t, k, p, g, a, b in self.events
        ).encode()

    def to_chrome_json(self) -> str:
        """Chrome trace JSON: a slice per goroutine run on its P's track, instants for the rest."""
        out: list[dict[str, Any]] = []
        running: dict[int, tuple[int, float]] = {}  # p -> (goid, start)
        for _, t, kind, p, goid, a, b in self.events:
            us = t * 1e6
            if kind == "run":
                running[p] = (goid, us)
                continue
            if kind in ("park", "exit", "gosched", "preempt", "syscall") and p in running:
                g, start = running.pop(p)
                out.append(
                    {
                        "name": f"G{g}",
                        "ph": "X",
                        "ts": start,
                        "dur": max(us - start, 0.001),
                        "pid": 0,
                        "tid": p,
                        "args": {"end": kind},
                    }
                )
                continue
            out.append(
                {
                    "name": kind,
                    "ph": "i",
                    "s": "t",
                    "ts": us,
                    "pid": 0,
                    "tid": p,
                    "args": {"goid": goid, "a": a, "b": b},
                }
            )
        meta = [
            {"name": "thread_name", "ph": "M", "pid": 0, "tid": p, "args": {"name": f"P{p}"}}
            for p in sorted({e[3] for e in self.events})
        ]
        return json.dumps({"traceEvents": meta + out, "displayTimeUnit": "ns"})
