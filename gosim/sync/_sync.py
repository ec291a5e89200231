"""``WaitGroup``, ``Once``, ``Cond``, ``Semaphore``, ``Pool`` and ``ErrGroup`` with Go's semantics.

Each parks goroutines through ``gosim.lowlevel`` with Go's wait reasons, so deadlock
dumps read as Go's do (``goroutine 1 [sync.WaitGroup.Wait]:``).
"""

from __future__ import annotations

import inspect
from collections import deque
from collections.abc import Awaitable, Callable, Generator
from typing import Any, Generic, Protocol, TypeVar

from gosim import Chan, context, go, lowlevel, recv, select
from gosim._core._exceptions import GosimError
from gosim.lowlevel import ParkingLot, Waiter, WaitReason

__all__ = [
    "Cond",
    "ErrGroup",
    "Locker",
    "Once",
    "Pool",
    "Semaphore",
    "SyncPanic",
    "WaitGroup",
    "once_func",
    "once_value",
]

T = TypeVar("T")

_WAITGROUP_WAIT = WaitReason.SYNC_WAITGROUP_WAIT
_MUTEX_LOCK = WaitReason.SYNC_MUTEX_LOCK  # Go's Once waits on its Mutex
_COND_WAIT = WaitReason.SYNC_COND_WAIT
_SEMACQUIRE = WaitReason.SEMACQUIRE


class SyncPanic(GosimError):
    """A misuse Go answers with ``panic`` (e.g. ``sync: negative WaitGroup counter``)."""


class Locker(Protocol):
    def lock(self) -> Awaitable[None]:
        """Acquire the lock; await at once."""

    def unlock(self) -> None:
        """Release the lock."""


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
        self._waiters = ParkingLot()
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
            self._releasing += self._waiters.unpark_all()

    def done(self) -> None:
        """Count one goroutine as finished: ``add(-1)``."""
        self.add(-1)

    async def wait(self) -> None:
        """Block until the counter is zero (wait reason ``sync.WaitGroup.Wait``)."""
        if self._count == 0:
            return
        await self._waiters.park(_WAITGROUP_WAIT)
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
        self._waiters = ParkingLot()

    async def do(self, fn: Callable[..., Any], *args: Any) -> None:
        """Call ``fn(*args)`` (awaiting it if it returns an awaitable) if and only if this is
        the first ``do`` on this Once; a concurrent caller waits until it has returned.
        A ``fn`` that raised counts as done, as in Go."""
        if self._done:
            return
        if self._running:
            # Another goroutine is in fn: wait for it to return, as Go's Once does.
            await self._waiters.park(_MUTEX_LOCK)
            return
        self._running = True
        try:
            result = fn(*args)
            if inspect.isawaitable(result):
                await result
        finally:
            self._done = True  # even if fn raised (Go: a panicking f counts as done)
            self._running = False
            self._waiters.unpark_all()


def once_value(fn: Callable[[], Awaitable[T] | T]) -> Callable[[], Awaitable[T]]:
    """Go's ``sync.OnceValue``: a function that calls ``fn`` once and returns its value.

    Every call returns the first call's result; callers that arrive while ``fn`` runs
    wait for it. If ``fn`` raised, every call raises that same exception, as Go's
    re-panics with the same value. ``fn`` may be sync or async; the result is awaited.
    """
    once = Once()
    outcome: list[Any] = []  # [value] or [None, exception], once fn has finished

    async def compute() -> None:
        try:
            result = fn()
            if inspect.isawaitable(result):
                result = await result
            outcome.append(result)
        except Exception as exc:
            outcome.extend((None, exc))

    async def get() -> T:
        await once.do(compute)
        if len(outcome) == 2:
            raise outcome[1]
        return outcome[0]  # type: ignore[no-any-return]

    return get


def once_func(fn: Callable[[], Awaitable[Any] | Any]) -> Callable[[], Awaitable[None]]:
    """Go's ``sync.OnceFunc``: a function that calls ``fn`` once; see :func:`once_value`."""
    get = once_value(fn)

    async def call() -> None:
        await get()

    return call


class Cond:
    """A condition variable over a Locker: ``wait`` (lock held), ``signal``, ``broadcast``."""

    __slots__ = ("_waiters", "locker")

    def __init__(self, locker: Locker) -> None:
        self.locker = locker
        self._waiters = ParkingLot()

    async def wait(self) -> None:
        """Unlock, park (``sync.Cond.Wait``) until signalled, then lock again."""
        # Unlocking first is safe: unlock readies but never yields, so no signal can
        # come between it and the park.
        self.locker.unlock()
        await self._waiters.park(_COND_WAIT)
        await self.locker.lock()

    def signal(self) -> None:
        """Wake the longest-waiting goroutine, if any."""
        self._waiters.unpark()

    def broadcast(self) -> None:
        """Wake every waiting goroutine."""
        self._waiters.unpark_all()


class Semaphore:
    """A weighted semaphore (golang.org/x/sync/semaphore): FIFO, no barging past waiters."""

    __slots__ = ("_cur", "_waiters", "size")

    def __init__(self, n: int) -> None:
        if n < 0:
            raise ValueError("semaphore size must be non-negative")
        self.size = n
        self._cur = 0
        # Each waiter's data is the units it wants. A plain one has its goroutine
        # parked on it; one with a context has a callback that closes the channel it
        # selects on against the context's.
        self._waiters = ParkingLot()

    async def acquire(self, n: int = 1, ctx: Any = None) -> None:
        """Take ``n`` units; block (``semacquire``) in FIFO order until they are free.

        With a context ``ctx`` (``gosim.context``), give up when it is done and raise its
        ``err()``, as x/sync's ``Acquire(ctx, n)`` returns it: also when it was done
        before the call, even if the units were free; units granted to a waiter whose
        context finished first are given back. Without one, asking for more than the
        size raises ValueError (Go would block forever).
        """
        done = ctx.done() if ctx is not None else None
        if done is not None and done.closed:
            raise ctx.err()
        if self.size - self._cur >= n and not self._waiters:
            self._cur += n
            return
        if done is None:
            if n > self.size:
                raise ValueError(f"acquire({n}) exceeds the semaphore's size {self.size}")
            await self._waiters.park(_SEMACQUIRE, n)
            return
        await self._acquire_or_done(n, ctx, done)

    async def _acquire_or_done(self, n: int, ctx: Any, done: Any) -> None:
        if n > self.size:  # doomed: do not make others wait behind it
            await done.recv()
            raise ctx.err()
        ready: Chan[None] = Chan()
        w = Waiter(n)
        w.on_settle(_close_ready, ready)
        self._waiters.add(w)
        i, _, _ = await select(recv(ready), recv(done))
        if i == 0:
            if done.closed:  # granted, but the context finished too: it wins
                self.release(n)
                raise ctx.err()
            return
        front = self._waiters.peek() is w
        if not w.cancel():  # granted after the context finished: give the units back
            self.release(n)
        elif front and self.size > self._cur:
            self._notify()
        raise ctx.err()

    def try_acquire(self, n: int = 1) -> bool:
        """Take ``n`` units without waiting: True if they were free and nobody queued."""
        if self.size - self._cur >= n and not self._waiters:
            self._cur += n
            return True
        return False

    def release(self, n: int = 1) -> None:
        """Give back ``n`` units and wake queued waiters in order while the first one's
        request fits (a large request at the head holds back smaller ones behind it);
        :class:`SyncPanic` when more are released than held."""
        self._cur -= n
        if self._cur < 0:
            raise SyncPanic("semaphore: released more than held")
        self._notify()

    def _notify(self) -> None:
        waiters = self._waiters
        while True:
            head = waiters.peek()
            if head is None or self.size - self._cur < head.data:
                break  # FIFO: a big waiter at the head blocks smaller ones behind it
            self._cur += head.data
            waiters.unpark()


def _close_ready(ready: Chan[None], w: Waiter) -> None:
    """A context-bound acquire's waiter was settled: granted (or withdrawn, when
    nobody selects on the channel any more): wake its select."""
    ready.close()


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
        """An object from the pool (this P's first, then one taken from another P), or
        ``new()``'s when it is empty, or None without ``new``."""
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
        """Offer ``x`` for reuse (None is ignored); the pool may drop it at any time."""
        if x is None:
            return
        local = self._mine()
        if local[0] is None:
            local[0] = x
        else:
            local[1].appendleft(x)


class _GoCall:
    """What :meth:`ErrGroup.go` returns: awaiting it starts the goroutine."""

    __slots__ = ("_args", "_fn", "_group")

    def __init__(
        self, group: ErrGroup, fn: Callable[..., Awaitable[Any]], args: tuple[Any, ...]
    ) -> None:
        self._group: ErrGroup | None = group
        self._fn = fn
        self._args = args

    def __await__(self) -> Generator[Any, Any, None]:
        group = self._group
        if group is None:
            raise RuntimeError("ErrGroup.go(...) awaited twice: it starts one goroutine")
        self._group = None
        group._unawaited -= 1
        return group._go(self._fn, self._args).__await__()


class ErrGroup:
    """golang.org/x/sync/errgroup: goroutines whose first error cancels a shared context.

    ``ErrGroup.with_context(parent)`` returns ``(group, ctx)``; ``ctx`` is cancelled
    (cause: the error) when a goroutine fails or when ``wait`` returns. ``wait``
    returns the first error (None if all succeeded). ``set_limit(n)`` bounds the number
    of goroutines running at once; ``await go(fn)`` blocks while the limit is reached
    and ``try_go(fn)`` returns False instead.

    ``go`` must be awaited (it may block, unlike ``WaitGroup.go``); a call that was
    never awaited starts nothing, and ``wait`` raises SyncPanic saying so rather than
    return as if its goroutine had run.
    """

    def __init__(self) -> None:
        self._wg = WaitGroup()
        self._err: BaseException | None = None
        self._cancel: Callable[[BaseException | None], None] | None = None
        self._sem: Semaphore | None = None
        self._unawaited = 0  # go() calls whose result was not awaited (yet)

    @classmethod
    def with_context(cls, parent: Any) -> tuple[ErrGroup, Any]:
        """A group and a context derived from ``parent`` that is cancelled (with the error
        as its cause) when a goroutine of the group first fails or when ``wait`` returns."""
        ctx, cancel = context.with_cancel_cause(parent)
        group = cls()
        group._cancel = cancel
        return group, ctx

    def set_limit(self, n: int) -> None:
        """Allow at most ``n`` goroutines at once; a negative ``n`` removes the limit.

        As in x/sync, changing a limit while goroutines counted by it are active panics
        (SyncPanic); removing it, or setting one when none was set, is always allowed.
        """
        if n < 0:
            self._sem = None
            return
        active = self._sem._cur if self._sem is not None else 0
        if active:
            raise SyncPanic(
                f"errgroup: modify limit while {active} goroutines in the group are still active"
            )
        self._sem = Semaphore(n)

    def go(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> Awaitable[None]:
        """Start ``fn(*args)`` in a goroutine when awaited; blocks while the limit is reached."""
        self._unawaited += 1
        return _GoCall(self, fn, args)

    def try_go(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> bool:
        """Start ``fn(*args)`` only if the limit allows it now; True if it started."""
        if self._sem is not None and not self._sem.try_acquire():
            return False
        self._start(fn, args)
        return True

    async def _go(self, fn: Callable[..., Awaitable[Any]], args: tuple[Any, ...]) -> None:
        if self._sem is not None:
            await self._sem.acquire()
        self._start(fn, args)

    def _start(self, fn: Callable[..., Awaitable[Any]], args: tuple[Any, ...]) -> None:
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
        """Wait for every goroutine; return the first error (None if all succeeded)."""
        if self._unawaited:
            raise SyncPanic(
                f"errgroup: {self._unawaited} go() calls were not awaited, so their "
                "goroutines never started (write `await group.go(fn)`)"
            )
        await self._wg.wait()
        if self._cancel is not None:
            self._cancel(self._err)
        return self._err
