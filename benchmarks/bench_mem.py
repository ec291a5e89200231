"""gosim.mem side by side with CPython's ``bytearray`` and Go's own allocator.

Run: ``pytest benchmarks/bench_mem.py`` (real timings; ``-s`` prints the summary table),
``--benchmark-disable`` for one smoke pass each (as CI does).

Groups (peers compared within a group; ``extra_info`` has ``ns_per_object`` and ratios):

* ``batch-64B`` / ``batch-1KiB``: ``malloc_many(size, N)`` then ``free_many`` of the same
  addresses, N = 100,000, in a steady state (spans reused through lazy sweeping); peers:
  N ``bytearray(size)`` made and dropped; Go's ``new([64]byte)`` / ``new([1024]byte)`` in
  batches of N under ``GOMAXPROCS=1`` (``benchmarks/go/mem``, ``go test -bench -benchmem``
  in a subprocess; skipped with a reason when ``go`` is absent; ``go_ns_per_op``).
* ``single``: one ``heap.malloc(64)`` call from Python per object vs ``bytearray(64)``.
* ``kernels``: the same batch through the numba kernels and through the same source with
  ``NUMBA_DISABLE_JIT=1`` (a subprocess); ``speedup`` = no-JIT time / JIT time.
"""

from __future__ import annotations

import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gosim import mem

N = 100_000
ROUNDS = 15
SINGLE_N = 20_000
NOJIT_N = 5_000
GO_DIR = Path(__file__).parent / "go" / "mem"

# ns/object of each peer, filled as the benchmarks run (file order), for the ratios.
_ns: dict[str, float] = {}


def timed_rounds(benchmark: Any, fn: Callable[[], None], objects: int, key: str) -> float:
    """Run ``fn`` ROUNDS times under the benchmark fixture; record the median ns/object
    (our own clock, so it is there under ``--benchmark-disable`` too)."""
    durations: list[float] = []

    def one() -> None:
        t0 = time.perf_counter()
        fn()
        durations.append(time.perf_counter() - t0)

    fn()  # warm-up: compile, fault the arena in, reach the steady state
    fn()
    benchmark.pedantic(one, rounds=ROUNDS, iterations=1)
    ns = statistics.median(durations) / objects * 1e9
    _ns[key] = ns
    benchmark.extra_info["ns_per_object"] = ns
    benchmark.extra_info["objects_per_s"] = 1e9 / ns
    return ns


def gosim_batch(size: int) -> Callable[[], None]:
    heap = mem.Heap(256 << 20)

    def run() -> None:
        heap.free_many(heap.malloc_many(size, N))

    return run


def bytearray_batch(size: int) -> Callable[[], None]:
    def run() -> None:
        objs = [bytearray(size) for _ in range(N)]
        del objs

    return run


_go_cache: dict[str, float] = {}


def go_ns_per_op(name: str) -> float:
    """ns/op of Go benchmark ``name`` (one ``go test`` run for both, cached)."""
    go = shutil.which("go")
    if go is None:
        pytest.skip("Go is not installed: no Go peer to compare with")
    if not _go_cache:
        benchtime = "1s" if os.environ.get("GOSIM_BENCH_QUICK") is None else "200000x"
        env = dict(os.environ, GOMAXPROCS="1", GOFLAGS="-mod=mod")
        cmd = [
            go,
            "test",
            "-run",
            "^$",
            "-bench",
            ".",
            "-benchmem",
            f"-benchtime={benchtime}",
            "-count=3",
        ]
        proc = subprocess.run(
            cmd, cwd=GO_DIR, env=env, check=False, capture_output=True, text=True, timeout=600
        )
        if proc.returncode != 0:
            pytest.fail(f"go test failed:\n{proc.stdout}\n{proc.stderr}")
        runs: dict[str, list[float]] = {}
        for m in re.finditer(
            r"^Benchmark(\w+?)(?:-\d+)?\s+\d+\s+([\d.]+) ns/op", proc.stdout, re.MULTILINE
        ):
            runs.setdefault(m.group(1), []).append(float(m.group(2)))
        _go_cache.update({k: statistics.median(v) for k, v in runs.items()})
    return _go_cache[name]


def go_peer(benchmark: Any, name: str, key: str) -> None:
    benchmark.pedantic(lambda: go_ns_per_op(name), rounds=1, iterations=1)
    ns = go_ns_per_op(name)
    _ns[key] = ns
    benchmark.extra_info["go_ns_per_op"] = ns
    benchmark.extra_info["objects_per_s"] = 1e9 / ns


def ratios(benchmark: Any, key: str) -> None:
    """gosim's time over each peer's (below 1: gosim is faster)."""
    for peer in ("bytearray", "go"):
        prefix = key.split(":", 1)[0]
        if f"{prefix}:{peer}" in _ns and f"{prefix}:gosim" in _ns:
            benchmark.extra_info[f"gosim_over_{peer}"] = (
                _ns[f"{prefix}:gosim"] / _ns[f"{prefix}:{peer}"]
            )


# ---- batch ----------------------------------------------------------------------------


@pytest.mark.benchmark(group="batch-64B")
def bench_batch64_gosim(benchmark: Any) -> None:
    timed_rounds(benchmark, gosim_batch(64), N, "b64:gosim")


@pytest.mark.benchmark(group="batch-64B")
def bench_batch64_bytearray(benchmark: Any) -> None:
    timed_rounds(benchmark, bytearray_batch(64), N, "b64:bytearray")
    ratios(benchmark, "b64:bytearray")


@pytest.mark.benchmark(group="batch-64B")
def bench_batch64_go(benchmark: Any) -> None:
    go_peer(benchmark, "New64", "b64:go")
    ratios(benchmark, "b64:go")


@pytest.mark.benchmark(group="batch-1KiB")
def bench_batch1k_gosim(benchmark: Any) -> None:
    timed_rounds(benchmark, gosim_batch(1024), N, "b1k:gosim")


@pytest.mark.benchmark(group="batch-1KiB")
def bench_batch1k_bytearray(benchmark: Any) -> None:
    timed_rounds(benchmark, bytearray_batch(1024), N, "b1k:bytearray")
    ratios(benchmark, "b1k:bytearray")


@pytest.mark.benchmark(group="batch-1KiB")
def bench_batch1k_go(benchmark: Any) -> None:
    go_peer(benchmark, "New1K", "b1k:go")
    ratios(benchmark, "b1k:go")


# ---- single objects from Python -------------------------------------------------------


@pytest.mark.benchmark(group="single")
def bench_single_malloc_gosim(benchmark: Any) -> None:
    heap = mem.Heap(64 << 20)
    addrs: list[int] = []

    def run() -> None:
        malloc = heap.malloc
        addrs.extend(malloc(64) for _ in range(SINGLE_N))
        heap.free_many(addrs)
        addrs.clear()

    timed_rounds(benchmark, run, SINGLE_N, "single:gosim")


@pytest.mark.benchmark(group="single")
def bench_single_bytearray(benchmark: Any) -> None:
    keep: list[bytearray] = []

    def run() -> None:
        keep.extend(bytearray(64) for _ in range(SINGLE_N))
        keep.clear()

    timed_rounds(benchmark, run, SINGLE_N, "single:bytearray")
    ratios(benchmark, "single:bytearray")


# ---- numba vs the same code without JIT -------------------------------------------------

_NOJIT_SCRIPT = f"""
import time
from gosim import mem
h = mem.Heap(64 << 20)
h.free_many(h.malloc_many(64, {NOJIT_N}))
best = 1e9
for _ in range(3):
    t0 = time.perf_counter()
    h.free_many(h.malloc_many(64, {NOJIT_N}))
    best = min(best, time.perf_counter() - t0)
print(best / {NOJIT_N} * 1e9)
"""


@pytest.mark.benchmark(group="kernels")
def bench_kernels_jit(benchmark: Any) -> None:
    timed_rounds(benchmark, gosim_batch(64), N, "kernels:jit")


@pytest.mark.benchmark(group="kernels")
def bench_kernels_nojit(benchmark: Any) -> None:
    env = dict(os.environ, NUMBA_DISABLE_JIT="1")
    out: list[float] = []

    def run() -> None:
        proc = subprocess.run(
            [sys.executable, "-c", _NOJIT_SCRIPT],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
            check=True,
        )
        out.append(float(proc.stdout.strip().splitlines()[-1]))

    benchmark.pedantic(run, rounds=1, iterations=1)
    ns = out[-1]
    benchmark.extra_info["ns_per_object"] = ns
    if "kernels:jit" in _ns:
        benchmark.extra_info["speedup"] = ns / _ns["kernels:jit"]


def bench_zz_summary() -> None:
    """Print the figures in one table (visible with ``-s``)."""
    rows = [f"{k:>20}: {v:10.1f} ns/object  {1e3 / v:8.2f} M objects/s" for k, v in _ns.items()]
    print("\n" + "\n".join(rows))
