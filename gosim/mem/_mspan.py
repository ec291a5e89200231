"""Spans: the allocation bitmap walk, span sets, and sweeping.

Mirrors ``nextFreeFast`` (``malloc.go``), ``nextFreeIndex`` / ``refillAllocCache``
(``mbitmap.go``), ``spanSet`` (``mspanset.go``) and ``sweepLocked.sweep``
(``mgcsweep.go``).

Glossary
--------
allocBits
    One bit per slot, set for slots allocated as of the span's last sweep. Slots below
    ``freeindex`` are allocated too: allocation only moves ``freeindex`` forward.
allocCache
    The complement of the 64 allocBits starting at ``freeindex & ~63``, shifted so bit 0
    is ``freeindex``: a set bit is a free slot, so ``ctz`` finds the next one.
gcmarkBits
    One bit per slot, set for live objects. Go sets them while marking; here they are
    also kept live between collections: an allocation sets its bit ("allocate black", as
    ``gcmarknewobject`` does during a GC) and ``free`` clears it, so a sweep at any time
    keeps exactly the live objects.
sweep
    ``allocBits := gcmarkBits`` (Go swaps the two and starts a fresh, zeroed mark bitmap,
    because the next GC re-marks everything; objects here stay live until freed or left
    unmarked by ``mark``, so the new mark bitmap starts as a copy), ``allocCount :=
    popcount``, ``freeindex := 0``. A span left with no object goes back to the page heap
    unless the sweeper means to allocate from it at once (``preserve``).
span set
    mcentral keeps, per span class, ``partial[2]`` and ``full[2]``: swept and unswept
    sets that swap roles when ``sweepgen`` rises by 2 (one GC cycle). Go's ``spanSet`` is
    a lock-free FIFO; here a doubly linked FIFO through the span records, which also lets
    ``free`` move a span from a swept set to an unswept one in O(1).
sweepgen
    Go's protocol: ``s.sweepgen == sg - 2`` needs sweeping, ``sg`` is swept and ready,
    ``sg + 3`` was swept and is cached in an mcache.

Fast to slow
------------
1. ``next_free_fast``: ``ctz`` of the allocCache; no loop, no bitmap read.
2. ``next_free_index``: reload the allocCache 64 bits further on and retry.
3. The span is full: ``Mcache.refill`` (in ``_mcache.py``) trades it for another.
"""

from __future__ import annotations

import numpy as np

from gosim.jit import kernel

from ._bits import ctz64, inline_kernel, popcount64, shr
from ._layout import (
    BITMAP_WORDS_PER_PAGE,
    H_B_ACACHE,
    H_B_MBITS,
    H_LARGE_FREE_BYTES,
    H_LARGE_FREES,
    H_O_CENTRAL,
    H_O_SPAN,
    H_O_STATS,
    H_RECLAIMED,
    H_SWEEPGEN,
    H_SWEPT,
    LIST_WORDS,
    LISTS_PER_CLASS,
    NUM_SPAN_CLASSES,
    S_ALLOCCOUNT,
    S_FREEINDEX,
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
    ST_SMALL_FREE,
)
from ._mheap import mheap_free_span
from ._sizeclasses import PAGE_SHIFT

# ---- span rows and bitmaps -------------------------------------------------------------


@inline_kernel
def span_row(meta: np.ndarray, s: int) -> int:
    """Offset of span ``s``'s record in ``meta``."""
    return int(meta[H_O_SPAN] + s * SPAN_FIELDS)


@inline_kernel
def refill_alloc_cache(meta: np.ndarray, bits: np.ndarray, s: int, which_word: int) -> None:
    """Go's ``refillAllocCache``: allocCache := ^allocBits[whichWord]."""
    bits[meta[H_B_ACACHE] + s] = ~bits[s * BITMAP_WORDS_PER_PAGE + which_word]


@inline_kernel
def next_free_fast(meta: np.ndarray, bits: np.ndarray, s: int) -> int:
    """Go's ``nextFreeFast``: the next free slot if the allocCache shows one at once, else
    -1. Takes the slot (freeindex, allocCount); the caller sets its mark bit."""
    ac = meta[H_B_ACACHE] + s
    cache = bits[ac]
    the_bit = ctz64(cache)  # is there a free object in the allocCache?
    if the_bit < 64:
        row = span_row(meta, s)
        result = meta[row + S_FREEINDEX] + the_bit
        nelems = meta[row + S_NELEMS]
        if result < nelems:
            freeidx = result + 1
            if freeidx % 64 == 0 and freeidx != nelems:
                return -1  # the cache must be reloaded: next_free_index's job
            bits[ac] = shr(cache, the_bit + 1)
            meta[row + S_FREEINDEX] = freeidx
            meta[row + S_ALLOCCOUNT] += 1
            return int(result)
    return -1


@kernel
def next_free_index(meta: np.ndarray, bits: np.ndarray, s: int) -> int:
    """Go's ``nextFreeIndex``: index of the next free slot at or after freeindex (nelems
    when none), advancing freeindex past it. Does not count it in allocCount."""
    row = span_row(meta, s)
    sfreeindex = meta[row + S_FREEINDEX]
    snelems = meta[row + S_NELEMS]
    if sfreeindex >= snelems:
        return int(snelems)
    ac = meta[H_B_ACACHE] + s
    a_cache = bits[ac]
    bit_index = ctz64(a_cache)
    while bit_index == 64:
        # Move the index to the start of the next cached bits.
        sfreeindex = (sfreeindex + 64) & ~63
        if sfreeindex >= snelems:
            meta[row + S_FREEINDEX] = snelems
            return int(snelems)
        refill_alloc_cache(meta, bits, s, sfreeindex >> 6)
        a_cache = bits[ac]
        bit_index = ctz64(a_cache)
    result = sfreeindex + bit_index
    if result >= snelems:
        meta[row + S_FREEINDEX] = snelems
        return int(snelems)
    bits[ac] = shr(a_cache, bit_index + 1)
    sfreeindex = result + 1
    if sfreeindex % 64 == 0 and sfreeindex != snelems:
        refill_alloc_cache(meta, bits, s, sfreeindex >> 6)
    meta[row + S_FREEINDEX] = sfreeindex
    return int(result)


@inline_kernel
def mark_bit_word(meta: np.ndarray, s: int, idx: int) -> int:
    """Index in ``bits`` of the gcmarkBits word holding slot ``idx`` of span ``s``."""
    return int(meta[H_B_MBITS] + s * BITMAP_WORDS_PER_PAGE + (idx >> 6))


@inline_kernel
def alloc_bit_word(s: int, idx: int) -> int:
    """Index in ``bits`` of the allocBits word holding slot ``idx`` of span ``s``."""
    return int(s * BITMAP_WORDS_PER_PAGE + (idx >> 6))


# ---- span sets (mcentral lists) ---------------------------------------------------------


@inline_kernel
def list_id(spc: int, full: int, swept: bool, sweepgen: int) -> int:
    """mcentral list id: ``partial[sg/2%2]`` is the swept partial set, the other one the
    unswept set, and likewise for ``full`` (Go's ``partialSwept`` etc.)."""
    k = (sweepgen >> 1) & 1
    if not swept:
        k = 1 - k
    return int(spc * LISTS_PER_CLASS + 2 * full + k)


@kernel
def list_push(meta: np.ndarray, lst: int, s: int) -> None:
    """Append span ``s`` to list ``lst`` (FIFO, as Go's ``spanSet.push``)."""
    o = meta[H_O_CENTRAL] + lst * LIST_WORDS
    row = span_row(meta, s)
    tail = meta[o + 1]
    meta[row + S_LIST] = lst
    meta[row + S_NEXT] = -1
    meta[row + S_PREV] = tail
    if tail < 0:
        meta[o] = s
    else:
        meta[span_row(meta, tail) + S_NEXT] = s
    meta[o + 1] = s
    meta[o + 2] += 1


@kernel
def list_remove(meta: np.ndarray, s: int) -> None:
    """Unlink span ``s`` from the list that holds it (a no-op when it is on none)."""
    row = span_row(meta, s)
    lst = meta[row + S_LIST]
    if lst < 0:
        return
    o = meta[H_O_CENTRAL] + lst * LIST_WORDS
    nxt = meta[row + S_NEXT]
    prv = meta[row + S_PREV]
    if prv < 0:
        meta[o] = nxt
    else:
        meta[span_row(meta, prv) + S_NEXT] = nxt
    if nxt < 0:
        meta[o + 1] = prv
    else:
        meta[span_row(meta, nxt) + S_PREV] = prv
    meta[o + 2] -= 1
    meta[row + S_LIST] = -1
    meta[row + S_NEXT] = -1
    meta[row + S_PREV] = -1


@kernel
def list_pop(meta: np.ndarray, lst: int) -> int:
    """Take the oldest span off list ``lst``, or -1 (Go's ``spanSet.pop``)."""
    s = meta[meta[H_O_CENTRAL] + lst * LIST_WORDS]
    if s >= 0:
        list_remove(meta, s)
    return int(s)


@kernel
def mark_dirty(meta: np.ndarray, s: int) -> None:
    """An object of uncached span ``s`` was freed: make sure a sweep will see the span.

    A span on a swept list moves to the unswept partial set (``sweepgen = sg - 2``), where
    ``cacheSpan`` will sweep it lazily; one already unswept stays where it is.
    """
    row = span_row(meta, s)
    sg = meta[H_SWEEPGEN]
    lst = meta[row + S_LIST]
    if lst < 0:
        return  # cached: uncacheSpan sees the pending frees
    spc = meta[row + S_SPC]
    if lst == list_id(spc, 0, True, sg) or lst == list_id(spc, 1, True, sg):
        list_remove(meta, s)
        meta[row + S_SWEEPGEN] = sg - 2
        list_push(meta, list_id(spc, 0, False, sg), s)


# ---- sweeping ----------------------------------------------------------------------------


@kernel
def sweep_span(meta: np.ndarray, bits: np.ndarray, s: int, preserve: bool) -> bool:
    """Go's ``sweepLocked.sweep``: make the span's free slots reusable.

    Precondition: ``s`` is on no list and in no mcache. With ``preserve`` the caller keeps
    the span (it will allocate from it); otherwise it goes to the right swept set, or back
    to the page heap when nothing in it is live. Returns True when the span was freed.
    """
    row = span_row(meta, s)
    sg = meta[H_SWEEPGEN]
    spc = meta[row + S_SPC]
    cls = spc >> 1
    nelems = meta[row + S_NELEMS]
    nwords = (nelems + 63) >> 6
    abase = s * BITMAP_WORDS_PER_PAGE
    mbase = meta[H_B_MBITS] + abase
    nalloc = 0
    for w in range(nwords):
        nalloc += popcount64(bits[mbase + w])
    alloc_count = meta[row + S_ALLOCCOUNT]
    nfreed = alloc_count - nalloc
    # Explicit frees were counted when they happened; the rest died unmarked.
    nfreed_gc = nfreed - meta[row + S_PENDING]
    # allocBits := gcmarkBits (see the module doc for why the mark bits are kept).
    for w in range(nwords):
        bits[abase + w] = bits[mbase + w]
    meta[row + S_ALLOCCOUNT] = nalloc
    meta[row + S_FREEINDEX] = 0
    meta[row + S_PENDING] = 0
    refill_alloc_cache(meta, bits, s, 0)
    meta[row + S_SWEEPGEN] = sg
    meta[H_SWEPT] += 1
    if cls != 0:
        if nfreed_gc > 0:
            meta[meta[H_O_STATS] + ST_SMALL_FREE + cls] += nfreed_gc
        if nfreed > 0:
            meta[row + S_NEEDZERO] = 1
        if not preserve:
            if nalloc == 0:
                mheap_free_span(meta, bits, s)
                meta[H_RECLAIMED] += 1
                return True
            full = 1 if nalloc == nelems else 0
            list_push(meta, list_id(spc, full, True, sg), s)
    elif not preserve:
        if nalloc == 0:
            if nfreed_gc > 0:
                meta[H_LARGE_FREES] += 1
                meta[H_LARGE_FREE_BYTES] += meta[row + S_NPAGES] << PAGE_SHIFT
            mheap_free_span(meta, bits, s)
            meta[H_RECLAIMED] += 1
            return True
        list_push(meta, list_id(spc, 1, True, sg), s)
    return False


@kernel
def reclaim(meta: np.ndarray, bits: np.ndarray) -> int:
    """Sweep every unswept span of every class (Go's ``sweepone`` loop / ``finishsweep_m``
    and ``mheap.reclaim``); returns the number of spans given back to the page heap."""
    sg = meta[H_SWEEPGEN]
    freed = 0
    for spc in range(NUM_SPAN_CLASSES):
        for full in range(2):
            lst = list_id(spc, full, False, sg)
            while True:
                s = list_pop(meta, lst)
                if s < 0:
                    break
                if sweep_span(meta, bits, s, False):
                    freed += 1
    return freed
