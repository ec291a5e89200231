"""Markdown tables from a pytest-benchmark JSON written by ``bench_core.py``.

Usage: ``python benchmarks/report_core.py core.json [more.json ...]``

Prints, per workload, each peer's time per op (``extra_info["ns_per_op"]``: for every
peer the median of three means over at least 0.3 s of measured work, ``testing.B``'s
ns/op for Go and the summed phases of as many rounds as fill 0.3 s for the Python
peers; see ``bench_core.py``), then gosim's ratio to each peer (gosim's time over the
peer's: 2.0x means gosim takes twice as long per op, 0.5x half as long), then every
peer's ratio to Go. A later file's entry replaces an earlier one for the same workload
and peer, so a re-run of one group can be laid over a full run.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Table order: workloads as in bench_core.py, gosim first, then the natives, then by
# library; peers not listed here (gosim-p2, ...) follow gosim.
WORKLOAD_ORDER = ("spawn-join", "pingpong", "buffered", "ring", "select2")
PEER_ORDER = ("gosim", "go", "gevent", "asyncio", "trio")


@dataclass(frozen=True)
class Entry:
    """One peer's result on one workload."""

    workload: str
    peer: str
    unit: str
    ns_per_op: float
    ns_per_op_min: float | None
    ops: int | None
    rounds: int | None


def load(paths: Iterable[Path]) -> dict[tuple[str, str], Entry]:
    """Entries keyed by (workload, peer); results without bench_core's extra_info (other
    benchmark files in the same JSON) are ignored."""
    entries: dict[tuple[str, str], Entry] = {}
    for path in paths:
        data = json.loads(path.read_text())
        for bench in data.get("benchmarks", []):
            info: dict[str, Any] = bench.get("extra_info") or {}
            if "ns_per_op" not in info or "workload" not in info or "peer" not in info:
                continue
            entry = Entry(
                workload=str(info["workload"]),
                peer=str(info["peer"]),
                unit=str(info.get("unit", "op")),
                ns_per_op=float(info["ns_per_op"]),
                ns_per_op_min=_opt_float(info.get("ns_per_op_min")),
                ops=_opt_int(info.get("ops")),
                rounds=_opt_int(info.get("rounds")),
            )
            entries[entry.workload, entry.peer] = entry
    return entries


def _opt_float(x: object) -> float | None:
    return float(x) if isinstance(x, int | float) else None


def _opt_int(x: object) -> int | None:
    return int(x) if isinstance(x, int | float) else None


def _order(names: Iterable[str], preferred: Sequence[str]) -> list[str]:
    def key(name: str) -> tuple[int, str]:
        if name in preferred:
            return preferred.index(name), ""
        # gosim variants right after gosim, anything else at the end
        return (0 if name.startswith("gosim") else len(preferred)), name

    return sorted(set(names), key=key)


def fmt_time(ns: float) -> str:
    """A duration in the unit that keeps three significant figures readable."""
    if ns < 1_000:
        return f"{ns:.3g} ns"
    if ns < 1_000_000:
        return f"{ns / 1_000:.3g} µs"
    return f"{ns / 1_000_000:.3g} ms"


def fmt_ratio(r: float) -> str:
    return f"{r:.3g}x" if r < 100 else f"{r:.0f}x"


def _row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    align = ["---"] + ["---:"] * (len(header) - 1)
    return [_row(header), _row(align), *(_row(r) for r in rows)]


def render(entries: dict[tuple[str, str], Entry]) -> str:
    """The three tables as one markdown string."""
    if not entries:
        return "No bench_core.py results found (was the JSON written by bench_core.py?)\n"
    workloads = _order((w for w, _ in entries), WORKLOAD_ORDER)
    peers = _order((p for _, p in entries), PEER_ORDER)
    units = {w: e.unit for (w, _), e in entries.items()}

    def label(w: str) -> str:
        return f"{w} (per {units[w]})"

    out = ["### CPU time per op (median of means over at least 0.3 s of measured work)", ""]
    rows = [
        [label(w)]
        + [fmt_time(entries[w, p].ns_per_op) if (w, p) in entries else "—" for p in peers]
        for w in workloads
    ]
    out += _table(["workload", *peers], rows)

    gosims = [p for p in peers if p.startswith("gosim")]
    others = [p for p in peers if not p.startswith("gosim")]
    out += ["", "### gosim's time over each peer's (below 1x means gosim is faster)", ""]
    if not gosims:
        out.append("gosim has no results in this file (skipped: core not available?).")
    else:
        header = ["workload"] + [f"{g} / {p}" for g in gosims for p in others]
        rows = []
        for w in workloads:
            cells = [label(w)]
            for g in gosims:
                for p in others:
                    if (w, g) in entries and (w, p) in entries:
                        cells.append(fmt_ratio(entries[w, g].ns_per_op / entries[w, p].ns_per_op))
                    else:
                        cells.append("—")
            rows.append(cells)
        out += _table(header, rows)

    if "go" in others:
        out += ["", "### Each peer's time over Go's (GOMAXPROCS=1)", ""]
        rest = [p for p in peers if p != "go"]
        rows = [
            [label(w)]
            + [
                fmt_ratio(entries[w, p].ns_per_op / entries[w, "go"].ns_per_op)
                if (w, p) in entries and (w, "go") in entries
                else "—"
                for p in rest
            ]
            for w in workloads
        ]
        out += _table(["workload", *rest], rows)
    return "\n".join(out) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json", nargs="+", type=Path, help="pytest-benchmark JSON file(s)")
    args = parser.parse_args(argv)
    sys.stdout.write(render(load(args.json)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
