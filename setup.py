"""Build script for the optional C accelerators; all metadata lives in pyproject.toml.

``gosim._speedups`` (channels, go, the driver loop), ``netframe._speedups`` (the codec's
per-frame loops) and ``idempotency._speedups`` (the record table, the fingerprint and
MemoryStore's steps) are optional: when they cannot be compiled (no C compiler, an
unsupported Python), the install goes on and the pure-Python code runs, which is the
reference implementation and is tested in CI too (GOSIM_PURE_PYTHON=1).
"""

from glob import glob

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "gosim._speedups",
            sources=["gosim/_speedups.c"],
            # The parts it includes, one per mechanism: a change to one rebuilds it.
            depends=sorted(glob("gosim/_speedups_*.c.h")),
            optional=True,
            extra_compile_args=["-O2", "-std=c11"],
        ),
        Extension(
            "netframe._speedups",
            sources=["netframe/_speedups.c"],
            # The parts it includes (sans-IO, I/O, msgpack cutter, server): a change to
            # one rebuilds it.
            depends=sorted(glob("netframe/_speedups_*.c.h")),
            optional=True,
            extra_compile_args=["-O2", "-std=c11"],
        ),
        Extension(
            "idempotency._speedups",
            sources=["idempotency/_speedups.c"],
            # Its parts (record, keys, memory, batch): a change to one rebuilds it.
            depends=sorted(glob("idempotency/_speedups_*.c.h")),
            optional=True,
            extra_compile_args=["-O2", "-std=c11"],
        ),
    ]
)
