"""The page heap: spans of pages for size classes and large objects, and their return.

Mirrors ``runtime/mheap.go``: ``mheap.alloc`` -> ``allocSpan`` (find pages, initialise
the span record, point ``spans[]`` at it) and ``freeSpan`` (clear ``spans[]``, give the
pages back to the page allocator).

Glossary
--------
span record
    The row of ``meta``'s span table at the span's first page (Go's ``mspan``).
spanof
    Page -> first page of the in-use span covering it, -1 for free pages (Go's
    ``h.spans``, which ``spanOf`` reads to map an address to its span).
zeroedBase
    Pages at or above it were never handed out, so they still hold zeros and a span made
    of them needs no clearing (Go's ``heapArena.zeroedBase`` / ``allocNeedsZero``).

Go's mheap also keeps a per-P page cache (64 pages) in front of the page allocator to
avoid its lock; with no lock here there is nothing for it to amortise, so it is omitted.
"""

from __future__ import annotations

import numpy as np

from gosim.jit import kernel

from ._bits import ALL_ONES
from ._layout import (
    BITMAP_WORDS_PER_PAGE,
    C_DIVMAGIC,
    C_SIZE,
    H_B_ACACHE,
    H_B_MBITS,
    H_O_CLASS,
    H_O_SPAN,
    H_O_SPANOF,
    H_PAGES_INUSE,
    H_SPANS_INUSE,
    H_SWEEPGEN,
    H_ZEROED_BASE,
    S_ALLOCCOUNT,
    S_BEFORE_CACHE,
    S_CACHED_BY,
    S_ELEMSIZE,
    S_FREEINDEX,
    S_LIMIT,
    S_LIST,
    S_NEEDZERO,
    S_NELEMS,
    S_NEXT,
    S_NPAGES,
    S_PENDING,
    S_PREV,
    S_SPC,
    S_SWEEPGEN,
    SPAN_FIELDS,
)
from ._pagealloc import pa_alloc_range, pa_find, pa_free_range
from ._sizeclasses import PAGE_SHIFT


@kernel
def mheap_alloc(meta: np.ndarray, bits: np.ndarray, npages: int, spc: int) -> int:
    """A fresh in-use span of ``npages`` pages for span class ``spc``, or -1 when no free
    run is long enough (Go's ``mheap.alloc``; the caller reclaims and retries)."""
    base = pa_find(meta, bits, npages)
    if base < 0:
        return -1
    pa_alloc_range(meta, bits, base, npages)
    row = meta[H_O_SPAN] + base * SPAN_FIELDS
    cls = spc >> 1
    if cls == 0:
        elemsize = npages << PAGE_SHIFT
        nelems = 1
    else:
        elemsize = meta[meta[H_O_CLASS] + C_SIZE + cls]
        # n := s.divideByElemSize(npages << _PageShift): Go's magic-number division.
        nelems = ((npages << PAGE_SHIFT) * meta[meta[H_O_CLASS] + C_DIVMAGIC + cls]) >> 32
    meta[row + S_NPAGES] = npages
    meta[row + S_SPC] = spc
    meta[row + S_ELEMSIZE] = elemsize
    meta[row + S_NELEMS] = nelems
    meta[row + S_FREEINDEX] = 0
    meta[row + S_ALLOCCOUNT] = 0
    meta[row + S_SWEEPGEN] = meta[H_SWEEPGEN]
    meta[row + S_LIST] = -1
    meta[row + S_NEXT] = -1
    meta[row + S_PREV] = -1
    meta[row + S_PENDING] = 0
    meta[row + S_BEFORE_CACHE] = 0
    meta[row + S_CACHED_BY] = -1
    meta[row + S_LIMIT] = (base << PAGE_SHIFT) + nelems * elemsize
    # allocNeedsZero: pages above zeroedBase are still zero from the arena's creation.
    meta[row + S_NEEDZERO] = 1 if base < meta[H_ZEROED_BASE] else 0
    meta[H_ZEROED_BASE] = max(meta[H_ZEROED_BASE], base + npages)
    ospanof = meta[H_O_SPANOF]
    for p in range(base, base + npages):
        meta[ospanof + p] = base
    # Fresh bitmaps: nothing allocated, nothing marked (Go's newAllocBits/newMarkBits).
    nwords = (nelems + 63) >> 6
    abase = base * BITMAP_WORDS_PER_PAGE
    mbase = meta[H_B_MBITS] + abase
    for w in range(nwords):
        bits[abase + w] = 0
        bits[mbase + w] = 0
    bits[meta[H_B_ACACHE] + base] = ALL_ONES
    meta[H_PAGES_INUSE] += npages
    meta[H_SPANS_INUSE] += 1
    return base


@kernel
def mheap_free_span(meta: np.ndarray, bits: np.ndarray, s: int) -> None:
    """Return span ``s``'s pages to the page allocator (Go's ``mheap.freeSpan``).

    Precondition: ``s`` is in use, on no mcentral list and in no mcache.
    """
    row = meta[H_O_SPAN] + s * SPAN_FIELDS
    npages = meta[row + S_NPAGES]
    ospanof = meta[H_O_SPANOF]
    for p in range(s, s + npages):
        meta[ospanof + p] = -1
    meta[row + S_SPC] = -1
    meta[row + S_LIST] = -1
    meta[row + S_CACHED_BY] = -1
    pa_free_range(meta, bits, s, npages)
    meta[H_PAGES_INUSE] -= npages
    meta[H_SPANS_INUSE] -= 1
