"""The page allocator: a bitmap per 512-page chunk, a summary per chunk, first fit.

Mirrors ``runtime/mpagealloc.go`` and ``mpallocbits.go``.

Glossary
--------
chunk
    512 pages (4 MiB) with one bitmap of 512 bits, 1 = page in use (Go's ``pallocBits``).
summary
    ``(start, max, end)`` of a chunk: free pages at its start, the longest free run in
    it, free pages at its end (Go's ``pallocSum``, which packs the three in 64 bits).
searchAddr
    A page index below which no page is free: every search starts there.

Fast to slow (``pa_find``)
--------------------------
1. Skip the chunks below ``searchAddr`` (and move ``searchAddr`` past chunks found full).
2. Walk the summaries in address order carrying the free run that reaches the current
   chunk's start: a run that crosses chunk boundaries is found from ``end`` + ``start``
   sums without reading a bitmap.
3. Only a chunk whose ``max`` fits the request is searched bit by bit, and then only
   for the first fit.

Go keeps the summaries in a five-level radix tree so that a 48-bit address space is
searched in a handful of steps. An arena here is at most a few GiB (a few thousand
chunks), so one level of summaries scanned linearly from ``searchAddr`` does the same
work in a few microseconds; the tree's upper levels would only add bookkeeping.
"""

from __future__ import annotations

import numpy as np

from gosim.jit import kernel

from ._bits import ALL_ONES, bit, low_mask
from ._layout import (
    CHUNK_PAGES,
    CHUNK_WORDS,
    H_B_PALLOC,
    H_NCHUNKS,
    H_NPAGES,
    H_O_SUM,
    H_SEARCH,
)


@kernel
def pa_update_summary(meta: np.ndarray, bits: np.ndarray, c: int) -> None:
    """Recompute chunk ``c``'s ``(start, max, end)`` from its bitmap (Go's ``summarize``)."""
    base = meta[H_B_PALLOC] + c * CHUNK_WORDS
    start = 0
    best = 0
    run = 0
    seen_used = False
    for w in range(CHUNK_WORDS):
        word = bits[base + w]
        if word == 0:
            run += 64
            continue
        if word == ALL_ONES:
            if not seen_used:
                start = run
                seen_used = True
            best = max(best, run)
            run = 0
            continue
        for i in range(64):
            if word & bit(i):
                if not seen_used:
                    start = run
                    seen_used = True
                best = max(best, run)
                run = 0
            else:
                run += 1
    if not seen_used:
        start = run
    best = max(best, run)
    o = meta[H_O_SUM] + c * 3
    meta[o] = start
    meta[o + 1] = best
    meta[o + 2] = run


@kernel
def _find_in_chunk(meta: np.ndarray, bits: np.ndarray, c: int, npages: int) -> int:
    """First page of the first free run of ``npages`` inside chunk ``c`` (which has one)."""
    base = meta[H_B_PALLOC] + c * CHUNK_WORDS
    run = 0
    for w in range(CHUNK_WORDS):
        word = bits[base + w]
        if word == ALL_ONES:
            run = 0
            continue
        if word == 0 and run + 64 < npages:
            run += 64
            continue
        for i in range(64):
            if word & bit(i):
                run = 0
            else:
                run += 1
                if run >= npages:
                    return c * CHUNK_PAGES + w * 64 + i - npages + 1
    return -1


@kernel
def pa_find(meta: np.ndarray, bits: np.ndarray, npages: int) -> int:
    """First fit: the lowest page starting ``npages`` free pages, or -1 (Go's ``find``)."""
    nchunks = meta[H_NCHUNKS]
    osum = meta[H_O_SUM]
    c = meta[H_SEARCH] // CHUNK_PAGES
    # Chunks with no free page at the bottom of the search move searchAddr up for good.
    while c < nchunks and meta[osum + c * 3 + 1] == 0:
        c += 1
        meta[H_SEARCH] = c * CHUNK_PAGES
    run = 0
    run_start = -1
    while c < nchunks:
        o = osum + c * 3
        start = meta[o]
        best = meta[o + 1]
        end = meta[o + 2]
        if start == CHUNK_PAGES:  # wholly free chunk: the run goes on
            if run == 0:
                run_start = c * CHUNK_PAGES
            run += CHUNK_PAGES
            if run >= npages:
                return run_start
        else:
            if run > 0 and run + start >= npages:
                return run_start  # a run crossing into this chunk comes first
            if best >= npages:
                return _find_in_chunk(meta, bits, c, npages)
            run = end
            run_start = c * CHUNK_PAGES + CHUNK_PAGES - end
        c += 1
    return -1


@kernel
def _set_range(meta: np.ndarray, bits: np.ndarray, base: int, npages: int, used: bool) -> None:
    """Set (``used``) or clear the bitmap bits of pages ``[base, base + npages)`` and
    refresh the summaries of the chunks touched."""
    pbase = meta[H_B_PALLOC]
    p = base
    end = base + npages
    while p < end:
        w = p >> 6
        lo = p & 63
        n = min(64 - lo, end - p)
        mask = low_mask(n) << np.uint64(lo)
        if used:
            bits[pbase + w] |= mask
        else:
            bits[pbase + w] &= ~mask
        p += n
    for c in range(base // CHUNK_PAGES, (end - 1) // CHUNK_PAGES + 1):
        pa_update_summary(meta, bits, c)


@kernel
def pa_alloc_range(meta: np.ndarray, bits: np.ndarray, base: int, npages: int) -> None:
    """Mark pages in use (Go's ``allocRange``); the caller found them free."""
    _set_range(meta, bits, base, npages, True)
    if base == meta[H_SEARCH]:
        meta[H_SEARCH] = base + npages


@kernel
def pa_free_range(meta: np.ndarray, bits: np.ndarray, base: int, npages: int) -> None:
    """Give pages back (Go's ``pageAlloc.free``); ``searchAddr`` moves down to them."""
    _set_range(meta, bits, base, npages, False)
    meta[H_SEARCH] = min(meta[H_SEARCH], base)


@kernel
def pa_init(meta: np.ndarray, bits: np.ndarray) -> None:
    """Every page free; the tail of a partial last chunk is marked in use for good."""
    npages = meta[H_NPAGES]
    nchunks = meta[H_NCHUNKS]
    tail = nchunks * CHUNK_PAGES - npages
    if tail > 0:
        _set_range(meta, bits, npages, tail, True)
    for c in range(nchunks):
        pa_update_summary(meta, bits, c)
    meta[H_SEARCH] = 0


@kernel
def pa_largest_run(meta: np.ndarray) -> int:
    """The longest run of free pages (crossing chunks), for error messages and stats."""
    nchunks = meta[H_NCHUNKS]
    osum = meta[H_O_SUM]
    best = 0
    run = 0
    for c in range(nchunks):
        start = meta[osum + c * 3]
        best = max(best, meta[osum + c * 3 + 1])
        if start == CHUNK_PAGES:
            run += CHUNK_PAGES
        else:
            best = max(best, run + start)
            run = meta[osum + c * 3 + 2]
        best = max(best, run)
    return best


__all__ = ["pa_alloc_range", "pa_find", "pa_free_range", "pa_init"]
