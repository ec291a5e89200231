"""Atomic instructions on numpy-backed integer cells, callable from Python and from kernels.

Every function here takes ``(arr, index, ...)``: ``arr`` is a one-dimensional numpy array
of ``int32``, ``int64``, ``uint32`` or ``uint64`` and ``index`` picks the cell. The same
functions are called from plain Python (one numba dispatch each, about 0.3 µs) and from
inside ``@numba.njit(nogil=True)`` kernels, where they compile to single instructions.

How the instructions are made
-----------------------------
numba has no CPU atomics API, so each operation is an ``@intrinsic`` that emits the LLVM
instruction directly through llvmlite: ``atomicrmw`` (add, xchg, and, or), ``cmpxchg``,
and ``load atomic`` / ``store atomic`` with an explicit ordering. On x86-64 LLVM lowers
these to ``lock xadd``/``lock add``, ``xchg``, ``lock cmpxchg`` and plain ``mov`` (plus
``xchg`` for a sequentially consistent store); on arm64 to LSE or LL/SC sequences.

Orderings
---------
The unsuffixed operations are sequentially consistent, as all of Go's sync/atomic
operations are. ``_acquire`` loads and ``_release`` stores are the one-way barriers a
lock needs (acquire on entry, release on exit) and cost nothing extra on x86-64;
``_relaxed`` (LLVM ``monotonic``) operations are atomic but order nothing, for the
read-only polling of a spin loop.

Return values follow Go where Go has the operation: ``atomic_add`` returns the *new*
value (``atomic.AddInt64``), ``atomic_swap`` the old one, ``atomic_cas`` whether it
swapped; ``atomic_and``/``atomic_or`` return the old value (Go 1.23's ``And``/``Or``).
``atomic_fetch_add`` returns the old value, the C++ ``fetch_add`` a ticket lock wants.
Arithmetic wraps modulo 2**width (two's complement), as in Go; inside a kernel, numba
converts the operand to the cell's type first, so an out-of-range operand wraps too.

Without the JIT
---------------
Under ``NUMBA_DISABLE_JIT=1`` intrinsics cannot run, so the same names are bound to a
pure-Python implementation that serialises every operation on one ``threading.Lock``:
correct from any number of Python threads (it is then sequentially consistent), though a
thousand times slower, and not atomic with respect to compiled code (there is none).

Alternatives rejected: ``ctypes``-called C helpers cost a microsecond per call from Python
and cannot be called from kernels; numba's CUDA atomics exist only for GPUs; a lock
around a numpy cell would not be atomic with respect to kernels running without the GIL.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np
from numba import types
from numba.core import cgutils as _cgutils_typed

# JIT_ENABLED (gosim.jit's one flag, re-exported): True when numba compiles and the
# functions below are real atomic instructions; False means the lock-based pure-Python
# fallback is in use.
from gosim.jit import JIT_ENABLED, documented, intrinsic, kernel

cgutils: Any = _cgutils_typed  # numba.core.cgutils is untyped


__all__ = [
    "JIT_ENABLED",
    "SUPPORTED_DTYPES",
    "atomic_add",
    "atomic_and",
    "atomic_cas",
    "atomic_fence",
    "atomic_fetch_add",
    "atomic_load",
    "atomic_load_acquire",
    "atomic_load_relaxed",
    "atomic_or",
    "atomic_store",
    "atomic_store_relaxed",
    "atomic_store_release",
    "atomic_swap",
]

#: The cell types the atomics accept (Go's int32, int64, uint32, uint64).
SUPPORTED_DTYPES: tuple[np.dtype[Any], ...] = (
    np.dtype(np.int32),
    np.dtype(np.int64),
    np.dtype(np.uint32),
    np.dtype(np.uint64),
)

# The atomics never allocate: no numba runtime, so no reference counting per call.
_kernel = kernel(refcounts=False)


# --------------------------------------------------------------------------------------
# The LLVM side: intrinsics. Each one types its operands to the cell's dtype, so numba
# inserts the (wrapping) integer conversion before the instruction.

_NUMBA_CELL_TYPES = (types.int32, types.int64, types.uint32, types.uint64)


def _cell_type(arr: Any, *, writes: bool) -> Any:
    """Return the cell dtype when ``arr`` is an array the atomics accept, else None."""
    if not isinstance(arr, types.Array) or arr.ndim != 1:
        return None
    if arr.dtype not in _NUMBA_CELL_TYPES:
        return None
    if writes and not arr.mutable:
        return None
    return arr.dtype


def _is_operand(ty: Any) -> bool:
    return isinstance(ty, (types.Integer, types.Boolean))


def _cell_pointer(context: Any, builder: Any, arrty: Any, arr: Any, index: Any) -> Any:
    array = context.make_array(arrty)(context, builder, arr)
    return cgutils.get_item_pointer(context, builder, arrty, array, [index], wraparound=False)


def _make_rmw(op: str, *, return_new: bool) -> Any:
    """An intrinsic ``(arr, index, value) -> old`` (or new) doing ``atomicrmw op``."""

    def typer(typingctx: Any, arr: Any, index: Any, value: Any) -> Any:
        dt = _cell_type(arr, writes=True)
        if dt is None or not isinstance(index, types.Integer) or not _is_operand(value):
            return None
        sig = dt(arr, types.intp, dt)

        def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
            arr_v, index_v, value_v = args
            ptr = _cell_pointer(context, builder, sig.args[0], arr_v, index_v)
            old = builder.atomic_rmw(op, ptr, value_v, "seq_cst")
            if return_new:
                # Only "add" asks for the new value; LLVM integer add wraps.
                return builder.add(old, value_v)
            return old

        return sig, codegen

    typer.__name__ = f"_rmw_{op}_{'new' if return_new else 'old'}"
    return intrinsic(typer)


_rmw_add_new = _make_rmw("add", return_new=True)
_rmw_add_old = _make_rmw("add", return_new=False)
_rmw_xchg = _make_rmw("xchg", return_new=False)
_rmw_and = _make_rmw("and", return_new=False)
_rmw_or = _make_rmw("or", return_new=False)


@intrinsic
def _cmpxchg(typingctx: Any, arr: Any, index: Any, old: Any, new: Any) -> Any:
    dt = _cell_type(arr, writes=True)
    if dt is None or not isinstance(index, types.Integer):
        return None
    if not (_is_operand(old) and _is_operand(new)):
        return None
    sig = types.boolean(arr, types.intp, dt, dt)

    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        arr_v, index_v, old_v, new_v = args
        ptr = _cell_pointer(context, builder, sig.args[0], arr_v, index_v)
        pair = builder.cmpxchg(ptr, old_v, new_v, "seq_cst", "seq_cst")
        return builder.extract_value(pair, 1)

    return sig, codegen


def _make_load(ordering: str) -> Any:
    def typer(typingctx: Any, arr: Any, index: Any) -> Any:
        dt = _cell_type(arr, writes=False)
        if dt is None or not isinstance(index, types.Integer):
            return None
        sig = dt(arr, types.intp)

        def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
            arr_v, index_v = args
            ptr = _cell_pointer(context, builder, sig.args[0], arr_v, index_v)
            align = context.get_abi_sizeof(context.get_value_type(sig.return_type))
            return builder.load_atomic(ptr, ordering, align)

        return sig, codegen

    typer.__name__ = f"_load_{ordering}"
    return intrinsic(typer)


def _make_store(ordering: str) -> Any:
    def typer(typingctx: Any, arr: Any, index: Any, value: Any) -> Any:
        dt = _cell_type(arr, writes=True)
        if dt is None or not isinstance(index, types.Integer) or not _is_operand(value):
            return None
        sig = types.void(arr, types.intp, dt)

        def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
            arr_v, index_v, value_v = args
            ptr = _cell_pointer(context, builder, sig.args[0], arr_v, index_v)
            align = context.get_abi_sizeof(value_v.type)
            builder.store_atomic(value_v, ptr, ordering, align)
            return context.get_dummy_value()

        return sig, codegen

    typer.__name__ = f"_store_{ordering}"
    return intrinsic(typer)


_load_seq_cst = _make_load("seq_cst")
_load_acquire = _make_load("acquire")
_load_monotonic = _make_load("monotonic")
_store_seq_cst = _make_store("seq_cst")
_store_release = _make_store("release")
_store_monotonic = _make_store("monotonic")


@intrinsic
def _fence_seq_cst(typingctx: Any) -> Any:
    sig = types.void()

    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        builder.fence("seq_cst")
        return context.get_dummy_value()

    return sig, codegen


# --------------------------------------------------------------------------------------
# The compiled entry points. The index check keeps a bad index from becoming a write to
# arbitrary memory; it is one compare and a predictable branch.


@_kernel
def _check_index(arr: Any, index: int) -> None:
    if index < 0 or index >= arr.shape[0]:
        raise IndexError("atomic: index out of range")


@_kernel
def _jit_load(arr: Any, index: int) -> int:
    _check_index(arr, index)
    return _load_seq_cst(arr, index)  # type: ignore[no-any-return]


@_kernel
def _jit_load_acquire(arr: Any, index: int) -> int:
    _check_index(arr, index)
    return _load_acquire(arr, index)  # type: ignore[no-any-return]


@_kernel
def _jit_load_relaxed(arr: Any, index: int) -> int:
    _check_index(arr, index)
    return _load_monotonic(arr, index)  # type: ignore[no-any-return]


@_kernel
def _jit_store(arr: Any, index: int, value: int) -> None:
    _check_index(arr, index)
    _store_seq_cst(arr, index, value)


@_kernel
def _jit_store_release(arr: Any, index: int, value: int) -> None:
    _check_index(arr, index)
    _store_release(arr, index, value)


@_kernel
def _jit_store_relaxed(arr: Any, index: int, value: int) -> None:
    _check_index(arr, index)
    _store_monotonic(arr, index, value)


@_kernel
def _jit_add(arr: Any, index: int, delta: int) -> int:
    _check_index(arr, index)
    return _rmw_add_new(arr, index, delta)  # type: ignore[no-any-return]


@_kernel
def _jit_fetch_add(arr: Any, index: int, delta: int) -> int:
    _check_index(arr, index)
    return _rmw_add_old(arr, index, delta)  # type: ignore[no-any-return]


@_kernel
def _jit_swap(arr: Any, index: int, new: int) -> int:
    _check_index(arr, index)
    return _rmw_xchg(arr, index, new)  # type: ignore[no-any-return]


@_kernel
def _jit_and(arr: Any, index: int, mask: int) -> int:
    _check_index(arr, index)
    return _rmw_and(arr, index, mask)  # type: ignore[no-any-return]


@_kernel
def _jit_or(arr: Any, index: int, mask: int) -> int:
    _check_index(arr, index)
    return _rmw_or(arr, index, mask)  # type: ignore[no-any-return]


@_kernel
def _jit_cas(arr: Any, index: int, old: int, new: int) -> bool:
    _check_index(arr, index)
    return _cmpxchg(arr, index, old, new)  # type: ignore[no-any-return]


@_kernel
def _jit_fence() -> None:
    _fence_seq_cst()


# --------------------------------------------------------------------------------------
# The pure-Python fallback (NUMBA_DISABLE_JIT=1). One lock serialises every operation on
# every cell, which makes each one atomic and the whole set sequentially consistent.

_FALLBACK_LOCK = threading.Lock()


def _py_check(arr: Any, index: int) -> None:
    if arr.ndim != 1 or arr.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"atomic: need a 1-D array of int32/int64/uint32/uint64, got {arr.dtype}")
    if index < 0 or index >= arr.shape[0]:
        raise IndexError("atomic: index out of range")


def _py_wrap(arr: Any, value: int) -> int:
    """``value`` reduced to the cell's width, two's complement for signed cells."""
    bits = arr.dtype.itemsize * 8
    value = int(value) & ((1 << bits) - 1)
    if arr.dtype.kind == "i" and value >> (bits - 1):
        value -= 1 << bits
    return value


def _py_load(arr: Any, index: int) -> int:
    _py_check(arr, index)
    with _FALLBACK_LOCK:
        return int(arr[index])


def _py_store(arr: Any, index: int, value: int) -> None:
    _py_check(arr, index)
    with _FALLBACK_LOCK:
        arr[index] = _py_wrap(arr, value)


def _py_add(arr: Any, index: int, delta: int) -> int:
    _py_check(arr, index)
    with _FALLBACK_LOCK:
        new = _py_wrap(arr, int(arr[index]) + int(delta))
        arr[index] = new
        return new


def _py_fetch_add(arr: Any, index: int, delta: int) -> int:
    _py_check(arr, index)
    with _FALLBACK_LOCK:
        old = int(arr[index])
        arr[index] = _py_wrap(arr, old + int(delta))
        return old


def _py_swap(arr: Any, index: int, new: int) -> int:
    _py_check(arr, index)
    with _FALLBACK_LOCK:
        old = int(arr[index])
        arr[index] = _py_wrap(arr, new)
        return old


def _py_and(arr: Any, index: int, mask: int) -> int:
    _py_check(arr, index)
    with _FALLBACK_LOCK:
        old = int(arr[index])
        arr[index] = _py_wrap(arr, old & _py_wrap(arr, mask))
        return old


def _py_or(arr: Any, index: int, mask: int) -> int:
    _py_check(arr, index)
    with _FALLBACK_LOCK:
        old = int(arr[index])
        arr[index] = _py_wrap(arr, old | _py_wrap(arr, mask))
        return old


def _py_cas(arr: Any, index: int, old: int, new: int) -> bool:
    _py_check(arr, index)
    with _FALLBACK_LOCK:
        if int(arr[index]) != _py_wrap(arr, old):
            return False
        arr[index] = _py_wrap(arr, new)
        return True


def _py_fence() -> None:
    with _FALLBACK_LOCK:
        pass


# --------------------------------------------------------------------------------------
# The public names: compiled when the JIT is on, the fallback otherwise.

_Load = Callable[[Any, int], int]
_Store = Callable[[Any, int, int], None]
_Rmw = Callable[[Any, int, int], int]

atomic_load: _Load = documented(
    _jit_load if JIT_ENABLED else _py_load,
    "atomic_load",
    """Sequentially consistent load of ``arr[index]`` (Go's ``atomic.LoadInt64``).""",
)

atomic_load_acquire: _Load = documented(
    _jit_load_acquire if JIT_ENABLED else _py_load,
    "atomic_load_acquire",
    """Acquire load: later reads and writes cannot move before it (lock entry).""",
)

atomic_load_relaxed: _Load = documented(
    _jit_load_relaxed if JIT_ENABLED else _py_load,
    "atomic_load_relaxed",
    """Relaxed (``monotonic``) load: atomic, orders nothing; for polling in spin loops.""",
)

atomic_store: _Store = documented(
    _jit_store if JIT_ENABLED else _py_store,
    "atomic_store",
    """Sequentially consistent store (Go's ``atomic.StoreInt64``).""",
)

atomic_store_release: _Store = documented(
    _jit_store_release if JIT_ENABLED else _py_store,
    "atomic_store_release",
    """Release store: earlier reads and writes cannot move after it (lock exit).""",
)

atomic_store_relaxed: _Store = documented(
    _jit_store_relaxed if JIT_ENABLED else _py_store,
    "atomic_store_relaxed",
    """Relaxed (``monotonic``) store: atomic, orders nothing.""",
)

atomic_add: _Rmw = documented(
    _jit_add if JIT_ENABLED else _py_add,
    "atomic_add",
    """Add ``delta`` (wrapping) and return the **new** value (Go's ``atomic.AddInt64``).""",
)

atomic_fetch_add: _Rmw = documented(
    _jit_fetch_add if JIT_ENABLED else _py_fetch_add,
    "atomic_fetch_add",
    """Add ``delta`` (wrapping) and return the **old** value (C++ ``fetch_add``).""",
)

atomic_swap: _Rmw = documented(
    _jit_swap if JIT_ENABLED else _py_swap,
    "atomic_swap",
    """Store ``new`` and return the old value (Go's ``atomic.SwapInt64``).""",
)

atomic_and: _Rmw = documented(
    _jit_and if JIT_ENABLED else _py_and,
    "atomic_and",
    """Bitwise-and ``mask`` into the cell and return the old value (Go 1.23 ``AndInt64``).""",
)

atomic_or: _Rmw = documented(
    _jit_or if JIT_ENABLED else _py_or,
    "atomic_or",
    """Bitwise-or ``mask`` into the cell and return the old value (Go 1.23 ``OrInt64``).""",
)

atomic_cas: Callable[[Any, int, int, int], bool] = documented(
    _jit_cas if JIT_ENABLED else _py_cas,
    "atomic_cas",
    """If the cell equals ``old``, store ``new`` and return True; else return False
(Go's ``atomic.CompareAndSwapInt64``). Sequentially consistent either way.""",
)

atomic_fence: Callable[[], None] = documented(
    _jit_fence if JIT_ENABLED else _py_fence,
    "atomic_fence",
    """A sequentially consistent fence (``mfence`` on x86-64).""",
)
