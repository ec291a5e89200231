"""gosim.mem side by side with CPython's ``bytearray`` and Go's own allocator.

Run: ``pytest benchmarks/bench_mem.py`` (real timings; ``-s`` prints the summary table),
``--benchmark-disable`` for one smoke pass each (as CI does).

Groups (peers compared within a group; ``extra_info`` has ``ns_per_object`` and ratios):

Every figure is CPU time per object, a mean over at least 0.3 s of work (Go's over
``-test.benchtime=300ms``, as ``cpu-ns/op``; the wall clock beside): issue 30's method.

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
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from benchmarks.procs import find_go, go_build, go_env, parse_go_bench
from gosim import mem

N = 100_000
ROUNDS = 5
# Every peer timed alike (issue 30): a figure is a mean over at least MEASURE_SECONDS of
# work, as testing.B runs Go's for -benchtime, and CPU time (the wall clock of this
# shared machine also counts the waits for a core).
MEASURE_SECONDS = 0.3
SINGLE_N = 20_000
NOJIT_N = 5_000
GO_DIR = Path(__file__).parent / "go" / "mem"

# ns/object of each peer, filled as the benchmarks run (file order), for the ratios.
_ns: dict[str, float] = {}


def timed(fn: Callable[[], None], objects: int, seconds: float) -> tuple[float, float]:
    """``fn`` (``objects`` objects a call) again and again until ``seconds`` of wall
    clock have passed (at least once): (ns of this thread's CPU, ns of wall clock) per
    object over all the calls."""
    calls = 0
    w0, c0 = time.perf_counter(), time.thread_time()
    while calls == 0 or time.perf_counter() - w0 < seconds:
        fn()
        calls += 1
    cpu, wall = time.thread_time() - c0, time.perf_counter() - w0
    return cpu / (calls * objects) * 1e9, wall / (calls * objects) * 1e9


def timed_rounds(benchmark: Any, fn: Callable[[], None], objects: int, key: str) -> float:
    """ROUNDS figures of ``fn`` (:func:`timed`, MEASURE_SECONDS each) under the
    benchmark fixture; record the median CPU ns/object (our own clock, so it is there
    under ``--benchmark-disable`` too, from one short figure)."""
    figures: list[tuple[float, float]] = []
    seconds = 0.0 if benchmark.disabled else MEASURE_SECONDS

    fn()  # warm-up: compile, fault the arena in, reach the steady state
    fn()
    benchmark.pedantic(
        lambda: figures.append(timed(fn, objects, seconds)), rounds=ROUNDS, iterations=1
    )
    ns = statistics.median(c for c, _ in figures)
    benchmark.extra_info["wall_ns_per_object"] = statistics.median(w for _, w in figures)
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


def go_mem_binary(out: Path) -> Path:
    """``go test -c`` of benchmarks/go/mem."""
    return go_build("mem", out, test=True)


def go_mem_round(binary: Path, name: str, benchtime: str, count: int) -> list[tuple[float, float]]:
    """(CPU ns/op, wall-clock ns/op) (op = object) of Go benchmark ``Benchmark<name>``,
    ``count`` runs in one process under GOMAXPROCS=1: the process's CPU time, which
    mem_test.go reports as ``cpu-ns/op``, and testing.B's ns/op."""
    cmd = [str(binary), "-test.run=^$", f"-test.bench=^Benchmark{name}$", "-test.benchmem",
           f"-test.benchtime={benchtime}", f"-test.count={count}"]  # fmt: skip
    proc = subprocess.run(
        cmd, cwd=GO_DIR, env=go_env(), check=False, capture_output=True, text=True, timeout=600
    )
    runs = parse_go_bench(proc.stdout).get(name)
    cpu = parse_go_bench(proc.stdout, "cpu-ns/op").get(name)
    if proc.returncode != 0 or not runs or not cpu or len(cpu) != len(runs):
        raise RuntimeError(f"go benchmark {name} failed:\n{proc.stdout}\n{proc.stderr}")
    return [(c, ns) for (c, _), (ns, _) in zip(cpu, runs, strict=True)]


def go_ns_per_op(name: str, binary: Path) -> float:
    """ns/op of Go benchmark ``name`` (median of three runs, cached)."""
    if name not in _go_cache:
        benchtime = "300ms" if os.environ.get("GOSIM_BENCH_QUICK") is None else "200000x"
        runs = go_mem_round(binary, name, benchtime, 3)
        _go_cache[name] = statistics.median(c for c, _ in runs)
    return _go_cache[name]


@pytest.fixture(scope="module")
def go_mem(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if find_go() is None:
        pytest.skip("Go is not installed: no Go peer to compare with")
    return go_mem_binary(tmp_path_factory.mktemp("gomem") / "mem.test")


def go_peer(benchmark: Any, name: str, key: str, binary: Path) -> None:
    benchmark.pedantic(lambda: go_ns_per_op(name, binary), rounds=1, iterations=1)
    ns = go_ns_per_op(name, binary)
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
def bench_batch64_go(benchmark: Any, go_mem: Path) -> None:
    go_peer(benchmark, "New64", "b64:go", go_mem)
    ratios(benchmark, "b64:go")


@pytest.mark.benchmark(group="batch-1KiB")
def bench_batch1k_gosim(benchmark: Any) -> None:
    timed_rounds(benchmark, gosim_batch(1024), N, "b1k:gosim")


@pytest.mark.benchmark(group="batch-1KiB")
def bench_batch1k_bytearray(benchmark: Any) -> None:
    timed_rounds(benchmark, bytearray_batch(1024), N, "b1k:bytearray")
    ratios(benchmark, "b1k:bytearray")


@pytest.mark.benchmark(group="batch-1KiB")
def bench_batch1k_go(benchmark: Any, go_mem: Path) -> None:
    go_peer(benchmark, "New1K", "b1k:go", go_mem)
    ratios(benchmark, "b1k:go")


# ---- single objects from Python -------------------------------------------------------


def gosim_single() -> Callable[[], None]:
    """SINGLE_N ``heap.malloc(64)`` calls from Python, then one ``free_many``."""
    heap = mem.Heap(64 << 20)
    addrs: list[int] = []

    def run() -> None:
        malloc = heap.malloc
        addrs.extend(malloc(64) for _ in range(SINGLE_N))
        heap.free_many(addrs)
        addrs.clear()

    return run


def bytearray_single() -> Callable[[], None]:
    keep: list[bytearray] = []

    def run() -> None:
        keep.extend(bytearray(64) for _ in range(SINGLE_N))
        keep.clear()

    return run


@pytest.mark.benchmark(group="single")
def bench_single_malloc_gosim(benchmark: Any) -> None:
    timed_rounds(benchmark, gosim_single(), SINGLE_N, "single:gosim")


@pytest.mark.benchmark(group="single")
def bench_single_bytearray(benchmark: Any) -> None:
    timed_rounds(benchmark, bytearray_single(), SINGLE_N, "single:bytearray")
    ratios(benchmark, "single:bytearray")


# ---- numba vs the same code without JIT -------------------------------------------------

_NOJIT_SCRIPT = f"""
import time
from benchmarks.procs import find_go, go_build, go_env, parse_go_bench
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


def nojit_ns_per_object() -> float:
    """ns/object of the 64 B batch with ``NUMBA_DISABLE_JIT=1``, in a fresh process."""
    env = dict(os.environ, NUMBA_DISABLE_JIT="1")
    proc = subprocess.run(
        [sys.executable, "-c", _NOJIT_SCRIPT],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    return float(proc.stdout.strip().splitlines()[-1])


@pytest.mark.benchmark(group="kernels")
def bench_kernels_jit(benchmark: Any) -> None:
    timed_rounds(benchmark, gosim_batch(64), N, "kernels:jit")


@pytest.mark.benchmark(group="kernels")
def bench_kernels_nojit(benchmark: Any) -> None:
    out: list[float] = []
    benchmark.pedantic(lambda: out.append(nojit_ns_per_object()), rounds=1, iterations=1)
    ns = out[-1]
    benchmark.extra_info["ns_per_object"] = ns
    if "kernels:jit" in _ns:
        benchmark.extra_info["speedup"] = ns / _ns["kernels:jit"]


def bench_zz_summary() -> None:
    """Print the figures in one table (visible with ``-s``)."""
    rows = [f"{k:>20}: {v:10.1f} ns/object  {1e3 / v:8.2f} M objects/s" for k, v in _ns.items()]
    print("\n" + "\n".join(rows))
