"""Draw docs/img/spin_throughput.png from a bench_spin.py run.

Usage::

    pytest benchmarks/bench_spin.py --benchmark-json=spin.json
    python benchmarks/plot_spin.py spin.json [-o docs/img/spin_throughput.png]

Left: throughput of the ``contended-counter`` group (2 threads sharing a counter under
each lock) on a log scale, each bar labelled with its ratio to ``threading.Lock`` and
its Jain fairness index. Right: the ``atomic-add`` group. Needs matplotlib.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # after use(): the backend must be chosen first

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "docs" / "img" / "spin_throughput.png"


def rows(data: dict[str, Any], group: str) -> list[dict[str, Any]]:
    return [b for b in data["benchmarks"] if b["group"] == group]


def label(bench: dict[str, Any]) -> str:
    info = bench["extra_info"]
    text = str(info.get("lock") or info.get("what") or bench["name"])
    return text.replace(" (nogil kernels)", "\n(nogil kernels)").replace(
        " (Python threads)", "\n(Python threads)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("json", type=Path, help="pytest-benchmark --benchmark-json output")
    parser.add_argument("-o", "--output", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    data = json.loads(args.json.read_text())

    counter = sorted(rows(data, "contended-counter"), key=lambda b: b["extra_info"]["throughput"])
    adds = sorted(rows(data, "atomic-add"), key=lambda b: b["extra_info"]["throughput"])
    if not counter:
        raise SystemExit("no contended-counter results in the JSON: run bench_spin.py")

    fig, (left, right) = plt.subplots(
        1, 2, figsize=(13, 5.5), gridspec_kw={"width_ratios": [3, 1.4]}
    )
    names = [label(b) for b in counter]
    rates = [b["extra_info"]["throughput"] / 1e6 for b in counter]
    colors = ["#888888" if "threading" in n else "#3b75af" for n in names]
    bars = left.barh(names, rates, color=colors)
    left.set_xscale("log")
    left.set_xlabel("lock acquisitions per second, millions (log scale)")
    left.set_title("Contended counter, 2 threads sharing one lock")
    for bar, bench in zip(bars, counter, strict=True):
        info = bench["extra_info"]
        ratio = info.get("ratio_to_threading")
        note = f"  {bar.get_width():.1f} M/s, fairness {info['fairness']:.3f}"
        if ratio is not None:
            note += f", {ratio:.1f}x threading.Lock"
        left.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, note, va="center")
    left.set_xlim(right=max(rates) * 8)

    add_names = [label(b) for b in adds]
    add_rates = [b["extra_info"]["throughput"] / 1e6 for b in adds]
    add_bars = right.barh(add_names, add_rates, color="#5a9e5a")
    right.set_xlabel("increments per second, millions")
    right.set_title("Shared counter += 1, 2 threads")
    for bar in add_bars:
        right.text(
            bar.get_width(),
            bar.get_y() + bar.get_height() / 2,
            f" {bar.get_width():.1f}",
            va="center",
        )
    right.set_xlim(right=max(add_rates) * 1.3)

    machine = data.get("machine_info", {})
    fig.suptitle(
        f"gosim.spin and gosim.atomic on {machine.get('cpu', {}).get('brand_raw', 'this CPU')}"
        f" ({machine.get('cpu', {}).get('count', '?')} cores)",
        fontsize=11,
    )
    fig.tight_layout()
    args.output.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.output, dpi=110)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
