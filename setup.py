"""Build script for the optional C accelerator; all metadata lives in pyproject.toml.

``gosim._speedups`` is optional: when it cannot be compiled (no C compiler, an
unsupported Python), the install goes on and gosim runs its pure-Python code, which is
the reference implementation and is tested in CI too (GOSIM_PURE_PYTHON=1).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "gosim._speedups",
            sources=["gosim/_speedups.c"],
            optional=True,
            extra_compile_args=["-O2", "-std=c11"],
        )
    ]
)
