"""``Mutex`` and ``RWMutex`` with Go's semantics (``sync/mutex.go``, ``sync/rwmutex.go``).

Mutex, normal mode: waiters queue FIFO, but a woken waiter does not own the lock: it
competes with goroutines arriving meanwhile, and newcomers usually win (they are
already running). A woken waiter that loses goes back to the *front* of the queue.
Starvation mode, entered when a waiter has waited more than 1 ms (Go's
``starvationThresholdNs``): ``unlock`` hands the lock directly to the first waiter and
newcomers queue at the tail without trying. It ends when the waiter that gets the lock
is the last one, or waited less than 1 ms, judged at the handoff (before the unlocker can
queue again, as Go's unlock yields to the waiter it hands to). Time is the runtime
clock, so virtual time makes the mode switches deterministic.

Spinning: Go spins a few times before parking only when it can pay off: more than one
P, other Ps running, and an empty local run queue (``sync_runtime_canSpin``). In a
single-threaded driver another goroutine can only release the lock if this one lets it
run, so "spinning" here is up to 4 yields (``gosched``) under the same conditions
before parking; with one P, or nothing else running, it parks at once. The check is the
scheduler's (``lowlevel.can_spin``, as Go keeps ``sync_runtime_canSpin`` in ``proc.go``).
"""

from __future__ import annotations

from collections.abc import Awaitable

from gosim import _internals, lowlevel
from gosim._chan import _DONE
from gosim._core._exceptions import FatalError
from gosim._internals import GOSCHED as _GOSCHED
from gosim.lowlevel import ParkingLot, WaitReason

_MUTEX_LOCK = WaitReason.SYNC_MUTEX_LOCK
_RWMUTEX_RLOCK = WaitReason.SYNC_RWMUTEX_RLOCK
_RWMUTEX_LOCK = WaitReason.SYNC_RWMUTEX_LOCK

__all__ = ["FatalError", "Mutex", "RWMutex"]

STARVATION_THRESHOLD = 1e-3  # seconds (Go: 1e6 ns)


class Mutex:
    """A mutual exclusion lock; ``async with mu:`` or ``await mu.lock()`` / ``mu.unlock()``."""

    __slots__ = ("_locked", "_starving", "_waiters", "_woken")

    def __init__(self) -> None:
        self._locked = False
        self._starving = False
        # Parked lockers, each waiter's data the runtime-clock time it began waiting;
        # the head is served first.
        self._waiters = ParkingLot()
        self._woken = False  # a woken waiter is on its way to compete

    def __repr__(self) -> str:
        mode = "starving" if self._starving else "normal"
        return f"<gosim.sync.Mutex locked={self._locked} {mode} waiters={len(self._waiters)}>"

    @property
    def starving(self) -> bool:
        """True in starvation mode (for tests and dumps; Go has no such query)."""
        return self._starving

    def locked(self) -> bool:
        """Whether the mutex is held now (for tests and dumps: Go has no such query)."""
        return self._locked

    def lock(self) -> Awaitable[None]:
        """Acquire the lock; block (wait reason ``sync.Mutex.Lock``) while another holds it."""
        if not self._locked and not self._starving and not self._waiters:
            self._locked = True
            return _DONE
        return self._lock_slow()

    async def _lock_slow(self) -> None:
        rt = lowlevel.current_runtime()
        wait_start = 0.0
        spins = 0
        while True:
            if not self._locked and not self._starving:
                self._locked = True
                return
            if not self._starving and wait_start == 0.0 and lowlevel.can_spin(spins):
                spins += 1
                await _internals.trap(_GOSCHED)
                continue
            # A woken waiter that lost the race goes back to the front (Go: LIFO).
            front = wait_start != 0.0
            if not front:
                wait_start = rt.now()
            if await self._waiters.park(_MUTEX_LOCK, wait_start, front):
                return  # starvation mode handed the lock to us (unlock decided the mode)
            self._woken = False
            if not self._locked:
                self._locked = True  # the lock is free: the woken waiter takes it
                return
            # A newcomer took it first. Waiting too long switches to starvation mode.
            if rt.now() - wait_start > STARVATION_THRESHOLD:
                self._starving = True

    def try_lock(self) -> bool:
        """Acquire without blocking; False if held (or in starvation mode)."""
        if self._locked or self._starving:
            return False
        self._locked = True
        return True

    def unlock(self) -> None:
        """Release the lock. Unlocking an unlocked mutex is Go's fatal error."""
        if not self._locked:
            raise FatalError("fatal error: sync: unlock of unlocked mutex")
        if self._starving:
            if self._waiters:
                self._hand_off()
                return
            self._starving = False
        self._locked = False
        if self._waiters and not self._woken:
            self._woken = True
            self._waiters.unpark(False)  # wake one to compete

    def _hand_off(self) -> None:
        """Starvation mode's unlock: give the lock to the head waiter, which runs next.

        Go's unlock hands off and yields (``semrelease`` with handoff), so the waiter
        runs before the unlocker can queue again; the waiter then leaves starvation mode
        when it is the last waiter or waited under 1 ms. ``unlock`` is not a yield point
        here, so the mode is decided now, on the state the waiter would find: deciding
        after the unlocker had re-queued would see a waiter every time and never leave.
        """
        waiters = self._waiters
        head = waiters.peek()
        assert head is not None
        waited = lowlevel.current_runtime().now() - head.data
        if len(waiters) == 1 or waited < STARVATION_THRESHOLD:
            self._starving = False
        waiters.unpark(True)  # ownership handed over: stays locked

    async def __aenter__(self) -> None:
        await self.lock()

    async def __aexit__(self, *exc: object) -> None:
        self.unlock()


class RWMutex:
    """A reader/writer lock with writer preference: a waiting writer blocks new readers."""

    __slots__ = ("_readers", "_rwait", "_writer", "_wwait")

    def __init__(self) -> None:
        self._readers = 0  # readers holding the lock
        self._writer = False
        self._rwait = ParkingLot()  # readers parked
        self._wwait = ParkingLot()  # writers parked

    def rlock(self) -> Awaitable[None]:
        """Acquire for reading (wait reason ``sync.RWMutex.RLock``)."""
        if not self._writer and not self._wwait:
            self._readers += 1
            return _DONE
        return self._rwait.park(_RWMUTEX_RLOCK)  # the waker counts us in

    def try_rlock(self) -> bool:
        """Take a read lock without waiting: False while a writer holds or waits for it."""
        if self._writer or self._wwait:
            return False
        self._readers += 1
        return True

    def runlock(self) -> None:
        """Release a read lock; the last reader out lets a waiting writer in. Unlocking an
        unlocked RWMutex is a :class:`FatalError`."""
        if self._readers <= 0:
            raise FatalError("fatal error: sync: RUnlock of unlocked RWMutex")
        self._readers -= 1
        if self._readers == 0 and self._wwait:
            self._writer = True
            self._wwait.unpark()

    def lock(self) -> Awaitable[None]:
        """Acquire for writing (wait reason ``sync.RWMutex.Lock``)."""
        if not self._writer and self._readers == 0 and not self._wwait:
            self._writer = True
            return _DONE
        # Go's writer first takes the RWMutex's inner Mutex, held by any writer before
        # it: behind another writer its dump reads sync.Mutex.Lock, and
        # sync.RWMutex.Lock only while it waits for readers to leave.
        reason = _MUTEX_LOCK if self._writer or self._wwait else _RWMUTEX_LOCK
        return self._wwait.park(reason)  # the waker counts us in

    def try_lock(self) -> bool:
        """Take the write lock without waiting: False while anyone holds it."""
        if self._writer or self._readers:
            return False
        self._writer = True
        return True

    def unlock(self) -> None:
        """Release the write lock: waiting readers go first, then the next writer. Unlocking
        an unlocked RWMutex is a :class:`FatalError`."""
        if not self._writer:
            raise FatalError("fatal error: sync: Unlock of unlocked RWMutex")
        self._writer = False
        if self._rwait:
            # Readers that arrived during the write go next, all at once.
            self._readers += self._rwait.unpark_all()
        elif self._wwait:
            self._writer = True
            self._wwait.unpark()

    def rlocker(self) -> _RLocker:
        """A Locker whose lock/unlock are rlock/runlock (Go's RLocker)."""
        return _RLocker(self)


class _RLocker:
    __slots__ = ("_rw",)

    def __init__(self, rw: RWMutex) -> None:
        self._rw = rw

    def lock(self) -> Awaitable[None]:
        return self._rw.rlock()

    def unlock(self) -> None:
        self._rw.runlock()
