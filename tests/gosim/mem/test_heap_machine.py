"""The heap against a model (a dict of live blocks), with hypothesis' state machines.

Invariants checked after every step: live objects never overlap and keep their bytes;
each lies inside its span; alignment follows Go's rules; sizes round up to the class
size; counters equal the model's. Also run with ``NUMBA_DISABLE_JIT=1`` in a subprocess,
so the pure-Python form of the kernels is held to the same model.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import hypothesis.strategies as st
import numpy as np
import pytest
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from gosim import mem
from gosim.mem import _layout as lay

PAGE = mem.PAGE_SIZE
ARENA_PAGES = 48
PROCS = 2
EXAMPLES = int(os.environ.get("GOSIM_MEM_MACHINE_EXAMPLES", "60"))
STEPS = int(os.environ.get("GOSIM_MEM_MACHINE_STEPS", "40"))

sizes = st.one_of(
    st.integers(1, 15),  # tiny when noscan
    st.integers(16, 1024),
    st.integers(1025, 32768),
    st.integers(32769, 5 * PAGE),  # large
    st.sampled_from([8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]),
)


@dataclass
class Obj:
    size: int
    tiny: bool
    extent: int  # bytes the object owns: class size, pages, or (tiny) its own size
    tag: int


def tiny_align(size: int) -> int:
    if size % 8 == 0:
        return 8
    if size % 4 == 0:
        return 4
    if size % 2 == 0:
        return 2
    return 1


class HeapMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.heap = mem.Heap(ARENA_PAGES * PAGE, PROCS)
        self.live: dict[int, Obj] = {}
        self.freed: set[int] = set()
        self.mallocs = 0
        self.next_tag = 1

    # ---- helpers ----------------------------------------------------------------

    def counters(self) -> tuple[int, ...]:
        s = self.heap.read_mem_stats()
        return (s.Mallocs, s.Frees, s.HeapAlloc, s.HeapObjects, s.TinyAllocs)

    def record(self, addr: int, size: int, noscan: bool) -> None:
        assert addr not in self.live
        tiny = noscan and size < mem.TINY_SIZE
        if tiny:
            extent = size
        elif size > mem.MAX_SMALL_SIZE:
            extent = -(-size // PAGE) * PAGE
        else:
            extent = mem.roundupsize(size)
        view = self.heap.view(addr, size)
        assert bytes(view) == bytes(size), "memory handed out must be zeroed"
        tag = self.next_tag % 251 + 1
        self.next_tag += 1
        view[:] = bytes([tag]) * size
        self.live[addr] = Obj(size, tiny, extent, tag)
        self.freed.discard(addr)
        self.mallocs += 1

    def forget(self, addr: int) -> None:
        o = self.live.pop(addr)
        assert bytes(self.heap.view(addr, o.size)) == bytes([o.tag]) * o.size
        self.freed.add(addr)

    # ---- rules ------------------------------------------------------------------

    @rule(size=sizes, p=st.integers(0, PROCS - 1), noscan=st.booleans())
    def malloc(self, size: int, p: int, noscan: bool) -> None:
        before = self.counters()
        try:
            a = self.heap.malloc(size, p, noscan=noscan)
        except mem.OutOfMemoryError:
            assert self.counters() == before
            return
        self.record(a, size, noscan)

    @rule(size=sizes, n=st.integers(1, 40), p=st.integers(0, PROCS - 1), noscan=st.booleans())
    def malloc_many(self, size: int, n: int, p: int, noscan: bool) -> None:
        before = self.counters()
        try:
            addrs = self.heap.malloc_many(size, n, p, noscan=noscan)
        except mem.OutOfMemoryError:
            assert self.counters() == before
            return
        assert addrs.dtype == np.int64 and len(addrs) == n
        for a in addrs.tolist():
            self.record(a, size, noscan)

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        a = data.draw(st.sampled_from(sorted(self.live)))
        self.heap.free(a)
        self.forget(a)

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def free_many(self, data: st.DataObject) -> None:
        addrs = data.draw(st.lists(st.sampled_from(sorted(self.live)), unique=True, max_size=30))
        self.heap.free_many(np.array(addrs, dtype=np.int64))
        for a in addrs:
            self.forget(a)

    @precondition(lambda self: self.freed - set(self.live))
    @rule(data=st.data())
    def double_free(self, data: st.DataObject) -> None:
        a = data.draw(st.sampled_from(sorted(self.freed - set(self.live))))
        before = self.counters()
        with pytest.raises(mem.BadAddressError):
            self.heap.free(a)
        assert self.counters() == before

    @precondition(lambda self: any(not o.tiny for o in self.live.values()))
    @rule(data=st.data(), off=st.integers(1, 7))
    def interior_free(self, data: st.DataObject, off: int) -> None:
        a = data.draw(st.sampled_from(sorted(a for a, o in self.live.items() if not o.tiny)))
        before = self.counters()
        with pytest.raises(mem.InteriorPointerError):
            self.heap.free(a + off)
        assert self.counters() == before

    @rule(addr=st.one_of(st.integers(-(2**40), -1), st.integers(ARENA_PAGES * PAGE + 1, 2**40)))
    def foreign_free(self, addr: int) -> None:
        before = self.counters()
        with pytest.raises(mem.ForeignAddressError):
            self.heap.free(addr)
        assert self.counters() == before

    @rule(data=st.data())
    def mark_and_sweep(self, data: st.DataObject) -> None:
        keep = data.draw(
            st.sets(st.sampled_from(sorted(self.live))) if self.live else st.just(set())
        )
        self.heap.mark(sorted(keep))
        # Swept at once so the counters are exact: unswept garbage still counts in
        # HeapAlloc, as in Go (lazy sweeping after mark is covered in test_heap.py).
        self.heap.sweep()
        for a in [a for a in self.live if a not in keep]:
            self.forget(a)

    @rule()
    def sweep(self) -> None:
        self.heap.sweep()

    # ---- invariants -------------------------------------------------------------

    @invariant()
    def no_overlap_inside_span_aligned(self) -> None:
        meta = self.heap._meta
        o_span = int(meta[lay.H_O_SPAN])
        o_spanof = int(meta[lay.H_O_SPANOF])
        prev_end = -1
        for a in sorted(self.live):
            o = self.live[a]
            assert a >= prev_end, f"object {a:#x} overlaps the previous one"
            prev_end = a + o.extent
            s = int(meta[o_spanof + a // PAGE])
            assert s >= 0
            row = o_span + s * lay.SPAN_FIELDS
            span_end = (s + int(meta[row + lay.S_NPAGES])) * PAGE
            assert s * PAGE <= a and a + o.extent <= span_end
            if o.tiny:
                assert a % tiny_align(o.size) == 0
                assert a // 16 == (a + o.size - 1) // 16  # within one 16-byte block
            elif o.size > mem.MAX_SMALL_SIZE:
                assert a % PAGE == 0
            else:
                c = mem.size_classes()[mem.size_to_class(o.size)]
                assert int(meta[row + lay.S_ELEMSIZE]) == c.size >= o.size
                assert a % 8 == 0 and a % c.min_align == 0
                if c.size & (c.size - 1) == 0:
                    assert a % min(c.size, PAGE) == 0

    @invariant()
    def counters_match_model(self) -> None:
        s = self.heap.read_mem_stats()
        assert s.Mallocs == self.mallocs
        meta = self.heap._meta
        o_mc = int(meta[lay.H_O_MCACHE])
        current = {int(meta[o_mc + p * lay.MCACHE_WORDS + lay.MC_TINY]) for p in range(PROCS)}
        current.discard(-1)
        blocks = {a & ~15 for a, o in self.live.items() if o.tiny} | current
        plain = [o for o in self.live.values() if not o.tiny]
        assert s.HeapObjects == len(plain) + len(blocks)
        assert s.HeapAlloc == sum(o.extent for o in plain) + 16 * len(blocks)
        assert s.HeapIdle + s.HeapInuse == s.HeapSys
        per_class = [0] * 68
        for o in plain:
            per_class[mem.size_to_class(o.size)] += 1
        per_class[2] += len(blocks)
        assert [b.Mallocs - b.Frees for b in s.BySize] == per_class


HeapMachine.TestCase.settings = settings(
    max_examples=EXAMPLES, stateful_step_count=STEPS, deadline=None
)
TestHeapMachine = HeapMachine.TestCase


def test_machine_without_jit() -> None:
    """The same machine on the pure-Python kernels (``NUMBA_DISABLE_JIT=1``)."""
    env = dict(
        os.environ,
        NUMBA_DISABLE_JIT="1",
        GOSIM_MEM_MACHINE_EXAMPLES="8",
        GOSIM_MEM_MACHINE_STEPS="20",
    )
    here = Path(__file__)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            str(here),
            "-q",
            "-p",
            "no:cacheprovider",
            "-k",
            "TestHeapMachine",
            "--import-mode=importlib",
        ],
        check=False,
        cwd=here.parents[3],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "1 passed" in proc.stdout
