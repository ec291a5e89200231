"""gosim.atomic: Go's sync/atomic semantics, atomicity under threads and in kernels."""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from numba import njit
from numba.core.errors import TypingError

from gosim import atomic
from gosim.atomic import (
    Bool,
    InconsistentTypeError,
    Int32,
    Int64,
    NilValueError,
    Uint32,
    Uint64,
    Value,
    _ops,
    atomic_add,
    atomic_and,
    atomic_cas,
    atomic_fetch_add,
    atomic_load,
    atomic_load_acquire,
    atomic_load_relaxed,
    atomic_or,
    atomic_store,
    atomic_store_relaxed,
    atomic_store_release,
    atomic_swap,
)

REPO = Path(__file__).resolve().parents[2]
INT_TYPES = [Int32, Int64, Uint32, Uint64]

jit_only = pytest.mark.skipif(
    not atomic.JIT_ENABLED, reason="needs compiled kernels; NUMBA_DISABLE_JIT is set"
)


def wrap(value: int, bits: int, signed: bool) -> int:
    """The model: two's-complement reduction of an exact integer to `bits` bits."""
    value %= 1 << bits
    if signed and value >= 1 << (bits - 1):
        value -= 1 << bits
    return value


def type_values(cls: Any) -> st.SearchStrategy[int]:
    return st.integers(cls.min_value, cls.max_value)


def deltas(cls: Any) -> st.SearchStrategy[int]:
    return st.integers(-(1 << (cls.bits - 1)), (1 << cls.bits) - 1)


# ------------------------------------------------------------------ integer semantics


@pytest.mark.parametrize("cls", INT_TYPES)
def test_zero_value_and_basic_operations(cls: Any) -> None:
    a = cls()
    assert a.load() == 0
    a.store(7)
    assert a.load() == 7
    assert a.add(3) == 10
    assert a.swap(4) == 10
    assert a.load() == 4
    assert not a.compare_and_swap(5, 9)
    assert a.load() == 4
    assert a.compare_and_swap(4, 9)
    assert a.load() == 9
    assert repr(a) == f"{cls.__name__}(9)"


@pytest.mark.parametrize("cls", INT_TYPES)
def test_add_wraps_at_both_ends(cls: Any) -> None:
    a = cls(cls.max_value)
    assert a.add(1) == cls.min_value
    assert a.add(-1) == cls.max_value
    # -1 and 2**bits - 1 are the same bit pattern: both decrement.
    assert a.add((1 << cls.bits) - 1) == cls.max_value - 1


@given(data=st.data())
@pytest.mark.parametrize("cls", INT_TYPES)
def test_and_or_return_the_old_value_and_apply_the_mask(cls: Any, data: st.DataObject) -> None:
    """Go 1.23's And/Or methods: the bitwise operation, the old value returned; the
    mask read either way round, as add's delta is."""
    start = data.draw(type_values(cls))
    mask = data.draw(deltas(cls))
    signed = cls.min_value < 0
    a = cls(start)
    assert a.and_(mask) == start
    assert a.load() == wrap(start & mask, cls.bits, signed)
    a.store(start)
    assert a.or_(mask) == start
    assert a.load() == wrap(start | mask, cls.bits, signed)


@pytest.mark.parametrize("cls", INT_TYPES)
def test_and_or_from_threads_lose_no_bit(cls: Any) -> None:
    """Each thread sets and clears its own bit many times; every set is seen by an
    or_ that returns the bit clear, and the word ends with every bit set once."""
    a = cls()
    nthreads = min(8, cls.bits - 1)

    wrong: list[int] = []  # a thread's assertion would not fail the test: count instead

    def work(bit: int) -> None:
        bad = 0
        for _ in range(2000):
            bad += a.or_(1 << bit) & (1 << bit) != 0
            bad += a.and_(~(1 << bit)) & (1 << bit) == 0
        a.or_(1 << bit)
        wrong.append(bad)

    threads = [threading.Thread(target=work, args=(b,)) for b in range(nthreads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert wrong == [0] * nthreads
    assert a.load() == (1 << nthreads) - 1


@pytest.mark.parametrize("cls", INT_TYPES)
def test_store_range_boundaries(cls: Any) -> None:
    a = cls()
    a.store(cls.max_value)
    assert a.load() == cls.max_value
    a.store(cls.min_value)
    assert a.load() == cls.min_value
    with pytest.raises(OverflowError):
        a.store(cls.max_value + 1)
    with pytest.raises(OverflowError):
        a.store(cls.min_value - 1)
    with pytest.raises(OverflowError):
        a.swap(cls.max_value + 1)
    with pytest.raises(OverflowError):
        a.compare_and_swap(cls.min_value, cls.max_value + 1)
    assert a.load() == cls.min_value  # failed operations changed nothing


@pytest.mark.parametrize("cls", INT_TYPES)
def test_add_delta_range_boundaries(cls: Any) -> None:
    a = cls()
    a.add(-(1 << (cls.bits - 1)))
    a.add((1 << cls.bits) - 1)
    with pytest.raises(OverflowError):
        a.add(1 << cls.bits)
    with pytest.raises(OverflowError):
        a.add(-(1 << (cls.bits - 1)) - 1)


@pytest.mark.parametrize("cls", INT_TYPES)
@given(data=st.data())
def test_add_sequence_matches_twos_complement(cls: Any, data: st.DataObject) -> None:
    start = data.draw(type_values(cls))
    ds = data.draw(st.lists(deltas(cls), max_size=20))
    a = cls(start)
    exact = start
    signed = cls.min_value < 0
    for d in ds:
        exact += d
        assert a.add(d) == wrap(exact, cls.bits, signed)
    assert a.load() == wrap(exact, cls.bits, signed)


DTYPES = [np.int32, np.int64, np.uint32, np.uint64]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "impl",
    [
        pytest.param(
            ("compiled", atomic_add, atomic_fetch_add, atomic_and, atomic_or), id="public"
        ),
        pytest.param(
            ("fallback", _ops._py_add, _ops._py_fetch_add, _ops._py_and, _ops._py_or), id="fallback"
        ),
    ],
)
@given(data=st.data())
def test_kernel_functions_wrap_like_go(dtype: Any, impl: Any, data: st.DataObject) -> None:
    """The (arr, index) functions, and the pure-Python fallback under the same contract,
    agree with the model for each width, including operands wider than the cell."""
    _, add, fetch_add, and_, or_ = impl
    info = np.iinfo(dtype)
    bits, signed = info.bits, info.min < 0
    arr = np.zeros(3, dtype=dtype)
    start = data.draw(st.integers(int(info.min), int(info.max)))
    arr[1] = start
    delta = data.draw(st.integers(-(1 << 62), (1 << 62)))
    exact = start + delta
    assert add(arr, 1, delta) == wrap(exact, bits, signed)
    assert fetch_add(arr, 1, -delta) == wrap(exact, bits, signed)
    assert int(arr[1]) == start
    # Operands from Python are int64s (the dispatcher's integer type), wider than 32-bit
    # cells: the cell keeps the low bits.
    mask = data.draw(st.integers(-(1 << 63), (1 << 63) - 1))
    assert and_(arr, 1, mask) == start
    assert int(arr[1]) == wrap(start & mask, bits, signed)
    assert or_(arr, 1, mask) == wrap(start & mask, bits, signed)
    assert int(arr[1]) == wrap((start & mask) | mask, bits, signed)
    assert arr[0] == 0 and arr[2] == 0  # neighbours untouched


@pytest.mark.parametrize("dtype", DTYPES)
def test_loads_stores_swap_cas_every_ordering(dtype: Any) -> None:
    arr = np.zeros(2, dtype=dtype)
    for store in (atomic_store, atomic_store_release, atomic_store_relaxed):
        store(arr, 1, 5)
        for load in (atomic_load, atomic_load_acquire, atomic_load_relaxed):
            assert load(arr, 1) == 5
    assert atomic_swap(arr, 1, 6) == 5
    assert atomic_cas(arr, 1, 6, 8) is True
    assert atomic_cas(arr, 1, 6, 9) is False
    assert arr[1] == 8 and arr[0] == 0


def test_index_is_bounds_checked() -> None:
    arr = np.zeros(4, dtype=np.int64)
    for bad in (-1, 4):
        with pytest.raises(IndexError):
            atomic_add(arr, bad, 1)
        with pytest.raises(IndexError):
            atomic_load(arr, bad)
        with pytest.raises(IndexError):
            atomic_cas(arr, bad, 0, 1)
    assert atomic_add(arr, 3, 1) == 1


@jit_only
def test_unsupported_arrays_are_rejected_when_compiling() -> None:
    with pytest.raises(TypingError):
        atomic_add(np.zeros(2, dtype=np.float64), 0, 1)
    with pytest.raises(TypingError):
        atomic_add(np.zeros((2, 2), dtype=np.int64), 0, 1)
    frozen = np.zeros(2, dtype=np.int64)
    frozen.flags.writeable = False
    with pytest.raises(TypingError):
        atomic_store(frozen, 0, 1)
    assert atomic_load(frozen, 0) == 0  # reading a read-only cell is fine


def test_at_shares_an_existing_cell_and_validates_it() -> None:
    cells = np.zeros(4, dtype=np.uint32)
    a = Uint32.at(cells, 2)
    a.add(5)
    assert cells[2] == 5 and a.cell is cells and a.index == 2
    cells[2] = 9
    assert a.load() == 9
    with pytest.raises(TypeError):
        Int32.at(cells, 0)
    with pytest.raises(IndexError):
        Uint32.at(cells, 4)
    with pytest.raises(TypeError):
        Uint32.at(cells.reshape(2, 2), 0)
    flags = np.zeros(1, dtype=np.uint32)
    b = Bool.at(flags)
    assert b.compare_and_swap(False, True) and flags[0] == 1
    with pytest.raises(TypeError):
        Bool.at(np.zeros(1, dtype=np.int32))


def test_bool() -> None:
    b = Bool()
    assert b.load() is False
    assert b.swap(True) is False
    assert b.load() is True
    assert not b.compare_and_swap(False, True)
    assert b.compare_and_swap(True, False)
    b.store(True)
    assert repr(b) == "Bool(True)"
    assert b.cell[b.index] == 1  # Go's representation: a uint32 holding 0 or 1


# ------------------------------------------------------------------------ Value


def test_value_zero_and_store() -> None:
    v: Value[Any] = Value()
    assert v.load() is None
    v.store("a")
    assert v.load() == "a"
    assert v.swap("b") == "a"
    assert repr(v) == "Value('b')"


def test_value_go_panics_exact_messages() -> None:
    v: Value[Any] = Value()
    with pytest.raises(NilValueError, match=r"^sync/atomic: store of nil value into Value$"):
        v.store(None)
    with pytest.raises(NilValueError, match=r"^sync/atomic: swap of nil value into Value$"):
        v.swap(None)
    with pytest.raises(
        NilValueError, match=r"^sync/atomic: compare and swap of nil value into Value$"
    ):
        v.compare_and_swap(None, None)
    v.store(1)
    with pytest.raises(
        InconsistentTypeError,
        match=r"^sync/atomic: store of inconsistently typed value into Value$",
    ):
        v.store("x")
    with pytest.raises(
        InconsistentTypeError,
        match=r"^sync/atomic: swap of inconsistently typed value into Value$",
    ):
        v.swap(1.0)
    with pytest.raises(
        InconsistentTypeError,
        match=r"^sync/atomic: compare and swap of inconsistently typed values$",
    ):
        v.compare_and_swap(1, "x")
    with pytest.raises(
        InconsistentTypeError,
        match=r"^sync/atomic: compare and swap of inconsistently typed value into Value$",
    ):
        v.compare_and_swap("a", "b")
    assert v.load() == 1  # every failed operation left the value alone
    # Subclasses are other concrete types, as in Go; bool is not int.
    with pytest.raises(InconsistentTypeError):
        v.store(True)
    assert isinstance(NilValueError("x"), ValueError)
    assert isinstance(InconsistentTypeError("x"), TypeError)


def test_value_compare_and_swap() -> None:
    v: Value[Any] = Value()
    assert not v.compare_and_swap(1, 2)  # nothing stored, old is not nil
    assert v.load() is None
    assert v.compare_and_swap(None, 2)  # nothing stored and old is nil: first store
    assert not v.compare_and_swap(None, 3)
    assert not v.compare_and_swap(1, 3)
    assert v.compare_and_swap(2, 3)
    assert v.load() == 3
    f: Value[float] = Value()
    f.store(math.nan)
    assert not f.compare_and_swap(math.nan, 1.0)  # NaN != NaN, as in Go


# --------------------------------------------------------- stateful model check


class AtomicsMachine(RuleBasedStateMachine):
    """Every atomic type against a plain-Python model of Go's semantics."""

    def __init__(self) -> None:
        super().__init__()
        self.ints = {cls: cls() for cls in INT_TYPES}
        self.int_model = dict.fromkeys(INT_TYPES, 0)
        self.flag = Bool()
        self.flag_model = False
        self.value: Value[Any] = Value()
        self.value_model: Any = None
        self.value_type: type | None = None

    @rule(cls=st.sampled_from(INT_TYPES), data=st.data())
    def store(self, cls: Any, data: st.DataObject) -> None:
        v = data.draw(type_values(cls))
        self.ints[cls].store(v)
        self.int_model[cls] = v

    @rule(cls=st.sampled_from(INT_TYPES), data=st.data())
    def add(self, cls: Any, data: st.DataObject) -> None:
        d = data.draw(deltas(cls))
        expect = wrap(self.int_model[cls] + d, cls.bits, cls.min_value < 0)
        assert self.ints[cls].add(d) == expect
        self.int_model[cls] = expect

    @rule(cls=st.sampled_from(INT_TYPES), data=st.data())
    def swap(self, cls: Any, data: st.DataObject) -> None:
        v = data.draw(type_values(cls))
        assert self.ints[cls].swap(v) == self.int_model[cls]
        self.int_model[cls] = v

    @rule(cls=st.sampled_from(INT_TYPES), data=st.data(), use_current=st.booleans())
    def compare_and_swap(self, cls: Any, data: st.DataObject, use_current: bool) -> None:
        old = self.int_model[cls] if use_current else data.draw(type_values(cls))
        new = data.draw(type_values(cls))
        swapped = self.ints[cls].compare_and_swap(old, new)
        assert swapped == (old == self.int_model[cls])
        if swapped:
            self.int_model[cls] = new

    @rule(old=st.booleans(), new=st.booleans())
    def bool_cas(self, old: bool, new: bool) -> None:
        assert self.flag.compare_and_swap(old, new) == (old == self.flag_model)
        if old == self.flag_model:
            self.flag_model = new

    @rule(new=st.booleans())
    def bool_swap(self, new: bool) -> None:
        assert self.flag.swap(new) == self.flag_model
        self.flag_model = new

    @rule(x=st.one_of(st.integers(), st.text(max_size=3), st.none()))
    def value_store(self, x: Any) -> None:
        if x is None:
            with pytest.raises(NilValueError):
                self.value.store(x)
        elif self.value_type is not None and type(x) is not self.value_type:
            with pytest.raises(InconsistentTypeError):
                self.value.store(x)
        else:
            self.value.store(x)
            self.value_model, self.value_type = x, type(x)

    @precondition(lambda self: self.value_type is not None)
    @rule(data=st.data(), use_current=st.booleans())
    def value_cas(self, data: st.DataObject, use_current: bool) -> None:
        strat = st.integers() if self.value_type is int else st.text(max_size=3)
        old = self.value_model if use_current else data.draw(strat)
        new = data.draw(strat)
        swapped = self.value.compare_and_swap(old, new)
        assert swapped == (old == self.value_model)
        if swapped:
            self.value_model = new

    @invariant()
    def loads_match_model(self) -> None:
        for cls, a in self.ints.items():
            assert a.load() == self.int_model[cls]
        assert self.flag.load() == self.flag_model
        assert self.value.load() == self.value_model


TestAtomicsMachine = AtomicsMachine.TestCase


# ------------------------------------------------------------ Python OS threads


def run_threads(n: int, target: Any, *args: Any) -> None:
    threads = [threading.Thread(target=target, args=(i, *args)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


@pytest.mark.parametrize("cls", INT_TYPES)
def test_add_from_python_threads_loses_nothing(cls: Any) -> None:
    a = cls()
    n, m = 4, 3000

    def work(_: int) -> None:
        for _ in range(m):
            a.add(1)

    run_threads(n, work)
    assert a.load() == wrap(n * m, cls.bits, cls.min_value < 0)


def test_cas_loop_from_python_threads_loses_nothing() -> None:
    a = Int64()
    n, m = 4, 2000

    def work(_: int) -> None:
        for _ in range(m):
            while True:
                v = a.load()
                if a.compare_and_swap(v, v + 3):
                    break

    run_threads(n, work)
    assert a.load() == 3 * n * m


def test_value_first_store_race_has_one_winner() -> None:
    for _ in range(20):
        v: Value[int] = Value()
        wins: list[int] = []
        barrier = threading.Barrier(4)

        def work(
            i: int, v: Value[int] = v, wins: list[int] = wins, barrier: threading.Barrier = barrier
        ) -> None:
            barrier.wait()
            if v.compare_and_swap(None, i):
                wins.append(i)

        run_threads(4, work)
        assert len(wins) == 1 and v.load() == wins[0]


# ----------------------------------------------------------- nogil numba kernels


@njit(nogil=True)
def add_kernel(cells: Any, n: int) -> None:
    for _ in range(n):
        atomic_add(cells, 0, 1)


@njit(nogil=True)
def cas_kernel(cells: Any, n: int) -> None:
    for _ in range(n):
        while True:
            v = atomic_load_relaxed(cells, 0)
            if atomic_cas(cells, 0, v, v + 1):
                break


@njit(nogil=True)
def ticket_kernel(cells: Any, out: Any) -> None:
    for i in range(out.shape[0]):
        out[i] = atomic_fetch_add(cells, 0, 1)


@njit(nogil=True)
def plain_add_kernel(cells: Any, n: int) -> None:
    for _ in range(n):
        cells[0] += 1


def kernel_body_ir(kernel: Any) -> str:
    """The LLVM IR of the kernel's own function (not its Python wrapper, nor NRT's)."""
    ir = kernel.inspect_llvm(kernel.signatures[0])
    name = kernel.py_func.__name__
    for block in ir.split("\ndefine ")[1:]:
        header = block.split("\n", 1)[0]
        if f"{len(name)}{name}" in header and "cpython" not in header and "cfunc" not in header:
            return block.split("\n}\n", 1)[0]
    raise AssertionError(f"no function for {name} in the IR")


def run_kernels(kernel: Any, args_per_thread: list[tuple[Any, ...]]) -> None:
    threads = [threading.Thread(target=kernel, args=a) for a in args_per_thread]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


@jit_only
@pytest.mark.parametrize("dtype", DTYPES)
def test_atomic_add_from_two_nogil_kernels(dtype: Any) -> None:
    cells = np.zeros(1, dtype=dtype)
    m = 500_000
    run_kernels(add_kernel, [(cells, m), (cells, m)])
    info = np.iinfo(dtype)
    assert int(cells[0]) == wrap(2 * m, info.bits, info.min < 0)


@jit_only
def test_cas_loop_from_two_nogil_kernels() -> None:
    cells = np.zeros(1, dtype=np.int64)
    m = 300_000
    run_kernels(cas_kernel, [(cells, m), (cells, m)])
    assert cells[0] == 2 * m


@jit_only
def test_fetch_add_hands_out_each_ticket_exactly_once() -> None:
    cells = np.zeros(1, dtype=np.int64)
    outs = [np.empty(200_000, dtype=np.int64) for _ in range(2)]
    run_kernels(ticket_kernel, [(cells, outs[0]), (cells, outs[1])])
    tickets = np.sort(np.concatenate(outs))
    assert np.array_equal(tickets, np.arange(400_000))


@jit_only
def test_kernels_and_python_threads_share_one_cell() -> None:
    counter = Int64()
    m = 200_000

    def python_side(_: int) -> None:
        for _ in range(2000):
            counter.add(1)

    kernel_thread = threading.Thread(target=add_kernel, args=(counter.cell, m))
    kernel_thread.start()
    run_threads(2, python_side)
    kernel_thread.join()
    assert counter.load() == m + 4000


@jit_only
def test_compiled_kernels_contain_the_atomic_instructions() -> None:
    cells = np.zeros(1, dtype=np.int64)
    out = np.empty(1, dtype=np.int64)
    ticket_kernel(cells, out)
    cas_kernel(cells, 1)
    plain_add_kernel(cells, 1)
    ticket_ir = kernel_body_ir(ticket_kernel)
    cas_ir = kernel_body_ir(cas_kernel)
    assert re.search(r"atomicrmw add ptr %[\w.]+, i64 1 seq_cst", ticket_ir)
    assert re.search(r"cmpxchg ptr %[\w.]+, i64 %[\w.]+, i64 %[\w.]+ seq_cst seq_cst", cas_ir)
    assert re.search(r"load atomic i64, ptr %[\w.]+ monotonic", cas_ir)
    # The control: a plain increment compiles to no atomic instruction at all.
    plain_ir = kernel_body_ir(plain_add_kernel)
    assert not re.search(r"\batomicrmw\b|\bcmpxchg\b|load atomic|store atomic", plain_ir)
    if os.uname().machine in ("x86_64", "amd64"):
        ticket_asm = ticket_kernel.inspect_asm(ticket_kernel.signatures[0])
        cas_asm = cas_kernel.inspect_asm(cas_kernel.signatures[0])
        assert re.search(r"\block\s+xaddq\b", ticket_asm)
        assert re.search(r"\block\s+cmpxchgq\b", cas_asm)


# --------------------------------------------------------- NUMBA_DISABLE_JIT=1

DISABLED_JIT_SCRIPT = textwrap.dedent(
    """
    import threading
    import numpy as np
    from numba import njit
    from gosim import atomic
    from gosim.atomic import Int32, Uint64, Value, atomic_add, atomic_cas, atomic_load_relaxed

    assert not atomic.JIT_ENABLED
    # The fall-back's code itself, in a function object of its own carrying atomic_add's
    # docstring (gosim.jit.documented).
    assert atomic_add.__code__ is atomic._ops._py_add.__code__
    assert atomic_add.__doc__.startswith("Add ``delta``")
    # One fall-back serves three loads; each public name has its own docstring.
    assert atomic.atomic_load_acquire.__doc__.startswith("Acquire load")
    assert atomic.atomic_load.__doc__.startswith("Sequentially consistent load")

    @njit(nogil=True)
    def cas_kernel(cells, n):
        for _ in range(n):
            while True:
                v = atomic_load_relaxed(cells, 0)
                if atomic_cas(cells, 0, v, v + 1):
                    break

    cells = np.zeros(1, dtype=np.int64)
    a = Int32(2**31 - 1)
    u = Uint64()
    def work():
        cas_kernel(cells, 3000)
        for _ in range(3000):
            a.add(1)
            u.add(-1)
            atomic_add(cells, 0, 1)
    ts = [threading.Thread(target=work) for _ in range(4)]
    for t in ts: t.start()
    for t in ts: t.join()
    assert cells[0] == 4 * 6000, cells[0]
    assert a.load() == (2**31 - 1 + 12000) - 2**32, a.load()
    assert u.load() == 2**64 - 12000, u.load()
    try:
        Value().store(None)
    except atomic.NilValueError as e:
        assert str(e) == "sync/atomic: store of nil value into Value"
    else:
        raise AssertionError("no panic")
    print("ok")
    """
)


def test_same_code_runs_with_numba_disabled() -> None:
    env = {**os.environ, "NUMBA_DISABLE_JIT": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, "-c", DISABLED_JIT_SCRIPT],
        check=False,
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"
