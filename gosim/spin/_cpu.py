"""The CPU and OS primitives spin loops are built from: pause, yield, futex.

Go's names: ``procyield(n)`` executes the CPU's spin-wait hint ``n`` times (Go's
``runtime.procyield``, ``PAUSE`` on amd64, ``YIELD`` on arm64); ``osyield`` gives the
core to another thread (``sched_yield``); ``futexsleep``/``futexwakeup`` park and wake
threads on a word (Linux ``futex(2)``, Go's ``os_linux.go``).

How they are made: each is a numba ``@intrinsic``. The pause is the LLVM target
intrinsic ``llvm.x86.sse2.pause`` (or ``llvm.aarch64.hint`` with ``yield``): numba's code
emitter has no inline-assembly parser, so ``asm("pause")`` aborts LLVM while a target
intrinsic does not. Other architectures get no instruction: the loop still works, only
without the hint's power saving and pipeline-flush avoidance. ``sched_yield`` and
``syscall`` are called by symbol name, which LLVM resolves in the running process, so
the compiled code holds no addresses and can be cached on disk.

Without the JIT (``NUMBA_DISABLE_JIT=1``) the same names run as Python: ``cpu_relax``
becomes ``time.sleep(0)`` because a Python loop that spins keeps the GIL and would stop
the holder it waits for from ever releasing; the futex goes through ``ctypes``.
"""

from __future__ import annotations

import ctypes
import os
import platform
import sys
import time
from collections.abc import Callable
from typing import Any

from llvmlite import ir
from numba import types
from numba.core import cgutils as _cgutils_typed

from gosim.jit import JIT_ENABLED, documented, intrinsic, kernel

cgutils: Any = _cgutils_typed  # numba.core.cgutils is untyped


__all__ = [
    "HAVE_FUTEX",
    "PAUSE_INSTRUCTION",
    "cpu_relax",
    "futexsleep",
    "futexwakeup",
    "osyield",
    "procyield",
]

_kernel = kernel(refcounts=False)  # no allocation: see gosim.jit.kernel


_MACHINE = platform.machine().lower()

#: The spin-wait hint ``cpu_relax`` emits on this machine, or "" when there is none.
PAUSE_INSTRUCTION: str = (
    "pause"
    if _MACHINE in ("x86_64", "amd64", "i386", "i686")
    else "yield"
    if _MACHINE in ("aarch64", "arm64")
    else ""
)

# futex(2) system call numbers by architecture (Linux only).
_SYS_FUTEX = {
    "x86_64": 202,
    "amd64": 202,
    "aarch64": 98,
    "arm64": 98,
    "riscv64": 98,
    "ppc64le": 221,
    "ppc64": 221,
    "s390x": 238,
}
_FUTEX_WAIT_PRIVATE = 128  # FUTEX_WAIT | FUTEX_PRIVATE_FLAG
_FUTEX_WAKE_PRIVATE = 129  # FUTEX_WAKE | FUTEX_PRIVATE_FLAG

#: True when futexsleep really parks the thread in the kernel (Linux); otherwise it
#: sleeps briefly and returns, which the lock's retry loop tolerates as a spurious wake.
HAVE_FUTEX: bool = sys.platform.startswith("linux") and _MACHINE in _SYS_FUTEX
_SYS_FUTEX_NR = _SYS_FUTEX.get(_MACHINE, -1)
_HAVE_POSIX = os.name == "posix"

# A futex word is 32 bits; the lock words are int64, so address their low half.
_LOW_HALF_OFFSET = 0 if sys.byteorder == "little" else 4
# Without a futex, a "sleep" is this long (microseconds) before the caller rechecks.
_FALLBACK_SLEEP_US = 50


@intrinsic
def _pause(typingctx: Any) -> Any:
    sig = types.void()

    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        void_fn = ir.FunctionType(ir.VoidType(), [])
        if PAUSE_INSTRUCTION == "pause":
            fn = cgutils.get_or_insert_function(builder.module, void_fn, "llvm.x86.sse2.pause")
            builder.call(fn, [])
        elif PAUSE_INSTRUCTION == "yield":
            hint_fn = ir.FunctionType(ir.VoidType(), [ir.IntType(32)])
            fn = cgutils.get_or_insert_function(builder.module, hint_fn, "llvm.aarch64.hint")
            builder.call(fn, [ir.Constant(ir.IntType(32), 1)])  # hint #1 is YIELD
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def _sched_yield(typingctx: Any) -> Any:
    sig = types.void()

    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        if _HAVE_POSIX:
            fnty = ir.FunctionType(ir.IntType(32), [])
            builder.call(cgutils.get_or_insert_function(builder.module, fnty, "sched_yield"), [])
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def _usleep(typingctx: Any, micros: Any) -> Any:
    if not isinstance(micros, types.Integer):
        return None
    sig = types.void(types.uint32)

    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        if _HAVE_POSIX:
            fnty = ir.FunctionType(ir.IntType(32), [ir.IntType(32)])
            builder.call(cgutils.get_or_insert_function(builder.module, fnty, "usleep"), args)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def _futex(typingctx: Any, arr: Any, index: Any, op: Any, val: Any) -> Any:
    """``syscall(SYS_futex, &arr[index] (low half), op, val, NULL, NULL, 0)``."""
    if not (isinstance(arr, types.Array) and arr.ndim == 1 and arr.dtype == types.int64):
        return None
    sig = types.int64(arr, types.intp, types.int64, types.int64)

    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        arr_v, index_v, op_v, val_v = args
        i64 = ir.IntType(64)
        array = context.make_array(sig.args[0])(context, builder, arr_v)
        ptr = cgutils.get_item_pointer(
            context, builder, sig.args[0], array, [index_v], wraparound=False
        )
        addr = builder.add(builder.ptrtoint(ptr, i64), ir.Constant(i64, _LOW_HALF_OFFSET))
        fnty = ir.FunctionType(i64, [i64] * 7)
        fn = cgutils.get_or_insert_function(builder.module, fnty, "syscall")
        zero = ir.Constant(i64, 0)
        return builder.call(
            fn, [ir.Constant(i64, _SYS_FUTEX_NR), addr, op_v, val_v, zero, zero, zero]
        )

    return sig, codegen


# --------------------------------------------------------------------------------------
# Compiled versions.


@_kernel
def _jit_cpu_relax() -> None:
    _pause()


@_kernel
def _jit_procyield(cycles: int) -> None:
    for _ in range(cycles):
        _pause()


@_kernel
def _jit_osyield() -> None:
    _sched_yield()


@_kernel
def _jit_futexsleep(words: Any, index: int, val: int) -> None:
    if HAVE_FUTEX:
        _futex(words, index, _FUTEX_WAIT_PRIVATE, val)
    else:
        _usleep(_FALLBACK_SLEEP_US)


@_kernel
def _jit_futexwakeup(words: Any, index: int, count: int) -> None:
    if HAVE_FUTEX:
        _futex(words, index, _FUTEX_WAKE_PRIVATE, count)


# --------------------------------------------------------------------------------------
# Pure-Python versions (NUMBA_DISABLE_JIT=1).

_libc_syscall: Any = None
if HAVE_FUTEX:
    _libc_syscall = ctypes.CDLL(None, use_errno=True).syscall
    _libc_syscall.argtypes = [ctypes.c_long] * 7
    _libc_syscall.restype = ctypes.c_long


def _py_cpu_relax() -> None:
    time.sleep(0)  # releases the GIL, which a Python spinner must do to let the holder run


def _py_procyield(cycles: int) -> None:
    for _ in range(cycles):
        time.sleep(0)


def _py_osyield() -> None:
    if hasattr(os, "sched_yield"):
        os.sched_yield()
    else:
        time.sleep(0)


def _py_futex(words: Any, index: int, op: int, val: int) -> None:
    if not 0 <= index < words.shape[0]:
        raise IndexError("futex: index out of range")
    addr = words.ctypes.data + index * words.itemsize + _LOW_HALF_OFFSET
    _libc_syscall(_SYS_FUTEX_NR, addr, op, val, 0, 0, 0)


def _py_futexsleep(words: Any, index: int, val: int) -> None:
    if HAVE_FUTEX:
        _py_futex(words, index, _FUTEX_WAIT_PRIVATE, val)
    else:
        time.sleep(_FALLBACK_SLEEP_US / 1e6)


def _py_futexwakeup(words: Any, index: int, count: int) -> None:
    if HAVE_FUTEX:
        _py_futex(words, index, _FUTEX_WAKE_PRIVATE, count)


cpu_relax: Callable[[], None] = documented(
    _jit_cpu_relax if JIT_ENABLED else _py_cpu_relax,
    "cpu_relax",
    """One spin-wait hint (x86 ``pause``, arm64 ``yield``; nothing elsewhere).""",
)

procyield: Callable[[int], None] = documented(
    _jit_procyield if JIT_ENABLED else _py_procyield,
    "procyield",
    """``cycles`` spin-wait hints in a row (Go's ``runtime.procyield``).""",
)

osyield: Callable[[], None] = documented(
    _jit_osyield if JIT_ENABLED else _py_osyield,
    "osyield",
    """Offer the core to another runnable thread (``sched_yield``; Go's ``osyield``).""",
)

futexsleep: Callable[[Any, int, int], None] = documented(
    _jit_futexsleep if JIT_ENABLED else _py_futexsleep,
    "futexsleep",
    """If the 32-bit low half of ``words[index]`` still equals ``val``, sleep until a
:func:`futexwakeup` on it (or a spurious wake-up); otherwise return at once. Go's
``futexsleep`` with no timeout. Callers must recheck their condition after it returns.""",
)

futexwakeup: Callable[[Any, int, int], None] = documented(
    _jit_futexwakeup if JIT_ENABLED else _py_futexwakeup,
    "futexwakeup",
    """Wake at most ``count`` threads sleeping in :func:`futexsleep` on ``words[index]``.""",
)
