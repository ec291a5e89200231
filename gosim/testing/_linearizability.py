"""A linearizability checker for histories of concurrent operations.

A *history* is a list of :class:`Operation`: what a client asked (``input``), what it
got back (``output``), when it asked (``call``) and when the answer arrived (``ret``).
A *model* (:class:`Model`) is the object's sequential specification: an initial state
and a step function. The history is *linearizable* when each operation can be given a
single instant between its call and its return such that, taken in that order, the
operations are a legal sequential run of the model that gives every operation the
output it observed. An operation without a return (its caller crashed or gave up) may
take effect at any instant after its call, or not at all.

The algorithm (:func:`check_linearizability`) is Wing and Gong's search as refined by
Lowe and used by Porcupine:

* **P-compositionality.** When the model has a ``partition`` function (a key-value
  store partitioned by key), each part is checked alone: a history is linearizable
  exactly when every part is, so the search never sees the product of the parts.
* **Depth-first search over the linearization order.** The call and return events of a
  part are sorted by time into a doubly linked list. The search walks it from the front:
  at a call it tries to linearize that operation next (the model accepts its output),
  lifting the call and its return out of the list; at a return it has reached an
  operation that should already be linearized, and backtracks.
* **Memoised states.** A pair (set of linearized operations, model state) is explored
  once: the set is a bitset held in a Python ``int`` and the state must be hashable
  (or mapped to a hashable key by ``Model.key``).

When a history is not linearizable, :func:`check_linearizability` shrinks the failing
part to a counterexample (see :class:`LinearizabilityResult` for what it guarantees):
first the shortest failing prefix (binary search; operations still in flight at the cut
become pending, which keeps the prefix failing), then operations are dropped one
chunk, then one at a time, while the rest stays non-linearizable.

The search follows pointers and calls the model's Python functions at every step: there
is no array-shaped work for a compiled kernel, so the checker is pure Python.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Generic, TypeVar, cast

__all__ = [
    "UNKNOWN",
    "HistoryError",
    "HistoryRecorder",
    "LinearizabilityResult",
    "Model",
    "Operation",
    "Unknown",
    "check_linearizability",
]

S = TypeVar("S")
I = TypeVar("I")  # noqa: E741 -- Input, as Porcupine names it
O = TypeVar("O")  # noqa: E741 -- Output


class Unknown:
    """The type of :data:`UNKNOWN`, the output a step function is given for an operation
    that never returned."""

    __slots__ = ()
    _instance: Unknown | None = None

    def __new__(cls) -> Unknown:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "UNKNOWN"

    def __reduce__(self) -> str:
        return "UNKNOWN"


#: The output a :class:`Model`'s ``step`` receives for a pending operation (one with no
#: return): the step must then accept any output the operation could have had.
UNKNOWN: Final = Unknown()


class HistoryError(ValueError):
    """A history or a model that cannot be checked: the message names the operation and
    what is wrong with it (a return before its call, a time that is not a number...)."""


@dataclass(frozen=True, slots=True)
class Operation(Generic[I, O]):
    """One operation of a history.

    ``call`` and ``ret`` are times on one clock (any real numbers: seconds, a logical
    counter); ``ret`` is ``None`` for a *pending* operation, whose caller never saw an
    answer: it may have taken effect at any time after ``call``, or not at all, and its
    ``output`` must be ``None``. Two operations are ordered when one returned strictly
    before the other was called; otherwise they overlapped (equal times overlap).
    ``client`` only labels the operation in a printed counterexample.
    """

    input: I
    call: float
    output: O | None = None
    ret: float | None = None
    client: Hashable = None

    @property
    def pending(self) -> bool:
        """True when the operation has no return."""
        return self.ret is None

    def describe(self, model: Model[Any, I, O] | None = None) -> str:
        """One line: the interval, the client, and input -> output (the model's
        ``describe`` when given)."""
        ret = "pending" if self.ret is None else _fmt_time(self.ret)
        who = "" if self.client is None else f"client {self.client}: "
        if model is not None and model.describe is not None:
            out = UNKNOWN if self.ret is None else cast(O, self.output)
            what = model.describe(self.input, out)
        elif self.ret is None:
            what = f"{self.input!r} -> ? (no return)"
        else:
            what = f"{self.input!r} -> {self.output!r}"
        return f"[{_fmt_time(self.call)}, {ret}] {who}{what}"


def _fmt_time(t: float) -> str:
    return str(t) if isinstance(t, int) else f"{t:.6g}"


@dataclass(frozen=True)
class Model(Generic[S, I, O]):
    """A sequential specification: what one operation does to the object's state.

    Give exactly one of:

    * ``apply(state, input) -> (output, new_state)`` for a deterministic object: an
      operation is accepted when its observed output equals (``==``) the one ``apply``
      gives (a pending operation's output is not compared);
    * ``step(state, input, output) -> (ok, new_state)``, which checks the output
      itself (for an output with several acceptable values). For a pending operation
      ``output`` is :data:`UNKNOWN` and ``step`` must accept any output it could have
      had.

    Either must be a pure function and must not change ``state`` in place; one state
    comes out of a step (as in Porcupine: a nondeterministic object's possible states
    must be folded into one state value, such as a set). States are memoised, so they
    must be hashable and compare by value (tuples, frozensets, frozen dataclasses), or
    ``key`` must map a state to such a value (two states with equal keys must behave
    the same in every later step).

    ``partition(input)``, when given, returns the part an operation belongs to (a key
    of a key-value store): it is only correct when no operation touches two parts and
    the parts are independent objects (P-compositionality); each part is then checked
    alone from ``init``. ``describe(input, output)`` prints an operation in
    counterexamples (``output`` is :data:`UNKNOWN` for a pending one).
    """

    init: S
    apply: Callable[[S, I], tuple[O, S]] | None = None
    step: Callable[[S, I, O | Unknown], tuple[bool, S]] | None = None
    partition: Callable[[I], Hashable] | None = None
    key: Callable[[S], Hashable] | None = None
    describe: Callable[[I, O | Unknown], str] | None = None

    def __post_init__(self) -> None:
        if (self.apply is None) == (self.step is None):
            raise HistoryError("a Model takes exactly one of apply= and step=")


@dataclass(frozen=True)
class LinearizabilityResult(Generic[I, O]):
    """What :func:`check_linearizability` found; true in a boolean context when the
    history is linearizable.

    When it is not, ``counterexample`` is a sub-history (operations of the checked
    history, unchanged, in call order) of one part (``partition`` is its key, ``None``
    without a partition function) such that:

    * it is not linearizable on its own, from the model's initial state;
    * every operation in it is needed: had any one of them not been seen to return
      (made pending: free to take effect at any time after its call, or not at all),
      the rest would be linearizable. So the counterexample never blames an operation
      for the absence of another: a stale read comes with the writes that make it
      stale, not alone as a read of a value nobody wrote.

    With ``minimize=False`` the counterexample is the whole failing part, unshrunk.
    """

    linearizable: bool
    counterexample: tuple[Operation[I, O], ...] = ()
    partition: Hashable = None
    model: Model[Any, I, O] | None = field(default=None, repr=False, compare=False)

    def __bool__(self) -> bool:
        return self.linearizable

    def describe(self) -> str:
        """The verdict, and the counterexample one operation a line, in call order."""
        if self.linearizable:
            return "linearizable"
        part = "" if self.partition is None else f" (partition {self.partition!r})"
        n = len(self.counterexample)
        lines = [
            f"not linearizable{part}: these {n} operation{'s' if n != 1 else ''} "
            "cannot be put in an order the model accepts:"
        ]
        lines.extend("  " + op.describe(self.model) for op in self.counterexample)
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.describe()


class HistoryRecorder(Generic[I, O]):
    """Records a history as the operations happen.

    ``i = rec.call(input, client)`` before the operation is sent, ``rec.ret(i, output)``
    when its answer arrives; an operation never returned stays pending. Times come from
    ``clock`` (such as ``gosim.now``); the default is a logical clock that counts the
    events, which orders them exactly as they were recorded (good for code on one
    thread, as gosim's goroutines are).
    """

    def __init__(self, clock: Callable[[], float] | None = None) -> None:
        self._clock = clock
        self._tick = 0
        self._calls: list[tuple[I, float, Hashable]] = []
        self._rets: dict[int, tuple[O, float]] = {}

    def _now(self) -> float:
        if self._clock is not None:
            return self._clock()
        self._tick += 1
        return self._tick

    def call(self, input: I, client: Hashable = None) -> int:
        """Record an invocation now; returns the operation's index for :meth:`ret`."""
        self._calls.append((input, self._now(), client))
        return len(self._calls) - 1

    def ret(self, index: int, output: O) -> None:
        """Record that operation ``index`` returned ``output`` now."""
        if not 0 <= index < len(self._calls):
            raise HistoryError(f"no operation {index} was called")
        if index in self._rets:
            raise HistoryError(f"operation {index} already returned")
        self._rets[index] = (output, self._now())

    def history(self) -> list[Operation[I, O]]:
        """The operations recorded so far, pending ones included, in call order."""
        ops: list[Operation[I, O]] = []
        for i, (inp, call, client) in enumerate(self._calls):
            done = self._rets.get(i)
            if done is None:
                ops.append(Operation(inp, call, client=client))
            else:
                ops.append(Operation(inp, call, done[0], done[1], client))
        return ops


# ---------------------------------------------------------------- checking


def check_linearizability(
    model: Model[Any, I, O],
    history: Iterable[Operation[I, O]],
    *,
    minimize: bool = True,
) -> LinearizabilityResult[I, O]:
    """Check that ``history`` is linearizable with respect to ``model``.

    The answer is exact (the search is complete): ``linearizable`` is True exactly
    when an order exists. Parts (``model.partition``) are checked in order of their
    first call and the first failing one is reported. The worst case is exponential in
    the number of operations that overlap in time; the memo keeps histories with a
    bounded overlap tractable.

    Raises :class:`HistoryError` for an operation whose times are not finite real
    numbers, that returns before it is called, or that is pending but has an output.
    """
    ops = list(history)
    for i, op in enumerate(ops):
        _validate(i, op)
    parts: dict[Hashable, list[Operation[I, O]]] = {}
    if model.partition is None:
        parts[None] = ops
    else:
        for op in ops:
            parts.setdefault(model.partition(op.input), []).append(op)
    for key, part in parts.items():
        if _check(model, part) is False:
            bad = _shrink(model, part) if minimize else part
            bad = sorted(bad, key=lambda op: op.call)
            return LinearizabilityResult(False, tuple(bad), key, model)
    return LinearizabilityResult(True, model=model)


def _validate(i: int, op: Operation[Any, Any]) -> None:
    if not isinstance(op, Operation):
        raise HistoryError(f"history item {i} is a {type(op).__name__}, not an Operation")
    for name, t in (("call", op.call), ("ret", op.ret)):
        if t is None and name == "ret":
            continue
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t):
            raise HistoryError(
                f"operation {i} ({op.input!r}): {name} time {t!r} is not a finite number"
            )
    if op.ret is None:
        if op.output is not None:
            raise HistoryError(
                f"operation {i} ({op.input!r}) has output {op.output!r} but no return time"
            )
    elif op.ret < op.call:
        raise HistoryError(
            f"operation {i} ({op.input!r}) returns at {op.ret} before it is called at {op.call}"
        )


def _check(
    model: Model[Any, Any, Any],
    ops: Sequence[Operation[Any, Any]],
    forgotten: frozenset[int] = frozenset(),
    budget: int | None = None,
) -> bool | None:
    """The search over one part: True (linearizable), False, or None when ``budget``
    steps ran out first. Operations whose index is in ``forgotten`` are treated as
    pending."""
    n = len(ops)
    if n == 0:
        return True
    apply, step, key = model.apply, model.step, model.key
    pending = [op.ret is None or i in forgotten for i, op in enumerate(ops)]
    # Events sorted by (time, kind, op): calls sort before returns at an equal time, so
    # operations that touch at an instant overlap.
    events: list[tuple[float, int, int]] = []
    for i, op in enumerate(ops):
        events.append((op.call, 0, i))
        if not pending[i]:
            events.append((cast(float, op.ret), 1, i))
    events.sort()
    # A doubly linked list over the events in arrays: ``head`` and ``tail`` sentinels.
    m = len(events)
    head, tail = m, m + 1
    nxt = [*range(1, m), tail, 0, -1]
    prv = [head, *range(m - 1), -1, m - 1]
    is_call = [kind == 0 for _, kind, _ in events] + [False, False]
    op_of = [i for _, _, i in events]
    ret_event = [-1] * n
    for e, (_, kind, i) in enumerate(events):
        if kind == 1:
            ret_event[i] = e
    match = [ret_event[op_of[e]] if is_call[e] else -1 for e in range(m)]
    inputs = [op.input for op in ops]
    outputs = [
        UNKNOWN if pending[i] and step is not None else op.output for i, op in enumerate(ops)
    ]

    state = model.init
    linearized = 0
    remaining = sum(1 for p in pending if not p)
    stack: list[tuple[int, Any, int]] = []
    memo: set[tuple[int, Hashable]] = set()
    steps = 0
    e = nxt[head]
    while remaining:
        if budget is not None:
            steps += 1
            if steps > budget:
                return None
        if is_call[e]:
            i = op_of[e]
            if apply is not None:
                got, new = apply(state, inputs[i])
                ok = pending[i] or got == outputs[i]
            else:
                ok, new = cast(Callable[[Any, Any, Any], tuple[bool, Any]], step)(
                    state, inputs[i], outputs[i]
                )
            if ok:
                lin = linearized | (1 << i)
                seen = (lin, new if key is None else key(new))
                if seen not in memo:
                    memo.add(seen)
                    stack.append((e, state, linearized))
                    state, linearized = new, lin
                    # lift the call, then its return, out of the list
                    nxt[prv[e]] = nxt[e]
                    prv[nxt[e]] = prv[e]
                    r = match[e]
                    if r >= 0:
                        nxt[prv[r]] = nxt[r]
                        prv[nxt[r]] = prv[r]
                        remaining -= 1
                    e = nxt[head]
                    continue
            e = nxt[e]
        else:
            # An operation that returned here is not linearized yet: undo the last choice.
            if not stack:
                return False
            e, state, linearized = stack.pop()
            r = match[e]
            if r >= 0:  # put the return back, then the call (the reverse of lifting)
                nxt[prv[r]] = r
                prv[nxt[r]] = r
                remaining += 1
            nxt[prv[e]] = e
            prv[nxt[e]] = e
            e = nxt[e]
    return True


# ---------------------------------------------------------------- shrinking

# A chunk is dropped only when its search ends within this many steps: dropping many
# operations at once makes them pending, and a failing search over many pending
# operations can be long. The final one-at-a-time pass has no bound.
_CHUNK_BUDGET = 200_000


def _shrink(model: Model[Any, I, O], ops: list[Operation[I, O]]) -> list[Operation[I, O]]:
    cut, original = _failing_prefix(model, ops)
    kept = _minimize(model, cut)
    # The operations the cut made pending get their return back (which keeps the rest
    # failing: it only adds a constraint), and the result is minimized again, so it
    # holds the history's operations unchanged.
    restore = {id(c): o for c, o in zip(cut, original, strict=True)}
    return _minimize(model, [restore[id(op)] for op in kept])


def _minimize(model: Model[Any, I, O], ops: list[Operation[I, O]]) -> list[Operation[I, O]]:
    ops = list(ops)

    def needed(ops: list[Operation[I, O]], i: int) -> bool:
        return _check(model, ops, frozenset((i,))) is not False

    # Pending operations (crashed callers, and the ones in flight at the cut) stay in
    # while completed ones are dropped: a pending write may be what explains a read, and
    # without it the read would look wrong for a reason the history does not have.
    # Chunks of completed operations first, halving: a chunk is dropped when the rest
    # still fails with it pending.
    size = len(ops) // 2
    while size > 1:
        start = 0
        while start < len(ops):
            chunk = frozenset(
                i for i in range(start, min(start + size, len(ops))) if ops[i].ret is not None
            )
            if chunk and _check(model, ops, chunk, _CHUNK_BUDGET) is False:
                ops = [op for i, op in enumerate(ops) if i not in chunk]
            else:
                start += size
        size //= 2
    # Then one at a time until none can go: each completed one left is needed.
    changed = True
    while changed:
        changed = False
        for i in range(len(ops) - 1, -1, -1):
            if ops[i].ret is not None and not needed(ops, i):
                del ops[i]
                changed = True
    # Last, the pending operations that no completed one needs.
    for p in range(len(ops) - 1, -1, -1):
        if ops[p].ret is None:
            rest = ops[:p] + ops[p + 1 :]
            if all(needed(rest, i) for i in range(len(rest)) if rest[i].ret is not None):
                ops = rest
    return ops


def _failing_prefix(
    model: Model[Any, I, O], ops: list[Operation[I, O]]
) -> tuple[list[Operation[I, O]], list[Operation[I, O]]]:
    """The shortest failing prefix: the operations called up to the earliest return
    event at which the history stops being linearizable, the ones still in flight
    there made pending; and beside it, each operation as it was. A prefix cut this way
    is linearizable whenever a longer one is (its order is the longer one's, cut), so a
    binary search finds the earliest."""
    events = sorted(
        [(op.call, 0, i) for i, op in enumerate(ops)]
        + [(op.ret, 1, i) for i, op in enumerate(ops) if op.ret is not None]
    )
    returns = [k for k, (_, kind, _) in enumerate(events) if kind == 1]

    def cut(k: int) -> tuple[list[Operation[I, O]], list[Operation[I, O]]]:
        called = [i for _, kind, i in events[: k + 1] if kind == 0]
        returned = {i for _, kind, i in events[: k + 1] if kind == 1}
        prefix = [
            ops[i]
            if i in returned or ops[i].ret is None
            else Operation(ops[i].input, ops[i].call, None, None, ops[i].client)
            for i in called
        ]
        return prefix, [ops[i] for i in called]

    lo, hi = -1, len(returns) - 1  # the cut at returns[hi] fails (the whole history)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _check(model, cut(returns[mid])[0]) is False:
            hi = mid
        else:
            lo = mid
    if not returns:  # only pending operations: never fails, so never asked
        return ops, ops
    return cut(returns[hi])
