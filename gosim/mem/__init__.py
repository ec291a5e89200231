"""gosim.mem: Go's size-classed allocator over an arena, with numba-compiled hot paths.

The layers are Go's (``runtime/malloc.go``): a per-P ``mcache`` with one span per span
class and the tiny allocator; an ``mcentral`` per span class with swept and unswept span
sets; the ``mheap`` with a page allocator (a bitmap and summary per 512-page chunk, first
fit). Size classes are computed by Go's ``mksizeclasses.go`` algorithm. Modules, low to
high: ``_sizeclasses``, ``_layout``, ``_bits``, ``_pagealloc``, ``_mheap``, ``_mspan``
(bitmaps, span sets, sweeping), ``_mcentral``, ``_mcache`` (mallocgc, free, mark), then
``_heap`` (the Python API) and ``_replay`` (trace replay and the report).

Imports only the standard library, numpy and numba.
"""

from __future__ import annotations

from ._errors import BadAddressError as BadAddressError
from ._errors import DoubleFreeError as DoubleFreeError
from ._errors import ForeignAddressError as ForeignAddressError
from ._errors import InteriorPointerError as InteriorPointerError
from ._errors import OutOfMemoryError as OutOfMemoryError
from ._errors import UnallocatedAddressError as UnallocatedAddressError
from ._heap import BySizeEntry as BySizeEntry
from ._heap import ClassOccupancy as ClassOccupancy
from ._heap import Heap as Heap
from ._heap import MemStats as MemStats
from ._heap import PStats as PStats
from ._sizeclasses import MAX_SMALL_SIZE as MAX_SMALL_SIZE
from ._sizeclasses import PAGE_SIZE as PAGE_SIZE
from ._sizeclasses import TINY_SIZE as TINY_SIZE
from ._sizeclasses import SizeClass as SizeClass
from ._sizeclasses import roundupsize as roundupsize
from ._sizeclasses import size_classes as size_classes
from ._sizeclasses import size_to_class as size_to_class

__all__ = [
    "MAX_SMALL_SIZE",
    "PAGE_SIZE",
    "TINY_SIZE",
    "BadAddressError",
    "BySizeEntry",
    "ClassOccupancy",
    "DoubleFreeError",
    "ForeignAddressError",
    "Heap",
    "InteriorPointerError",
    "MemStats",
    "OutOfMemoryError",
    "PStats",
    "SizeClass",
    "UnallocatedAddressError",
    "roundupsize",
    "size_classes",
    "size_to_class",
]

for _name in __all__:
    _obj = globals()[_name]
    if getattr(_obj, "__module__", "").startswith("gosim.mem._"):
        try:
            _obj.__module__ = "gosim.mem"
        except (AttributeError, TypeError):
            pass
