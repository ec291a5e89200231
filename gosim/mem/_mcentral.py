"""mcentral: per span class, the spans not held by any mcache.

Mirrors ``runtime/mcentral.go``: ``cacheSpan`` (hand a span with free slots to an
mcache), ``uncacheSpan`` (take one back) and ``grow`` (a fresh span from the heap).

Fast to slow (``cache_span``)
-----------------------------
1. A swept span with free slots (``partialSwept``): no work at all.
2. An unswept partial span: sweep it now (lazy sweeping, as Go's allocation-driven
   sweeping) and use it; it has free slots by construction.
3. An unswept full span: sweep it; use it if sweeping freed a slot, else file it as
   swept-full. Steps 2 and 3 give up after ``SPAN_BUDGET`` (100) spans, as Go does, to
   bound allocation latency.
4. ``grow``: fresh pages from the page heap; when none are left, sweep everything
   unswept (``reclaim``) and try once more before reporting exhaustion.
"""

from __future__ import annotations

import numpy as np

from gosim.jit import kernel

from ._bits import shr
from ._layout import (
    C_NPAGES,
    H_B_ACACHE,
    H_O_CLASS,
    H_SWEEPGEN,
    S_ALLOCCOUNT,
    S_FREEINDEX,
    S_NELEMS,
    S_PENDING,
    S_SPC,
    S_SWEEPGEN,
    SPAN_BUDGET,
)
from ._mheap import mheap_alloc
from ._mspan import (
    list_id,
    list_pop,
    list_push,
    next_free_index,
    reclaim,
    refill_alloc_cache,
    span_row,
    sweep_span,
)


@kernel
def mheap_alloc_or_reclaim(meta: np.ndarray, bits: np.ndarray, npages: int, spc: int) -> int:
    """``mheap.alloc``, sweeping all unswept spans first if no free run is long enough."""
    s = mheap_alloc(meta, bits, npages, spc)
    if s < 0 and reclaim(meta, bits) > 0:
        s = mheap_alloc(meta, bits, npages, spc)
    return s


@kernel
def cache_span(meta: np.ndarray, bits: np.ndarray, spc: int) -> int:
    """Go's ``mcentral.cacheSpan``: a span of class ``spc`` with a free slot, its
    allocCache loaded at freeindex; -1 when the heap is exhausted."""
    sg = meta[H_SWEEPGEN]
    budget = SPAN_BUDGET
    s = list_pop(meta, list_id(spc, 0, True, sg))  # 1. partial swept
    if s < 0:  # 2. partial unswept: sweep it and use it (it has a free slot)
        s = list_pop(meta, list_id(spc, 0, False, sg))
        if s >= 0:
            sweep_span(meta, bits, s, True)
            budget -= 1
    if s < 0:
        while budget >= 0:  # 3. full unswept: sweep, use if anything was freed
            t = list_pop(meta, list_id(spc, 1, False, sg))
            if t < 0:
                break
            sweep_span(meta, bits, t, True)
            row = span_row(meta, t)
            fi = next_free_index(meta, bits, t)
            if fi != meta[row + S_NELEMS]:
                meta[row + S_FREEINDEX] = fi
                s = t
                break
            list_push(meta, list_id(spc, 1, True, sg), t)
            budget -= 1
    if s < 0:  # 4. grow
        cls = spc >> 1
        npages = meta[meta[H_O_CLASS] + C_NPAGES + cls]
        s = mheap_alloc_or_reclaim(meta, bits, npages, spc)
        if s < 0:
            return -1
    # havespan: load the allocCache so that bit 0 is freeindex.
    row = span_row(meta, s)
    fi = meta[row + S_FREEINDEX]
    refill_alloc_cache(meta, bits, s, fi >> 6)
    ac = meta[H_B_ACACHE] + s
    bits[ac] = shr(bits[ac], fi % 64)
    return int(s)


@kernel
def uncache_span(meta: np.ndarray, s: int) -> None:
    """Go's ``mcentral.uncacheSpan``: file a span an mcache lets go.

    A span with objects freed while it was cached needs a sweep before those slots can be
    reused, so it goes to the unswept partial set (the stale-span case of Go's code,
    which sweeps at once; here the sweep stays lazy).
    """
    row = span_row(meta, s)
    sg = meta[H_SWEEPGEN]
    spc = meta[row + S_SPC]
    if meta[row + S_PENDING] > 0:
        meta[row + S_SWEEPGEN] = sg - 2
        list_push(meta, list_id(spc, 0, False, sg), s)
        return
    meta[row + S_SWEEPGEN] = sg
    full = 1 if meta[row + S_ALLOCCOUNT] >= meta[row + S_NELEMS] else 0
    list_push(meta, list_id(spc, full, True, sg), s)
