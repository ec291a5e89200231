"""The C twins' leak check: run the work once to warm every cache, then again under
tracemalloc, and say what it left behind."""

from __future__ import annotations

import gc
import sys
import tracemalloc
from collections.abc import Callable


def leaks(
    work: Callable[[int], None], *watched: object, warm: int, runs: int
) -> tuple[list[int], int]:
    """``work(warm)``, then ``work(runs)`` traced: how far each of ``watched``'s
    reference counts moved over the traced runs (0: no reference to it kept or lost),
    and the bytes allocated during them and still live after a collection (near 0:
    nothing kept)."""
    work(warm)
    gc.collect()
    refs = [sys.getrefcount(w) for w in watched]
    tracemalloc.start()
    try:
        work(runs)
        gc.collect()
        live = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    after = [sys.getrefcount(w) for w in watched]  # counted as before: the same refs held
    return [a - r for a, r in zip(after, refs, strict=True)], live
