"""Go's small-object size classes, computed the way ``runtime/mksizeclasses.go`` does.

Glossary
--------
size class
    One of 67 object sizes (8 B ... 32 KiB) that every small allocation is rounded up
    to; class 0 stands for "large" (more than 32 KiB, whole pages).
span
    A run of ``npages`` 8 KiB pages cut into ``objects`` slots of one class's size; the
    ``tail_waste`` bytes at its end hold no slot.
max waste
    The worst fraction of a span lost when every slot holds an object one byte larger than
    the previous class's size: round-up waste plus tail waste.
span class
    ``class << 1 | noscan``: Go keeps pointer-free ("noscan") objects in spans apart from
    the others so the collector never scans them; 136 span classes in all.

The algorithm (mirrors ``makeClasses`` in ``mksizeclasses.go``)
-------------------------------------------------------------
1. Walk sizes upward in steps of ``align``; ``align`` grows at powers of two (16 from 32 B,
   size/8 from 128 B, 256 from 2 KiB) so round-up waste stays near 12.5%.
2. For each size pick the fewest pages whose leftover is at most 1/8 of the span.
3. If the previous class used as many pages and fit as many objects, merge into it
   (keep the larger size).
4. Finally grow each size to the largest multiple of 128 that still fits the same number of
   objects in the same pages (``9472`` rather than ``8448``: six objects in seven pages).

``size_to_class8`` covers sizes up to 1024 in 8-byte steps and ``size_to_class128`` sizes
up to 32 KiB in 128-byte steps; ``size_to_class`` is Go's ``mallocgc`` lookup. The table is
computed at import, never pasted: ``tests/gosim/mem/test_sizeclasses.py`` compares every field
with the ``sizeclasses.go`` of an installed Go toolchain.
"""

from __future__ import annotations

import operator
from typing import NamedTuple

#: log2 of the page size: Go's ``_PageShift``.
PAGE_SHIFT = 13
#: Go's ``pageSize``: 8 KiB.
PAGE_SIZE = 1 << PAGE_SHIFT
#: Go's ``_MaxSmallSize``: larger objects get whole pages of their own.
MAX_SMALL_SIZE = 32 << 10
#: Go's ``smallSizeDiv`` and ``smallSizeMax``: step and limit of ``size_to_class8``.
SMALL_SIZE_DIV = 8
SMALL_SIZE_MAX = 1024
#: Go's ``largeSizeDiv``: step of ``size_to_class128``.
LARGE_SIZE_DIV = 128
#: Go's ``_NumSizeClasses``, class 0 included.
NUM_SIZE_CLASSES = 68
#: Go's ``maxTinySize``: noscan objects smaller than this share 16-byte blocks.
TINY_SIZE = 16


class SizeClass(NamedTuple):
    """One row of Go's size-class table (index = class number; class 0 is all zeros)."""

    size: int  #: bytes per object (``class_to_size``)
    npages: int  #: pages per span (``class_to_allocnpages``)
    objects: int  #: objects per span
    tail_waste: int  #: bytes at the end of a span that hold no object
    max_waste: float  #: worst-case fraction of the span wasted (0.1561 = 15.61%)
    min_align: int  #: guaranteed address alignment of every object in the class
    div_magic: int  #: ``class_to_divmagic``: ``n // size == (n * div_magic) >> 32``


def _power_of_two(x: int) -> bool:
    return x != 0 and x & (x - 1) == 0


def _make_classes() -> list[tuple[int, int]]:
    """``makeClasses``: (size, npages) for classes 0..67."""
    classes: list[list[int]] = [[0, 0]]  # class 0 is a dummy entry, as in Go
    align = 8
    size = align
    while size <= MAX_SMALL_SIZE:
        if _power_of_two(size):  # bump alignment once in a while
            if size >= 2048:
                align = 256
            elif size >= 128:
                align = size // 8
            elif size >= 32:
                align = 16  # Go's heap bitmaps assume 16-byte alignment from 32 bytes
        # Fewest pages whose leftover is at most 1/8 of the span.
        allocsize = PAGE_SIZE
        while allocsize % size > allocsize // 8:
            allocsize += PAGE_SIZE
        npages = allocsize // PAGE_SIZE
        prev = classes[-1]
        if len(classes) > 1 and npages == prev[1] and allocsize // size == allocsize // prev[0]:
            prev[0] = size  # same pages, same count: one class with the larger size
        else:
            classes.append([size, npages])
        size += align
    # Grow each size to fit the same count in the same pages, keeping 128-byte alignment
    # (size_to_class128 needs it).
    for c in classes[1:]:
        psize = c[1] * PAGE_SIZE
        new_size = (psize // (psize // c[0])) & ~(LARGE_SIZE_DIV - 1)
        c[0] = max(c[0], new_size)
    if len(classes) != NUM_SIZE_CLASSES:
        raise AssertionError("number of size classes has changed")
    return [(c[0], c[1]) for c in classes]


def _div_magic(size: int, npages: int) -> int:
    """``^uint32(0)/size + 1``, checked over the span as ``computeDivMagic`` does."""
    if size == 0:
        return 0
    magic = (0xFFFFFFFF // size) + 1
    # Spot-check the span's slot boundaries (Go checks every n; these are the risky ones).
    for n in range(0, npages * PAGE_SIZE + 1, size):
        for m in (n, n + size - 1):
            if m <= npages * PAGE_SIZE and (m * magic) >> 32 != m // size:
                raise AssertionError(f"bad 32-bit divide magic for size {size}")
    return magic


def _build() -> tuple[tuple[SizeClass, ...], tuple[int, ...], tuple[int, ...]]:
    raw = _make_classes()
    rows: list[SizeClass] = [SizeClass(0, 0, 0, 0, 0.0, 0, 0)]
    prev_size = 0
    for size, npages in raw[1:]:
        span = npages * PAGE_SIZE
        objects = span // size
        tail = span - size * objects
        max_waste = ((size - prev_size - 1) * objects + tail) / span
        align_bits = min((size & -size).bit_length() - 1, PAGE_SHIFT)
        rows.append(
            SizeClass(
                size, npages, objects, tail, max_waste, 1 << align_bits, _div_magic(size, npages)
            )
        )
        prev_size = size

    def first_class_at_least(n: int) -> int:
        return next(j for j, r in enumerate(rows) if r.size >= n)

    sc8 = tuple(
        first_class_at_least(i * SMALL_SIZE_DIV)
        for i in range(SMALL_SIZE_MAX // SMALL_SIZE_DIV + 1)
    )
    sc128 = tuple(
        first_class_at_least(SMALL_SIZE_MAX + i * LARGE_SIZE_DIV)
        for i in range((MAX_SMALL_SIZE - SMALL_SIZE_MAX) // LARGE_SIZE_DIV + 1)
    )
    return tuple(rows), sc8, sc128


#: The table: ``CLASSES[c]`` for class ``c`` (0 = large objects).
CLASSES, SIZE_TO_CLASS8, SIZE_TO_CLASS128 = _build()


def size_classes() -> tuple[SizeClass, ...]:
    """Go's size-class table, one :class:`SizeClass` per class; index = class number.

    Class 0 is Go's dummy entry (all fields 0): it stands for large objects.
    """
    return CLASSES


def size_to_class(n: int) -> int:
    """The size class ``mallocgc`` picks for an ``n``-byte object; 0 when ``n`` is large
    (more than 32 KiB) or 0.

    Raises ``TypeError`` for a non-int and ``ValueError`` for a negative size.
    """
    n = operator.index(n)  # TypeError for floats, strings, None
    if n < 0:
        raise ValueError(f"negative size {n}")
    if n > MAX_SMALL_SIZE:
        return 0
    if n <= SMALL_SIZE_MAX - 8:
        return SIZE_TO_CLASS8[(n + SMALL_SIZE_DIV - 1) // SMALL_SIZE_DIV]
    return SIZE_TO_CLASS128[(n - SMALL_SIZE_MAX + LARGE_SIZE_DIV - 1) // LARGE_SIZE_DIV]


def roundupsize(n: int) -> int:
    """Go's ``roundupsize``: bytes actually reserved for an ``n``-byte request."""
    c = size_to_class(n)
    if c == 0 and n > 0:
        return -(-n // PAGE_SIZE) * PAGE_SIZE
    return CLASSES[c].size
