"""Spinlocks that really spin on CPU cores, for OS threads and numba ``nogil`` kernels.

Glossary
--------
words
    A lock's entire state: an aligned int64 numpy array (``lock.words``), in 128-byte
    lines so that words written by different threads never share a cache line. Python
    threads call ``lock.acquire()``; a kernel calls ``tas_acquire(lock.words)`` (or
    ``spin_acquire(lock.kind, lock.words, me)``) on the same array.
slot (``me``)
    The queue locks (MCS, CLH) give every waiting thread a node of its own. Python
    threads get one automatically; a kernel thread takes one with
    ``with lock.reserved_slot() as me:``.
pause, procyield, osyield, futex
    The CPU's spin-wait hint (x86 ``pause``; arm64 ``yield``), Go's ``procyield(n)``
    (n pauses), ``sched_yield``, and futex sleep/wake: see ``_cpu``.

The locks: fairness and cache behaviour
---------------------------------------
===========  ===========  ===================================================  ==========
lock         fairness     cache traffic per hand-over                          polls
===========  ===========  ===================================================  ==========
TASLock      none         every poll is an exchange: the line bounces among    the word
                          all waiters, even while the lock is held
TTASLock     none per     polls are loads of a shared copy; every failed       the word
             acquisition  test backs off exponentially (4..1024 pauses), so
                          the holder keeps the line for bursts of acquisitions
TicketLock   FIFO         one ``serving`` line invalidated in every waiter     shared
MCSLock      FIFO         O(1): each waiter polls a flag in its own node       own node
CLHLock      FIFO         O(1): each waiter polls its predecessor's node       pred node
RuntimeLock  none         TTAS-like while spinning; then sleeps in the kernel  the word
===========  ===========  ===================================================  ==========

Measured (benchmarks/bench_spin.py; 2 cores, 2 kernel threads sharing a counter): TTAS
about 120 M acquisitions/s, over 20x two Python threads on ``threading.Lock`` (5 M/s),
because ownership passes in bursts and the counter's line stays put; Go's RuntimeLock
about 40 M/s (its sleeper leaves the lock alone); TAS 15 M/s; the FIFO locks 4-6 M/s
with Jain fairness 1.00, because strict alternation moves the lock's and the counter's
lines between the cores at every acquisition. FIFO is paid for in cache misses.

How a waiter waits, fast to slow
--------------------------------
1. The uncontended acquire is one atomic instruction (exchange, fetch-add or swap of the
   tail) and the release one store (or exchange): a few nanoseconds in a kernel.
2. A waiter polls with acquire or relaxed loads and a ``pause`` between polls; the pause
   stops the core from flooding the memory system with speculative loads, frees the
   sibling hyperthread, and avoids the pipeline flush when the line finally changes.
3. After ``SPIN_LIMIT`` polls (tens of microseconds) the wait is long enough that the
   holder is probably descheduled, so every further poll also ``osyield``s: this keeps
   the FIFO locks usable when threads outnumber cores, where pure spinning makes the
   next-in-line and the holder fight for a core for whole time slices.
4. Only :class:`RuntimeLock` sleeps: Go's runtime policy from ``lock_futex.go``
   (``lock2``/``unlock2``): 4 rounds of ``procyield(30)``, one ``osyield`` round, then
   futex sleep with the key marked ``MUTEX_SLEEPING`` so ``unlock2`` knows to wake one.

What a spinlock is for, and what it is not
------------------------------------------
Spinning wins when critical sections are shorter than a context switch and every
thread has its own core, which is the case inside ``nogil`` kernels on a machine's
cores. From Python threads it loses: the critical section needs the GIL, so every
hand-over between threads is also a GIL hand-over through the OS (tens of µs). The
FIFO locks force one per acquisition (measured 40 k/s, against 5 M/s for
``threading.Lock``, which lets one thread run a whole GIL interval); TTAS and
RuntimeLock, whose hand-overs are rare, reach about 0.7 M/s. The Python methods exist
so that Python threads and kernels can share one lock, not as a faster
``threading.Lock``. Goroutines must not spin on these (they would stop their P); use
``gosim.sync``.

Compiled without numba's reference counting (the private ``_nrt=False`` option): with
it, every call that passes ``words`` increments and decrements the array's reference
count, two atomic operations on one line that all threads share, which measured 10x
slower than the lock itself.

Alternatives rejected: a futex-only lock (that is ``threading.Lock`` already); Anderson's
array lock (FIFO and local spinning like MCS but O(threads) memory per lock and a fixed
thread count, with nothing MCS/CLH do not already show); numba's ``prange`` for the
threads (its thread pool cannot be paired with Python threads on one lock).

Mirrors Go's ``runtime/lock_futex.go`` (``lock2``, ``unlock2``), ``runtime/proc.go``
(``procyield``, ``osyield``, the ``active_spin`` constants) and ``runtime/os_linux.go``
(``futexsleep``, ``futexwakeup``).
"""

from ._contention import ContentionResult as ContentionResult
from ._contention import count_under_lock as count_under_lock
from ._contention import jain_index as jain_index
from ._contention import measure_contention as measure_contention
from ._cpu import HAVE_FUTEX as HAVE_FUTEX
from ._cpu import PAUSE_INSTRUCTION as PAUSE_INSTRUCTION
from ._cpu import cpu_relax as cpu_relax
from ._cpu import futexsleep as futexsleep
from ._cpu import futexwakeup as futexwakeup
from ._cpu import osyield as osyield
from ._cpu import procyield as procyield
from ._kernels import CLH as CLH
from ._kernels import LINE_WORDS as LINE_WORDS
from ._kernels import MCS as MCS
from ._kernels import RUNTIME as RUNTIME
from ._kernels import SPIN_LIMIT as SPIN_LIMIT
from ._kernels import TAS as TAS
from ._kernels import TICKET as TICKET
from ._kernels import TTAS as TTAS
from ._kernels import UnlockOfUnlockedError as UnlockOfUnlockedError
from ._kernels import clh_acquire as clh_acquire
from ._kernels import clh_release as clh_release
from ._kernels import clh_try_acquire as clh_try_acquire
from ._kernels import lock2 as lock2
from ._kernels import lock2_try as lock2_try
from ._kernels import mcs_acquire as mcs_acquire
from ._kernels import mcs_release as mcs_release
from ._kernels import mcs_try_acquire as mcs_try_acquire
from ._kernels import spin_acquire as spin_acquire
from ._kernels import spin_release as spin_release
from ._kernels import tas_acquire as tas_acquire
from ._kernels import tas_release as tas_release
from ._kernels import tas_try_acquire as tas_try_acquire
from ._kernels import ticket_acquire as ticket_acquire
from ._kernels import ticket_release as ticket_release
from ._kernels import ticket_try_acquire as ticket_try_acquire
from ._kernels import ttas_acquire as ttas_acquire
from ._kernels import unlock2 as unlock2
from ._locks import CLHLock as CLHLock
from ._locks import MCSLock as MCSLock
from ._locks import QueueSpinLock as QueueSpinLock
from ._locks import RuntimeLock as RuntimeLock
from ._locks import SpinLock as SpinLock
from ._locks import TASLock as TASLock
from ._locks import TicketLock as TicketLock
from ._locks import TTASLock as TTASLock
from ._locks import new_words as new_words

__all__ = [
    "CLH",
    "HAVE_FUTEX",
    "LINE_WORDS",
    "MCS",
    "PAUSE_INSTRUCTION",
    "RUNTIME",
    "SPIN_LIMIT",
    "TAS",
    "TICKET",
    "TTAS",
    "CLHLock",
    "ContentionResult",
    "MCSLock",
    "QueueSpinLock",
    "RuntimeLock",
    "SpinLock",
    "TASLock",
    "TTASLock",
    "TicketLock",
    "UnlockOfUnlockedError",
    "clh_acquire",
    "clh_release",
    "clh_try_acquire",
    "count_under_lock",
    "cpu_relax",
    "futexsleep",
    "futexwakeup",
    "jain_index",
    "lock2",
    "lock2_try",
    "mcs_acquire",
    "mcs_release",
    "mcs_try_acquire",
    "measure_contention",
    "new_words",
    "osyield",
    "procyield",
    "spin_acquire",
    "spin_release",
    "tas_acquire",
    "tas_release",
    "tas_try_acquire",
    "ticket_acquire",
    "ticket_release",
    "ticket_try_acquire",
    "ttas_acquire",
    "unlock2",
]
