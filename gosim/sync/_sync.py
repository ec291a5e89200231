"""``WaitGroup``, ``Once``, ``Cond``, ``Semaphore``, ``Pool`` and ``ErrGroup`` with Go's semantics.

Each parks goroutines through ``gosim.lowlevel`` with Go's wait reasons, so deadlock
dumps read as Go's do (``goroutine 1 [sync.WaitGroup.Wait]:``).
"""

from __future__ import annotations

import inspect
import types
from collections import deque
from collections.abc import Awaitable, Callable, Generator
from typing import Any, Generic, Protocol, TypeVar

from gosim import go, lowlevel
from gosim._core._exceptions import GosimError
from gosim._core._sched import PARK as _PARK

__all__ = ["Cond", "ErrGroup", "Locker", "Once", "Pool", "Semaphore", "SyncPanic", "WaitGroup"]

T = TypeVar("T")


class SyncPanic(GosimError):
    """A misuse Go answers with ``panic`` (e.g. ``sync: negative WaitGroup counter``)."""


class Locker(Protocol):
    def lock(self) -> Awaitable[None]: ...

    def unlock(self) -> None: ...


@types.coroutine
def _park(queue: deque[Any] | list[Any], reason: str) -> Generator[Any, Any, Any]:
    g = lowlevel.current_g()
    queue.append(g)
    g.waitreason = reason
    return (yield _PARK)


class WaitGroup:
    """Wait for a collection of goroutines: ``add``, ``done``, ``wait``; ``go(fn, *args)``.

    Go's misuse panics: ``sync: negative WaitGroup counter`` from ``add``, and
    ``sync: WaitGroup is reused before previous Wait has returned`` from a ``wait``
    that wakes to find the counter raised again (as in Go, the waiter detects it).
    Go's third, ``Add called concurrently with Wait``, needs ``add`` and ``wait`` to
    interleave inside their own bodies, which a cooperative scheduler never does.
    """

    __slots__ = ("_count", "_releasing", "_waiters")

    def __init__(self) -> None:
        self._count = 0
        self._waiters: list[Any] = []
        self._releasing = 0  # waiters readied by the last done() and not yet returned

    def add(self, delta: int) -> None:
        """Add ``delta`` to the counter; at zero, release the waiters.

        A negative result panics after it is stored, as Go's ``Add`` does, so a program
        that recovers sees the counter Go would (``add(1)`` after ``add(-1)`` is zero).
        """
        self._count = count = self._count + delta
        if count < 0:
            raise SyncPanic("sync: negative WaitGroup counter")
        if count == 0 and self._waiters:
            waiters, self._waiters = self._waiters, []
            self._releasing += len(waiters)
            for g in waiters:
                lowlevel.ready(g, None)

    def done(self) -> None:
        self.add(-1)

    async def wait(self) -> None:
        """Block until the counter is zero (wait reason ``sync.WaitGroup.Wait``)."""
        if self._count == 0:
            return
        await _park(self._waiters, "sync.WaitGroup.Wait")
        self._releasing -= 1
        if self._count != 0:
            raise SyncPanic("sync: WaitGroup is reused before previous Wait has returned")

    def go(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> None:
        """Start ``fn(*args)`` in a goroutine counted by this group (Go 1.25's ``wg.Go``)."""
        self.add(1)

        async def run() -> None:
            try:
                await fn(*args)
            finally:
                self.done()

        go(run)


class Once:
    """Run a function once: ``await once.do(fn, *args)``. A call that raised counts as done."""

    __slots__ = ("_done", "_running", "_waiters")

    def __init__(self) -> None:
        self._done = False
        self._running = False
        self._waiters: list[Any] = []

    async def do(self, fn: Callable[..., Any], *args: Any) -> None:
        if self._done:
            return
        if self._running:
            # Another goroutine is in fn: wait for it to return, as Go's Once does.
            await _park(self._waiters, "sync.Mutex.Lock")
            return
        self._running = True
        try:
            result = fn(*args)
            if inspect.isawaitable(result):
                await result
        finally:
            self._done = True  # even if fn raised (Go: a panicking f counts as done)
            self._running = False
            waiters, self._waiters = self._waiters, []
            for g in waiters:
                lowlevel.ready(g, None)


class Cond:
    """A condition variable over a Locker: ``wait`` (lock held), ``signal``, ``broadcast``."""

    __slots__ = ("_waiters", "locker")

    def __init__(self, locker: Locker) -> None:
        self.locker = locker
        self._waiters: deque[Any] = deque()

    async def wait(self) -> None:
        """Unlock, park (``sync.Cond.Wait``) until signalled, then lock again."""
        g = lowlevel.current_g()
        self._waiters.append(g)
        self.locker.unlock()
        g.waitreason = "sync.Cond.Wait"
        await lowlevel.park("sync.Cond.Wait")
        await self.locker.lock()

    def signal(self) -> None:
        """Wake the longest-waiting goroutine, if any."""
        if self._waiters:
            lowlevel.ready(self._waiters.popleft(), None)

    def broadcast(self) -> None:
        """Wake every waiting goroutine."""
        waiters, self._waiters = self._waiters, deque()
        for g in waiters:
            lowlevel.ready(g, None)


class Semaphore:
    """A weighted semaphore (golang.org/x/sync/semaphore): FIFO, no barging past waiters."""

    __slots__ = ("_cur", "_waiters", "size")

    def __init__(self, n: int) -> None:
        if n < 0:
            raise ValueError("semaphore size must be non-negative")
        self.size = n
        self._cur = 0
        self._waiters: deque[list[Any]] = deque()  # [n, g]

    async def acquire(self, n: int = 1) -> None:
        """Take ``n`` units; block (``semacquire``) in FIFO order until they are free."""
        if n > self.size:
            # Go's semaphore would block forever (or until ctx is done); say so instead.
            raise ValueError(f"acquire({n}) exceeds the semaphore's size {self.size}")
        if self.size - self._cur >= n and not self._waiters:
            self._cur += n
            return
        g = lowlevel.current_g()
        self._waiters.append([n, g])
        await lowlevel.park("semacquire")

    def try_acquire(self, n: int = 1) -> bool:
        if self.size - self._cur >= n and not self._waiters:
            self._cur += n
            return True
        return False

    def release(self, n: int = 1) -> None:
        self._cur -= n
        if self._cur < 0:
            raise SyncPanic("semaphore: released more than held")
        while self._waiters:
            need, g = self._waiters[0]
            if self.size - self._cur < need:
                break  # FIFO: a big waiter at the head blocks smaller ones behind it
            self._waiters.popleft()
            self._cur += need
            lowlevel.ready(g, None)


class Pool(Generic[T]):
    """Go's ``sync.Pool``: per-P caches (a private slot and a shared list), stealing on a miss.

    ``get`` takes this P's private object, else the head of its shared list, else the
    tail of another P's shared list, else calls ``new`` (None without one). ``put``
    fills the private slot first, then the shared list. Objects may vanish at any time
    in Go (GC); here they stay until taken, which Go's contract allows.
    """

    def __init__(self, new: Callable[[], T] | None = None) -> None:
        self.new = new
        self._local: dict[int, list[Any]] = {}  # p id -> [private, shared deque]
        self.stats = {"private": 0, "shared": 0, "stolen": 0, "new": 0}

    def _mine(self) -> list[Any]:
        pid = lowlevel.current_runtime().curp.id
        local = self._local.get(pid)
        if local is None:
            local = self._local[pid] = [None, deque()]
        return local

    def get(self) -> T | None:
        local = self._mine()
        x = local[0]
        if x is not None:
            local[0] = None
            self.stats["private"] += 1
            return x  # type: ignore[no-any-return]
        if local[1]:
            self.stats["shared"] += 1
            return local[1].popleft()  # type: ignore[no-any-return]
        for other in self._local.values():
            if other is not local and other[1]:
                self.stats["stolen"] += 1
                return other[1].pop()  # type: ignore[no-any-return]
        if self.new is None:
            return None
        self.stats["new"] += 1
        return self.new()

    def put(self, x: T) -> None:
        if x is None:
            return
        local = self._mine()
        if local[0] is None:
            local[0] = x
        else:
            local[1].appendleft(x)


class ErrGroup:
    """golang.org/x/sync/errgroup: goroutines whose first error cancels a shared context.

    ``ErrGroup.with_context(parent)`` returns ``(group, ctx)``; ``ctx`` is cancelled
    (cause: the error) when a goroutine fails or when ``wait`` returns. ``wait``
    returns the first error (None if all succeeded). ``set_limit(n)`` bounds the number
    of goroutines running at once; ``go`` blocks while the limit is reached.
    """

    def __init__(self) -> None:
        self._wg = WaitGroup()
        self._err: BaseException | None = None
        self._cancel: Callable[[BaseException | None], None] | None = None
        self._sem: Semaphore | None = None

    @classmethod
    def with_context(cls, parent: Any) -> tuple[ErrGroup, Any]:
        from gosim import context  # noqa: PLC0415 - context imports sync; break the cycle

        ctx, cancel = context.with_cancel_cause(parent)
        group = cls()
        group._cancel = cancel
        return group, ctx

    def set_limit(self, n: int) -> None:
        if self._wg._count:
            raise SyncPanic("errgroup: modify limit while goroutines in the group are still active")
        self._sem = Semaphore(n) if n >= 0 else None

    async def go(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> None:
        """Start ``fn(*args)``; blocks while the limit is reached."""
        if self._sem is not None:
            await self._sem.acquire()
        self._wg.add(1)
        sem = self._sem

        async def run() -> None:
            try:
                await fn(*args)
            except Exception as exc:
                if self._err is None:
                    self._err = exc
                    if self._cancel is not None:
                        self._cancel(exc)
            finally:
                if sem is not None:
                    sem.release()
                self._wg.done()

        go(run)

    async def wait(self) -> BaseException | None:
        await self._wg.wait()
        if self._cancel is not None:
            self._cancel(self._err)
        return self._err
