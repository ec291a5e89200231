"""Trace parsing, replay and the ``python -m gosim.mem report`` command."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gosim import mem
from gosim.mem._replay import (
    TraceFormatError,
    format_report,
    parse_trace,
    replay_trace,
    report_file,
    synthetic_trace,
)


def test_parse_and_replay_counts() -> None:
    ops = parse_trace("# demo\na 64\na 100000 1\n\na 5\nf 0\ngc\na 64 # comment\n")
    assert ops.tolist() == [[0, 64, 0], [0, 100000, 1], [0, 5, 0], [1, 0, 0], [2, 0, 0], [0, 64, 0]]
    rep = replay_trace(ops)
    last = rep.final
    assert last[0].objects == 1 and last[0].span_bytes == 13 * mem.PAGE_SIZE  # large
    assert last[6].objects == 1 and last[6].requested_bytes == 64  # class 6: 64 bytes
    assert last[2].objects == 1 and last[2].requested_bytes == 5  # the tiny block
    assert rep.samples[-1].requested == 100000 + 5 + 64
    assert "per size class" in format_report(rep)


@pytest.mark.parametrize("bad", ["a", "a x", "a 0", "a -3", "f", "x 1", "gc 1", "a 1 2 3"])
def test_bad_lines_name_the_line(bad: str) -> None:
    with pytest.raises(TraceFormatError, match="line 2"):
        parse_trace(f"a 8\n{bad}\n")


def test_free_of_unknown_object_fails() -> None:
    with pytest.raises(ValueError, match="trace operation 1"):
        replay_trace(parse_trace("a 8\nf 3\n"))
    with pytest.raises(ValueError, match="trace operation 2"):
        replay_trace(parse_trace("a 8\nf 0\nf 0\n"))


def test_exhaustion_in_trace() -> None:
    with pytest.raises(mem.OutOfMemoryError, match="trace operation 1"):
        replay_trace(parse_trace("a 40000\na 40000\n"), arena_bytes=6 * mem.PAGE_SIZE)


def test_synthetic_trace_replays_with_gc() -> None:
    ops = parse_trace(synthetic_trace(20000, seed=3, gc_every=5000))
    rep = replay_trace(ops)
    assert rep.ops == 20000
    ends = rep.samples[-1]
    assert ends.heap_alloc >= ends.requested
    assert ends.heap_inuse >= ends.heap_alloc


def test_cli_report_with_plot(tmp_path: Path) -> None:
    trace = tmp_path / "t.txt"
    trace.write_text(synthetic_trace(5000, seed=1))
    png = tmp_path / "out.png"
    cmd = [sys.executable, "-m", "gosim.mem", "report", str(trace), "--plot", str(png)]
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "replayed 5000 operations" in proc.stdout
    assert png.stat().st_size > 1000


@pytest.mark.slow
def test_million_operation_trace(tmp_path: Path) -> None:
    trace = tmp_path / "t1m.txt"
    trace.write_text(synthetic_trace(1_000_000, seed=7, gc_every=200_000))
    rep = report_file(trace)
    assert rep.ops == 1_000_000
