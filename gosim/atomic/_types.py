"""Go's sync/atomic types as Python objects over a numpy cell.

Each integer object owns (or borrows) one cell of a one-dimensional numpy array, exposed
as ``.cell`` and ``.index``, so a ``nogil`` kernel can operate on the very same word with
the functions of :mod:`gosim.atomic` while Python threads call the methods.
"""

from __future__ import annotations

import threading
from typing import Any, ClassVar, Generic, Self, TypeVar

import numpy as np
import numpy.typing as npt

from ._ops import (
    atomic_add,
    atomic_and,
    atomic_cas,
    atomic_load,
    atomic_or,
    atomic_store,
    atomic_swap,
)

__all__ = [
    "AtomicError",
    "Bool",
    "InconsistentTypeError",
    "Int32",
    "Int64",
    "NilValueError",
    "Uint32",
    "Uint64",
    "Value",
]


class AtomicError(Exception):
    """Base of the errors Go's sync/atomic raises as panics; the message is Go's."""


class NilValueError(AtomicError, ValueError):
    """Raised when ``None`` (Go's nil) is stored, swapped or compare-and-swapped into a
    :class:`Value`. A Value cannot hold nil: keep a sentinel object instead."""


class InconsistentTypeError(AtomicError, TypeError):
    """Raised when a :class:`Value` is given a value whose concrete type differs from
    the type of its first stored value, or a compare-and-swap whose ``old`` and ``new``
    have different types. Every value a Value holds must have one concrete type."""


_INT64_MAX = (1 << 63) - 1
_TWO_64 = 1 << 64


def _as_int64(value: int) -> int:
    """The same 64 bits read as a signed int64, the one integer type numba's dispatcher
    converts every Python int to (a uint64 above 2**63 would not convert); the kernel
    then narrows it to the cell's width, which keeps the bits."""
    return value - _TWO_64 if value > _INT64_MAX else value


class _Cell:
    """An atomic over one cell of a 1-D numpy array of ``dtype``: its own, or one shared
    with ``nogil`` kernels (:meth:`at`)."""

    __slots__ = ("_cell", "_index")

    dtype: ClassVar[np.dtype[Any]]

    # Invariant: _cell is a 1-D, aligned, writeable array of dtype `dtype` and
    # 0 <= _index < len(_cell); only atomic operations touch _cell[_index].
    _cell: npt.NDArray[Any]
    _index: int

    @classmethod
    def at(cls, cell: npt.NDArray[Any], index: int = 0) -> Self:
        """An atomic over an existing cell ``cell[index]`` (shared with kernels).

        Raises TypeError if ``cell`` is not a 1-D, aligned, writeable array of this type's
        dtype, and IndexError if ``index`` is out of range. The current value is kept.
        """
        dtype = cls.dtype
        if not isinstance(cell, np.ndarray) or cell.ndim != 1 or cell.dtype != dtype:
            raise TypeError(f"{cls.__name__}.at needs a 1-D {dtype} array")
        if not (cell.flags.aligned and cell.flags.writeable):
            raise TypeError(f"{cls.__name__}.at needs an aligned, writeable array")
        if not 0 <= index < cell.shape[0]:
            raise IndexError("atomic: index out of range")
        obj = cls.__new__(cls)
        obj._cell = cell
        obj._index = int(index)
        return obj

    @property
    def cell(self) -> npt.NDArray[Any]:
        """The numpy array holding the value; pass it with :attr:`index` to a kernel."""
        return self._cell

    @property
    def index(self) -> int:
        """Position of the value in :attr:`cell`."""
        return self._index


class _AtomicInteger(_Cell):
    """A ``width``-bit integer cell with Go's atomic operations, all sequentially
    consistent. Arithmetic wraps modulo ``2**width`` (two's complement)."""

    __slots__ = ()

    # Each subclass sets the cell's numpy dtype; the rest follows from it.
    min_value: ClassVar[int]
    max_value: ClassVar[int]
    bits: ClassVar[int]
    # add() accepts deltas in [_delta_min, _delta_limit): either reading of `bits` bits.
    _delta_min: ClassVar[int]
    _delta_limit: ClassVar[int]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        info = np.iinfo(cls.dtype)
        cls.bits = info.bits
        cls.min_value, cls.max_value = int(info.min), int(info.max)
        cls._delta_min = -(1 << (info.bits - 1))
        cls._delta_limit = 1 << info.bits

    def __init__(self, value: int = 0) -> None:
        self._cell = np.zeros(1, dtype=self.dtype)
        self._index = 0
        if value:
            self.store(value)

    def _checked(self, value: int) -> int:
        if not self.min_value <= value <= self.max_value:
            raise OverflowError(f"{value} does not fit in {type(self).__name__}")
        return _as_int64(int(value))

    def _operand(self, delta: int) -> int:
        # Accept either reading of a width-bit pattern (-1 and 2**w - 1 both decrement).
        # Any such delta is in [-2**63, 2**64); the kernel keeps its low `bits` bits.
        if not self._delta_min <= delta < self._delta_limit:
            raise OverflowError(f"delta {delta} does not fit in {self.bits} bits")
        return delta - _TWO_64 if delta > _INT64_MAX else int(delta)

    def load(self) -> int:
        """Return the value (Go's ``Load``)."""
        return int(atomic_load(self._cell, self._index))

    def store(self, value: int) -> None:
        """Set the value (Go's ``Store``). OverflowError if it does not fit the type."""
        atomic_store(self._cell, self._index, self._checked(value))

    def add(self, delta: int) -> int:
        """Add ``delta`` and return the new value, wrapping on overflow (Go's ``Add``).

        ``delta`` is taken modulo ``2**bits``, so for unsigned types ``add(-1)``
        decrements as Go's ``Add(^uint32(0))`` does. OverflowError if ``delta`` fits
        neither the signed nor the unsigned ``bits``-bit range.
        """
        return int(atomic_add(self._cell, self._index, self._operand(delta)))

    def and_(self, mask: int) -> int:
        """Bitwise AND the value with ``mask``; return the old value (Go 1.23's ``And``).

        ``mask`` is read as ``add``'s delta is, so ``Uint32.and_(-2)`` clears bit 0.
        """
        return int(atomic_and(self._cell, self._index, self._operand(mask)))

    def or_(self, mask: int) -> int:
        """Bitwise OR the value with ``mask``; return the old value (Go 1.23's ``Or``)."""
        return int(atomic_or(self._cell, self._index, self._operand(mask)))

    def swap(self, new: int) -> int:
        """Set the value to ``new`` and return the old one (Go's ``Swap``)."""
        return int(atomic_swap(self._cell, self._index, self._checked(new)))

    def compare_and_swap(self, old: int, new: int) -> bool:
        """If the value is ``old``, set it to ``new`` and return True; else return False
        (Go's ``CompareAndSwap``). OverflowError if either does not fit the type."""
        return bool(atomic_cas(self._cell, self._index, self._checked(old), self._checked(new)))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.load()})"


class Int32(_AtomicInteger):
    """Go's ``atomic.Int32``: a signed 32-bit integer cell (numpy ``int32``)."""

    __slots__ = ()
    dtype = np.dtype(np.int32)


class Int64(_AtomicInteger):
    """Go's ``atomic.Int64``: a signed 64-bit integer cell (numpy ``int64``)."""

    __slots__ = ()
    dtype = np.dtype(np.int64)


class Uint32(_AtomicInteger):
    """Go's ``atomic.Uint32``: an unsigned 32-bit integer cell (numpy ``uint32``)."""

    __slots__ = ()
    dtype = np.dtype(np.uint32)


class Uint64(_AtomicInteger):
    """Go's ``atomic.Uint64``: an unsigned 64-bit integer cell (numpy ``uint64``)."""

    __slots__ = ()
    dtype = np.dtype(np.uint64)


class Bool(_Cell):
    """Go's ``atomic.Bool``: a boolean in a ``uint32`` cell holding 0 or 1, as Go's is.

    Values given to :meth:`store`, :meth:`swap` and :meth:`compare_and_swap` are
    converted with ``bool()``. Kernels see the cell as a 0/1 ``uint32``.
    """

    __slots__ = ()

    dtype: ClassVar[np.dtype[Any]] = np.dtype(np.uint32)

    # Invariant: _cell[_index] is 0 or 1 whenever it is only touched through this API.

    def __init__(self, value: bool = False) -> None:
        self._cell = np.zeros(1, dtype=self.dtype)
        self._index = 0
        if value:
            self.store(True)

    def load(self) -> bool:
        """Return the value (Go's ``Load``)."""
        return atomic_load(self._cell, self._index) != 0

    def store(self, value: bool) -> None:
        """Set the value (Go's ``Store``)."""
        atomic_store(self._cell, self._index, 1 if value else 0)

    def swap(self, new: bool) -> bool:
        """Set the value to ``new`` and return the old one (Go's ``Swap``)."""
        return atomic_swap(self._cell, self._index, 1 if new else 0) != 0

    def compare_and_swap(self, old: bool, new: bool) -> bool:
        """If the value is ``old``, set it to ``new`` and return True (Go's
        ``CompareAndSwap``); otherwise return False."""
        return bool(atomic_cas(self._cell, self._index, 1 if old else 0, 1 if new else 0))

    def __repr__(self) -> str:
        return f"Bool({self.load()})"


_T = TypeVar("_T")


class Value(Generic[_T]):
    """Go's ``atomic.Value``: holds any object, all of one concrete type.

    The zero Value holds nothing and :meth:`load` returns None. The first store fixes
    the type: later stores of another concrete type (``type(x) is not type(first)``;
    subclasses count as other types, as Go's concrete types do) raise
    :class:`InconsistentTypeError`, and storing None raises :class:`NilValueError`,
    both with Go's panic messages. :meth:`compare_and_swap` compares with ``==`` as Go's
    interface comparison does (so a NaN never matches).

    Loads read one reference, which is atomic in CPython with or without the GIL;
    writers serialise on a lock so the first store's type check and the write are one
    step. Not backed by numpy: Python objects cannot live in a kernel's array.
    """

    __slots__ = ("_lock", "_type", "_value")

    # Invariant: _value is None iff _type is None (nothing stored yet); otherwise
    # type(_value) is _type. Both change only while _lock is held.
    _value: _T | None
    _type: type | None
    _lock: threading.Lock

    def __init__(self) -> None:
        self._value = None
        self._type = None
        self._lock = threading.Lock()

    def load(self) -> _T | None:
        """Return the value of the most recent store, or None if there has been none."""
        return self._value

    def store(self, value: _T) -> None:
        """Set the value. NilValueError for None; InconsistentTypeError if its type
        differs from the first stored value's."""
        if value is None:
            raise NilValueError("sync/atomic: store of nil value into Value")
        with self._lock:
            if self._type is not None and type(value) is not self._type:
                raise InconsistentTypeError(
                    "sync/atomic: store of inconsistently typed value into Value"
                )
            self._type = type(value)
            self._value = value

    def swap(self, new: _T) -> _T | None:
        """Set the value to ``new`` and return the old one (None if there was none).
        Raises as :meth:`store` does, with Go's ``swap`` messages."""
        if new is None:
            raise NilValueError("sync/atomic: swap of nil value into Value")
        with self._lock:
            if self._type is not None and type(new) is not self._type:
                raise InconsistentTypeError(
                    "sync/atomic: swap of inconsistently typed value into Value"
                )
            old = self._value
            self._type = type(new)
            self._value = new
            return old

    def compare_and_swap(self, old: _T | None, new: _T) -> bool:
        """If the value equals ``old`` (None meaning "nothing stored yet"), set it to
        ``new`` and return True; else return False.

        NilValueError if ``new`` is None; InconsistentTypeError if ``old`` is not None
        and its type differs from ``new``'s, or if ``new``'s type differs from the
        stored values' type (Go's three ``compare and swap`` panics).
        """
        if new is None:
            raise NilValueError("sync/atomic: compare and swap of nil value into Value")
        if old is not None and type(old) is not type(new):
            raise InconsistentTypeError(
                "sync/atomic: compare and swap of inconsistently typed values"
            )
        with self._lock:
            if self._type is None:
                if old is not None:
                    return False
                self._type = type(new)
                self._value = new
                return True
            if type(new) is not self._type:
                raise InconsistentTypeError(
                    "sync/atomic: compare and swap of inconsistently typed value into Value"
                )
            current = self._value
            if old is None or type(current) is not type(old) or not bool(current == old):
                return False
            self._value = new
            return True

    def __repr__(self) -> str:
        return f"Value({self._value!r})"
