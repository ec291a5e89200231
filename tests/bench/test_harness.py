"""The machinery of ``python -m benchmarks`` on a tiny fake suite: interleaving, the raw
JSON, the report's section, ``--compare`` and the exit statuses.

The real suites are smoke-run by ``pytest benchmarks --benchmark-disable``; these tests
keep the harness itself from rotting, in well under a second each (no timing asserted).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from benchmarks import __main__ as cli
from benchmarks import harness, report, suites
from benchmarks.harness import Peer, Row, Suite

ROOT = Path(__file__).resolve().parents[2]


def _peer(name: str, log: list[str], values: list[float], fail_at: int | None = None) -> Peer:
    """A peer whose k-th call returns values[k] (and logs its name), raising at call
    ``fail_at``."""
    calls = iter(range(len(values)))

    def measure() -> dict[str, float]:
        k = next(calls)
        log.append(name)
        if k == fail_at:
            raise RuntimeError(f"{name} broke")
        return {"value": values[k], "cpu": values[k] / 2}

    return Peer(name, measure)


def _suite(log: list[str], scale: float = 1.0, fail: bool = False, name: str = "fake") -> Suite:
    """Two rows: ``time`` (lower is better, peers fast/slow, one warm-up round) and
    ``rate`` (higher is better, peers fast/slow)."""

    def rows(quick: bool) -> list[Row]:
        return [
            Row("time", "ns per op", "lower", [
                _peer("fast", log, [999.0, 100.0 * scale, 101.0 * scale, 99.0 * scale]),
                _peer("slow", log, [999.0, 300.0, 310.0, 290.0], fail_at=2 if fail else None),
            ], warmup=1, extras={"cpu": "ns of CPU per op"}),
            Row("rate", "frames/s", "higher", [
                _peer("fast", log, [5e6, 5.1e6, 4.9e6]),
                _peer("slow", log, [1e6, 1e6, 1e6]),
            ]),
        ]  # fmt: skip

    return Suite(name, "A fake suite", rows, reference="fast")


def test_peers_run_interleaved_round_by_round() -> None:
    log: list[str] = []
    result = harness.run_suites([_suite(log)], quick=True, rounds=3)
    # row "time": a warm-up round, then 3 rounds, each peer once per round, the order
    # alternating (round -1, the warm-up, reversed); then row "rate" the same way
    # without a warm-up
    forward, backward = ["fast", "slow"], ["slow", "fast"]
    assert log == (backward + forward) * 2 + forward + backward + forward
    row = result["suites"]["fake"]["rows"][0]
    assert [(r["round"], r["peer"]) for r in row["rounds"]] == [
        (0, "fast"), (0, "slow"), (1, "slow"), (1, "fast"), (2, "fast"), (2, "slow"),
    ]  # fmt: skip
    assert [r["seq"] for r in row["rounds"]] == list(range(6))
    assert [r["value"] for r in row["rounds"] if r["peer"] == "fast"] == [100.0, 101.0, 99.0]
    assert harness.failures_of(result) == []


def test_a_failing_peer_is_recorded_and_the_others_go_on() -> None:
    log: list[str] = []
    result = harness.run_suites([_suite(log, fail=True)], quick=True, rounds=3)
    failures = harness.failures_of(result)
    assert [(f["row"], f["peer"], f["round"]) for f in failures] == [("time", "slow", 1)]
    assert "slow broke" in failures[0]["error"]
    row = result["suites"]["fake"]["rows"][0]
    assert [r["peer"] for r in row["rounds"]] == ["fast", "slow", "fast", "fast"]


def test_json_keeps_every_round_and_the_machine(tmp_path: Path) -> None:
    result = harness.run_suites([_suite([])], quick=False, rounds=3)
    path = tmp_path / "run.json"
    harness.write_json(result, path)
    back = harness.read_json(path)
    assert back == json.loads(json.dumps(result))
    assert len(back["suites"]["fake"]["rows"][0]["rounds"]) == 6
    assert back["machine"]["commit"]  # a git checkout: the commit is recorded
    assert back["date"].endswith("Z")
    for key in ("cpu", "cpus", "python", "loadavg_start", "loadavg_end", "gc_threshold"):
        assert key in back["machine"]
    (tmp_path / "other.json").write_text('{"benchmarks": []}')
    with pytest.raises(ValueError, match="not a `python -m benchmarks` result"):
        harness.read_json(tmp_path / "other.json")


def test_compare_flags_only_what_moved_beyond_the_noise() -> None:
    old = harness.run_suites([_suite([])], quick=False, rounds=3)
    same = harness.run_suites([_suite([], scale=1.01)], quick=False, rounds=3)
    worse = harness.run_suites([_suite([], scale=1.5)], quick=False, rounds=3)
    assert not any(c.regression for c in harness.compare(old, same))  # 1 %: within 2 %
    flagged = [c for c in harness.compare(old, worse) if c.regression]
    assert [(c.row, c.peer) for c in flagged] == [("time", "fast")]
    assert flagged[0].worse_by == pytest.approx(0.5)
    assert flagged[0].noise == pytest.approx(0.02)  # (101 - 99) / 100
    # better is not a regression, whichever way the metric runs
    assert not any(c.regression for c in harness.compare(worse, old))
    single = harness.run_suites([_suite([], scale=1.5)], quick=False, rounds=1)
    unjudged = harness.compare(old, single)
    assert unjudged and all(c.noise is None and not c.regression for c in unjudged)


@pytest.fixture
def fake_cli(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Callable[..., int]]:
    """``python -m benchmarks`` with the fake suite in place of the real ones."""
    md = tmp_path / "BENCHMARKS.md"
    md.write_text("an earlier report\n")
    (tmp_path / "docs").mkdir()

    def run(*args: str, scale: float = 1.0, fail: bool = False) -> int:
        monkeypatch.setattr(suites, "SUITES", {"fake": _suite([], scale=scale, fail=fail)})
        argv = [*args, "--benchmarks-md", str(md), "--img-dir", str(tmp_path / "img"),
                "--performance-md", str(tmp_path / "docs" / "performance.md")]  # fmt: skip
        return cli.main(argv)

    yield run


def test_the_command_writes_json_markdown_plots_and_exit_statuses(
    fake_cli: Callable[..., int], tmp_path: Path
) -> None:
    old = tmp_path / "old.json"
    assert fake_cli("--rounds", "3", "--json", str(old)) == 0
    text = (tmp_path / "BENCHMARKS.md").read_text()
    assert "an earlier report" not in text
    block = report.read_blocks(text)["fake"]
    assert f"- **Raw rounds**: `{old}`" in block and "--only fake --rounds 3" in block
    assert "| time | 3x (2.93x to 3.07x) |" in block  # slow over fast, round by round
    assert "](img/bench_fake.png)" in (tmp_path / "docs" / "performance.md").read_text()
    assert (tmp_path / "img" / "bench_fake.png").stat().st_size > 0
    assert harness.read_json(old)["suites"]["fake"]["rows"][0]["rounds"]
    new = ["--rounds", "3", "--json", str(tmp_path / "new.json"), "--no-plots"]  # plots: slow
    assert fake_cli(*new, "--compare", str(old), scale=1.5) == 3
    assert fake_cli(*new, "--compare", str(old)) == 0
    assert fake_cli(*new, fail=True) == 1
    # --quick leaves BENCHMARKS.md and the plots alone
    before = (tmp_path / "BENCHMARKS.md").read_text()
    assert fake_cli("--quick", "--json", str(tmp_path / "quick.json"), scale=2.0) == 0
    assert (tmp_path / "BENCHMARKS.md").read_text() == before


def test_benchmarks_md_has_markers_for_every_suite() -> None:
    text = (ROOT / "BENCHMARKS.md").read_text()
    for name in suites.SUITES:
        assert text.count(report.begin_marker(name)) == 1, name
        assert text.count(report.end_marker(name)) == 1, name


def test_a_costly_row_runs_at_most_its_cap_of_rounds() -> None:
    log: list[str] = []
    row = Row("costly", "ns per op", "lower", [_peer("only", log, [1.0] * 5)], max_rounds=2)
    suite = Suite("capped", "capped", lambda quick: [row])
    result = harness.run_suites([suite], quick=False, rounds=5)
    assert [r["round"] for r in result["suites"]["capped"]["rows"][0]["rounds"]] == [0, 1]
    assert log == ["only", "only"]


def test_relative_compare_cancels_a_load_that_moved_every_peer() -> None:
    """Every peer 1.5x slower (the machine got busier): the absolute comparison flags the
    fast peer, the relative one (time over the reference, round by round) does not; a
    peer that alone got slower is flagged by both."""

    def suite(fast: float, slow: float) -> Suite:
        def rows(quick: bool) -> list[Row]:
            return [Row("time", "ns per op", "lower", [
                _peer("fast", [], [100.0 * fast, 101.0 * fast, 99.0 * fast]),
                _peer("slow", [], [300.0 * slow, 303.0 * slow, 297.0 * slow]),
            ])]  # fmt: skip

        return Suite("fake", "fake", rows, reference="fast")

    old = harness.run_suites([suite(1.0, 1.0)], quick=False, rounds=3)
    busier = harness.run_suites([suite(1.5, 1.5)], quick=False, rounds=3)
    assert [c.peer for c in harness.compare(old, busier) if c.regression] == ["fast", "slow"]
    relative = harness.compare(old, busier, relative=True)
    assert [c.peer for c in relative] == ["slow"]  # the reference is not judged
    assert not relative[0].regression and relative[0].worse_by == pytest.approx(0.0)
    slower = harness.run_suites([suite(1.0, 1.5)], quick=False, rounds=3)
    flagged = [c for c in harness.compare(old, slower, relative=True) if c.regression]
    assert [c.peer for c in flagged] == ["slow"]
    assert flagged[0].worse_by == pytest.approx(0.5)


def test_postgres_rows_without_postgresql_say_why_and_the_sqlite_peer_still_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No PostgreSQL on the machine: every peer that needs the cluster is recorded as
    skipped with the reason (the report lists it), and the SQLite peer beside them runs."""
    from benchmarks import bench_postgres  # noqa: PLC0415

    monkeypatch.setattr(bench_postgres, "PG_BIN", None)
    suite = suites.SUITES["postgres"]
    try:
        done = [harness.run_row(suite, row, 1, harness.Reporter()) for row in suite.rows(True)]
    finally:
        suites.cleanup()
    failures = [f for row in done for f in row["failures"]]
    assert sorted(f["peer"] for f in failures) == sorted(
        [suites.PG_GROUP, suites.PG_PER_CALL, "1 server", "2 servers", *bench_postgres.KEYED]
        + [f"{n}, {mode}" for n in ("1 server", "2 servers") for mode in ("two-step", "one-step")]
        + ["go-ledger-postgres-default"]
    )
    for f in failures:
        assert f["round"] == -1  # at the peer's open: nothing ran
        assert "skipped: PostgreSQL is not installed" in f["error"], f["error"]
    assert [r["peer"] for r in done[0]["rounds"]] == ["sqlite FULL"]
    assert done[0]["rounds"][0]["value"] > 0 and done[0]["rounds"][0]["server_cpu_ns"] > 0
