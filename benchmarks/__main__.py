"""``python -m benchmarks``: every benchmark suite, peers interleaved round by round.

    python -m benchmarks                    every suite; writes the JSON, the report
                                            (BENCHMARKS.md, docs/performance.md) and
                                            its plots (docs/img/bench_<suite>*.png)
    python -m benchmarks --quick            a tour in about a minute (JSON only)
    python -m benchmarks --only network     one suite (repeat --only for more): its
                                            section of the report alone is rewritten
    python -m benchmarks --compare OLD.json flag cells that got worse beyond the noise
    python -m benchmarks --from-json R.json rewrite the report's sections of the suites in
                                            R.json (and their plots) without running

A run that writes the report keeps its JSON in benchmarks/results/, named in the header
of every section it wrote.

Exit status: 0 when every peer ran; 1 when a peer failed to run (the message says which
and why); 3 when ``--compare`` flagged a regression; 2 for a usage error.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from benchmarks import harness, procs, report
from benchmarks.harness import Failure, Peer, Row, Suite

EXIT_PEER_FAILED = 1
EXIT_REGRESSION = 3
DEFAULT_ROUNDS = 7


class RichReporter(harness.Reporter):
    def __init__(self, progress: Progress, console: Console) -> None:
        self.progress = progress
        self.console = console
        self.tasks: dict[str, Any] = {}

    def suite_started(self, suite: Suite, cells: int) -> None:
        self.tasks[suite.name] = self.progress.add_task(suite.name, total=cells)

    def cell_started(self, suite: Suite, row: Row, peer: Peer, round_no: int) -> None:
        what = "warm-up" if round_no < 0 else f"round {round_no + 1}"
        self.progress.update(
            self.tasks[suite.name], description=f"{suite.name}: {row.name} · {peer.name} · {what}"
        )

    def cell_done(self, suite: Suite) -> None:
        self.progress.advance(self.tasks[suite.name])

    def failed(self, failure: Failure) -> None:
        self.console.print(
            f"[bold red]FAILED[/] {failure.suite} / {failure.row} / {failure.peer}: "
            f"{failure.error}",
            highlight=False,
        )


def summary_table(result: dict[str, Any], name: str) -> Table:
    """One line per row and peer (narrow enough for a terminal), extra figures last."""
    suite = result["suites"][name]
    ref = suite["reference"]
    extras: dict[str, str] = {}
    for row in suite["rows"]:
        extras.update(row["extras"])
    table = Table(title=suite["title"])
    table.add_column("workload")
    table.add_column("peer")
    for col in ("median", "spread", f"over {ref}" if ref else "", *extras.values()):
        table.add_column(col, justify="right")
    for row in suite["rows"]:
        cs = harness.cells(row)
        base = cs.get(ref) if ref else None
        for i, p in enumerate(row["peers"]):
            label = f"{row['name']} ({row['unit']})" if i == 0 else ""
            c = cs.get(p)
            if c is None:
                table.add_row(label, p, "[red]failed[/]")
                continue
            spread = "" if c.spread is None else f"{c.spread:.0%}"
            ratio = ""
            if base is not None and base.median and c.median:
                x = c.median / base.median if row["better"] == "lower" else base.median / c.median
                ratio = harness.fmt_ratio(x)
            more = []
            for key, unit in extras.items():
                e = harness.cells(row, key).get(p)
                more.append("" if e is None else harness.fmt_value(e.median, unit))
            table.add_row(label, p, harness.fmt_value(c.median, row["unit"]), spread, ratio, *more)
        table.add_section()
    return table


def ratio_table(result: dict[str, Any], name: str) -> Table | None:
    """The rows' declared ratios (each round's pair from the same round), if any."""
    lines = [
        (row["name"], label, c)
        for row in result["suites"][name]["rows"]
        for label, c in harness.row_ratios(row)
    ]
    if not lines:
        return None
    table = Table(title=f"{result['suites'][name]['title']}: ratios within each round")
    for col in ("workload", "ratio", "median", "range"):
        table.add_column(col, justify="right" if col in ("median", "range") else "left")
    for row_name, label, c in lines:
        if c is None:
            table.add_row(row_name, label, "[red]no round[/]", "")
            continue
        lo, hi = min(c.values), max(c.values)
        rng = f"{harness.fmt_ratio(lo)} to {harness.fmt_ratio(hi)}"
        table.add_row(row_name, label, harness.fmt_ratio(c.median), rng)
    return table


def publish(
    result: dict[str, Any],
    names: list[str],
    json_path: Path | None,
    args: argparse.Namespace,
    all_suites: dict[str, Suite],
    plots: bool,
    markdown: bool = True,
) -> None:
    """Draw the plots of suites ``names`` and rewrite their sections of the report and the
    performance page (the other suites' sections are kept)."""
    images: dict[str, list[Path | None]] = {}
    if plots:
        for name in names:
            images[name] = report.plot_suite(result, name, args.img_dir)
    if markdown:
        order = [(s.name, s.title) for s in all_suites.values()]
        order += [(n, result["suites"][n]["title"]) for n in names if n not in all_suites]
        report.write_report(
            result, names, order, args.benchmarks_md, args.performance_md, json_path,
            images, root=harness.ROOT,
        )  # fmt: skip


def suite_command(name: str, quick: bool, rounds: int) -> str:
    """The command line that runs suite ``name`` alone with these settings."""
    words = ["python -m benchmarks", "--only", name]
    if quick:
        words.append("--quick")
    if rounds != (2 if quick else DEFAULT_ROUNDS):
        words += ["--rounds", str(rounds)]
    return " ".join(words)


def main(argv: list[str] | None = None) -> int:
    from benchmarks import suites  # noqa: PLC0415 -- after argparse's --help

    ap = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--quick", action="store_true", help="small sizes, 2 rounds: about a minute")
    ap.add_argument(
        "--only",
        action="append",
        choices=list(suites.SUITES),
        metavar="SUITE",
        help=f"run this suite only (repeatable): {', '.join(suites.SUITES)}",
    )
    ap.add_argument("--rounds", type=int, help="interleaved rounds per peer (default 7, quick 2)")
    ap.add_argument(
        "--json",
        type=Path,
        help="where the raw JSON goes (default .benchmarks/harness/<date>-<commit>.json)",
    )
    ap.add_argument(
        "--compare",
        type=Path,
        metavar="OLD.json",
        help="flag regressions beyond the noise against an earlier run",
    )
    ap.add_argument(
        "--relative",
        action="store_true",
        help="with --compare: judge each peer's time over its suite's reference peer, "
        "round by round, not its own figure (for a loaded machine)",
    )
    ap.add_argument(
        "--markdown",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="rewrite the run's suites' sections of BENCHMARKS.md and docs/performance.md "
        "(default: on, off with --quick)",
    )
    ap.add_argument(
        "--plots",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="draw docs/img/bench_<suite>*.png, a plot per group of workloads "
        "(default: on, off with --quick)",
    )
    ap.add_argument(
        "--from-json",
        type=Path,
        action="append",
        metavar="RESULT.json",
        help="rewrite the report's sections (and plots) of the suites in this earlier run's "
        "JSON, without running anything (repeatable; a later file wins)",
    )
    ap.add_argument(
        "--benchmarks-md", type=Path, default=harness.ROOT / "BENCHMARKS.md", help=argparse.SUPPRESS
    )
    ap.add_argument(
        "--performance-md",
        type=Path,
        default=harness.ROOT / "docs" / "performance.md",
        help=argparse.SUPPRESS,
    )
    ap.add_argument(
        "--img-dir", type=Path, default=harness.ROOT / "docs" / "img", help=argparse.SUPPRESS
    )
    args = ap.parse_args(argv)
    rounds = args.rounds or (2 if args.quick else DEFAULT_ROUNDS)
    if rounds < 1:
        ap.error("--rounds must be at least 1")
    write_md = (not args.quick) if args.markdown is None else args.markdown
    write_plots = (not args.quick) if args.plots is None else args.plots
    old = harness.read_json(args.compare) if args.compare else None
    if args.from_json:
        for path in args.from_json:
            earlier = harness.read_json(path)
            names = list(earlier["suites"])
            publish(earlier, names, path, args, suites.SUITES, write_plots)
            print(f"{path}: sections {', '.join(names)} rewritten in {args.benchmarks_md}")
        return 0
    chosen = [suites.SUITES[name] for name in (args.only or suites.SUITES)]

    console = Console(stderr=True)
    console.print(
        f"[bold]python -m benchmarks[/]: {', '.join(s.name for s in chosen)}; "
        f"{rounds} interleaved rounds{' (quick sizes)' if args.quick else ''}"
    )
    console.print(suites.GC_NOTE, highlight=False)
    start = time.monotonic()
    gc.set_threshold(*procs.GC_THRESHOLD)  # the in-process Python peers' collector pace
    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
    )
    try:
        with progress:
            reporter = RichReporter(progress, console)
            result = harness.run_suites(chosen, quick=args.quick, rounds=rounds, reporter=reporter)
    finally:
        suites.cleanup()
    result["machine"]["go_version"] = suites.go_version_line()
    result["gc_note"] = suites.GC_NOTE
    result["seconds"] = round(time.monotonic() - start, 1)
    for suite in chosen:
        # the command that reruns this suite alone, as the report shows it
        result["suites"][suite.name]["command"] = suite_command(suite.name, args.quick, rounds)

    for suite in chosen:
        console.print(summary_table(result, suite.name))
        ratios = ratio_table(result, suite.name)
        if ratios is not None:
            console.print(ratios)
    m = result["machine"]
    stamp = result["date"].replace(":", "").replace("-", "")
    # A run that writes the report keeps its rounds beside it (the report names the
    # file); another run's go to the untracked .benchmarks/.
    stem = f"{stamp}-{m['commit'][:10]}-{'+'.join(s.name for s in chosen)}"
    where = harness.ROOT / ("benchmarks/results" if write_md else ".benchmarks/harness")
    path = args.json or where / f"{stem}.json"
    harness.write_json(result, path)
    console.print(f"raw rounds: {path}")
    if write_md or write_plots:
        publish(result, [s.name for s in chosen], path if write_md else None, args,
                suites.SUITES, write_plots, write_md)  # fmt: skip
        if write_md:
            console.print(f"sections {', '.join(s.name for s in chosen)} regenerated in "
                          f"{args.benchmarks_md} and {args.performance_md}")  # fmt: skip

    status = 0
    if old is not None:
        if old["quick"] != result["quick"]:
            console.print(
                "[yellow]warning:[/] one run used --quick sizes and the other did not: "
                "rates of different sizes differ by more than noise"
            )
        if old["machine"]["host"] != result["machine"]["host"]:
            console.print(f"[yellow]warning:[/] {args.compare} was taken on another machine")
        changes = harness.compare(old, result, relative=args.relative)
        regressions = [c for c in changes if c.regression]
        unjudged = sum(1 for c in changes if c.noise is None)
        what = "time over the reference peer's" if args.relative else "figure"
        table = Table(title=f"against {args.compare}: {what} worse by more than the noise")
        for col in ("suite", "row", "peer", "old", "new", "worse by", "noise"):
            table.add_column(col)
        for c in regressions:
            table.add_row(
                c.suite,
                c.row,
                c.peer,
                f"{c.old:.4g}",
                f"{c.new:.4g}",
                f"{c.worse_by:+.0%}",
                f"{c.noise:.0%}",
            )
        console.print(table)
        console.print(
            f"{len(changes)} cells compared, {len(regressions)} regressions beyond the noise"
            + (f", {unjudged} with fewer than 2 rounds (not judged)" if unjudged else "")
        )
        if regressions:
            status = EXIT_REGRESSION
    failures = harness.failures_of(result)
    if failures:
        console.print(f"[bold red]{len(failures)} peer failure(s):[/]")
        for f in failures:
            console.print(
                f"  {f['suite']} / {f['row']} / {f['peer']}: {f['error']}", highlight=False
            )
        status = EXIT_PEER_FAILED
    console.print(f"done in {result['seconds']:.0f} s")
    return status


if __name__ == "__main__":
    sys.exit(main())
