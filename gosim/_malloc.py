"""``gosim.malloc`` / ``gosim.free``: the allocator as goroutines see it, per-P mcaches.

Each runtime owns (lazily) one :class:`gosim.mem.Heap`. A goroutine's ``malloc`` goes
to the mcache of the P it is running on, as Go's ``mallocgc`` uses ``getMCache()``, so
which P ran which goroutine shows in ``heap().read_mem_stats().PerP``. The heap is made
with one mcache per P up to :data:`HEAP_PROCS` (or ``gomaxprocs`` if larger at first
use); Ps added later by ``gomaxprocs`` share mcaches modulo that count.

``use_heap(heap)`` installs a heap of your own (a larger arena, say) before first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from gosim._internals import Runtime
from gosim.lowlevel import RuntimeVar, current_runtime

if TYPE_CHECKING:
    from gosim.mem import Heap

DEFAULT_ARENA_BYTES: Final = 64 * 1024 * 1024  # pages are only resident once touched
HEAP_PROCS: Final = 16

_HEAP: RuntimeVar[Heap] = RuntimeVar("gosim.heap")  # set on first use


def _heap_of(rt: Runtime) -> Heap:
    heap = _HEAP.get_in(rt)
    if heap is None:
        # Imported here: gosim.mem loads numba, which `import gosim` should not pay for.
        from gosim.mem import Heap  # noqa: PLC0415

        heap = Heap(DEFAULT_ARENA_BYTES, procs=max(HEAP_PROCS, len(rt.allp)))
        _HEAP.set_in(rt, heap)
    return heap


def heap() -> Heap:
    """The running runtime's heap (created with a 64 MiB arena on first use)."""
    return _heap_of(current_runtime())


def use_heap(h: Heap) -> None:
    """Make ``h`` the running runtime's heap; only before the first ``malloc``."""
    rt = current_runtime()
    old = _HEAP.get_in(rt)
    if old is not None and old is not h:
        raise RuntimeError("use_heap: this runtime already allocated from another heap")
    _HEAP.set_in(rt, h)


def malloc(n: int, *, noscan: bool = True) -> int:
    """Allocate ``n`` bytes from the current P's mcache; return the address (an int).

    Raises ``gosim.mem.OutOfMemoryError`` when the arena is exhausted (heap unchanged).
    """
    rt = current_runtime()
    h = _heap_of(rt)
    return h.malloc(n, p=rt.curp.id % h.procs, noscan=noscan)


def free(addr: int) -> None:
    """Free the object at ``addr``; double or foreign frees raise ``gosim.mem.BadAddressError``."""
    _heap_of(current_runtime()).free(addr)
