"""Where every piece of allocator metadata lives: the three numpy arrays and their fields.

The allocator's whole state is four arrays so that one numba call receives it all in four
arguments (each array argument costs a type check at dispatch):

``meta`` (int64)
    header · span table (one row per page; a span's row is its first page's) ·
    ``spanof`` (page -> first page of its in-use span, or -1; Go's ``h.spans``) ·
    mcentral lists · one mcache row per P · class tables · per-class counters ·
    page-allocator chunk summaries.
``bits`` (uint64)
    allocBits and gcmarkBits (16 words per page: a span of ``k`` pages owns the rows of
    its ``k`` pages, enough for ``k * 1024`` objects of 8 bytes) · one allocCache per span ·
    the page allocator's chunk bitmaps (8 words = 512 pages per chunk).
``tiny`` (uint16)
    one word per 16-byte slot of the arena: for a tiny block, a bit per byte offset at
    which a live tiny object starts.
``arena`` (uint8)
    the memory handed out; addresses are offsets into it.

A span id is the index of its first page. ``-1`` is Go's ``emptymspan`` / nil.
The offsets of the regions are stored in the header so kernels read them at run time.
"""

from __future__ import annotations

from ._sizeclasses import NUM_SIZE_CLASSES, PAGE_SHIFT, PAGE_SIZE

NUM_SPAN_CLASSES = NUM_SIZE_CLASSES * 2
#: ``makeSpanClass(2, noscan=true)``: the 16-byte noscan span class tiny blocks come from.
TINY_SPAN_CLASS = 2 << 1 | 1
#: Go's ``pallocChunkPages``: pages per page-allocator chunk (one bitmap, one summary).
CHUNK_PAGES = 512
CHUNK_WORDS = CHUNK_PAGES // 64
#: allocBits/gcmarkBits words reserved per page: 8 KiB / 8 B = 1024 objects = 16 words.
BITMAP_WORDS_PER_PAGE = PAGE_SIZE // 8 // 64
#: Go's ``spanBudget`` in ``mcentral.cacheSpan``: unswept spans tried before growing.
SPAN_BUDGET = 100

# ---- header (meta[0:HEADER_WORDS]) -----------------------------------------------------
H_NPAGES = 0  # pages in the arena
H_PROCS = 1  # number of Ps (mcache rows)
H_NCHUNKS = 2  # page-allocator chunks (the last may be partial; its tail is marked in use)
H_SWEEPGEN = 3  # Go's mheap_.sweepgen: +2 per GC cycle
H_SEARCH = 4  # page allocator searchAddr: no free page below this page index
H_PAGES_INUSE = 5  # pages held by in-use spans (HeapInuse / 8 KiB)
H_SPANS_INUSE = 6
H_LARGE_ALLOCS = 7  # Go's largeAllocCount
H_LARGE_ALLOC_BYTES = 8  # Go's largeAlloc
H_LARGE_FREES = 9  # Go's largeFreeCount
H_LARGE_FREE_BYTES = 10  # Go's largeFree
H_TINY_ALLOCS = 11  # Go's tinyAllocCount (flushed from the mcaches)
H_ERR_INDEX = 12  # batch kernels: index of the failing element
H_ZEROED_BASE = 13  # Go's heapArena.zeroedBase, in pages: pages above it were never used
H_SWEPT = 14  # spans swept, ever
H_RECLAIMED = 15  # spans given back to the page heap by sweeping
H_GC_CYCLES = 16
H_ARENA = 17  # arena bytes
H_O_SPAN = 18  # offset of the span table
H_O_SPANOF = 19
H_O_CENTRAL = 20
H_O_MCACHE = 21
H_O_CLASS = 22
H_O_STATS = 23
H_O_SUM = 24
H_B_MBITS = 25  # offsets in ``bits``
H_B_ACACHE = 26
H_B_PALLOC = 27
H_REFILLS = 28
#: A heap invariant a kernel found broken (Go's ``throw``): one of the THROW_* codes, 0 for
#: none. The kernel stops as if the heap were exhausted; the heap object then raises
#: RuntimeInternalError instead of OutOfMemoryError, on that call and every later one.
H_THROW = 29
HEADER_WORDS = 32

# ---- span row fields ---------------------------------------------------------------
S_NPAGES = 0
S_SPC = 1  # span class; -1 when this page starts no in-use span
S_ELEMSIZE = 2
S_NELEMS = 3
S_FREEINDEX = 4  # Go's freeindex: slots below it are allocated or were at the last sweep
S_ALLOCCOUNT = 5  # Go's allocCount (explicit frees are subtracted only when swept)
S_SWEEPGEN = 6  # Go's rule: sg-2 needs sweeping, sg swept, sg+3 swept and cached
S_LIST = 7  # mcentral list holding the span, or -1 (cached, or a large span being freed)
S_NEXT = 8
S_PREV = 9
S_PENDING = 10  # objects freed explicitly since the last sweep (not yet reusable)
S_BEFORE_CACHE = 11  # Go's allocCountBeforeCache
S_CACHED_BY = 12  # P whose mcache holds the span, or -1
S_NEEDZERO = 13  # Go's needzero: slots may hold old data
S_LIMIT = 14  # end of the last object (Go's s.limit)
SPAN_FIELDS = 16

# ---- mcentral lists: per span class, partial[2] then full[2]; head, tail, count -------
LIST_WORDS = 3
LISTS_PER_CLASS = 4

# ---- mcache row (per P): alloc[NUM_SPAN_CLASSES], then these ---------------------------
MC_TINY = NUM_SPAN_CLASSES  # address of the current tiny block, or -1
MC_TINYOFFSET = NUM_SPAN_CLASSES + 1
MC_TINYALLOCS = NUM_SPAN_CLASSES + 2  # Go's c.tinyAllocs (not yet flushed)
MC_REFILLS = NUM_SPAN_CLASSES + 3
MC_MALLOCS = NUM_SPAN_CLASSES + 4  # objects this P allocated (observability)
MCACHE_WORDS = NUM_SPAN_CLASSES + 8

# ---- class tables (copied from _sizeclasses) ------------------------------------------
C_SIZE = 0
C_NPAGES = NUM_SIZE_CLASSES
C_NELEMS = 2 * NUM_SIZE_CLASSES
C_DIVMAGIC = 3 * NUM_SIZE_CLASSES
C_SC8 = 4 * NUM_SIZE_CLASSES  # 129 entries
C_SC128 = C_SC8 + 129  # 249 entries
CLASS_WORDS = C_SC128 + 249

# ---- per-class counters ---------------------------------------------------------------
ST_SMALL_ALLOC = 0  # Go's smallAllocCount (flushed from mcaches at refill)
ST_SMALL_FREE = NUM_SIZE_CLASSES  # Go's smallFreeCount (explicit frees and sweeping)
STATS_WORDS = 2 * NUM_SIZE_CLASSES

# ---- kernel result codes (negative = error; see _heap.py for the exceptions) ----------
OK = 0
ERR_OOM = -1
ERR_FOREIGN = -2  # outside the arena
ERR_UNALLOCATED = -3  # no object was ever handed out there since the last sweep
ERR_INTERIOR = -4  # inside an object, not at its start
ERR_DOUBLE = -5  # the object was freed already
ERR_TINY = -6  # inside a tiny block, where no live tiny object starts

# ---- H_THROW codes: what broke ------------------------------------------------------
THROW_REFILL_NOT_FULL = 1  # Go's "refill of span with free space remaining"
THROW_MESSAGES = {
    THROW_REFILL_NOT_FULL: "refill of span with free space remaining",
}

# Kinds recorded by the free claim pass.
KIND_OBJECT = 1
KIND_TINY = 2

__all__ = ["PAGE_SHIFT", "PAGE_SIZE"]
