"""gosim.malloc / gosim.free go through the running goroutine's P's mcache."""

from __future__ import annotations

import pytest

import gosim
from gosim import Chan, go
from gosim.mem import DoubleFreeError, Heap


def test_malloc_uses_the_current_ps_mcache_and_free_returns_memory() -> None:
    async def worker(n: int, out: Chan[list[int]]) -> None:
        addrs = []
        for _ in range(n):
            addrs.append(gosim.malloc(64))
            await gosim.gosched()  # move around between Ps
        await out.send(addrs)

    async def main() -> tuple[int, int, list[int], int]:
        out: Chan[list[int]] = Chan(8)
        for _ in range(8):
            go(worker, 50, out)
        addrs: list[int] = []
        for _ in range(8):
            addrs += await out.recv() or []
        stats = gosim.heap().read_mem_stats()
        per_p = [ps.mallocs for ps in stats.PerP]
        view = gosim.heap().view(addrs[0], 64)
        view[:5] = b"hello"
        for a in addrs:
            gosim.free(a)
        with pytest.raises(DoubleFreeError):
            gosim.free(addrs[0])
        return len(set(addrs)), stats.Mallocs, per_p, gosim.heap().read_mem_stats().Frees

    distinct, mallocs, per_p, frees = gosim.run(main, procs=3, seed=2, virtual_time=True)
    assert distinct == 400 and mallocs == 400 and frees == 400
    assert sum(1 for n in per_p if n) >= 2  # several Ps allocated from their own mcache
    assert sum(per_p) == 400


def test_use_heap_installs_a_custom_heap_before_first_use() -> None:
    async def main() -> int:
        h = Heap(8 * 1024 * 1024, procs=2)
        gosim.use_heap(h)
        addr = gosim.malloc(100)
        with pytest.raises(RuntimeError):
            gosim.use_heap(Heap(8 * 1024 * 1024, procs=2))
        return h.read_mem_stats().Mallocs + (addr >= 0)

    assert gosim.run(main, procs=2) == 2
