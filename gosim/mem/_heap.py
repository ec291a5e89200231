"""``Heap``: the Python face of the allocator, and ``MemStats``.

A ``Heap`` reserves one contiguous arena (a numpy ``uint8`` buffer); addresses are
offsets into it, and ``view(addr, n)`` is a memoryview of the bytes. Its metadata lives in
a few numpy arrays (see ``_layout.py``) that numba kernels update; every public call is
one kernel call, and the batch calls (``malloc_many``, ``free_many``) amortise that call's
cost over many objects.

Glossary
--------
P
    A processor index ``0 <= p < procs``. Every allocating call takes it explicitly, so a
    scheduler can pass the current P (Go's ``getMCache``): objects from different Ps
    come from different cached spans.
noscan
    The object holds no Python-visible references (raw bytes): Go's pointer-free objects,
    kept in their own span classes; noscan objects under 16 bytes use the tiny allocator.
    Default True, since an arena holds bytes.

Fast to slow (``malloc``)
-------------------------
1. tiny block of the P's mcache (noscan, < 16 bytes);
2. ``next_free_fast`` on the P's cached span of the size class;
3. ``next_free_index``, then ``refill`` from mcentral (lazy sweeping happens here);
4. a fresh span, or pages for a large object, from the page heap; sweep everything and
   retry once before raising :class:`OutOfMemoryError`.

Freeing clears the object's mark bit at once (a double free is caught immediately) but,
as in Go, the slot becomes reusable only when its span is swept: lazily, when an mcache
next needs a span of that class, or by ``sweep()``. Large objects return their pages at
once. ``mark(live)`` then ``sweep()`` is a stop-the-world collection where the caller
names the reachable objects.

Thread safety: a ``Heap`` is not locked. Use it from one thread at a time (the kernels
release the GIL, so concurrent calls from two threads would race).
"""

from __future__ import annotations

import operator
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from gosim._core._exceptions import RuntimeInternalError

from . import _layout as lay
from ._errors import (
    BadAddressError,
    DoubleFreeError,
    ForeignAddressError,
    InteriorPointerError,
    OutOfMemoryError,
    UnallocatedAddressError,
)
from ._mcache import (
    census,
    free_batch,
    malloc_batch,
    malloc_one,
    mark_live,
    unmalloc_large,
)
from ._mspan import reclaim
from ._pagealloc import pa_init, pa_largest_run
from ._sizeclasses import (
    CLASSES,
    MAX_SMALL_SIZE,
    NUM_SIZE_CLASSES,
    PAGE_SIZE,
    SIZE_TO_CLASS8,
    SIZE_TO_CLASS128,
    TINY_SIZE,
)

Int64Array = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class BySizeEntry:
    """Go's ``MemStats.BySize[i]``: objects of one size class (class 0: large objects)."""

    Size: int
    Mallocs: int
    Frees: int


@dataclass(frozen=True, slots=True)
class PStats:
    """One P's mcache: the spans it holds (one per span class at most), how often it
    refilled, how many objects it handed out, and tiny allocations not yet flushed."""

    spans_cached: int
    refills: int
    mallocs: int
    tiny_allocs_unflushed: int


@dataclass(frozen=True, slots=True)
class ClassOccupancy:
    """Spans of one size class (0 = large) and how full they are."""

    size: int
    spans: int
    pages: int
    objects: int  #: allocated and not yet freed (freed-but-unswept slots excluded)
    slots: int


@dataclass(frozen=True, slots=True)
class MemStats:
    """A snapshot of the heap in Go's ``runtime.MemStats`` terms (bytes unless noted).

    Counts are exact at the moment of the call (Go's ``ReadMemStats`` stops the world for
    the same reason). As in Go, tiny allocations count in ``Mallocs`` and also in
    ``Frees`` (they are not tracked one by one); their 16-byte blocks count as objects
    of class 2. ``HeapAlloc`` includes unmarked objects not yet swept.
    """

    HeapAlloc: int  #: bytes of allocated objects (slot sizes; whole pages for large ones)
    HeapSys: int  #: the arena
    HeapIdle: int  #: bytes in free pages
    HeapInuse: int  #: bytes in in-use spans
    HeapReleased: int  #: always 0: the arena is never returned to the OS
    HeapObjects: int  #: Mallocs - Frees
    Mallocs: int
    Frees: int
    TinyAllocs: int
    TotalAlloc: int  #: bytes ever allocated (never decreases)
    NumGC: int
    BySize: tuple[BySizeEntry, ...]  #: index = size class
    SpansInUse: int
    InternalFragmentation: int  #: HeapInuse - HeapAlloc: free slots plus span tails
    TailWaste: int  #: bytes at span ends that fit no object
    PerP: tuple[PStats, ...]
    ByClass: tuple[ClassOccupancy, ...]  #: index = size class


def _index(value: Any, what: str) -> int:
    if isinstance(value, bool):
        raise TypeError(f"{what} must be an int, not bool")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{what} must be an int, not {type(value).__name__}") from None


class Heap:
    """A Go-style size-classed heap over one arena of ``arena_bytes`` (a multiple of
    8 KiB), with ``procs`` per-P caches.

    Guarantees: live objects never overlap; each lies inside its span; small objects are
    aligned to ``SizeClass.min_align`` of their class (a power-of-two size up to 8 KiB is
    aligned to itself), tiny objects by Go's tiny rules; memory is zeroed when handed out;
    a failed call changes nothing.
    """

    __slots__ = (
        "_arena",
        "_arena_words",
        "_bits",
        "_kind1",
        "_meta",
        "_one",
        "_procs",
        "_tiny",
        "arena_bytes",
    )

    def __init__(self, arena_bytes: int, procs: int = 1) -> None:
        arena_bytes = _index(arena_bytes, "arena_bytes")
        procs = _index(procs, "procs")
        if arena_bytes <= 0 or arena_bytes % PAGE_SIZE:
            raise ValueError(f"arena_bytes must be a positive multiple of {PAGE_SIZE}")
        if procs < 1:
            raise ValueError("procs must be at least 1")
        npages = arena_bytes // PAGE_SIZE
        nchunks = -(-npages // lay.CHUNK_PAGES)
        o_span = lay.HEADER_WORDS
        o_spanof = o_span + npages * lay.SPAN_FIELDS
        o_central = o_spanof + npages
        o_mcache = o_central + lay.NUM_SPAN_CLASSES * lay.LISTS_PER_CLASS * lay.LIST_WORDS
        o_class = o_mcache + procs * lay.MCACHE_WORDS
        o_stats = o_class + lay.CLASS_WORDS
        o_sum = o_stats + lay.STATS_WORDS
        meta = np.zeros(o_sum + nchunks * 3, dtype=np.int64)
        bpp = lay.BITMAP_WORDS_PER_PAGE
        b_mbits = npages * bpp
        b_acache = 2 * npages * bpp
        b_palloc = b_acache + npages
        bits = np.zeros(b_palloc + nchunks * lay.CHUNK_WORDS, dtype=np.uint64)
        header = {
            lay.H_NPAGES: npages,
            lay.H_PROCS: procs,
            lay.H_NCHUNKS: nchunks,
            lay.H_ARENA: arena_bytes,
            lay.H_O_SPAN: o_span,
            lay.H_O_SPANOF: o_spanof,
            lay.H_O_CENTRAL: o_central,
            lay.H_O_MCACHE: o_mcache,
            lay.H_O_CLASS: o_class,
            lay.H_O_STATS: o_stats,
            lay.H_O_SUM: o_sum,
            lay.H_B_MBITS: b_mbits,
            lay.H_B_ACACHE: b_acache,
            lay.H_B_PALLOC: b_palloc,
        }
        for k, v in header.items():
            meta[k] = v
        meta[o_span:o_spanof].reshape(npages, lay.SPAN_FIELDS)[:, lay.S_SPC] = -1
        meta[o_spanof:o_central] = -1
        lists = meta[o_central:o_mcache].reshape(-1, lay.LIST_WORDS)
        lists[:, 0] = -1
        lists[:, 1] = -1
        mc = meta[o_mcache:o_class].reshape(procs, lay.MCACHE_WORDS)
        mc[:, : lay.NUM_SPAN_CLASSES] = -1
        mc[:, lay.MC_TINY] = -1
        cls = meta[o_class:o_stats]
        for c, row in enumerate(CLASSES):
            cls[lay.C_SIZE + c] = row.size
            cls[lay.C_NPAGES + c] = row.npages
            cls[lay.C_NELEMS + c] = row.objects
            cls[lay.C_DIVMAGIC + c] = row.div_magic
        cls[lay.C_SC8 : lay.C_SC8 + len(SIZE_TO_CLASS8)] = SIZE_TO_CLASS8
        cls[lay.C_SC128 : lay.C_SC128 + len(SIZE_TO_CLASS128)] = SIZE_TO_CLASS128
        pa_init(meta, bits)
        self._meta = meta
        self._bits = bits
        self._tiny = np.zeros(npages * (PAGE_SIZE // TINY_SIZE), dtype=np.uint16)
        self._arena = np.zeros(arena_bytes, dtype=np.uint8)
        # The kernels clear memory a word at a time (see _mcache.zero_range).
        self._arena_words = self._arena.view(np.uint64)
        self._procs = procs
        self._one = np.zeros(1, dtype=np.int64)
        self._kind1 = np.zeros(1, dtype=np.int8)
        self.arena_bytes = arena_bytes

    # ---- properties ---------------------------------------------------------------------

    @property
    def procs(self) -> int:
        """Number of Ps (mcaches)."""
        return self._procs

    @property
    def zerobase(self) -> int:
        """The address every 0-byte allocation returns (Go's ``&zerobase``): one past the
        arena's end, so it overlaps no object; ``view(zerobase, 0)`` is empty."""
        return self.arena_bytes

    # ---- allocation ---------------------------------------------------------------------

    def _check_p(self, p: Any) -> int:
        q = _index(p, "p")
        if not 0 <= q < self._procs:
            raise ValueError(f"p={q} out of range: this heap has {self._procs} Ps")
        return q

    def _oom(self, size: int, n: int) -> OutOfMemoryError | RuntimeInternalError:
        """Why an allocation failed: the heap's broken invariant if a kernel stopped on
        one, else exhaustion, told with the heap's free pages as they are now."""
        return self._broken() or self._exhausted(size, n)

    def _broken(self) -> RuntimeInternalError | None:
        """The invariant a kernel stopped on (Go's throw), not exhaustion; None if none."""
        thrown = int(self._meta[lay.H_THROW])
        if not thrown:
            return None
        return RuntimeInternalError(
            f"fatal error: {lay.THROW_MESSAGES[thrown]} (gosim.mem heap; "
            "the heap's counts and bitmaps disagree: a bug in gosim.mem)"
        )

    def _exhausted(self, size: int, n: int) -> OutOfMemoryError:
        meta = self._meta
        free_pages = int(meta[lay.H_NPAGES] - meta[lay.H_PAGES_INUSE])
        what = f"{n} objects of {size} bytes" if n != 1 else f"{size} bytes"
        return OutOfMemoryError(
            f"out of memory: cannot allocate {what} "
            f"(arena {self.arena_bytes} bytes, {free_pages} free pages, "
            f"longest free run {pa_largest_run(meta)} pages)"
        )

    def malloc(self, n: int, p: int = 0, *, noscan: bool = True) -> int:
        """Allocate ``n`` zeroed bytes from P ``p``'s cache; returns the address.

        The object occupies its class's slot size (``roundupsize(n)``). Raises
        ``TypeError``/``ValueError`` for a bad size or P, :class:`OutOfMemoryError` when
        the arena is exhausted (nothing changes then), and
        :class:`gosim.RuntimeInternalError` (Go's ``throw``) when a kernel found the
        heap's own invariants broken: a bug in gosim.mem, after which the heap is unusable.
        """
        n = _index(n, "size")
        if n < 0:
            raise ValueError(f"negative size {n}")
        if not (type(p) is int and 0 <= p < self._procs):
            p = self._check_p(p)
        if n == 0:
            return self.arena_bytes
        a = int(
            malloc_one(self._meta, self._bits, self._tiny, self._arena_words, p, n, bool(noscan))
        )
        if a < 0:
            raise self._oom(n, 1)
        return a

    def _surely_fits(self, size: int, n: int) -> bool:
        """True when fresh pages alone could hold ``n`` more small objects of ``size``,
        so a batch cannot fail and needs no snapshot. A span of several pages needs them
        in one run: free pages enough in all are not enough when they are scattered, so
        the spans must fit in the longest free run (where, at worst, all of them go)."""
        free_pages = int(self._meta[lay.H_NPAGES] - self._meta[lay.H_PAGES_INUSE])
        size = max(size, TINY_SIZE)
        c = CLASSES[_class_of(size)]
        pages = (-(-n // c.objects) + 1) * c.npages
        if pages > free_pages:
            return False
        return c.npages == 1 or pages <= int(pa_largest_run(self._meta))

    def malloc_many(self, size: int, n: int, p: int = 0, *, noscan: bool = True) -> Int64Array:
        """Allocate ``n`` objects of ``size`` bytes each from P ``p``; returns their
        addresses (int64 array), in allocation order. All or nothing: on exhaustion
        :class:`OutOfMemoryError` is raised and the heap is as before the call."""
        size = _index(size, "size")
        n = _index(n, "n")
        if size < 0 or n < 0:
            raise ValueError(f"negative {'size' if size < 0 else 'count'}")
        p = self._check_p(p)
        out = np.empty(n, dtype=np.int64)
        if n == 0:
            return out
        if size == 0:
            out.fill(self.arena_bytes)
            return out
        meta, bits, tiny, arena = self._meta, self._bits, self._tiny, self._arena_words
        large = size > MAX_SMALL_SIZE
        snapshot = None
        if not large and n > 1 and not self._surely_fits(size, n):
            snapshot = (meta.copy(), bits.copy(), tiny.copy())
        got = int(malloc_batch(meta, bits, tiny, arena, p, size, bool(noscan), out))
        if got == n:
            return out
        broken = self._broken()  # before the rollback, which would clear H_THROW
        if broken is not None:
            raise broken  # a broken heap is not rolled back to a state that looked sound
        if large:
            for a in out[:got][::-1]:
                unmalloc_large(meta, bits, int(a))
        elif snapshot is not None:
            meta[:] = snapshot[0]
            bits[:] = snapshot[1]
            tiny[:] = snapshot[2]
        raise self._exhausted(size, n)  # told as the caller finds the heap: rolled back

    # ---- freeing ------------------------------------------------------------------------

    def _raise_bad(self, code: int, addr: int, index: int, verb: str) -> None:
        if code == lay.ERR_FOREIGN:
            raise ForeignAddressError(
                f"{verb} of foreign address {addr:#x}: outside the arena "
                f"[0, {self.arena_bytes:#x})",
                addr,
                index,
            )
        if code == lay.ERR_UNALLOCATED:
            raise UnallocatedAddressError(f"{verb} of unallocated address {addr:#x}", addr, index)
        if code == lay.ERR_INTERIOR:
            raise InteriorPointerError(
                f"{verb} of interior pointer {addr:#x}: no object starts there", addr, index
            )
        if code == lay.ERR_DOUBLE:
            raise DoubleFreeError(
                f"{verb} of freed object {addr:#x} (double free, or unmarked by mark)", addr, index
            )
        if code == lay.ERR_TINY:
            raise BadAddressError(
                f"{verb} of {addr:#x}: no live tiny object starts there "
                "(double free or interior pointer)",
                addr,
                index,
            )
        raise AssertionError(f"unknown kernel code {code}")  # pragma: no cover

    def free(self, addr: int) -> None:
        """Free the object starting at ``addr``; its slot is reused after its span's next
        sweep (a large object's pages return at once). Raises a
        :class:`BadAddressError` subclass (heap unchanged) for a double free, an interior,
        unallocated or foreign address. ``free(zerobase)`` does nothing."""
        addr = _index(addr, "address")
        if addr == self.arena_bytes:
            return
        one = self._one
        one[0] = addr
        code = int(free_batch(self._meta, self._bits, self._tiny, one, self._kind1))
        if code < 0:
            self._raise_bad(code, addr, 0, "free")

    def _addr_array(self, addrs: Iterable[int] | npt.ArrayLike) -> Int64Array:
        arr = np.asarray(addrs)
        if arr.dtype.kind not in "iu" and arr.size:
            raise TypeError(f"addresses must be ints, not {arr.dtype}")
        arr = np.ascontiguousarray(arr, dtype=np.int64).reshape(-1)
        kept: Int64Array = arr[arr != self.arena_bytes]
        return kept

    def free_many(self, addrs: Iterable[int] | npt.ArrayLike) -> None:
        """Free every address in ``addrs`` (one kernel call), or none of them: on a bad
        address (including a repeat within ``addrs``) the matching
        :class:`BadAddressError` is raised with ``index`` set, and nothing is freed."""
        arr = self._addr_array(addrs)
        if arr.size == 0:
            return
        kinds = np.empty(arr.size, dtype=np.int8)
        code = int(free_batch(self._meta, self._bits, self._tiny, arr, kinds))
        if code < 0:
            i = int(self._meta[lay.H_ERR_INDEX])
            self._raise_bad(code, int(arr[i]), i, "free")

    # ---- collection ---------------------------------------------------------------------

    def mark(self, live_addrs: Iterable[int] | npt.ArrayLike) -> None:
        """Run a GC mark phase in which exactly ``live_addrs`` (object start addresses)
        are reachable; every other object becomes garbage, freed when its span is swept.

        Mirrors ``gcStart`` (flush the mcaches, finish sweeping), marking, and mark
        termination (``sweepgen += 2``, so every span is unswept). Raises a
        :class:`BadAddressError` subclass (heap unchanged) if an address is no live object.
        """
        arr = self._addr_array(live_addrs)
        kinds = np.empty(arr.size, dtype=np.int8)
        code = int(mark_live(self._meta, self._bits, self._tiny, arr, kinds))
        if code < 0:
            i = int(self._meta[lay.H_ERR_INDEX])
            self._raise_bad(code, int(arr[i]), i, "mark")

    def sweep(self) -> int:
        """Sweep every unswept span now (Go's background sweeper run to completion):
        unmarked and freed objects' slots become reusable and spans with no live object
        go back to the page heap. Returns how many spans went back."""
        return int(reclaim(self._meta, self._bits))

    # ---- memory -------------------------------------------------------------------------

    def view(self, addr: int, n: int) -> memoryview:
        """A writable memoryview of arena bytes ``[addr, addr + n)`` (no copy)."""
        addr = _index(addr, "address")
        n = _index(n, "n")
        if n < 0 or addr < 0 or addr + n > self.arena_bytes:
            raise ValueError(f"range [{addr:#x}, {addr + n:#x}) is outside the arena")
        return self._arena.data[addr : addr + n]

    # ---- statistics ---------------------------------------------------------------------

    def read_mem_stats(self) -> MemStats:
        """Go's ``runtime.ReadMemStats``: exact counters at this moment."""
        meta = self._meta
        o_stats = int(meta[lay.H_O_STATS])
        small_alloc = meta[
            o_stats + lay.ST_SMALL_ALLOC : o_stats + lay.ST_SMALL_ALLOC + NUM_SIZE_CLASSES
        ].copy()
        small_free = meta[
            o_stats + lay.ST_SMALL_FREE : o_stats + lay.ST_SMALL_FREE + NUM_SIZE_CLASSES
        ].copy()
        o_mc = int(meta[lay.H_O_MCACHE])
        mc = meta[o_mc : o_mc + self._procs * lay.MCACHE_WORDS].reshape(
            self._procs, lay.MCACHE_WORDS
        )
        spans = meta[int(meta[lay.H_O_SPAN]) : int(meta[lay.H_O_SPANOF])].reshape(
            -1, lay.SPAN_FIELDS
        )
        # Allocations from spans still cached (Go flushes mcaches before reading).
        cached = mc[:, : lay.NUM_SPAN_CLASSES]
        pi, spc = np.nonzero(cached >= 0)
        sids = cached[pi, spc]
        inflight = spans[sids, lay.S_ALLOCCOUNT] - spans[sids, lay.S_BEFORE_CACHE]
        np.add.at(small_alloc, spc >> 1, inflight)
        tiny_allocs = int(meta[lay.H_TINY_ALLOCS] + mc[:, lay.MC_TINYALLOCS].sum())
        sizes = np.array([c.size for c in CLASSES], dtype=np.int64)
        large_allocs = int(meta[lay.H_LARGE_ALLOCS])
        large_frees = int(meta[lay.H_LARGE_FREES])
        mallocs = int(small_alloc[1:].sum()) + large_allocs + tiny_allocs
        frees = int(small_free[1:].sum()) + large_frees + tiny_allocs
        heap_alloc = int(
            ((small_alloc - small_free) * sizes).sum()
            + meta[lay.H_LARGE_ALLOC_BYTES]
            - meta[lay.H_LARGE_FREE_BYTES]
        )
        total_alloc = int((small_alloc * sizes).sum() + meta[lay.H_LARGE_ALLOC_BYTES])
        npages = int(meta[lay.H_NPAGES])
        inuse = int(meta[lay.H_PAGES_INUSE]) * PAGE_SIZE
        occ = np.zeros((NUM_SIZE_CLASSES, 4), dtype=np.int64)
        census(meta, occ)
        tails = np.array([c.tail_waste for c in CLASSES], dtype=np.int64)
        by_size = [BySizeEntry(0, large_allocs, large_frees)]
        by_size += [
            BySizeEntry(CLASSES[c].size, int(small_alloc[c]), int(small_free[c]))
            for c in range(1, NUM_SIZE_CLASSES)
        ]
        per_p = tuple(
            PStats(
                int((mc[p, : lay.NUM_SPAN_CLASSES] >= 0).sum()),
                int(mc[p, lay.MC_REFILLS]),
                int(mc[p, lay.MC_MALLOCS]),
                int(mc[p, lay.MC_TINYALLOCS]),
            )
            for p in range(self._procs)
        )
        by_class = tuple(
            ClassOccupancy(
                CLASSES[c].size, int(occ[c, 0]), int(occ[c, 1]), int(occ[c, 2]), int(occ[c, 3])
            )
            for c in range(NUM_SIZE_CLASSES)
        )
        return MemStats(
            HeapAlloc=heap_alloc,
            HeapSys=npages * PAGE_SIZE,
            HeapIdle=npages * PAGE_SIZE - inuse,
            HeapInuse=inuse,
            HeapReleased=0,
            HeapObjects=mallocs - frees,
            Mallocs=mallocs,
            Frees=frees,
            TinyAllocs=tiny_allocs,
            TotalAlloc=total_alloc,
            NumGC=int(meta[lay.H_GC_CYCLES]),
            BySize=tuple(by_size),
            SpansInUse=int(meta[lay.H_SPANS_INUSE]),
            InternalFragmentation=inuse - heap_alloc,
            TailWaste=int((occ[1:, 0] * tails[1:]).sum()),
            PerP=per_p,
            ByClass=by_class,
        )

    statistics = read_mem_stats


def _class_of(size: int) -> int:
    if size <= 1024 - 8:
        return SIZE_TO_CLASS8[(size + 7) // 8]
    return SIZE_TO_CLASS128[(size - 1024 + 127) // 128]
