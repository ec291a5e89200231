"""The benchmark suites: pytest-benchmark files (``bench_*.py``, one smoke pass each with
``pytest benchmarks --benchmark-disable``) and the one command that runs them all with
their peers interleaved, ``python -m benchmarks`` (see ``__main__.py``)."""
