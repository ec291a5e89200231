"""``python -m gosim.mem report TRACEFILE [--plot out.png] [--arena BYTES]``.

Replays an allocation trace (format: ``gosim/mem/_replay.py``) through a fresh heap and
prints occupancy and waste per size class; ``--plot`` also draws them.
``python -m gosim.mem synth N OUT`` writes a synthetic trace of N operations.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ._replay import format_report, report_file, synthetic_trace


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gosim.mem")
    sub = parser.add_subparsers(dest="cmd", required=True)
    rep = sub.add_parser("report", help="replay a trace; print (and plot) per-class waste")
    rep.add_argument("trace")
    rep.add_argument("--plot", default=None, help="write a PNG figure here")
    rep.add_argument("--arena", type=int, default=None, help="arena bytes (default: fit)")
    syn = sub.add_parser("synth", help="write a synthetic trace")
    syn.add_argument("nops", type=int)
    syn.add_argument("out")
    syn.add_argument("--seed", type=int, default=0)
    syn.add_argument("--gc-every", type=int, default=0)
    args = parser.parse_args(argv)
    if args.cmd == "synth":
        Path(args.out).write_text(synthetic_trace(args.nops, args.seed, gc_every=args.gc_every))
        return 0
    report = report_file(args.trace, plot=args.plot, arena_bytes=args.arena)
    print(format_report(report))
    if args.plot:
        print(f"figure: {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
