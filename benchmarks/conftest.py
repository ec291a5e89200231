"""pytest configuration for the benchmark suite.

Benchmarks live outside ``testpaths``: run them with ``pytest benchmarks`` (real timings)
or ``pytest benchmarks --benchmark-disable`` (one smoke pass each, as CI does).
``python -m benchmarks`` runs the same workloads with their peers interleaved.
"""

from __future__ import annotations

import gc
from pathlib import Path

import pytest

from benchmarks.procs import GC_THRESHOLD, go_build, gopath_missing


def pytest_configure(config):  # type: ignore[no-untyped-def]
    # Collect bench_*.py files and bench_* functions besides the usual test_* ones.
    config.addinivalue_line("python_files", "bench_*.py")
    config.addinivalue_line("python_functions", "bench_*")
    # Every in-process Python peer under the collector pace gosim.run sets for itself,
    # as in `python -m benchmarks` (peer processes get it through their environment).
    gc.set_threshold(*GC_THRESHOLD)


@pytest.fixture(scope="module")
def go_ledger(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The Go twin of the keyed server (benchmarks/go/ledger), built once per module."""
    why = gopath_missing("ledger")
    if why is not None:
        pytest.skip(why)
    return go_build("ledger", tmp_path_factory.mktemp("goledger") / "ledger")
