"""Allocation traces: parse, replay through a :class:`Heap`, report occupancy and waste.

Trace format (text, one operation per line; ``#`` starts a comment; blank lines are
skipped; fields are separated by whitespace)::

    a SIZE [P]    allocate SIZE bytes (SIZE >= 1) on P (default 0); the object's id is
                  the number of ``a`` lines before this one (0, 1, 2, ...)
    f ID          free the object with that id
    gc            a collection: mark every live object, then sweep

Objects are noscan (byte buffers), so sizes under 16 use the tiny allocator, as
``[]byte`` of that size would in Go. Replay runs in one numba kernel per slice of the trace
(``_mcache.replay``), so a million operations take well under a second; between slices
the report samples the heap (HeapInuse, HeapAlloc, requested bytes, per-class spans).

Per size class the report shows, at the end of the trace and at the peak of HeapInuse:
spans, objects, occupancy (object bytes / span bytes) and the three kinds of waste:
round-up (slot size minus requested size, summed over live objects), free slots, and span
tails (``SizeClass.tail_waste`` per span).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from . import _layout as lay
from ._errors import OutOfMemoryError
from ._heap import Heap
from ._mcache import census, replay
from ._sizeclasses import CLASSES, NUM_SIZE_CLASSES, PAGE_SIZE

OP_ALLOC = 0
OP_FREE = 1
OP_GC = 2


class TraceFormatError(ValueError):
    """A trace line is not ``a SIZE [P]``, ``f ID`` or ``gc``; the message names the line."""


@dataclass(frozen=True, slots=True)
class ClassRow:
    """One size class at one moment of a replay (class 0 = large objects)."""

    size_class: int
    size: int
    spans: int
    objects: int
    span_bytes: int
    object_bytes: int
    requested_bytes: int
    round_up_waste: int
    free_slot_bytes: int
    tail_waste: int

    @property
    def occupancy(self) -> float:
        """Object bytes over span bytes (0 when the class has no span)."""
        return self.object_bytes / self.span_bytes if self.span_bytes else 0.0


@dataclass(frozen=True, slots=True)
class Sample:
    """Heap totals after ``ops`` operations."""

    ops: int
    heap_inuse: int
    heap_alloc: int
    requested: int


@dataclass(frozen=True, slots=True)
class ReplayReport:
    """What :func:`replay_trace` measured."""

    ops: int
    seconds: float  #: replay time (parsing excluded)
    parse_seconds: float
    samples: tuple[Sample, ...]
    final: tuple[ClassRow, ...]
    peak: tuple[ClassRow, ...]
    peak_ops: int


def parse_trace(text: str) -> npt.NDArray[np.int64]:
    """Trace text -> int64 array of rows ``(op, arg, p)``. Raises :class:`TraceFormatError`."""
    ops: list[tuple[int, int, int]] = []
    append = ops.append
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0]
        parts = line.split()
        if not parts:
            continue
        try:
            op = parts[0]
            if op == "a" and len(parts) in (2, 3):
                size = int(parts[1])
                if size < 1:
                    raise ValueError
                append((OP_ALLOC, size, int(parts[2]) if len(parts) == 3 else 0))
            elif op == "f" and len(parts) == 2:
                append((OP_FREE, int(parts[1]), 0))
            elif op == "gc" and len(parts) == 1:
                append((OP_GC, 0, 0))
            else:
                raise ValueError
        except ValueError:
            raise TraceFormatError(f"line {lineno}: bad trace line {raw!r}") from None
    if not ops:
        return np.zeros((0, 3), dtype=np.int64)
    return np.array(ops, dtype=np.int64)


def _rows(heap: Heap, req_live: npt.NDArray[np.int64]) -> tuple[ClassRow, ...]:
    occ = np.zeros((NUM_SIZE_CLASSES, 4), dtype=np.int64)
    census(heap._meta, occ)
    rows = []
    for c in range(NUM_SIZE_CLASSES):
        spans, pages, objects, slots = (int(x) for x in occ[c])
        if c == 0:
            size = 0
            object_bytes = pages * PAGE_SIZE if objects else 0
            free_slot = 0
            tail = 0
        else:
            size = CLASSES[c].size
            object_bytes = objects * size
            free_slot = (slots - objects) * size
            tail = spans * CLASSES[c].tail_waste
        req = int(req_live[c])
        rows.append(
            ClassRow(
                c,
                size,
                spans,
                objects,
                pages * PAGE_SIZE,
                object_bytes,
                req,
                max(object_bytes - req, 0),
                free_slot,
                tail,
            )
        )
    return tuple(rows)


def replay_trace(
    ops: npt.NDArray[np.int64],
    *,
    arena_bytes: int | None = None,
    procs: int | None = None,
    samples: int = 100,
) -> ReplayReport:
    """Replay parsed operations through a fresh :class:`Heap` and measure it.

    The arena defaults to twice the trace's total allocated bytes (pages rounded), at
    least 8 MiB; ``procs`` defaults to one more than the largest P in the trace. Raises
    the heap's own errors (with the failing line's operation index in the message).
    """
    n = int(ops.shape[0])
    allocs = ops[ops[:, 0] == OP_ALLOC]
    if procs is None:
        procs = int(allocs[:, 2].max()) + 1 if allocs.size else 1
    if arena_bytes is None:
        total = (
            int(((allocs[:, 1] + PAGE_SIZE - 1) // PAGE_SIZE * PAGE_SIZE).sum())
            if allocs.size
            else 0
        )
        arena_bytes = max(8 << 20, 2 * total)
        arena_bytes = -(-arena_bytes // PAGE_SIZE) * PAGE_SIZE
    heap = Heap(arena_bytes, procs)
    nalloc = int(allocs.shape[0])
    addr_by_id = np.full(max(nalloc, 1), -1, dtype=np.int64)
    size_by_id = np.zeros(max(nalloc, 1), dtype=np.int64)
    state = np.zeros(1, dtype=np.int64)
    req_live = np.zeros(NUM_SIZE_CLASSES, dtype=np.int64)
    scratch = np.zeros(max(nalloc, 1), dtype=np.int64)
    kinds = np.zeros(max(nalloc, 1), dtype=np.int8)
    meta = heap._meta
    taken: list[Sample] = []
    peak_rows = _rows(heap, req_live)
    peak_ops = 0
    peak_inuse = -1
    step = max(1, -(-n // max(samples, 1)))
    t0 = time.perf_counter()
    for start in range(0, n, step):
        stop = min(n, start + step)
        bad = int(
            replay(
                meta,
                heap._bits,
                heap._tiny,
                heap._arena_words,
                ops,
                start,
                stop,
                True,
                addr_by_id,
                size_by_id,
                state,
                req_live,
                scratch,
                kinds,
            )
        )
        if bad >= 0:
            code = int(meta[lay.H_ERR_INDEX])
            op = ("a", "f", "gc")[int(ops[bad, 0])]
            raise _op_error(code, bad, op, int(ops[bad, 1]), heap)
        st = heap.read_mem_stats()
        taken.append(Sample(stop, st.HeapInuse, st.HeapAlloc, int(req_live.sum())))
        if st.HeapInuse > peak_inuse:
            peak_inuse = st.HeapInuse
            peak_ops = stop
            peak_rows = _rows(heap, req_live)
    seconds = time.perf_counter() - t0
    return ReplayReport(n, seconds, 0.0, tuple(taken), _rows(heap, req_live), peak_rows, peak_ops)


def _op_error(code: int, index: int, op: str, arg: int, heap: Heap) -> Exception:
    where = f"trace operation {index} ({op} {arg})"
    if code == lay.ERR_OOM:
        return OutOfMemoryError(f"{where}: out of memory in a {heap.arena_bytes}-byte arena")
    return ValueError(f"{where}: bad free (object not live, error code {code})")


def format_report(rep: ReplayReport) -> str:
    """The report as text: totals, then per-class tables at the end and at the peak."""
    out = []
    rate = rep.ops / rep.seconds if rep.seconds else float("inf")
    out.append(
        f"replayed {rep.ops} operations in {rep.seconds:.3f} s "
        f"({rate / 1e6:.2f} M ops/s; parse {rep.parse_seconds:.3f} s)"
    )
    if rep.samples:
        last = rep.samples[-1]
        peak = max(rep.samples, key=lambda s: s.heap_inuse)
        out.append(
            f"end:  HeapInuse {last.heap_inuse} HeapAlloc {last.heap_alloc} "
            f"requested {last.requested}"
        )
        out.append(f"peak: HeapInuse {peak.heap_inuse} at op {peak.ops}")
    for title, rows in (("at end of trace", rep.final), (f"at peak (op {rep.peak_ops})", rep.peak)):
        out.append("")
        out.append(f"per size class, {title}:")
        out.append(
            f"{'class':>5} {'size':>6} {'spans':>6} {'objects':>8} {'occupancy':>9} "
            f"{'round-up':>10} {'free slots':>11} {'tail':>8}"
        )
        for r in rows:
            if r.spans == 0:
                continue
            out.append(
                f"{r.size_class:>5} {r.size if r.size_class else 'large':>6} "
                f"{r.spans:>6} {r.objects:>8} {100 * r.occupancy:>8.1f}% "
                f"{r.round_up_waste:>10} {r.free_slot_bytes:>11} {r.tail_waste:>8}"
            )
    return "\n".join(out)


def plot_report(rep: ReplayReport, path: str | Path) -> None:
    """Draw totals over time and per-class occupancy and waste at the peak (needs
    matplotlib, which the ``dev`` extra installs)."""
    # Imported here: matplotlib is optional (the dev extra), gosim.mem needs only numpy.
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(10, 8))
    xs = [s.ops for s in rep.samples]
    ax1.plot(xs, [s.heap_inuse / 2**20 for s in rep.samples], label="HeapInuse")
    ax1.plot(xs, [s.heap_alloc / 2**20 for s in rep.samples], label="HeapAlloc")
    ax1.plot(xs, [s.requested / 2**20 for s in rep.samples], label="requested")
    ax1.set_xlabel("operations")
    ax1.set_ylabel("MiB")
    ax1.set_title("heap over the trace")
    ax1.legend()
    rows = [r for r in rep.peak if r.spans and r.size_class]
    labels = [str(r.size) for r in rows]
    idx = np.arange(len(rows))
    kib = 1024.0
    ax2.bar(idx, [r.requested_bytes / kib for r in rows], label="requested")
    bottom = np.array([r.requested_bytes / kib for r in rows])
    for name, vals in (
        ("round-up", [r.round_up_waste for r in rows]),
        ("free slots", [r.free_slot_bytes for r in rows]),
        ("span tail", [r.tail_waste for r in rows]),
    ):
        v = np.array(vals) / kib
        ax2.bar(idx, v, bottom=bottom, label=name)
        bottom = bottom + v
    for i, r in zip(idx, rows, strict=True):
        ax2.annotate(
            f"{100 * r.occupancy:.0f}%", (i, bottom[i]), ha="center", va="bottom", fontsize=7
        )
    ax2.set_xticks(idx, labels, rotation=90, fontsize=7)
    ax2.set_xlabel("size class (bytes); label = occupancy")
    ax2.set_ylabel("KiB")
    ax2.set_title(f"per size class at peak HeapInuse (op {rep.peak_ops})")
    ax2.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def report_file(
    path: str | Path, *, plot: str | Path | None = None, arena_bytes: int | None = None
) -> ReplayReport:
    """Parse, replay and (optionally) plot a trace file; returns the report."""
    t0 = time.perf_counter()
    ops = parse_trace(Path(path).read_text())
    parse_seconds = time.perf_counter() - t0
    rep = replay_trace(ops, arena_bytes=arena_bytes)
    rep = ReplayReport(
        rep.ops, rep.seconds, parse_seconds, rep.samples, rep.final, rep.peak, rep.peak_ops
    )
    if plot is not None:
        plot_report(rep, plot)
    return rep


def synthetic_trace(nops: int, seed: int = 0, *, gc_every: int = 0) -> str:
    """A trace of ``nops`` operations with Go-like size mix (many small, a few large),
    each object freed some time after it is made; for tests, benchmarks and demos."""
    rng = np.random.default_rng(seed)
    lines = []
    live: list[int] = []
    next_id = 0
    choices = np.array([8, 12, 16, 24, 32, 48, 64, 100, 128, 250, 512, 1000, 2048, 5000, 40000])
    weights = np.array([8, 6, 10, 8, 10, 6, 10, 5, 6, 4, 4, 3, 2, 1, 0.2])
    sizes = rng.choice(choices, size=nops, p=weights / weights.sum())
    coin = rng.random(nops)
    picks = rng.random(nops)
    for i in range(nops):
        if gc_every and i and i % gc_every == 0:
            lines.append("gc")
            continue
        if live and coin[i] < 0.45:
            j = int(picks[i] * len(live))
            live[j], live[-1] = live[-1], live[j]
            lines.append(f"f {live.pop()}")
        else:
            lines.append(f"a {int(sizes[i])}")
            live.append(next_id)
            next_id += 1
    return "\n".join(lines) + "\n"
