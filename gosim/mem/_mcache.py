"""mcache and mallocgc: the per-P front end of the allocator, and the batch kernels.

Mirrors ``runtime/mcache.go`` (``refill``, ``allocLarge``, ``releaseAll``) and the
allocation paths of ``mallocgc`` in ``malloc.go``, plus the free/mark entry points the
Python API needs.

Glossary
--------
P
    A processor slot of the scheduler. Each P owns one mcache row, so allocation from
    different Ps never touches the same span (Go's reason for per-P caches: no lock).
mcache
    Per P: one span per span class to allocate from (``alloc[spc]``, -1 = Go's
    ``emptymspan``), and the tiny block.
tiny block
    A 16-byte slot of the 16-byte noscan class into which noscan objects under 16 bytes
    are packed (Go's ``c.tiny`` / ``c.tinyoffset``). ``tiny[addr >> 4]`` holds a bit for
    each live tiny object's start, so each one can be freed on its own; the block goes
    back when its last object is freed and no mcache still packs into it. (Go frees a
    tiny block when no sub-object is reachable; explicit frees reach the same state.)

Fast to slow (``alloc_small`` = the small path of ``mallocgc``)
----------------------------------------------------------------
1. ``next_free_fast`` on the P's cached span: one ``ctz`` on the allocCache.
2. ``next_free_index``: reload the allocCache from the allocBits further along.
3. ``refill``: hand the full span back to mcentral (``uncacheSpan``) and take one with
   free slots (``cacheSpan``: swept partial, then sweep unswept ones, then grow).
4. ``grow`` and large objects: pages from the page heap (``mheap_alloc``), sweeping
   everything unswept once if no run of pages is free (``reclaim``).

Each step amortises the next: 128 allocations of 64 bytes cost one refill, and one refill
in a steady state costs one lazy sweep instead of a page-heap search.
"""

from __future__ import annotations

import numpy as np

from gosim.jit import kernel

from ._bits import bit, ctz64, shr
from ._layout import (
    BITMAP_WORDS_PER_PAGE,
    C_DIVMAGIC,
    C_SC8,
    C_SC128,
    ERR_DOUBLE,
    ERR_FOREIGN,
    ERR_INTERIOR,
    ERR_OOM,
    ERR_TINY,
    ERR_UNALLOCATED,
    H_ARENA,
    H_B_ACACHE,
    H_B_MBITS,
    H_ERR_INDEX,
    H_GC_CYCLES,
    H_LARGE_ALLOC_BYTES,
    H_LARGE_ALLOCS,
    H_LARGE_FREE_BYTES,
    H_LARGE_FREES,
    H_NPAGES,
    H_O_CLASS,
    H_O_MCACHE,
    H_O_SPANOF,
    H_O_STATS,
    H_PROCS,
    H_REFILLS,
    H_SWEEPGEN,
    H_THROW,
    H_TINY_ALLOCS,
    KIND_OBJECT,
    KIND_TINY,
    MC_MALLOCS,
    MC_REFILLS,
    MC_TINY,
    MC_TINYALLOCS,
    MC_TINYOFFSET,
    MCACHE_WORDS,
    NUM_SPAN_CLASSES,
    OK,
    S_ALLOCCOUNT,
    S_BEFORE_CACHE,
    S_CACHED_BY,
    S_ELEMSIZE,
    S_FREEINDEX,
    S_LIMIT,
    S_NEEDZERO,
    S_NELEMS,
    S_NPAGES,
    S_PENDING,
    S_SPC,
    S_SWEEPGEN,
    ST_SMALL_ALLOC,
    ST_SMALL_FREE,
    THROW_REFILL_NOT_FULL,
    TINY_SPAN_CLASS,
)
from ._mcentral import cache_span, mheap_alloc_or_reclaim, uncache_span
from ._mheap import mheap_free_span
from ._mspan import (
    alloc_bit_word,
    list_id,
    list_push,
    list_remove,
    mark_bit_word,
    mark_dirty,
    next_free_fast,
    next_free_index,
    reclaim,
    span_row,
)
from ._sizeclasses import MAX_SMALL_SIZE, PAGE_SHIFT, PAGE_SIZE, TINY_SIZE

# ---- helpers -----------------------------------------------------------------------------


@kernel
def mcache_row(meta: np.ndarray, p: int) -> int:
    """Offset of P ``p``'s mcache row in ``meta``."""
    return int(meta[H_O_MCACHE] + p * MCACHE_WORDS)


@kernel
def size_class_of(meta: np.ndarray, size: int) -> int:
    """``size_to_class8`` / ``size_to_class128`` lookup for ``0 < size <= 32 KiB``."""
    oc = meta[H_O_CLASS]
    if size <= 1024 - 8:
        return int(meta[oc + C_SC8 + (size + 7) // 8])
    return int(meta[oc + C_SC128 + (size - 1024 + 127) // 128])


@kernel
def zero_range(arena: np.ndarray, addr: int, n: int) -> None:
    """``memclrNoHeapPointers`` on ``[addr, addr + n)`` rounded out to 8-byte words.

    ``arena`` is the arena viewed as uint64 words (every slot is 8-byte aligned and a
    multiple of 8 long); storing words measured 4x faster than a byte loop, and a slice
    assignment would build (and reference-count) an array view per object.
    """
    for w in range(addr >> 3, (addr + n + 7) >> 3):
        arena[w] = 0


@kernel
def is_current_tiny(meta: np.ndarray, block: int) -> bool:
    """Whether some P's mcache still packs tiny objects into ``block``."""
    for p in range(meta[H_PROCS]):  # noqa: SIM110 - numba compiles loops, not any(genexpr)
        if meta[mcache_row(meta, p) + MC_TINY] == block:
            return True
    return False


@kernel
def free_slots(meta: np.ndarray, s: int, cls: int, k: int) -> None:
    """Bookkeeping of the explicit free of ``k`` slots of span ``s`` whose mark bits are
    already clear: they become reusable at the span's next sweep, queued for here."""
    row = span_row(meta, s)
    meta[row + S_PENDING] += k
    meta[meta[H_O_STATS] + ST_SMALL_FREE + cls] += k
    if meta[row + S_CACHED_BY] < 0:
        mark_dirty(meta, s)


@kernel
def release_tiny_if_empty(meta: np.ndarray, bits: np.ndarray, tiny: np.ndarray, block: int) -> None:
    """Free tiny ``block`` if no live tiny object starts in it and no mcache packs into it."""
    if tiny[block >> 4] != 0 or is_current_tiny(meta, block):
        return
    s = meta[meta[H_O_SPANOF] + (block >> PAGE_SHIFT)]
    idx = (block - (s << PAGE_SHIFT)) >> 4
    w = mark_bit_word(meta, s, idx)
    b = bit(idx & 63)
    if bits[w] & b:
        bits[w] &= ~b
        free_slots(meta, s, 2, 1)


# ---- mcache ------------------------------------------------------------------------------


@kernel
def uncache(meta: np.ndarray, mc: int, spc: int, s: int) -> None:
    """Hand span ``s``, cached in the mcache at row ``mc`` for class ``spc``, back to
    mcentral: count the objects allocated from it while cached (Go's
    ``mcache.releaseAll``/``refill`` stats flush), then uncache it."""
    row = span_row(meta, s)
    meta[meta[H_O_STATS] + ST_SMALL_ALLOC + (spc >> 1)] += (
        meta[row + S_ALLOCCOUNT] - meta[row + S_BEFORE_CACHE]
    )
    meta[row + S_BEFORE_CACHE] = 0
    meta[row + S_CACHED_BY] = -1
    uncache_span(meta, s)
    meta[mc + spc] = -1


@kernel
def refill(meta: np.ndarray, bits: np.ndarray, p: int, spc: int) -> int:
    """Go's ``mcache.refill``: P ``p``'s span of class ``spc`` is full (or absent); give
    it back to mcentral and cache one with a free slot. Returns it, or -1 (exhausted)."""
    mc = mcache_row(meta, p)
    s = meta[mc + spc]
    if s >= 0:
        row = span_row(meta, s)
        if meta[row + S_ALLOCCOUNT] != meta[row + S_NELEMS]:
            # Go throws here: the caller found no free slot that the counts say exists,
            # so the bitmaps and the counts disagree. Going on would hand out a live
            # object's slot or leak the span's free ones.
            meta[H_THROW] = THROW_REFILL_NOT_FULL
            return -1
        uncache(meta, mc, spc, s)
    if spc == TINY_SPAN_CLASS:
        meta[H_TINY_ALLOCS] += meta[mc + MC_TINYALLOCS]
        meta[mc + MC_TINYALLOCS] = 0
    s = cache_span(meta, bits, spc)
    if s < 0:
        return -1
    row = span_row(meta, s)
    meta[row + S_SWEEPGEN] = meta[H_SWEEPGEN] + 3  # swept and cached
    meta[row + S_BEFORE_CACHE] = meta[row + S_ALLOCCOUNT]
    meta[row + S_CACHED_BY] = p
    meta[mc + spc] = s
    meta[mc + MC_REFILLS] += 1
    meta[H_REFILLS] += 1
    return int(s)


@kernel
def release_all(meta: np.ndarray, bits: np.ndarray, tiny: np.ndarray, p: int) -> None:
    """Go's ``mcache.releaseAll``: flush P ``p``'s counts and hand every cached span back."""
    mc = mcache_row(meta, p)
    for spc in range(NUM_SPAN_CLASSES):
        s = meta[mc + spc]
        if s >= 0:
            uncache(meta, mc, spc, s)
    t = meta[mc + MC_TINY]
    meta[mc + MC_TINY] = -1
    meta[mc + MC_TINYOFFSET] = 0
    if t >= 0:
        release_tiny_if_empty(meta, bits, tiny, t)
    meta[H_TINY_ALLOCS] += meta[mc + MC_TINYALLOCS]
    meta[mc + MC_TINYALLOCS] = 0


# ---- mallocgc ----------------------------------------------------------------------------


@kernel
def alloc_small(
    meta: np.ndarray, bits: np.ndarray, tiny: np.ndarray, arena: np.ndarray, p: int, spc: int
) -> int:
    """One object of span class ``spc`` from P ``p``'s mcache (the small-object path of
    ``mallocgc``): its address, or -1 when the heap is exhausted."""
    mc = mcache_row(meta, p)
    s = meta[mc + spc]
    idx = -1
    if s >= 0:
        idx = next_free_fast(meta, bits, s)
        if idx < 0:  # c.nextFree
            fi = next_free_index(meta, bits, s)
            if fi < meta[span_row(meta, s) + S_NELEMS]:
                idx = fi
                meta[span_row(meta, s) + S_ALLOCCOUNT] += 1
    if idx < 0:
        s = refill(meta, bits, p, spc)
        if s < 0:
            return ERR_OOM
        idx = next_free_index(meta, bits, s)
        meta[span_row(meta, s) + S_ALLOCCOUNT] += 1
    row = span_row(meta, s)
    bits[mark_bit_word(meta, s, idx)] |= bit(idx & 63)  # allocate black
    elemsize = meta[row + S_ELEMSIZE]
    addr = (s << PAGE_SHIFT) + idx * elemsize
    if meta[row + S_NEEDZERO]:
        zero_range(arena, addr, elemsize)
    if spc == TINY_SPAN_CLASS:
        tiny[addr >> 4] = 0  # a plain 16-byte object until malloc_tiny says otherwise
    meta[mc + MC_MALLOCS] += 1
    return int(addr)


@kernel
def malloc_tiny(
    meta: np.ndarray, bits: np.ndarray, tiny: np.ndarray, arena: np.ndarray, p: int, size: int
) -> int:
    """The tiny allocator of ``mallocgc``: a noscan object under 16 bytes, packed into the
    P's current 16-byte block when it fits (aligned by Go's rules: 8 if ``size % 8 == 0``,
    4 if ``% 4``, 2 if ``% 2``), else at the start of a new block."""
    mc = mcache_row(meta, p)
    off = meta[mc + MC_TINYOFFSET]
    if size & 7 == 0:
        off = (off + 7) & ~7
    elif size & 3 == 0:
        off = (off + 3) & ~3
    elif size & 1 == 0:
        off = (off + 1) & ~1
    t = meta[mc + MC_TINY]
    if off + size <= TINY_SIZE and t >= 0:
        x = t + off  # the object fits into the existing tiny block
        meta[mc + MC_TINYOFFSET] = off + size
        meta[mc + MC_TINYALLOCS] += 1
        meta[mc + MC_MALLOCS] += 1
        tiny[x >> 4] |= np.uint16(1 << (x & 15))
        return int(x)
    v = alloc_small(meta, bits, tiny, arena, p, TINY_SPAN_CLASS)
    if v < 0:
        return ERR_OOM
    zero_range(arena, v, TINY_SIZE)
    tiny[v >> 4] = np.uint16(1)
    # Keep whichever block has more room left (Go's "size < c.tinyoffset || c.tiny == 0").
    if size < meta[mc + MC_TINYOFFSET] or t < 0:
        meta[mc + MC_TINY] = v
        meta[mc + MC_TINYOFFSET] = size
        if t >= 0:
            release_tiny_if_empty(meta, bits, tiny, t)
    return int(v)


@kernel
def malloc_large(
    meta: np.ndarray, bits: np.ndarray, arena: np.ndarray, p: int, size: int, noscan: bool
) -> int:
    """Go's ``mcache.allocLarge``: a span of whole pages for one object over 32 KiB."""
    npages = (size + PAGE_SIZE - 1) >> PAGE_SHIFT
    spc = 1 if noscan else 0
    s = mheap_alloc_or_reclaim(meta, bits, npages, spc)
    if s < 0:
        return ERR_OOM
    row = span_row(meta, s)
    meta[row + S_FREEINDEX] = 1
    meta[row + S_ALLOCCOUNT] = 1
    meta[row + S_LIMIT] = (s << PAGE_SHIFT) + size
    bits[mark_bit_word(meta, s, 0)] |= bit(0)
    meta[H_LARGE_ALLOCS] += 1
    meta[H_LARGE_ALLOC_BYTES] += npages << PAGE_SHIFT
    list_push(meta, list_id(spc, 1, True, meta[H_SWEEPGEN]), s)
    addr = s << PAGE_SHIFT
    if meta[row + S_NEEDZERO]:
        zero_range(arena, addr, size)
    meta[mcache_row(meta, p) + MC_MALLOCS] += 1
    return int(addr)


@kernel
def malloc_one(
    meta: np.ndarray,
    bits: np.ndarray,
    tiny: np.ndarray,
    arena: np.ndarray,
    p: int,
    size: int,
    noscan: bool,
) -> int:
    """``mallocgc`` for ``size >= 1``: the address, or ``ERR_OOM``."""
    if size > MAX_SMALL_SIZE:
        return malloc_large(meta, bits, arena, p, size, noscan)
    if noscan and size < TINY_SIZE:
        return malloc_tiny(meta, bits, tiny, arena, p, size)
    spc = size_class_of(meta, size) << 1 | (1 if noscan else 0)
    return alloc_small(meta, bits, tiny, arena, p, spc)


@kernel
def malloc_batch(
    meta: np.ndarray,
    bits: np.ndarray,
    tiny: np.ndarray,
    arena: np.ndarray,
    p: int,
    size: int,
    noscan: bool,
    out: np.ndarray,
) -> int:
    """``len(out)`` objects of ``size`` bytes from P ``p``; returns how many were made
    (fewer only when the heap ran out; the caller then restores its snapshot)."""
    n = int(out.shape[0])
    if size > MAX_SMALL_SIZE or (noscan and size < TINY_SIZE):
        for i in range(n):
            a = malloc_one(meta, bits, tiny, arena, p, size, noscan)
            if a < 0:
                return i
            out[i] = a
        return n
    spc = size_class_of(meta, size) << 1 | (1 if noscan else 0)
    mc = mcache_row(meta, p)
    mbits = meta[H_B_MBITS]
    i = 0
    while i < n:
        s = meta[mc + spc]
        if s >= 0:
            # next_free_fast with the span's fields held in registers across objects.
            row = span_row(meta, s)
            ac = meta[H_B_ACACHE] + s
            cache = bits[ac]
            fi = meta[row + S_FREEINDEX]
            nelems = meta[row + S_NELEMS]
            elemsize = meta[row + S_ELEMSIZE]
            needzero = meta[row + S_NEEDZERO] != 0
            base = s << PAGE_SHIFT
            mbase = mbits + s * BITMAP_WORDS_PER_PAGE
            start = i
            while i < n:
                the_bit = ctz64(cache)
                if the_bit >= 64:
                    break
                result = fi + the_bit
                if result >= nelems:
                    break
                freeidx = result + 1
                if freeidx % 64 == 0 and freeidx != nelems:
                    break  # the cache needs reloading: the slow path below does it
                cache = shr(cache, the_bit + 1)
                fi = freeidx
                bits[mbase + (result >> 6)] |= bit(result & 63)  # allocate black
                addr = base + result * elemsize
                if needzero:
                    zero_range(arena, addr, elemsize)
                if spc == TINY_SPAN_CLASS:
                    tiny[addr >> 4] = 0
                out[i] = addr
                i += 1
            bits[ac] = cache
            meta[row + S_FREEINDEX] = fi
            meta[row + S_ALLOCCOUNT] += i - start
            meta[mc + MC_MALLOCS] += i - start
            if i >= n:
                break
        a = alloc_small(meta, bits, tiny, arena, p, spc)  # nextFree / refill
        if a < 0:
            return i
        out[i] = a
        i += 1
    return n


@kernel
def unmalloc_large(meta: np.ndarray, bits: np.ndarray, addr: int) -> None:
    """Undo ``malloc_large`` exactly (rollback of a failed batch): counters and pages."""
    s = addr >> PAGE_SHIFT
    row = span_row(meta, s)
    meta[H_LARGE_ALLOCS] -= 1
    meta[H_LARGE_ALLOC_BYTES] -= meta[row + S_NPAGES] << PAGE_SHIFT
    list_remove(meta, s)
    mheap_free_span(meta, bits, s)


# ---- free --------------------------------------------------------------------------------


@kernel
def classify(meta: np.ndarray, bits: np.ndarray, tiny: np.ndarray, addr: int, claim: bool) -> int:
    """What lives at ``addr``: ``KIND_OBJECT`` (a live object starts there), ``KIND_TINY``
    (a live tiny object starts there) or a negative error code. With ``claim`` the object
    is marked dead (mark bit or tiny bit cleared) so a second claim in the same batch
    fails; :func:`unclaim` undoes it."""
    if addr < 0 or addr >= meta[H_ARENA]:
        return ERR_FOREIGN
    s = meta[meta[H_O_SPANOF] + (addr >> PAGE_SHIFT)]
    if s < 0:
        return ERR_UNALLOCATED
    row = span_row(meta, s)
    spc = meta[row + S_SPC]
    off = addr - (s << PAGE_SHIFT)
    if spc >> 1 == 0:
        if off != 0:
            return ERR_INTERIOR
        w = mark_bit_word(meta, s, 0)
        if bits[w] & bit(0) == 0:
            return ERR_DOUBLE
        if claim:
            bits[w] &= ~bit(0)
        return KIND_OBJECT
    # n / elemsize by Go's magic multiply (class_to_divmagic).
    idx = (off * meta[meta[H_O_CLASS] + C_DIVMAGIC + (spc >> 1)]) >> 32
    if idx >= meta[row + S_NELEMS]:
        return ERR_UNALLOCATED  # in the span's tail waste
    w = mark_bit_word(meta, s, idx)
    b = bit(idx & 63)
    live = bits[w] & b != 0
    if spc == TINY_SPAN_CLASS and live:
        m = tiny[addr >> 4]
        if m != 0 or is_current_tiny(meta, addr & ~15):
            tb = np.uint16(1 << (addr & 15))
            if m & tb == 0:
                return ERR_TINY
            if claim:
                tiny[addr >> 4] = m & ~tb
            return KIND_TINY
    if off != idx * meta[row + S_ELEMSIZE]:
        return ERR_INTERIOR
    if not live:
        if idx < meta[row + S_FREEINDEX] or bits[alloc_bit_word(s, idx)] & b:
            return ERR_DOUBLE  # handed out since (or kept at) the last sweep, now dead
        return ERR_UNALLOCATED
    if claim:
        bits[w] &= ~b
    return KIND_OBJECT


@kernel
def unclaim(meta: np.ndarray, bits: np.ndarray, tiny: np.ndarray, addr: int, kind: int) -> None:
    """Undo a successful ``classify(..., claim=True)``."""
    if kind == KIND_TINY:
        tiny[addr >> 4] |= np.uint16(1 << (addr & 15))
        return
    s = meta[meta[H_O_SPANOF] + (addr >> PAGE_SHIFT)]
    row = span_row(meta, s)
    spc = meta[row + S_SPC]
    idx = 0
    if spc >> 1 != 0:
        idx = ((addr - (s << PAGE_SHIFT)) * meta[meta[H_O_CLASS] + C_DIVMAGIC + (spc >> 1)]) >> 32
    bits[mark_bit_word(meta, s, idx)] |= bit(idx & 63)


@kernel
def commit_free(meta: np.ndarray, bits: np.ndarray, tiny: np.ndarray, addr: int, kind: int) -> None:
    """Finish freeing a claimed object: counters, span queues, large pages back."""
    s = meta[meta[H_O_SPANOF] + (addr >> PAGE_SHIFT)]
    if kind == KIND_TINY:
        release_tiny_if_empty(meta, bits, tiny, addr & ~15)
        return
    row = span_row(meta, s)
    cls = meta[row + S_SPC] >> 1
    if cls == 0:  # large: the pages go back at once
        meta[H_LARGE_FREES] += 1
        meta[H_LARGE_FREE_BYTES] += meta[row + S_NPAGES] << PAGE_SHIFT
        list_remove(meta, s)
        mheap_free_span(meta, bits, s)
        return
    free_slots(meta, s, cls, 1)


@kernel
def free_batch(
    meta: np.ndarray, bits: np.ndarray, tiny: np.ndarray, addrs: np.ndarray, kinds: np.ndarray
) -> int:
    """Free every address in ``addrs`` or none: returns ``OK``, or an error code with
    ``meta[H_ERR_INDEX]`` = the first bad element (the heap is then unchanged).
    ``kinds`` is scratch space of the same length."""
    n = addrs.shape[0]
    for i in range(n):
        k = classify(meta, bits, tiny, addrs[i], True)
        if k < 0:
            for j in range(i - 1, -1, -1):
                unclaim(meta, bits, tiny, addrs[j], kinds[j])
            meta[H_ERR_INDEX] = i
            return k
        kinds[i] = k
    # Commit. Runs of objects from one span (the common case for a batch) are counted
    # once per run: one pending/counter update and one span-queue check per span.
    ospanof = meta[H_O_SPANOF]
    run_span = -1
    run_cls = 0
    run_n = 0
    for i in range(n):
        a = addrs[i]
        if kinds[i] == KIND_OBJECT:
            s = meta[ospanof + (a >> PAGE_SHIFT)]
            if s == run_span:
                run_n += 1
                continue
            cls = meta[span_row(meta, s) + S_SPC] >> 1
            if cls != 0:
                if run_n > 0:
                    free_slots(meta, run_span, run_cls, run_n)
                run_span = s
                run_cls = cls
                run_n = 1
                continue
        commit_free(meta, bits, tiny, a, kinds[i])
    if run_n > 0:
        free_slots(meta, run_span, run_cls, run_n)
    return OK


# ---- mark / sweep ------------------------------------------------------------------------


@kernel
def mark_live(
    meta: np.ndarray, bits: np.ndarray, tiny: np.ndarray, addrs: np.ndarray, kinds: np.ndarray
) -> int:
    """A whole GC mark phase with ``addrs`` as the reachable objects (``kinds``: scratch
    space of the same length). Returns ``OK`` or an error code (heap unchanged).

    1. Check every address is a live object.
    2. ``gcStart``: flush every mcache (``releaseAll``) and finish sweeping
       (``finishsweep_m``), so every span is swept and uncached.
    3. Clear all gcmarkBits (and tiny bits), then set those of ``addrs``.
    4. Mark termination: ``sweepgen += 2``: every span is now unswept; sweeping
       (lazily in ``cacheSpan``, or all at once in ``reclaim``) frees the unmarked.
    """
    n = addrs.shape[0]
    for i in range(n):
        k = classify(meta, bits, tiny, addrs[i], False)
        if k < 0:
            meta[H_ERR_INDEX] = i
            return k
        kinds[i] = k
    for p in range(meta[H_PROCS]):
        release_all(meta, bits, tiny, p)
    reclaim(meta, bits)
    npages = meta[H_NPAGES]
    ospanof = meta[H_O_SPANOF]
    pg = 0
    while pg < npages:
        if meta[ospanof + pg] != pg:
            pg += 1
            continue
        row = span_row(meta, pg)
        nelems = meta[row + S_NELEMS]
        base = mark_bit_word(meta, pg, 0)
        for w in range((nelems + 63) >> 6):
            bits[base + w] = 0
        if meta[row + S_SPC] == TINY_SPAN_CLASS:
            t0 = pg << (PAGE_SHIFT - 4)
            tiny[t0 : t0 + nelems] = 0
        pg += meta[row + S_NPAGES]
    for i in range(n):
        a = addrs[i]
        s = meta[ospanof + (a >> PAGE_SHIFT)]
        row = span_row(meta, s)
        spc = meta[row + S_SPC]
        idx = 0
        if spc >> 1 != 0:
            idx = ((a - (s << PAGE_SHIFT)) * meta[meta[H_O_CLASS] + C_DIVMAGIC + (spc >> 1)]) >> 32
        bits[mark_bit_word(meta, s, idx)] |= bit(idx & 63)
        if kinds[i] == KIND_TINY:
            tiny[a >> 4] |= np.uint16(1 << (a & 15))
    meta[H_SWEEPGEN] += 2
    meta[H_GC_CYCLES] += 1
    return OK


@kernel
def census(meta: np.ndarray, out: np.ndarray) -> None:
    """Per size class (row; 0 = large): spans, pages, objects allocated (not yet freed
    or swept away), slots. ``out`` is int64 ``(68, 4)``, overwritten."""
    out[:, :] = 0
    npages = meta[H_NPAGES]
    ospanof = meta[H_O_SPANOF]
    pg = 0
    while pg < npages:
        if meta[ospanof + pg] != pg:
            pg += 1
            continue
        row = span_row(meta, pg)
        cls = meta[row + S_SPC] >> 1
        out[cls, 0] += 1
        out[cls, 1] += meta[row + S_NPAGES]
        out[cls, 2] += meta[row + S_ALLOCCOUNT] - meta[row + S_PENDING]
        out[cls, 3] += meta[row + S_NELEMS]
        pg += meta[row + S_NPAGES]


@kernel
def _report_class(meta: np.ndarray, size: int, noscan: bool) -> int:
    """The class whose spans hold an object of ``size``: 0 = large, 2 = tiny blocks."""
    if size > MAX_SMALL_SIZE:
        return 0
    if noscan and size < TINY_SIZE:
        return 2
    return size_class_of(meta, size)


@kernel
def replay(
    meta: np.ndarray,
    bits: np.ndarray,
    tiny: np.ndarray,
    arena: np.ndarray,
    ops: np.ndarray,
    start: int,
    stop: int,
    noscan: bool,
    addr_by_id: np.ndarray,
    size_by_id: np.ndarray,
    state: np.ndarray,
    req_live: np.ndarray,
    scratch: np.ndarray,
    kinds: np.ndarray,
) -> int:
    """Run trace operations ``ops[start:stop]`` (rows ``(op, arg, p)``: 0 = allocate
    ``arg`` bytes as the next object id, 1 = free object ``arg``, 2 = mark every live
    object and sweep). ``state[0]`` is the next object id; ``req_live[c]`` tracks the
    bytes requested by live objects of class ``c``. Returns -1, or the index of the
    operation that failed (with ``meta[H_ERR_INDEX]`` = its error code)."""
    for i in range(start, stop):
        op = ops[i, 0]
        arg = ops[i, 1]
        p = ops[i, 2]
        if op == 0:
            if arg <= 0:
                meta[H_ERR_INDEX] = ERR_UNALLOCATED
                return i
            a = malloc_one(meta, bits, tiny, arena, p, arg, noscan)
            if a < 0:
                meta[H_ERR_INDEX] = ERR_OOM
                return i
            oid = state[0]
            state[0] = oid + 1
            addr_by_id[oid] = a
            size_by_id[oid] = arg
            req_live[_report_class(meta, arg, noscan)] += arg
        elif op == 1:
            if arg < 0 or arg >= state[0] or addr_by_id[arg] < 0:
                meta[H_ERR_INDEX] = ERR_DOUBLE
                return i
            scratch[0] = addr_by_id[arg]
            code = free_batch(meta, bits, tiny, scratch[:1], kinds[:1])
            if code < 0:
                meta[H_ERR_INDEX] = code
                return i
            addr_by_id[arg] = -1
            sz = size_by_id[arg]
            req_live[_report_class(meta, sz, noscan)] -= sz
        else:
            nlive = 0
            for j in range(state[0]):
                if addr_by_id[j] >= 0:
                    scratch[nlive] = addr_by_id[j]
                    nlive += 1
            code = mark_live(meta, bits, tiny, scratch[:nlive], kinds[:nlive])
            if code < 0:
                meta[H_ERR_INDEX] = code
                return i
            reclaim(meta, bits)
    return -1
