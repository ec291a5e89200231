"""Bit primitives for the allocator kernels: count-trailing-zeros, popcount, shifts.

``ctz64`` is Go's ``sys.Ctz64``, the heart of ``nextFreeFast``: under numba it is LLVM's
``cttz`` (one ``tzcnt``); under ``NUMBA_DISABLE_JIT=1`` the same names are plain Python on
ints, because numpy's uint64 scalars warn on the wrap-around the tricks rely on.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np
from numba import types
from numba.extending import intrinsic

from gosim.jit import JIT_ENABLED, kernel

_F = TypeVar("_F", bound=Callable[..., Any])


ALL_ONES = np.uint64(0xFFFFFFFFFFFFFFFF)
ZERO = np.uint64(0)
ONE = np.uint64(1)


#: Hot helpers, inlined into their callers at numba-IR level.
inline_kernel = kernel(inline=True)


if JIT_ENABLED:
    from numba.cpython.unsafe.numbers import trailing_zeros as _tz

    # Typed as Any: kernels call these intrinsics without numba's typing context.
    _trailing_zeros: Any = _tz

    def _ctpop_typer(typingctx: Any, x: Any) -> Any:
        sig = types.uint64(types.uint64)

        def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
            return builder.ctpop(args[0])

        return sig, codegen

    _ctpop: Any = intrinsic(_ctpop_typer)

    @inline_kernel
    def ctz64(x: np.uint64) -> int:
        """Trailing zero bits of ``x``; 64 when ``x`` is 0 (Go's ``sys.Ctz64``)."""
        return int(_trailing_zeros(np.uint64(x)))

    @inline_kernel
    def popcount64(x: np.uint64) -> int:
        """Set bits in ``x``."""
        return int(_ctpop(np.uint64(x)))

    @inline_kernel
    def shr(x: np.uint64, n: int) -> np.uint64:
        """``x >> n`` with Go's semantics for ``n >= 64`` (0), which LLVM leaves undefined."""
        if n >= 64:
            return np.uint64(0)
        return np.uint64(x) >> np.uint64(n)

    @inline_kernel
    def bit(n: int) -> np.uint64:
        """``1 << n`` as uint64, ``0 <= n < 64``."""
        return np.uint64(1) << np.uint64(n)

    @inline_kernel
    def low_mask(n: int) -> np.uint64:
        """The ``n`` low bits set, ``0 <= n <= 64``."""
        if n >= 64:
            return np.uint64(0xFFFFFFFFFFFFFFFF)
        return (np.uint64(1) << np.uint64(n)) - np.uint64(1)

else:

    def ctz64(x: np.uint64) -> int:
        """Trailing zero bits of ``x``; 64 when ``x`` is 0 (Go's ``sys.Ctz64``)."""
        v = int(x)
        return 64 if v == 0 else (v & -v).bit_length() - 1

    def popcount64(x: np.uint64) -> int:
        """Set bits in ``x``."""
        return int(x).bit_count()

    def shr(x: np.uint64, n: int) -> np.uint64:
        """``x >> n`` with Go's semantics for ``n >= 64`` (0)."""
        if n >= 64:
            return np.uint64(0)
        return np.uint64(int(x) >> int(n))

    def bit(n: int) -> np.uint64:
        """``1 << n`` as uint64, ``0 <= n < 64``."""
        return np.uint64(1 << int(n))

    def low_mask(n: int) -> np.uint64:
        """The ``n`` low bits set, ``0 <= n <= 64``."""
        return np.uint64((1 << int(n)) - 1)
