"""The runtime's timer heap: the C ``Timers.add``/``delete`` against the Python reference.

Both twins run the same random arms, re-arms, disarms and expiries (on either P) on
two runtimes; the heaps must stay the same list of (when, seq) entries, the timers'
fields and the counters the same, and the timers fire in the same order.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gosim._core._accel import speedups
from gosim._core._runtime import Runtime
from gosim._core._timers import Timer, Timers

pytestmark = pytest.mark.skipif(
    speedups is None, reason="the C accelerator is not built or GOSIM_PURE_PYTHON=1"
)

_OPS = st.lists(
    st.tuples(
        st.sampled_from(["add", "add", "add", "del", "expire", "p"]),
        st.integers(0, 39),  # which timer
        st.integers(0, 50),  # when, in tenths
    ),
    max_size=300,
)


class _Side:
    def __init__(self, c: bool) -> None:
        self.rt = Runtime(2, 1, None, deterministic=True)
        self.c = c
        self.fired: list[int] = []
        self.timers = [Timer(lambda i, now: self.fired.append(i), i) for i in range(40)]

    def add(self, i: int, when: float) -> None:
        if self.c:
            self.rt.timers.add(self.timers[i], when)
        else:
            Timers._add_py(self.rt.timers, self.timers[i], when)

    def delete(self, i: int) -> bool:
        if self.c:
            return self.rt.timers.delete(self.timers[i])
        return Timers._delete_py(self.rt.timers, self.timers[i])

    def state(self) -> Any:
        return (
            [[(w, s, t.arg) for w, s, t in p.timers.heap] for p in self.rt.allp],
            [p.timers.nlive for p in self.rt.allp],
            [(t.armed, t.seq, t.when, None if t.p is None else t.p.id) for t in self.timers],
            self.rt.timers.seq,
            self.rt.timers.narmed,
            self.fired,
        )


@settings(max_examples=200, deadline=None)
@given(ops=_OPS)
def test_c_timer_heap_matches_the_python_reference(ops: list[tuple[str, int, int]]) -> None:
    sides = [_Side(c=True), _Side(c=False)]
    for op, i, w in ops:
        results = []
        for side in sides:
            if op == "add":
                side.add(i, w / 10)
                results.append(None)
            elif op == "del":
                results.append(side.delete(i))
            elif op == "expire":
                side.rt.timers.check(w / 10)
                results.append(None)
            else:  # the timers of the other P from now on
                side.rt.curp = side.rt.allp[w % 2]
                results.append(None)
        assert results[0] == results[1]
        assert sides[0].state() == sides[1].state()


def test_many_stale_entries_rebuild_the_heap_on_either_twin() -> None:
    for c in (True, False):
        side = _Side(c)
        for k in range(400):
            side.add(k % 40, float(k))
        heap = side.rt.curp.timers
        assert heap.nlive == 40
        assert len(heap.heap) <= 2 * heap.nlive + 65  # rebuilt, not 400 entries long


def test_c_twins_refuse_what_is_not_a_timer_or_a_heap() -> None:
    rt = Runtime(1, 1, None, deterministic=True)
    with pytest.raises(TypeError):
        rt.timers.add(object(), 1.0)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        rt.timers.delete(object())  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        rt.timers.add(Timer(lambda a, now: None, None), "soon")  # type: ignore[arg-type]
    rt.curp.timers = []  # a P whose heap was replaced by something else
    with pytest.raises(TypeError, match="TimerHeap"):
        rt.timers.add(Timer(lambda a, now: None, None), 1.0)
