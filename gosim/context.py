"""Go's ``context`` package on gosim: cancellation trees, deadlines and values.

``ctx.done()`` is a :class:`gosim.Chan` closed when the context is cancelled, usable in
``select``; ``ctx.err()`` is None, :class:`Canceled` (``context canceled``) or
:class:`DeadlineExceeded` (``context deadline exceeded``). Cancelling a context cancels
its descendants, once: later cancels change nothing. Deadlines are runtime timers, so
under ``virtual_time`` they cost no real time. :func:`cause` gives the cause given to a
``with_cancel_cause`` cancel function, or to ``with_deadline_cause`` /
``with_timeout_cause`` for when the deadline passes (else the error itself). As in Go,
every constructor rejects a nil parent (``None``): ValueError, with Go's panic message
``cannot create context from nil parent``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Coroutine
from typing import Any

from gosim import Chan, _internals, go, lowlevel
from gosim._core._exceptions import GosimError
from gosim.lowlevel import RuntimeTimer

__all__ = [
    "CancelFunc",
    "Canceled",
    "Context",
    "DeadlineExceeded",
    "after_func",
    "background",
    "cause",
    "todo",
    "with_cancel",
    "with_cancel_cause",
    "with_deadline",
    "with_deadline_cause",
    "with_timeout",
    "with_timeout_cause",
    "with_value",
    "without_cancel",
]


class Canceled(GosimError):
    """``context canceled``: the context's cancel function was called."""

    def __init__(self) -> None:
        super().__init__("context canceled")


class DeadlineExceeded(GosimError, TimeoutError):
    """``context deadline exceeded``: the context's deadline passed."""

    def __init__(self) -> None:
        super().__init__("context deadline exceeded")


CancelFunc = Callable[[], None]


class Context:
    """A node of the context tree. Made by the functions of this module, not directly.

    A deadline's runtime timer is armed only once something could wait for it: the
    first ``done()``, an ``after_func``, a child context. Until then ``err()`` reads the
    clock instead. A request's deadline context that nobody waits on (the common case
    on a server: the deadline is checked, or never looked at) thus costs no timer.
    """

    # Slots, and the children set and after-functions list made on first use: a
    # request's deadline context is made and dropped per call on a server's hot path.
    __slots__ = (
        "_after",
        "_attached_to",
        "_cancellable",
        "_cause",
        "_children",
        "_deadline",
        "_done",
        "_due",
        "_due_cause",
        "_err",
        "_parent",
        "_timer",
    )

    def __init__(self, parent: Context | None) -> None:
        self._parent = parent
        self._done: Chan[None] | None = None
        self._err: BaseException | None = None
        self._cause: BaseException | None = None
        self._children: set[Context] | None = None
        self._deadline: float = math.inf if parent is None else parent._deadline
        self._timer: RuntimeTimer | None = None
        # This context's own deadline while its timer is not armed yet (else infinity),
        # and the cause to give when it passes.
        self._due = math.inf
        self._due_cause: BaseException | None = None
        self._after: list[Callable[[], None]] | None = None
        self._cancellable = parent is not None
        self._attached_to: Context | None = None  # the cancellable ancestor holding us

    def deadline_or_inf(self) -> float:
        """The deadline on the runtime clock, or infinity: ``deadline()`` without the flag."""
        return self._deadline

    def deadline(self) -> tuple[float, bool]:
        """``(deadline, ok)`` as Go's ``Deadline()``; ok is False when there is none."""
        return (self._deadline, True) if self._deadline != math.inf else (0.0, False)

    def done(self) -> Chan[None] | None:
        """A channel closed on cancellation; None for contexts that are never cancelled."""
        if not self._cancellable:
            return None
        if self._done is None:
            if self._due != math.inf:
                self._arm()  # first: a deadline already past cancels before the channel
            self._done = Chan()
            if self._err is not None:
                self._done.close()
        return self._done

    def err(self) -> BaseException | None:
        """None while the context is live; then why it ended: :class:`Canceled` or
        :class:`DeadlineExceeded` (Go's ``ctx.Err()``)."""
        if self._due != math.inf and self._err is None:
            rt = _internals.state.rt  # None outside the runtime: the clock stopped with it
            if rt is not None and rt.now() >= self._due:
                self._cancel(DeadlineExceeded(), self._due_cause)
        return self._err

    def _arm(self) -> None:
        """Arm the deadline's timer (something may now wait for the cancellation), or
        cancel at once if the deadline has passed."""
        d = self._due
        if d == math.inf or self._err is not None:
            return
        self._due = math.inf
        cause_ = self._due_cause
        if d <= lowlevel.current_runtime().now():
            self._cancel(DeadlineExceeded(), cause_)
            return
        if cause_ is None:
            self._timer = RuntimeTimer(_fire_deadline_uncaused, self)
        else:
            self._timer = RuntimeTimer(_fire_deadline, (self, cause_))
        lowlevel.add_timer(self._timer, d)

    def value(self, key: Any) -> Any:
        """The value stored under ``key`` by this context or its nearest ancestor that has
        one (``with_value``), else None."""
        return self._parent.value(key) if self._parent is not None else None

    def _attach(self) -> None:
        parent = self._parent
        while parent is not None and not parent._cancellable:
            parent = parent._parent
        if parent is None:
            return
        # The child's cancellation hangs on the parent's: the parent's deadline must fire.
        parent._arm()
        if parent.err() is not None:
            assert parent._err is not None
            self._cancel(parent._err, parent._cause)
        else:
            if parent._children is None:
                parent._children = set()
            parent._children.add(self)
            self._attached_to = parent

    def _cancel(self, err: BaseException, cause_: BaseException | None) -> None:
        if self._err is not None:
            return  # cancellation is idempotent: the first one wins
        if self._due != math.inf and type(err) is not DeadlineExceeded:
            rt = _internals.state.rt
            if rt is not None and rt.now() >= self._due:
                # The deadline passed before this cancel: an armed timer would have won.
                err, cause_ = DeadlineExceeded(), self._due_cause
        self._err = err
        self._cause = cause_ if cause_ is not None else err
        self._due = math.inf
        if self._done is not None:
            self._done.close()
        if self._timer is not None:
            lowlevel.del_timer(self._timer)
        if self._children is not None:
            children, self._children = self._children, None
            for child in children:
                child._cancel(err, self._cause)
        if self._attached_to is not None:
            if self._attached_to._children is not None:
                self._attached_to._children.discard(self)
            self._attached_to = None
        if self._after is not None:
            after, self._after = self._after, None
            for fn in after:
                fn()

    def __repr__(self) -> str:
        return f"<gosim.context.Context err={self._err!r}>"


class _ValueContext(Context):
    __slots__ = ("_key", "_val")

    def __init__(self, parent: Context, key: Any, val: Any) -> None:
        super().__init__(parent)
        self._cancellable = False
        self._key = key
        self._val = val

    def done(self) -> Chan[None] | None:
        return self._parent.done() if self._parent is not None else None

    def err(self) -> BaseException | None:
        return self._parent.err() if self._parent is not None else None

    def value(self, key: Any) -> Any:
        if key == self._key:
            return self._val
        return super().value(key)


class _WithoutCancel(Context):
    __slots__ = ("_values_from",)

    def __init__(self, parent: Context) -> None:
        super().__init__(None)
        self._values_from = parent
        self._cancellable = False

    def value(self, key: Any) -> Any:
        return self._values_from.value(key)


_BACKGROUND = Context(None)
_TODO = Context(None)


def background() -> Context:
    """The root context: never cancelled, no deadline, no values."""
    return _BACKGROUND


def todo() -> Context:
    """A placeholder root, for code that has not been given a context yet."""
    return _TODO


def _need_parent(parent: Context | None) -> Context:
    """Go's constructors panic on a nil parent; a context made from none would report
    ``err()`` while its ``done()`` never closes."""
    if parent is None:
        raise ValueError("cannot create context from nil parent")
    return parent


def with_cancel(parent: Context) -> tuple[Context, CancelFunc]:
    """A child of ``parent`` and the function that cancels it (with :class:`Canceled`);
    it is cancelled too when ``parent`` is. Call the function when done with it."""
    ctx = Context(_need_parent(parent))
    ctx._attach()
    return ctx, lambda: ctx._cancel(Canceled(), None)


def with_cancel_cause(parent: Context) -> tuple[Context, Callable[[BaseException | None], None]]:
    """As :func:`with_cancel`, but the cancel function takes a cause (``cause(ctx)``
    returns it; None means :class:`Canceled`)."""
    ctx = Context(_need_parent(parent))
    ctx._attach()
    return ctx, lambda c=None: ctx._cancel(Canceled(), c)


def _fire_deadline(arg: tuple[Context, BaseException | None], now: float) -> None:
    ctx, cause_ = arg
    ctx._cancel(DeadlineExceeded(), cause_)


def _fire_deadline_uncaused(ctx: Context, now: float) -> None:
    ctx._cancel(DeadlineExceeded(), None)


def _deadline_context(
    parent: Context, d: float, now: float, cause_: BaseException | None
) -> tuple[Context, CancelFunc]:
    """with_deadline_cause's body, given the runtime clock's ``now``."""
    ctx = Context(parent)
    inherited = ctx._deadline
    if d < inherited:
        ctx._deadline = d
    if parent._cancellable or parent._parent is not None:
        ctx._attach()  # not for a root (background, todo): nothing to attach to
    if ctx._err is None:
        if d <= now:
            ctx._cancel(DeadlineExceeded(), cause_)
        elif d < inherited:
            ctx._due = d  # the timer waits for a waiter (Context._arm)
            ctx._due_cause = cause_
    return ctx, lambda: ctx._cancel(Canceled(), None)


def with_deadline(parent: Context, d: float) -> tuple[Context, CancelFunc]:
    """Cancelled at runtime-clock time ``d`` (or with the parent, or by the cancel function)."""
    return _deadline_context(_need_parent(parent), d, lowlevel.current_runtime().now(), None)


def with_deadline_cause(
    parent: Context, d: float, cause_: BaseException | None
) -> tuple[Context, CancelFunc]:
    """As :func:`with_deadline`; when the deadline passes, :func:`cause` gives ``cause_``
    (``err()`` is still :class:`DeadlineExceeded`). The cancel function sets no cause."""
    return _deadline_context(_need_parent(parent), d, lowlevel.current_runtime().now(), cause_)


def with_timeout(parent: Context, timeout: float) -> tuple[Context, CancelFunc]:
    """Cancelled ``timeout`` seconds from now (``with_deadline(parent, now() + timeout)``)."""
    now = lowlevel.current_runtime().now()
    return _deadline_context(_need_parent(parent), now + timeout, now, None)


def with_timeout_cause(
    parent: Context, timeout: float, cause_: BaseException | None
) -> tuple[Context, CancelFunc]:
    """As :func:`with_timeout`, with :func:`with_deadline_cause`'s cause."""
    now = lowlevel.current_runtime().now()
    return _deadline_context(_need_parent(parent), now + timeout, now, cause_)


def with_value(parent: Context, key: Any, val: Any) -> Context:
    """A child of ``parent`` that answers ``val`` for ``key`` (``ctx.value(key)``);
    ``key`` may not be None."""
    _need_parent(parent)
    if key is None:
        raise ValueError("nil key")
    return _ValueContext(parent, key, val)


def without_cancel(parent: Context) -> Context:
    """A context with the parent's values that is never cancelled by it."""
    return _WithoutCancel(_need_parent(parent))


def cause(ctx: Context) -> BaseException | None:
    """Why ``ctx`` was cancelled: the cause given to its cancel, else ``ctx.err()``."""
    node: Context | None = ctx
    while node is not None and not node._cancellable and isinstance(node, _ValueContext):
        node = node._parent
    if node is None:
        return None
    node.err()  # a deadline that passed with no timer armed is noticed here
    return node._cause


class _AfterFunc:
    """One :func:`after_func` registration: called (on the cancelling side) when its
    context is done, it starts ``fn`` in a goroutine unless stopped first."""

    __slots__ = ("fn", "node", "pending")

    def __init__(self, fn: Callable[[], Coroutine[Any, Any, Any]], node: Context | None) -> None:
        self.fn = fn
        self.node = node
        self.pending = True

    def __call__(self) -> None:
        if self.pending:
            self.pending = False
            go(self.fn)

    def stop(self) -> bool:
        was = self.pending
        self.pending = False
        node = self.node
        if was and node is not None and node._err is None and node._after is not None:
            node._after.remove(self)  # a stopped call holds nothing on a long-lived ctx
        return was


def after_func(ctx: Context, fn: Callable[[], Coroutine[Any, Any, Any]]) -> Callable[[], bool]:
    """Run ``fn`` in a goroutine once ``ctx`` is done; the returned stop() prevents that.

    ``stop()`` returns True when it stopped ``fn`` from being started (the first call,
    before ``ctx`` is done; also for a context that is never done), False after ``fn``
    started or a previous stop, as Go's ``AfterFunc``.
    """
    node: Context | None = ctx
    while node is not None and not node._cancellable:
        node = node._parent
    registration = _AfterFunc(fn, node)
    if node is not None:
        node._arm()  # fn waits for the cancellation: the deadline's timer must fire
        if node._err is not None:
            registration()
        else:
            if node._after is None:
                node._after = []
            node._after.append(registration)
    return registration.stop
