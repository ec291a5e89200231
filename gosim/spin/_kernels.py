"""The lock algorithms as ``nogil`` kernels over an int64 ``words`` array.

Every lock's whole state is one C-contiguous int64 array (``words``), laid out in lines
of :data:`LINE_WORDS` words (128 bytes) so that words written by different threads never
share a cache line. A kernel takes ``words`` and, for the queue locks, ``me``: the
caller's slot in ``[0, slots)``, which no two threads may use at once. The layouts:

=========  ===========================================================================
kind       layout (line: fields)
=========  ===========================================================================
TAS, TTAS  0: state (0 free, 1 held)
TICKET     0: next ticket to hand out; 1: ticket now served
MCS        0: tail (slot + 1 of the last waiter, 0 = none); 1 + k: slot k's node
           (``next`` = successor slot + 1, ``locked`` = 1 while it must wait)
CLH        0: tail (node id, tagged: see ``_CLH_NODE_MASK``); 1 + j for node j in
           [0, slots]: ``locked``; 2 + slots + k: slot k's record (``node`` it owns,
           ``pred`` it waits on, ``seq``: its enqueues so far)
RUNTIME    0: key (0 unlocked, 1 locked, 2 sleeping; futex word), spin rounds
=========  ===========================================================================

These functions are the implementations; ``gosim.spin`` documents each lock's
fairness and cache behaviour. :func:`spin_acquire` / :func:`spin_release` dispatch on
a ``kind`` so one kernel can run every lock.
"""

from __future__ import annotations

from typing import Any

from gosim.atomic import (
    atomic_cas,
    atomic_fetch_add,
    atomic_load_acquire,
    atomic_load_relaxed,
    atomic_store_relaxed,
    atomic_store_release,
    atomic_swap,
)
from gosim.jit import kernel

from ._cpu import cpu_relax, futexsleep, futexwakeup, osyield, procyield

# The lock kernels never allocate: no numba runtime, so no reference counting per call
# (see gosim.jit.kernel). The inlined ones make a dispatch on ``kind`` cost a compare
# in the caller rather than a call.
_kernel = kernel(refcounts=False)
_inline_kernel = kernel(inline=True, refcounts=False)


#: Words per line: 16 int64 = 128 bytes, two 64-byte lines, because x86's adjacent-line
#: prefetcher pulls lines in pairs and would otherwise re-create false sharing.
LINE_WORDS = 16

# Lock kinds, for spin_acquire/spin_release.
TAS = 0
TTAS = 1
TICKET = 2
MCS = 3
CLH = 4
RUNTIME = 5

#: Spin-wait hints a waiter executes before it starts offering its core (osyield) on
#: every further poll. Past this point waiting is long (tens of microseconds), which
#: means the holder is probably not running: yielding lets it run when threads
#: outnumber cores, and costs one syscall per poll when they do not.
SPIN_LIMIT = 4096

# Test-and-test-and-set backoff bounds, in spin-wait hints (exponential, capped). At
# about 8 ns a pause here, the cap is about 8 µs: long enough that a holder running
# short critical sections keeps the line in its cache for hundreds of them.
TTAS_BACKOFF_MIN = 4
TTAS_BACKOFF_MAX = 1024

# Go's lock_futex.go policy constants (the names are Go's).
MUTEX_UNLOCKED = 0
MUTEX_LOCKED = 1
MUTEX_SLEEPING = 2
ACTIVE_SPIN = 4
ACTIVE_SPIN_CNT = 30
PASSIVE_SPIN = 1

# Field offsets inside a line.
_MCS_NEXT = 0
_MCS_LOCKED = 1
_CLH_NODE = 0
_CLH_PRED = 1
_CLH_SEQ = 2

# A CLH tail word is (seq << 32) | (slot << 16) | node: the node at the tail, tagged
# with the enqueuing slot and that slot's count of enqueues (31 bits), so that no two
# enqueues write the same word until one slot has enqueued 2**31 times. That is what
# lets try_acquire compare-and-swap the tail safely: node ids are recycled (a releaser
# adopts its predecessor's node), so the bare node id seen in the tail can be back
# there, locked by a new owner, by the time of the CAS (ABA); the tagged word cannot.
CLH_NODE_BITS = 16
CLH_MAX_SLOTS = (1 << CLH_NODE_BITS) - 2  # node ids run to `slots`, below the mask
_CLH_NODE_MASK = (1 << CLH_NODE_BITS) - 1
_CLH_SEQ_MASK = (1 << 31) - 1
_RUNTIME_SPIN = 1


@_kernel
def spin_wait(spins: int) -> int:
    """One poll's worth of waiting: a pause while ``spins < SPIN_LIMIT``, then an
    osyield per poll. Returns ``spins + 1``; callers start from 0."""
    if spins < SPIN_LIMIT:
        cpu_relax()
    else:
        osyield()
    return spins + 1


# ------------------------------------------------------------------ test-and-set


@_kernel
def tas_acquire(words: Any) -> None:
    """Spin on an atomic exchange until it returns 0 (free)."""
    spins = 0
    while atomic_swap(words, 0, 1) != 0:
        spins = spin_wait(spins)


@_kernel
def tas_try_acquire(words: Any) -> bool:
    """Take a TAS or TTAS lock if it is free; never waits."""
    return atomic_swap(words, 0, 1) == 0


@_kernel
def tas_release(words: Any) -> None:
    """Release a TAS or TTAS lock (a release store of 0)."""
    atomic_store_release(words, 0, 0)


# ------------------------------------------- test-and-test-and-set with backoff


@_kernel
def ttas_acquire(words: Any) -> None:
    """Test with a plain load, and try the exchange only when the lock looks free;
    after every failed test or lost race, back off for an exponentially growing number
    of pauses (Anderson's backoff: TTAS_BACKOFF_MIN doubling up to TTAS_BACKOFF_MAX)."""
    backoff = TTAS_BACKOFF_MIN
    while True:
        if atomic_load_relaxed(words, 0) == 0 and atomic_swap(words, 0, 1) == 0:
            return
        procyield(backoff)
        if backoff < TTAS_BACKOFF_MAX:
            backoff *= 2


# ------------------------------------------------------------------------ ticket


@_kernel
def ticket_acquire(words: Any) -> None:
    """Take the next ticket, then wait until it is served (FIFO)."""
    ticket = atomic_fetch_add(words, 0, 1)
    spins = 0
    while atomic_load_acquire(words, LINE_WORDS) != ticket:
        spins = spin_wait(spins)


@_kernel
def ticket_try_acquire(words: Any) -> bool:
    """Take a ticket only if it would be served at once."""
    serving = atomic_load_acquire(words, LINE_WORDS)
    return atomic_cas(words, 0, serving, serving + 1)


@_kernel
def ticket_release(words: Any) -> None:
    """Serve the next ticket. Only the holder writes ``serving``, so a plain
    read-increment-release-store is enough."""
    serving = atomic_load_relaxed(words, LINE_WORDS)
    atomic_store_release(words, LINE_WORDS, serving + 1)


# --------------------------------------------------------------------------- MCS


@_kernel
def _mcs_check_slot(words: Any, me: int) -> None:
    if me < 0 or (me + 2) * LINE_WORDS > words.shape[0]:
        raise IndexError("spin: MCS slot out of range")


@_kernel
def mcs_acquire(words: Any, me: int) -> None:
    """Append slot ``me``'s node to the queue; if there was a predecessor, link to it
    and spin on our own node's ``locked`` flag until it hands the lock over."""
    _mcs_check_slot(words, me)
    node = (me + 1) * LINE_WORDS
    atomic_store_relaxed(words, node + _MCS_NEXT, 0)
    atomic_store_relaxed(words, node + _MCS_LOCKED, 1)
    # The exchange is sequentially consistent, so the two stores above are visible to
    # whoever reads our node through the tail.
    pred = atomic_swap(words, 0, me + 1)
    if pred == 0:
        return
    atomic_store_release(words, pred * LINE_WORDS + _MCS_NEXT, me + 1)
    spins = 0
    while atomic_load_acquire(words, node + _MCS_LOCKED) != 0:
        spins = spin_wait(spins)


@_kernel
def mcs_try_acquire(words: Any, me: int) -> bool:
    """Take the lock only if the queue is empty."""
    _mcs_check_slot(words, me)
    node = (me + 1) * LINE_WORDS
    atomic_store_relaxed(words, node + _MCS_NEXT, 0)
    atomic_store_relaxed(words, node + _MCS_LOCKED, 1)
    return atomic_cas(words, 0, 0, me + 1)


@_kernel
def mcs_release(words: Any, me: int) -> None:
    """Hand the lock to our successor; with none, swing the tail back to empty, or,
    if a successor is mid-enqueue, wait for its link and then hand over."""
    _mcs_check_slot(words, me)
    node = (me + 1) * LINE_WORDS
    succ = atomic_load_acquire(words, node + _MCS_NEXT)
    if succ == 0:
        if atomic_cas(words, 0, me + 1, 0):
            return
        spins = 0
        while True:
            succ = atomic_load_acquire(words, node + _MCS_NEXT)
            if succ != 0:
                break
            spins = spin_wait(spins)
    atomic_store_release(words, succ * LINE_WORDS + _MCS_LOCKED, 0)


# --------------------------------------------------------------------------- CLH


@_kernel
def clh_slots(words: Any) -> int:
    """How many slots a CLH ``words`` array has room for."""
    return int((words.shape[0] // LINE_WORDS - 2) // 2)


@_kernel
def _clh_record(words: Any, me: int) -> int:
    slots = clh_slots(words)
    if me < 0 or me >= slots:
        raise IndexError("spin: CLH slot out of range")
    return (2 + slots + me) * LINE_WORDS


@_kernel
def _clh_tagged(words: Any, record: int, me: int, node: int) -> int:
    """The tail word for slot ``me`` enqueuing ``node``: a tag no earlier enqueue used."""
    seq = (atomic_load_relaxed(words, record + _CLH_SEQ) + 1) & _CLH_SEQ_MASK
    atomic_store_relaxed(words, record + _CLH_SEQ, seq)
    return int((seq << (2 * CLH_NODE_BITS)) | (me << CLH_NODE_BITS) | node)


@_kernel
def clh_acquire(words: Any, me: int) -> None:
    """Mark our node locked, swap it into the tail, and spin on the *predecessor's*
    node until it is released; we then own the lock and, later, that node."""
    record = _clh_record(words, me)
    node = atomic_load_relaxed(words, record + _CLH_NODE)
    atomic_store_relaxed(words, (1 + node) * LINE_WORDS, 1)
    pred = atomic_swap(words, 0, _clh_tagged(words, record, me, node)) & _CLH_NODE_MASK
    atomic_store_relaxed(words, record + _CLH_PRED, pred)
    spins = 0
    while atomic_load_acquire(words, (1 + pred) * LINE_WORDS) != 0:
        spins = spin_wait(spins)


@_kernel
def clh_try_observe(words: Any) -> int:
    """First step of :func:`clh_try_acquire`: the tail word if its node is released
    (the lock is free), else -1."""
    tail = atomic_load_acquire(words, 0)
    if atomic_load_acquire(words, (1 + (tail & _CLH_NODE_MASK)) * LINE_WORDS) != 0:
        return -1
    return int(tail)


@_kernel
def clh_try_commit(words: Any, me: int, seen: int) -> bool:
    """Second step of :func:`clh_try_acquire`: swing the tail from ``seen`` (a value
    :func:`clh_try_observe` returned) to our node with one compare-and-swap. It
    succeeds only if nobody enqueued since ``seen`` was read (the tags differ), so the
    node we queue behind is still the released one we saw."""
    record = _clh_record(words, me)
    node = atomic_load_relaxed(words, record + _CLH_NODE)
    atomic_store_relaxed(words, (1 + node) * LINE_WORDS, 1)
    if atomic_cas(words, 0, seen, _clh_tagged(words, record, me, node)):
        atomic_store_relaxed(words, record + _CLH_PRED, seen & _CLH_NODE_MASK)
        return True
    atomic_store_relaxed(words, (1 + node) * LINE_WORDS, 0)
    return False


@_kernel
def clh_try_acquire(words: Any, me: int) -> bool:
    """Take the lock only if it is free: the tail node is released and nobody
    enqueues before our compare-and-swap of the (tagged) tail word."""
    _clh_record(words, me)
    seen = clh_try_observe(words)
    if seen < 0:
        return False
    return clh_try_commit(words, me, seen)


@_kernel
def clh_release(words: Any, me: int) -> None:
    """Release our node (the successor spins on it) and adopt the predecessor's node,
    which nobody references any more, for our next acquire."""
    record = _clh_record(words, me)
    node = atomic_load_relaxed(words, record + _CLH_NODE)
    pred = atomic_load_relaxed(words, record + _CLH_PRED)
    atomic_store_release(words, (1 + node) * LINE_WORDS, 0)
    atomic_store_relaxed(words, record + _CLH_NODE, pred)


@_kernel
def clh_locked(words: Any) -> bool:
    """Whether a CLH lock is held or has waiters."""
    tail = atomic_load_acquire(words, 0) & _CLH_NODE_MASK
    return atomic_load_acquire(words, (1 + tail) * LINE_WORDS) != 0


# ------------------------------------------------------- Go's runtime lock (futex)


@_kernel
def lock2(words: Any) -> None:
    """Go's ``lock2`` (lock_futex.go): a speculative exchange; then rounds of active
    spinning (``procyield``), one passive round (``osyield``), then sleep on the futex
    with the key set to ``MUTEX_SLEEPING`` so the unlocker knows to wake someone."""
    v = atomic_swap(words, 0, MUTEX_LOCKED)
    if v == MUTEX_UNLOCKED:
        return
    # wait is the value to leave in the key on success: once anyone may be sleeping
    # (MUTEX_SLEEPING), taking the lock must keep that mark so they get their wake-up.
    wait = v
    spin = atomic_load_relaxed(words, _RUNTIME_SPIN)
    while True:
        for _ in range(spin):
            while atomic_load_relaxed(words, 0) == MUTEX_UNLOCKED:
                if atomic_cas(words, 0, MUTEX_UNLOCKED, wait):
                    return
            procyield(ACTIVE_SPIN_CNT)
        for _ in range(PASSIVE_SPIN):
            while atomic_load_relaxed(words, 0) == MUTEX_UNLOCKED:
                if atomic_cas(words, 0, MUTEX_UNLOCKED, wait):
                    return
            osyield()
        v = atomic_swap(words, 0, MUTEX_SLEEPING)
        if v == MUTEX_UNLOCKED:
            return
        wait = MUTEX_SLEEPING
        futexsleep(words, 0, MUTEX_SLEEPING)


@_kernel
def lock2_try(words: Any) -> bool:
    """Take Go's runtime lock only if it is unlocked."""
    return atomic_cas(words, 0, MUTEX_UNLOCKED, MUTEX_LOCKED)


class UnlockOfUnlockedError(RuntimeError):
    """Raised by :func:`unlock2` (Go's ``throw("unlock of unlocked lock")``) when the
    runtime lock was not held: a release without a matching acquire. The lock state
    is left unlocked; the program has a locking bug to fix."""


@_kernel
def unlock2(words: Any) -> None:
    """Go's ``unlock2``: exchange the key to unlocked and wake one sleeper if the old
    key said someone may be sleeping. Raises UnlockOfUnlockedError if it was free."""
    v = atomic_swap(words, 0, MUTEX_UNLOCKED)
    if v == MUTEX_UNLOCKED:
        raise UnlockOfUnlockedError("unlock of unlocked lock")
    if v == MUTEX_SLEEPING:
        futexwakeup(words, 0, 1)


# ------------------------------------------------------------------- dispatch


@_inline_kernel
def spin_acquire(kind: int, words: Any, me: int) -> None:
    """Acquire a lock of any ``kind`` (TAS, TTAS, TICKET, MCS, CLH, RUNTIME).
    ``me`` is used by MCS and CLH only."""
    if kind == TAS:
        tas_acquire(words)
    elif kind == TTAS:
        ttas_acquire(words)
    elif kind == TICKET:
        ticket_acquire(words)
    elif kind == MCS:
        mcs_acquire(words, me)
    elif kind == CLH:
        clh_acquire(words, me)
    elif kind == RUNTIME:
        lock2(words)
    else:
        raise ValueError("spin: unknown lock kind")


@_inline_kernel
def spin_release(kind: int, words: Any, me: int) -> None:
    """Release a lock taken with :func:`spin_acquire` with the same arguments."""
    if kind in (TAS, TTAS):
        tas_release(words)
    elif kind == TICKET:
        ticket_release(words)
    elif kind == MCS:
        mcs_release(words, me)
    elif kind == CLH:
        clh_release(words, me)
    elif kind == RUNTIME:
        unlock2(words)
    else:
        raise ValueError("spin: unknown lock kind")
