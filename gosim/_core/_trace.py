"""The runtime's event trace: what ran where and when, for replay checks and Perfetto.

Events are tuples ``(seq, time, kind, p, goid, a, b)`` appended by the scheduler:
``go`` (a = parent goid), ``run``, ``park``, ``ready``, ``gosched``, ``preempt``,
``exit``, ``steal`` (a = victim P, b = goroutines stolen), ``syscall``, ``timer``.
Time is the runtime clock, so under ``virtual_time`` a seeded run writes the same bytes
every time (:meth:`Trace.to_bytes`). The trace also notes the function each goroutine
runs, when it first appears.

:meth:`Trace.to_chrome_json` exports the Chrome trace format, openable in Perfetto or
``chrome://tracing``: the runtime is one process (named by ``process``), each goroutine
a track of its own named by its function (``G7 netframe._drivers._read_connection``),
its runs slices on it, labelled with the P they ran on; events of no goroutine (timers)
go on a ``runtime`` track. :meth:`Trace.merge_chrome_json` puts the traces of several
processes in one file, one Perfetto process each; with ``wall_clock=True`` their times
are wall-clock times, so that they line up.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from typing import Any

from gosim._core._dump import g_funcname

Event = tuple[int, float, str, int, int, int, int]

#: Kinds that end a goroutine's run on its P (the slice's end).
_RUN_ENDS = frozenset(("park", "exit", "gosched", "preempt", "syscall"))


class Trace:
    """Collects the scheduler's events; pass one to ``gosim.run(..., trace=Trace())``.

    ``process`` names the Perfetto process the export shows (default ``gosim``) and
    ``pid`` numbers it (give each process its own when merging). ``wall_clock``: export
    times as wall-clock times (``time.time()``, taken once against the runtime clock
    at the first event), for traces of processes meant to be merged; a virtual-time run
    keeps the runtime clock, so its export is the same bytes for a seed."""

    def __init__(self, process: str | None = None, pid: int = 0, wall_clock: bool = False) -> None:
        self.events: list[Event] = []
        #: goroutine id -> the function it runs (``module.qualname``).
        self.names: dict[int, str] = {}
        self._labels: dict[int, str] = {}  # goroutine id -> its function's qualname
        self.process = process
        self.pid = pid
        self.wall_clock = wall_clock
        self._offset: float | None = None  # wall time minus runtime time
        self._roots: dict[int, str] = {}  # goroutine id -> the process it starts

    def name_process(self, goid: int, name: str) -> None:
        """Show goroutine ``goid`` and every goroutine it starts from now on (and they
        start, transitively) as a Perfetto process of their own, ``name``: the
        processes of a system simulated in one runtime. Each gets a pid of its own
        after the trace's, in the order named."""
        self._roots[goid] = name

    def emit(self, rt: Any, kind: str, p: int, goid: int, a: int, b: int) -> None:
        """Record one scheduler event (``kind`` on P ``p`` for goroutine ``goid``, two
        event-specific numbers ``a`` and ``b``) at the runtime's clock; the runtime calls it."""
        now = rt.now()
        if goid and goid not in self.names:
            g = rt.allg.get(goid)
            self.names[goid] = g_funcname(g) if g is not None else "?"
            self._labels[goid] = _qualname(g) if g is not None else "?"
        if self._offset is None and self.wall_clock:
            self._offset = time.time() - now
        self.events.append((len(self.events), now, kind, p, goid, a, b))

    def to_bytes(self) -> bytes:
        """One line per event; identical between two seeded virtual-time runs."""
        return "".join(
            f"{s} {t!r} {k} p{p} g{g} {a} {b}\n" for s, t, k, p, g, a, b in self.events
        ).encode()

    def _pids(self) -> tuple[dict[int, int], dict[int, str]]:
        """Each goroutine's pid (the process its nearest named ancestor starts, else the
        trace's own), and each pid's process name."""
        processes = {self.pid: self.process or "gosim"}
        root_pid: dict[int, int] = {}
        for i, (goid, name) in enumerate(self._roots.items()):
            root_pid[goid] = self.pid + 1 + i
            processes[self.pid + 1 + i] = name
        pid_of: dict[int, int] = {}
        for _, _, kind, _, goid, parent, _ in self.events:
            if goid in root_pid:
                pid_of[goid] = root_pid[goid]
            elif kind == "go":
                pid_of[goid] = pid_of.get(parent, self.pid)
        return pid_of, processes

    def to_chrome_events(self) -> list[dict[str, Any]]:
        """The Chrome trace events of :meth:`to_chrome_json`, metadata first."""
        pid_of, processes = self._pids()
        own = self.pid
        offset = self._offset or 0.0
        out: list[dict[str, Any]] = []
        running: dict[int, tuple[int, float]] = {}  # p -> (goid, start)
        names, labels = self.names, self._labels
        for _, t, kind, p, goid, a, b in self.events:
            us = (t + offset) * 1e6
            if kind == "run":
                running[p] = (goid, us)
                continue
            if kind in _RUN_ENDS and p in running:
                g, start = running.pop(p)
                out.append(
                    {
                        "name": labels.get(g, "?"),
                        "ph": "X",
                        "ts": start,
                        "dur": max(us - start, 0.001),
                        "pid": pid_of.get(g, own),
                        "tid": g,
                        "args": {"p": p, "end": kind},
                    }
                )
                if kind != "syscall":
                    continue
            out.append(
                {
                    "name": kind,
                    "ph": "i",
                    "s": "t",
                    "ts": us,
                    "pid": pid_of.get(goid, own),
                    "tid": goid,
                    "args": {"p": p, "a": a, "b": b},
                }
            )
        meta: list[dict[str, Any]] = [
            {"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": name}}
            for pid, name in processes.items()
        ]
        for goid in sorted({e[4] for e in self.events}):
            pid = pid_of.get(goid, own)
            name = f"G{goid} {names.get(goid, '?')}" if goid else "runtime"
            meta.append(
                {"name": "thread_name", "ph": "M", "pid": pid, "tid": goid, "args": {"name": name}}
            )
            meta.append(
                {
                    "name": "thread_sort_index",
                    "ph": "M",
                    "pid": pid,
                    "tid": goid,
                    "args": {"sort_index": goid},
                }
            )
        return meta + out

    def to_chrome_json(self) -> str:
        """Chrome trace JSON: a track per goroutine named by its function, its runs as
        slices (``args.p``: the P), instants for the rest; one process (see the class)."""
        return json.dumps({"traceEvents": self.to_chrome_events(), "displayTimeUnit": "ns"})

    @staticmethod
    def merge_chrome_json(docs: Iterable[str]) -> str:
        """One Chrome trace of several (each a :meth:`to_chrome_json` of a process with
        its own ``pid``): every process stays a Perfetto process of its own."""
        events: list[dict[str, Any]] = []
        for doc in docs:
            events += json.loads(doc)["traceEvents"]
        return json.dumps({"traceEvents": events, "displayTimeUnit": "ns"})


def _qualname(g: Any) -> str:
    """A slice's label: the function's qualified name without its module."""
    fn = g.fn
    if fn is not None:
        return str(getattr(fn, "__qualname__", None) or getattr(fn, "__name__", fn))
    code = getattr(g.coro, "cr_code", None)
    return str(code.co_qualname) if code is not None else "?"
