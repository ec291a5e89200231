"""Build script for the optional C accelerators; all metadata lives in pyproject.toml.

``gosim._speedups`` (channels, go, the driver loop), ``netframe._speedups`` (the codec's
per-frame loops) and ``idempotency._speedups`` (the record table, the fingerprint and
MemoryStore's steps) are optional: when they cannot be compiled (no C compiler, an
unsupported Python), the install goes on and the pure-Python code runs, which is the
reference implementation and is tested in CI too (GOSIM_PURE_PYTHON=1).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "gosim._speedups",
            sources=["gosim/_speedups.c"],
            # The parts it includes, one per mechanism: a change to one rebuilds it.
            depends=[
                "gosim/_speedups_common.c.h",
                "gosim/_speedups_records.c.h",
                "gosim/_speedups_timers.c.h",
                "gosim/_speedups_sched.c.h",
                "gosim/_speedups_chan.c.h",
                "gosim/_speedups_select.c.h",
                "gosim/_speedups_wait.c.h",
                "gosim/_speedups_clock.c.h",
            ],
            optional=True,
            extra_compile_args=["-O2", "-std=c11"],
        ),
        Extension(
            "netframe._speedups",
            sources=["netframe/_speedups.c"],
            # The three parts it includes (sans-IO, I/O, server): a change rebuilds it.
            depends=[
                "netframe/_speedups_codec.c.h",
                "netframe/_speedups_io.c.h",
                "netframe/_speedups_server.c.h",
            ],
            optional=True,
            extra_compile_args=["-O2", "-std=c11"],
        ),
        Extension(
            "idempotency._speedups",
            sources=["idempotency/_speedups.c"],
            optional=True,
            extra_compile_args=["-O2", "-std=c11"],
        ),
    ]
)
