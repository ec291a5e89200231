"""pytest configuration for the benchmark suite.

Benchmarks live outside ``testpaths``: run them with ``pytest benchmarks`` (real timings)
or ``pytest benchmarks --benchmark-disable`` (one smoke pass each, as CI does).
"""

from __future__ import annotations


def pytest_configure(config):  # type: ignore[no-untyped-def]
    # Collect bench_*.py files and bench_* functions besides the usual test_* ones.
    config.addinivalue_line("python_files", "bench_*.py")
    config.addinivalue_line("python_functions", "bench_*")
