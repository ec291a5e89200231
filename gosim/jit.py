"""The one way this project compiles with numba: :func:`kernel`, :func:`intrinsic`,
:data:`JIT_ENABLED`.

Public because the packages above gosim (netframe's frame-boundary scan) declare their
kernels through it too: one decorator and one flag for the whole project, reached
without importing a private module of gosim.

Every numba kernel in the project (the atomics, the spinlocks and their contention
kernels, the allocator's bit scans, netframe's frame-boundary scan) is compiled through
:func:`kernel`, so they share one set of options: ``nogil=True`` (a kernel never needs
the GIL, so other threads run while it does) and ``cache=True`` (compiled once per
machine into numba's disk cache, not once per process). The two options that differ by
kernel are named parameters, not copies of the decorator.

Importing this module does not import numba or numpy: :data:`JIT_ENABLED` is read from
the environment the way numba reads it, and numba is imported when the first kernel is
declared. That keeps ``import gosim`` and ``import netframe`` at about 30 MB instead of
100 MB; numba (70 MB, 0.5 s to import) loads only in the modules that declare kernels
(``gosim.atomic``, ``gosim.spin``, ``gosim.mem``, ``netframe._kernels``), on first use.
"""

from __future__ import annotations

import os
import types
from collections.abc import Callable
from typing import Any, Final, TypeVar, cast, overload

__all__ = ["JIT_ENABLED", "documented", "intrinsic", "kernel"]

_F = TypeVar("_F", bound=Callable[..., Any])


def _jit_enabled(environ: dict[str, str] | os._Environ[str]) -> bool:
    # numba.core.config reads NUMBA_DISABLE_JIT as int(value), default 0, and falls back
    # to the default (with a warning) when int() fails; empty means unset.
    # tests/gosim/test_jit.py checks this against numba's own reading.
    value = environ.get("NUMBA_DISABLE_JIT", "")
    if not value:
        return True
    try:
        return int(value) == 0
    except ValueError:
        return True


#: True when numba compiles; False under ``NUMBA_DISABLE_JIT=1``, where every kernel runs
#: as the plain Python function it decorates (so the test suite can cover kernel code
#: and the pure-Python fall-backs the modules choose by this flag).
JIT_ENABLED: Final[bool] = _jit_enabled(os.environ)


@overload
def kernel(fn: _F, /) -> _F: ...


@overload
def kernel(*, inline: bool = ..., refcounts: bool = ...) -> Callable[[_F], _F]: ...


def kernel(
    fn: _F | None = None, /, *, inline: bool = False, refcounts: bool = True
) -> _F | Callable[[_F], _F]:
    """Declare ``fn`` a numba kernel: ``njit(nogil=True, cache=True)``, typed for mypy.

    Compilation happens on the first call (or on numba's disk-cache hit), not here.

    ``inline=True`` inlines the kernel into its numba callers at IR level, so a small hot
    helper costs no call. ``refcounts=False`` turns off numba's runtime (``_nrt=False``)
    for kernels that never allocate: without it numba increments and decrements each
    array argument's reference count (two atomic read-modify-writes on one shared cache
    line) on every call, which made a contended spinlock 10x slower when measured.
    """
    options: dict[str, Any] = {"nogil": True, "cache": True}
    if inline:
        options["inline"] = "always"
    if not refcounts:
        options["_nrt"] = False  # passed through a dict: numba's stubs omit it

    def declare(function: _F) -> _F:
        from numba import njit  # noqa: PLC0415  (numba loads with the first kernel)

        return cast(_F, njit(**options)(function))

    if fn is not None:
        return declare(fn)
    return declare


def intrinsic(typer: Callable[..., Any]) -> Any:
    """numba's ``@intrinsic`` (a function written in LLVM IR, callable from kernels),
    typed as Any: kernels call the result without the ``typingctx`` argument its stub
    signature asks for. Imports numba, as declaring the first kernel does."""
    from numba.extending import intrinsic as declare  # noqa: PLC0415 (numba loads here)

    return declare(typer)


def documented(fn: _F, name: str, doc: str) -> _F:
    """``fn`` (a kernel, or the plain function chosen instead of one) as the public
    ``name``, carrying ``doc``, so ``help()`` shows the same docstring with the JIT on
    or off, the text kept once, where the public name is bound.

    A kernel is its own object per name and takes ``doc`` as it is. A plain function may
    stand for several names (one fall-back for the three atomic loads), so it is copied
    first: a new function object over the same code, so calling it costs no extra frame.
    """
    if isinstance(fn, types.FunctionType):
        copy = types.FunctionType(
            fn.__code__, fn.__globals__, name, fn.__defaults__, fn.__closure__
        )
        copy.__kwdefaults__ = fn.__kwdefaults__
        copy.__annotations__ = dict(fn.__annotations__)
        copy.__module__ = fn.__module__
        copy.__qualname__ = name
        fn = cast(_F, copy)
    fn.__doc__ = doc
    return fn
