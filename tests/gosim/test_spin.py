"""gosim.spin: mutual exclusion from OS threads and nogil kernels, FIFO order, Go's lock2."""

from __future__ import annotations

import gc
import os
import re
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from numba import njit
from numba.core.registry import CPUDispatcher

from gosim import spin
from gosim.atomic import (
    JIT_ENABLED,
    _ops,
    atomic_fetch_add,
    atomic_load,
    atomic_store_release,
    atomic_swap,
)
from gosim.spin import _cpu
from gosim.spin import _kernels as k

REPO = Path(__file__).resolve().parents[2]
LOCK_CLASSES = [
    spin.TASLock,
    spin.TTASLock,
    spin.TicketLock,
    spin.MCSLock,
    spin.CLHLock,
    spin.RuntimeLock,
]
FIFO_CLASSES = [spin.TicketLock, spin.MCSLock, spin.CLHLock]

jit_only = pytest.mark.skipif(
    not JIT_ENABLED, reason="needs compiled kernels; NUMBA_DISABLE_JIT is set"
)


def wait_until(condition: Any, what: str, timeout: float = 10.0) -> None:
    """Poll `condition` (a bounded wait for another thread to reach a state)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.001)


# ----------------------------------------------------------------- mutual exclusion


@jit_only
@pytest.mark.parametrize("cls", LOCK_CLASSES)
def test_two_nogil_kernels_count_exactly(cls: Any) -> None:
    lock = cls()
    result = spin.count_under_lock(lock, threads=2, increments=100_000)
    assert result.counter == 200_000
    assert not lock.locked()


@jit_only
@pytest.mark.parametrize("cls", LOCK_CLASSES)
def test_contention_budget_is_spent_exactly(cls: Any) -> None:
    lock = cls()
    result = spin.measure_contention(lock, threads=2, budget=100_000)
    # Each acquisition that spent a unit was counted by its thread; a lost update would
    # make the threads' counts add up to more than the shared counter.
    assert result.total == result.counter == 100_000
    assert len(result.acquisitions) == 2
    assert 0.5 <= result.fairness <= 1.0
    assert not lock.locked()


@pytest.mark.parametrize("cls", LOCK_CLASSES)
def test_python_threads_count_exactly(cls: Any) -> None:
    lock = cls()
    box = [0]
    n, m = 4, 1500

    def work() -> None:
        for _ in range(m):
            with lock:
                v = box[0]
                if v % 97 == 0:
                    time.sleep(0)  # invite a thread switch inside the critical section
                box[0] = v + 1

    threads = [threading.Thread(target=work) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert box[0] == n * m
    assert not lock.locked()


@jit_only
def test_python_threads_and_a_kernel_share_one_lock() -> None:
    lock = spin.MCSLock(max_threads=8)
    shared = spin.new_words(2)
    m = 3000

    def python_side() -> None:
        for _ in range(m):
            with lock:
                # The same non-atomic update the kernel makes, from Python.
                shared[0] = shared[0] + 1

    def kernel_side(me: int) -> None:
        for _ in range(m):
            k.mcs_acquire(lock.words, me)
            shared[0] = shared[0] + 1
            k.mcs_release(lock.words, me)

    with lock.reserved_slot() as me:
        threads = [threading.Thread(target=python_side) for _ in range(2)]
        threads.append(threading.Thread(target=kernel_side, args=(me,)))
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert shared[0] == 3 * m


def test_jain_index() -> None:
    assert spin.jain_index([5, 5]) == 1.0
    assert spin.jain_index([10, 0]) == 0.5
    assert spin.jain_index([4, 0, 0, 0]) == 0.25
    assert spin.jain_index([]) == 1.0
    assert spin.jain_index([3, 1]) == pytest.approx(16 / (2 * 10))


# ----------------------------------------------------------------- single-thread API


@pytest.mark.parametrize("cls", LOCK_CLASSES)
def test_try_acquire_and_locked(cls: Any) -> None:
    lock = cls()
    assert not lock.locked()
    assert lock.try_acquire()
    assert lock.locked()
    assert not lock.try_acquire()
    lock.release()
    assert not lock.locked()
    lock.acquire()
    assert "locked" in repr(lock) and lock.locked()
    lock.release()
    assert repr(lock).endswith("unlocked>")


# Lines of the `cell` array the mixed CLH workers share (one 128-byte line each).
_INSIDE, _COUNTER, _OVERLAPS, _STARTED, _STOP = (i * k.LINE_WORDS for i in range(5))


@njit(nogil=True)
def _clh_mixed_worker(words: Any, me: int, use_try: bool, cell: Any, nthreads: int) -> int:
    """Take the CLH lock (by acquire, or by try_acquire's steps until they succeed) and bump a
    counter with a plain read-modify-write until told to stop; count the times the
    critical section was found occupied. Returns the increments made."""
    atomic_fetch_add(cell, _STARTED, 1)
    while atomic_load(cell, _STARTED) < nthreads:
        pass  # start together, so that the threads really overlap
    done = 0
    while atomic_load(cell, _STOP) == 0:
        if use_try:
            # clh_try_acquire in its two steps, with a pause between them as long as
            # an OS preemption there would make it: the window in which the tail node
            # can be released, re-taken and put back in the tail by the other threads.
            seen = k.clh_try_observe(words)
            if seen < 0:
                continue
            for _ in range(done % 256):
                _cpu.cpu_relax()
            if not k.clh_try_commit(words, me, seen):
                continue
        else:
            k.clh_acquire(words, me)
        if atomic_swap(cell, _INSIDE, 1) != 0:
            atomic_fetch_add(cell, _OVERLAPS, 1)
        cell[_COUNTER] = cell[_COUNTER] + 1
        atomic_store_release(cell, _INSIDE, 0)
        k.clh_release(words, me)
        done += 1
    return done


@jit_only
@pytest.mark.slow
def test_clh_try_acquire_and_acquire_from_os_threads_keep_mutual_exclusion() -> None:
    """A thread acquiring and a thread trying, on nogil kernels, the trier pausing
    between its look at the tail and its compare-and-swap (the ABA window, which an OS
    preemption opens as wide). No overlap, no lost increment."""
    nthreads = 2
    lock = spin.CLHLock(max_threads=nthreads)
    cell = np.zeros(5 * k.LINE_WORDS, dtype=np.int64)
    done = [0] * nthreads

    def work(me: int) -> None:
        done[me] = _clh_mixed_worker(lock.words, me, me == 0, cell, nthreads)

    warm = np.zeros_like(cell)
    warm[_STOP] = 1
    _clh_mixed_worker(lock.words, 0, True, warm, 1)  # compile outside the measured run
    threads = [threading.Thread(target=work, args=(me,)) for me in range(nthreads)]
    for t in threads:
        t.start()
    wait_until(lambda: atomic_load(cell, _STARTED) == nthreads, "the threads to start")
    time.sleep(2.0)
    atomic_store_release(cell, _STOP, 1)
    for t in threads:
        t.join(60)
        assert not t.is_alive()
    assert done[0] > 0, done  # the trier got the lock: the race was on
    assert cell[_OVERLAPS] == 0
    assert cell[_COUNTER] == sum(done)
    assert not lock.locked()


def test_clh_try_acquire_cannot_commit_after_the_tail_node_came_back_locked() -> None:
    """The ABA interleaving, replayed step by step on one thread: slot 0's
    try_acquire sees the tail node released; slot 1 then acquires behind that node,
    releases (adopting it) and acquires again, which puts the same node back in the
    tail, locked. Slot 0's compare-and-swap must fail: the lock is slot 1's."""
    lock = spin.CLHLock(max_threads=2)
    words = lock.words
    seen = k.clh_try_observe(words)
    assert seen >= 0  # free: the dummy node is released
    k.clh_acquire(words, 1)
    k.clh_release(words, 1)
    k.clh_acquire(words, 1)  # slot 1 holds the lock, through the node seen above
    assert not k.clh_try_commit(words, 0, seen)
    assert lock.locked()
    assert not k.clh_try_acquire(words, 0)
    k.clh_release(words, 1)
    assert not lock.locked()
    assert k.clh_try_acquire(words, 0)  # and the lock still works for both slots
    k.clh_release(words, 0)
    k.clh_acquire(words, 1)
    k.clh_release(words, 1)
    assert not lock.locked()


def test_words_are_line_aligned() -> None:
    for lines in (1, 2, 7):
        words = spin.new_words(lines)
        assert words.ctypes.data % (spin.LINE_WORDS * 8) == 0
        assert words.shape == (lines * spin.LINE_WORDS,) and not words.any()


def test_runtime_lock_unlock_of_unlocked_throws() -> None:
    lock = spin.RuntimeLock()
    with pytest.raises(spin.UnlockOfUnlockedError, match=r"^unlock of unlocked lock$"):
        lock.release()
    assert not lock.locked()
    assert isinstance(spin.UnlockOfUnlockedError("x"), RuntimeError)


def test_runtime_lock_does_not_spin_on_a_uniprocessor() -> None:
    assert atomic_load(spin.RuntimeLock(ncpu=1).words, 1) == 0
    assert atomic_load(spin.RuntimeLock(ncpu=2).words, 1) == k.ACTIVE_SPIN


def test_queue_lock_slots_are_bounded_and_recycled() -> None:
    lock = spin.CLHLock(max_threads=2)
    with lock.reserved_slot() as a, lock.reserved_slot() as b:
        assert {a, b} == {0, 1}
        with pytest.raises(RuntimeError, match="all 2 slots"), lock.reserved_slot():
            pass
    # Ten threads one after another: each takes a slot and gives it back as it ends.
    for _ in range(10):
        t = threading.Thread(target=lambda: (lock.acquire(), lock.release()))
        t.start()
        t.join()
        gc.collect()
    with lock.reserved_slot(), lock.reserved_slot():
        pass
    with pytest.raises(ValueError):
        spin.MCSLock(max_threads=0)


@jit_only
def test_queue_lock_kernels_check_the_slot() -> None:
    mcs = spin.MCSLock(max_threads=2)
    clh = spin.CLHLock(max_threads=2)
    for bad in (-1, 2):
        with pytest.raises(IndexError):
            k.mcs_acquire(mcs.words, bad)
        with pytest.raises(IndexError):
            k.clh_acquire(clh.words, bad)
    assert not mcs.locked() and not clh.locked()


@jit_only
def test_unknown_kind_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown lock kind"):
        k.spin_acquire(99, spin.new_words(1), 0)


# ------------------------------------------------------------------ FIFO hand-over


def waiting_behind(lock: Any, waiters: int) -> bool:
    """Whether exactly `waiters` threads are queued behind the holder, read from the
    words. Valid while nobody has released yet (no stale links)."""
    w = lock.words
    line = spin.LINE_WORDS
    if isinstance(lock, spin.TicketLock):
        queued = int(atomic_load(w, 0) - atomic_load(w, line)) - 1
    elif isinstance(lock, spin.MCSLock):
        # holder -> w1 -> ... -> tail: every queued node but the tail has a `next` link.
        links = sum(int(atomic_load(w, (1 + s) * line) != 0) for s in range(lock.max_threads))
        queued = links + (atomic_load(w, 0) != 0) - 1
    else:
        # CLH: the holder's node and every waiter's node are marked locked.
        nodes = lock.max_threads + 1
        queued = sum(int(atomic_load(w, (1 + j) * line) != 0) for j in range(nodes)) - 1
    return queued == waiters


@pytest.mark.parametrize("cls", FIFO_CLASSES)
def test_fifo_locks_grant_in_arrival_order(cls: Any) -> None:
    lock = cls()
    order: list[int] = []
    lock.acquire()
    threads = []
    for i in range(3):

        def waiter(i: int = i) -> None:
            with lock:
                order.append(i)

        t = threading.Thread(target=waiter)
        t.start()
        threads.append(t)
        # Admit the next waiter only once this one is queued.
        wait_until(lambda i=i: waiting_behind(lock, i + 1), f"waiter {i} to queue")
    lock.release()
    for t in threads:
        t.join()
    assert order == [0, 1, 2]


# ------------------------------------------------------ Go's lock2 sleeping policy


def test_runtime_lock_sleeps_after_spinning_and_is_woken() -> None:
    lock = spin.RuntimeLock()
    lock.acquire()
    got_it = threading.Event()

    def waiter() -> None:
        lock.acquire()
        got_it.set()
        lock.release()

    t = threading.Thread(target=waiter)
    t.start()
    # After its spins and its osyield the waiter marks the key MUTEX_SLEEPING and
    # sleeps in the futex: it is off the CPU, not spinning.
    wait_until(lambda: atomic_load(lock.words, 0) == k.MUTEX_SLEEPING, "waiter to sleep")
    assert not got_it.is_set()
    lock.release()  # sees MUTEX_SLEEPING, so it wakes the sleeper
    assert got_it.wait(10)
    t.join()
    assert not lock.locked()


# --------------------------------------------------------- stateful model check


TRY_ACQUIRE = {
    k.TAS: lambda w, me: k.tas_try_acquire(w),
    k.TTAS: lambda w, me: k.tas_try_acquire(w),
    k.TICKET: lambda w, me: k.ticket_try_acquire(w),
    k.MCS: k.mcs_try_acquire,
    k.CLH: k.clh_try_acquire,
    k.RUNTIME: lambda w, me: k.lock2_try(w),
}


class LockMachine(RuleBasedStateMachine):
    """Every lock kind against the model "free, or held by owner 0 or 1", driven from
    one thread through the kernels, each owner with its own slot."""

    def __init__(self) -> None:
        super().__init__()
        self.locks = [cls() for cls in LOCK_CLASSES]
        self.holder: list[int | None] = [None] * len(self.locks)

    @rule(i=st.integers(0, len(LOCK_CLASSES) - 1), who=st.integers(0, 1))
    def try_acquire(self, i: int, who: int) -> None:
        lock = self.locks[i]
        got = bool(TRY_ACQUIRE[lock.kind](lock.words, who))
        assert got == (self.holder[i] is None)
        if got:
            self.holder[i] = who

    @rule(i=st.integers(0, len(LOCK_CLASSES) - 1), who=st.integers(0, 1))
    def acquire_when_free(self, i: int, who: int) -> None:
        if self.holder[i] is not None:
            return  # on one thread that would wait forever
        lock = self.locks[i]
        k.spin_acquire(lock.kind, lock.words, who)
        self.holder[i] = who

    @precondition(lambda self: any(h is not None for h in self.holder))
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        i = data.draw(st.sampled_from([i for i, h in enumerate(self.holder) if h is not None]))
        who = self.holder[i]
        assert who is not None
        lock = self.locks[i]
        k.spin_release(lock.kind, lock.words, who)
        self.holder[i] = None

    @invariant()
    def locked_matches_model(self) -> None:
        for i, lock in enumerate(self.locks):
            assert lock.locked() == (self.holder[i] is not None), type(lock).__name__


TestLockMachine = LockMachine.TestCase


# ------------------------------------------------------------ compiled code checks


# The library's kernels are cached on disk, and numba cannot show cached code, so these
# uncached kernels call them: their modules link in the callees' code, which we inspect.


@njit(nogil=True)
def tas_then_ttas(words: Any) -> None:
    k.tas_acquire(words)
    k.tas_release(words)
    k.ttas_acquire(words)
    k.tas_release(words)


@jit_only
def test_spin_loops_contain_the_pause_instruction() -> None:
    if spin.PAUSE_INSTRUCTION != "pause":
        pytest.skip(f"no x86 pause on this machine ({os.uname().machine})")
    tas_then_ttas(spin.new_words(1))
    asm = tas_then_ttas.inspect_asm(tas_then_ttas.signatures[0])
    assert re.search(r"^\s*pause\b", asm, re.MULTILINE)
    assert re.search(r"^\s*xchgq\b", asm, re.MULTILINE)  # xchg with memory: locked


@jit_only
def test_lock_kernels_do_no_reference_counting() -> None:
    """The kernels are compiled without NRT: an incref/decref pair per call would be two
    atomic RMWs on one cache line shared by every thread (see `_kernels._kernel`)."""
    kernels = [
        obj
        for mod in (k, _ops, _cpu)
        for obj in vars(mod).values()
        if isinstance(obj, CPUDispatcher)
    ]
    assert k.mcs_acquire in kernels and _ops._jit_add in kernels
    for kernel in kernels:
        options = kernel.targetoptions
        assert options["_nrt"] is False and options["nogil"], kernel
        assert kernel._cache.__class__.__name__ == "FunctionCache", kernel  # cache=True
    lock = spin.MCSLock(max_threads=2)
    # The control: the same source compiled with NRT does count references.
    with_nrt = njit(nogil=True)(k.mcs_acquire.py_func)
    with_nrt(lock.words, 0)
    k.mcs_release(lock.words, 0)
    assert "NRT_incref" in with_nrt.inspect_llvm(with_nrt.signatures[0])


# --------------------------------------------------------- NUMBA_DISABLE_JIT=1

DISABLED_JIT_SCRIPT = textwrap.dedent(
    """
    import threading
    from gosim import spin
    from gosim.atomic import JIT_ENABLED

    assert not JIT_ENABLED
    classes = [spin.TASLock, spin.TTASLock, spin.TicketLock, spin.MCSLock,
               spin.CLHLock, spin.RuntimeLock]
    for cls in classes:
        # The contention kernels themselves, run as Python on two threads.
        lock = cls()
        r = spin.count_under_lock(lock, threads=2, increments=150)
        assert r.counter == 300, (cls, r)
        r = spin.measure_contention(lock, threads=2, budget=300)
        assert r.total == r.counter == 300, (cls, r)
        # And the lock objects from Python threads.
        box = [0]
        def work():
            for _ in range(150):
                with lock:
                    v = box[0]
                    box[0] = v + 1
        ts = [threading.Thread(target=work) for _ in range(3)]
        for t in ts: t.start()
        for t in ts: t.join()
        assert box[0] == 450, (cls, box)
        assert not lock.locked()
    print("ok")
    """
)


def test_same_code_runs_with_numba_disabled() -> None:
    env = {**os.environ, "NUMBA_DISABLE_JIT": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, "-c", DISABLED_JIT_SCRIPT],
        check=False,
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"
