"""BENCHMARKS.md and the performance page from a stored result (``tests/bench/fixtures/
two_suites.json``, two suites of made-up rounds): each suite's section carries its own
run's header, ratios come before absolute figures with the baseline inside the group, and
regenerating one suite leaves every other section byte for byte as it was."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest

from benchmarks import harness, report

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = Path(__file__).parent / "fixtures" / "two_suites.json"
ORDER = [("alpha", "The alpha suite"), ("beta", "The beta suite")]


@pytest.fixture
def result() -> dict[str, Any]:
    return harness.read_json(FIXTURE)


def _write(result: dict[str, Any], names: list[str], tmp_path: Path, json_name: str) -> str:
    md, perf = tmp_path / "BENCHMARKS.md", tmp_path / "docs" / "performance.md"
    perf.parent.mkdir(exist_ok=True)
    images: dict[str, list[Path | None]] = {
        n: [tmp_path / "docs" / "img" / report.plot_name(n, 0)] for n in names
    }
    report.write_report(
        result,
        names,
        ORDER,
        md,
        perf,
        tmp_path / "benchmarks" / json_name,
        images,
        tmp_path,
        profiles=None,
    )
    return md.read_text()


def test_a_section_names_its_machine_commit_load_and_command(result: dict[str, Any]) -> None:
    block = report.suite_block(result, "alpha", "benchmarks/results/run.json")
    head = block.split("\n###")[0]
    assert "Example CPU 9000, 2 cores" in head
    assert "CPython 3.11.7" in head and "go version go1.27.3 linux/amd64" in head
    assert "commit `0123456789`" in head and "2026-11-26 10:00:01 UTC" in head
    assert "3 interleaved rounds per peer" in head
    assert "load average (1 min) 1.5 to 2.5 during the run" in head  # the samples' range
    assert "`python -m benchmarks --only alpha --rounds 3`" in head
    assert "`benchmarks/results/run.json`" in head


def test_ratios_come_first_taken_round_by_round_over_a_baseline_in_the_group(
    result: dict[str, Any],
) -> None:
    block = report.suite_block(result, "alpha")
    ratios = block.index("| workload | gosim / go |")
    absolute = block.index("| workload | gosim | go |")
    assert ratios < absolute
    # round by round: 200/100, 220/100, 210/105 -> median 2, range 2 to 2.2
    assert "| spawn | 2x (2x to 2.2x) |" in block
    assert "| spawn (time per op) | 210 ns (200 ns to 220 ns) | 100 ns (100 ns to 105 ns) |" in (
        block
    )
    # the keyed row has no "go" peer: its ratios are to its Go twin, which is in the table
    keyed = block[block.index("### keyed") :]
    assert "Time over go-twin's" in keyed and "| go-twin | 1x (baseline) |" in keyed
    assert "over go's" not in keyed
    # a rate's ratio is a time: 10000/5000, 12000/4000, 11000/5500 -> 2, 3, 2
    assert "| python | 2x (2x to 3x) | 5 k (4 k to 5.5 k) |" in keyed
    # the row's declared ratio, and the wall-clock extra beside the CPU figures
    assert "| python over the twin | 0.5x | 0.333x to 0.5x |" in block
    assert "Wall clock per op, median of the rounds (range):" in block
    # a suite without a reference divides by its row's first peer
    beta = report.suite_block(result, "beta")
    assert "Time over group commit's" in beta and "| one per op | 10x" in beta


def test_every_note_belongs_to_a_table_of_the_real_suites() -> None:
    """A note is keyed by its table (a group's first row, an extra figure, a row's
    ratios): a renamed row must not leave its note behind, silently unused."""
    from benchmarks import suites  # noqa: PLC0415

    tables: set[tuple[str, str]] = set()
    for name, suite in suites.SUITES.items():
        rows = suite.rows(False)  # Row objects only: nothing starts before a round
        tables |= {(name, row.name) for row in rows}
        tables |= {(name, f"extra:{key}") for row in rows for key in row.extras}
        tables |= {(name, f"ratios:{row.name}") for row in rows if row.ratios}
    suites.cleanup()
    assert set(report.NOTES) <= tables, set(report.NOTES) - tables
    # and every suite's first table has one
    assert {name for name, _ in report.NOTES} == set(suites.SUITES)


def test_regenerating_one_suite_leaves_the_other_sections_byte_identical(
    result: dict[str, Any], tmp_path: Path
) -> None:
    first = _write(result, ["alpha", "beta"], tmp_path, "first.json")
    perf_first = (tmp_path / "docs" / "performance.md").read_text()
    blocks = report.read_blocks(first)
    assert set(blocks) == {"alpha", "beta"}
    assert "`benchmarks/first.json`" in blocks["alpha"]
    assert "](docs/img/bench_alpha.png)" in blocks["alpha"]
    assert "](img/bench_alpha.png)" in perf_first  # the page's own relative path

    later = copy.deepcopy(result)
    later["machine"]["commit"] = "fedcba9876543210fedcba9876543210fedcba98"
    later["date"] = "2026-11-27T09:00:00Z"
    alpha = later["suites"]["alpha"]
    alpha["date"] = "2026-11-27T09:00:01Z"
    alpha["loadavg"] = [[7.0, 6.0, 5.0], [8.0, 6.0, 5.0]]
    for rec in alpha["rows"][0]["rounds"]:
        rec["value"] *= 3
    del later["suites"]["beta"]  # a run of alpha alone
    second = _write(later, ["alpha"], tmp_path, "second.json")

    again = report.read_blocks(second)
    assert again["beta"] == blocks["beta"]  # byte for byte
    assert again["alpha"] != blocks["alpha"]
    assert "commit `fedcba9876`" in again["alpha"] and "7.0 to 8.0" in again["alpha"]
    # everything outside alpha's block is unchanged too
    a0, a1 = first.index(report.begin_marker("alpha")), first.index(report.end_marker("alpha"))
    b0, b1 = second.index(report.begin_marker("alpha")), second.index(report.end_marker("alpha"))
    assert first[:a0] == second[:b0] and first[a1:] == second[b1:]
    # the performance page is the same sections, so beta's is unchanged there as well
    perf_second = (tmp_path / "docs" / "performance.md").read_text()
    assert report.read_blocks(perf_second)["beta"] == report.read_blocks(perf_first)["beta"]
    assert report.read_blocks(perf_second)["alpha"] != report.read_blocks(perf_first)["alpha"]
    # and rendering the same result twice gives the same file
    assert _write(later, ["alpha"], tmp_path, "second.json") == second


def test_a_suite_never_run_says_how_to_run_it() -> None:
    text = report.render_report({}, ORDER, profiles=None)
    assert "`python -m benchmarks --only beta` writes this section" in text
    assert set(report.read_blocks(text)) == {"alpha", "beta"}


def test_the_report_ends_with_the_hand_written_profiles(tmp_path: Path) -> None:
    profiles = tmp_path / "profiles.md"
    profiles.write_text("## Where the misses go\n\nRead, not generated.\n")
    text = report.render_report({}, ORDER, profiles=profiles)
    assert text.endswith("## Where the misses go\n\nRead, not generated.\n")
    assert set(report.read_blocks(text)) == {"alpha", "beta"}
    assert report.render_report({}, ORDER, profiles=tmp_path / "absent.md").endswith(
        report.end_marker("beta") + "\n"
    )


def test_plots_normalise_each_group_to_a_peer_of_the_group(
    result: dict[str, Any], tmp_path: Path
) -> None:
    stale = tmp_path / "bench_alpha_7.png"
    stale.write_bytes(b"an earlier run's plot")
    paths = report.plot_suite(result, "alpha", tmp_path)
    # two groups (spawn+pingpong: gosim/go; keyed: go-twin/python), one plot each
    assert [p.name if p else None for p in paths] == ["bench_alpha.png", "bench_alpha_2.png"]
    assert all(p is not None and p.stat().st_size > 0 for p in paths)
    assert not stale.exists()  # a plot no group of this run draws is removed


def test_the_committed_report_is_what_the_generator_makes_of_its_runs() -> None:
    """BENCHMARKS.md names a stored run per section, its plots exist, no stored run is
    left that no section names, and the performance page is the report's sections."""
    text = (ROOT / "BENCHMARKS.md").read_text()
    blocks = report.read_blocks(text)
    named = set()
    for name, block in blocks.items():
        runs = re.findall(r"\*\*Raw rounds\*\*: `([^`]+)`", block)
        assert len(runs) == 1, name
        assert (ROOT / runs[0]).is_file(), runs[0]
        named.add(runs[0])
        stored = harness.read_json(ROOT / runs[0])
        assert name in stored["suites"], (name, runs[0])
        for image in re.findall(r"\]\((docs/img/[^)]+)\)", block):
            assert (ROOT / image).is_file(), image
    stored_runs = {
        f"benchmarks/results/{p.name}" for p in (ROOT / "benchmarks/results").glob("*.json")
    }
    assert stored_runs == named
    assert (ROOT / "docs" / "performance.md").read_text() == report.performance_page(text)
    # the hand-written profiles close the report, as they are
    assert text.rstrip("\n").endswith(report.PROFILES.read_text().rstrip("\n"))


def test_a_ratio_with_a_zero_on_both_sides_is_no_ratio_not_a_failure() -> None:
    row = {
        "name": "a fault, shrunk",
        "unit": "decisions kept",
        "better": "lower",
        "peers": ["random", "PCT", "absent"],
        "extras": {},
        "rounds": [
            {"round": 0, "peer": "random", "value": 0.0},
            {"round": 0, "peer": "PCT", "value": 0.0},
        ],
    }
    ratios = report.paired(row, "random")
    assert report._ratio_cell(row, ratios, "PCT") == "-"
    assert report._ratio_cell(row, ratios, "absent") == "failed"
