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
  (or mapped to a hashable key by ``Model.key``). With pending operations the memo
  goes by dominance: a node is not explored when one with the same state, the same
  completed operations linearized and a subset of its pending ones was, since it can
  do nothing that one cannot.

When a history is not linearizable, :func:`check_linearizability` shrinks the failing
part to a counterexample (see :class:`LinearizabilityResult` for what it guarantees):
first the shortest failing prefix (the failing search itself says where it is: the
latest return it could not get past; operations still in flight there become pending),
then completed operations are dropped one at a time while the rest stays
non-linearizable with the dropped one pending and the others' roles unchanged. One
pass does it, with a few searches an operation (see ``_minimize``); register histories
of up to 28 operations, reads and writes overlapping, as the property tests draw them,
shrink in at most about 700,000 model steps (measured over 16,000 drawn histories, 8
seeds: a seventh of the budget, under a second), histories of 40 in up to 1.6 million;
at 60 a few in a hundred run out of the budget.

The search tries, at each step, the completed operations that leave the state as it
is (reads of the current value) first, then the other completed ones, then the pending
ones; a pending operation that leaves the state as it is is not tried at all (the
order without it is as good). The order changes no answer, but a read put off fails
only after the search has gone deep, and reads first keeps a linearizable ledger
history of 10,000 operations near a second; pending last lets the nodes with fewer of
them, which dominate the others, come first.

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

    When it is not, ``counterexample`` is a sub-history of one part (``partition`` is
    its key, ``None`` without a partition function), in call order, that is not
    linearizable on its own, from the model's initial state. Its operations are the
    history's, except that one whose return the violation does not need, only its
    possible effect (a write that explains what a read saw), is shown pending (``ret``
    None). When ``minimal`` is True it is also 1-minimal in this sense:

    * every completed operation in it is needed: had any one of them not been seen to
      return (made pending: free to take effect at any time after its call, or not
      at all), the rest would be linearizable;
    * a pending operation in it is there because without it some completed one would
      no longer be needed.

    Minimal in this sense rather than "deleting any operation makes it linearizable":
    deleting a write can itself create a violation (a read of a value nobody wrote),
    so deletion-minimal counterexamples reduce a stale read to the read alone; here a
    stale read comes with the writes that make it stale.

    ``minimal`` is False with ``minimize=False`` (the counterexample is then the whole
    failing part), or when shrinking ran out of its step budget (five million model
    steps, some seconds): the counterexample is then non-linearizable but larger than
    it needs to be. Register histories of up to 28 overlapping reads and writes shrink
    within a seventh of the budget (measured: see the module's docstring); a long failing
    search, such as a ledger whose every balance depends on all the transfers before
    it, or a failing part of many more operations, can need more than all of it.
    """

    linearizable: bool
    counterexample: tuple[Operation[I, O], ...] = ()
    partition: Hashable = None
    minimal: bool = False
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
        verdict, stuck, _ = _search(model, part)
        if verdict is False:
            bad, minimal = _shrink(model, part, stuck) if minimize else (part, False)
            bad = sorted(bad, key=lambda op: op.call)
            return LinearizabilityResult(False, tuple(bad), key, minimal, model)
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


def _search(
    model: Model[Any, Any, Any],
    ops: Sequence[Operation[Any, Any]],
    forgotten: frozenset[int] = frozenset(),
    budget: int | None = None,
) -> tuple[bool | None, int, int]:
    """The search over one part. Returns the answer (True: linearizable, False, or
    None when ``budget`` steps ran out first), the operation whose return the search
    got stuck at latest in history order (-1 unless the answer is False), and the
    steps taken. Operations whose index is in ``forgotten`` are treated as pending."""
    n = len(ops)
    if n == 0:
        return True, -1, 0
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

    check = cast(Callable[[Any, Any, Any], tuple[bool, Any]], step)
    if key is None:
        key = _identity

    state = model.init
    here = key(state)  # the memo's key of state
    linearized = 0
    remaining = sum(1 for p in pending if not p)
    # A frame: the call lifted; the state, its key and the set before it; the pass it
    # was found in (0, 1, 2: below).
    stack: list[tuple[int, Any, Hashable, int, int]] = []
    memo: set[tuple[int, Hashable]] = set()
    # With pending operations the memo is by dominance: a node is (the completed
    # operations linearized, the state, the pending ones linearized), and a node whose
    # pending set contains a visited node's (the rest equal) is not explored. It can do
    # nothing the visited one cannot: the same operations are still to come, they may
    # be called at the same places, and every pending operation it has left the other
    # has left too. Without this a failing search with k pending operations walks
    # their 2**k subsets; shrinking makes many operations pending.
    pending_bits = sum(1 << i for i in range(n) if pending[i])
    done_bits = ~pending_bits
    seen_pending: dict[tuple[int, Hashable], list[int]] = {}
    steps = 0
    limit = 1 << 62 if budget is None else budget
    stuck = -1
    # Each node is scanned in passes: first for completed operations that leave the
    # state as it is (reads of the current value), then for the other completed ones,
    # last for pending ones, each pass in call order. The order the candidates are tried
    # in changes no answer (a later pass skips an earlier one's choices), but reads
    # first is most often right: a read linearized too late fails only after the search
    # has gone deep. Pending operations last makes the nodes with fewer of them come
    # first, and those prune the rest (above). A pending operation that leaves the state
    # as it is is never taken: the order without it is as good.
    last_pass = 2 if pending_bits else 1
    phase = 0
    e = nxt[head]
    while remaining:
        if is_call[e]:
            i = op_of[e]
            if pending[i] is not (phase == 2):
                e = nxt[e]
                continue
            steps += 1
            if steps >= limit:
                return None, -1, steps
            if apply is not None:
                got, new = apply(state, inputs[i])
                ok = pending[i] or got == outputs[i]
            else:
                ok, new = check(state, inputs[i], outputs[i])
            if ok:
                new_key = here if new is state else key(new)
                if (new_key == here) is (phase == 0):
                    after = linearized | (1 << i)
                    if pending_bits:
                        fresh = _visit(seen_pending, after, done_bits, new_key)
                    else:
                        seen = (after, new_key)
                        fresh = seen not in memo
                        if fresh:
                            memo.add(seen)
                    if fresh:
                        stack.append((e, state, here, linearized, phase))
                        state, here, linearized = new, new_key, after
                        # lift the call, then its return, out of the list
                        nxt[prv[e]] = nxt[e]
                        prv[nxt[e]] = prv[e]
                        r = match[e]
                        if r >= 0:
                            nxt[prv[r]] = nxt[r]
                            prv[nxt[r]] = prv[r]
                            remaining -= 1
                        phase = 0
                        e = nxt[head]
                        continue
            e = nxt[e]
        elif phase < last_pass:
            # A pass reached the first return: the next pass.
            phase += 1
            e = nxt[head]
        else:
            # An operation that returned here is not linearized yet: undo the last
            # choice and go on with the candidates after it, in the same pass.
            # The latest return the search is stopped at, over all the nodes: every
            # return before it has been passed, so the history cut there is the
            # shortest that fails.
            stuck = max(stuck, e)
            if not stack:
                return False, op_of[stuck], steps
            e, state, here, linearized, phase = stack.pop()
            r = match[e]
            if r >= 0:  # put the return back, then the call (the reverse of lifting)
                nxt[prv[r]] = r
                prv[nxt[r]] = r
                remaining += 1
            nxt[prv[e]] = e
            prv[nxt[e]] = e
            e = nxt[e]
    return True, -1, steps


def _identity(state: Any) -> Any:
    return state


def _visit(
    seen: dict[tuple[int, Hashable], list[int]], linearized: int, done_bits: int, state: Hashable
) -> bool:
    """Record the node (``linearized``, ``state``) in ``seen`` and say whether it is to
    be explored: False when a visited node with the same completed operations and
    state had a subset of its pending ones.

    Pruning against a node still being explored (an ancestor) is safe too: by
    induction on the length of the shortest way to the end, a node that can reach it
    is either explored or dominated by one that reaches it at least as soon."""
    pend = linearized & ~done_bits
    antichain = seen.setdefault((linearized & done_bits, state), [])
    for other in antichain:
        if other & ~pend == 0:
            return False
    # Sets this one is a subset of are dominated from now on.
    antichain[:] = [other for other in antichain if pend & ~other != 0]
    antichain.append(pend)
    return True


# ---------------------------------------------------------------- shrinking

# All the searches of one shrink together (a step is one call of the model, a few
# microseconds): past it the counterexample is returned as it is, not minimal.
_SHRINK_STEPS = 5_000_000


def _shrink(
    model: Model[Any, I, O], ops: list[Operation[I, O]], stuck: int
) -> tuple[list[Operation[I, O]], bool]:
    """The counterexample of a failing part, and whether it is minimal; ``stuck`` is
    the operation whose return the failing search could not pass."""
    cut, original = _failing_prefix(ops, stuck)
    left = [_SHRINK_STEPS]
    kept, minimal = _minimize(model, cut, left)
    # The operations the cut made pending get their return back (which keeps the rest
    # failing: it only adds a constraint), and the result is minimized again.
    position = {id(c): k for k, c in enumerate(cut)}
    kept = [original[position[id(op)]] if id(op) in position else op for op in kept]
    if minimal:
        kept, minimal = _minimize(model, kept, left)
    return kept, minimal


class _OutOfSteps(Exception):
    """Shrinking used up its step budget."""


def _minimize(
    model: Model[Any, I, O], ops: list[Operation[I, O]], left: list[int]
) -> tuple[list[Operation[I, O]], bool]:
    """``ops`` (failing) shrunk as :class:`LinearizabilityResult` says, and True; or as
    far as it got, and False, when the budget ``left[0]`` ran out.

    One operation at a time, from the latest: a completed operation the violation does
    not need is made pending, and then deleted only when that changes which of the
    others are needed in no way. A pending operation's possible effect may be what
    explains another's output (a write a read saw), and deleting it would swap the
    violation for another the history does not have (a read of a value nobody wrote).
    Last, the pending operations that no completed one needs are deleted.

    Two facts keep this to a few searches an operation (a search here is one check of
    "is operation j needed in this history"). Making an operation pending only adds
    orders, so an operation needed stays needed: one pass over the operations is
    enough, and those already passed are known to be needed before a deletion.
    Deleting a pending operation only removes orders (the history still fails), so an
    operation not needed stays not needed: only the needed ones can change their role.
    The result is the one the same rule gives when it searches every operation's role
    before and after each deletion and repeats the pass until nothing changes.
    """
    ops = list(ops)
    # Answers by (the identities of the history's operations, j); ``alive`` holds every
    # history asked about, so that no identity is reused while the cache lives.
    cache: dict[tuple[tuple[int, ...], int], bool] = {}
    alive: list[list[Operation[I, O]]] = []

    def ident(ops: list[Operation[I, O]]) -> tuple[int, ...]:
        return tuple(map(id, ops))

    def fails(ops: list[Operation[I, O]], forgotten: frozenset[int]) -> bool:
        verdict, _, used = _search(model, ops, forgotten, left[0])
        left[0] -= used
        if verdict is None:
            raise _OutOfSteps
        alive.append(ops)
        return not verdict

    def needed(ops: list[Operation[I, O]], j: int) -> bool:
        k = (ident(ops), j)
        known = cache.get(k)
        if known is None:
            known = cache[k] = not fails(ops, frozenset((j,)))
        return known

    def needed_among(ops: list[Operation[I, O]], group: list[int]) -> set[int]:
        # The operations of ``group`` that ``ops`` needs. When ``ops`` still fails with
        # two of them pending, it fails with either one pending (fewer orders): one
        # search clears both, and most operations of a failing history are not needed.
        # (Larger groups clear more at once but their searches, with more operations
        # pending, cost more than they save.)
        ids = ident(ops)
        unknown = [j for j in group if (ids, j) not in cache]
        for a, b in zip(unknown[::2], unknown[1::2], strict=False):
            if fails(ops, frozenset((a, b))):
                cache[ids, a] = cache[ids, b] = False
        return {j for j in group if needed(ops, j)}

    def same_roles(forgot: list[Operation[I, O]], i: int, rest: list[Operation[I, O]]) -> bool:
        # ``forgot`` has operation i pending, ``rest`` is it without i. The operations
        # after i were needed when passed and still are; of those before it, only the
        # needed ones can stop being needed.
        before = [j for j in range(i) if forgot[j].ret is not None]
        need = needed_among(forgot, before)
        ids = ident(rest)
        alive.append(rest)
        for j in before:
            if j not in need:
                cache[ids, j] = False
        return all(
            needed(rest, j)
            for j, op in enumerate(rest)
            if op.ret is not None and (j >= i or j in need)
        )

    try:
        for i in range(len(ops) - 1, -1, -1):
            if ops[i].ret is None or needed(ops, i):
                continue
            forgot = [*ops[:i], _forget(ops[i]), *ops[i + 1 :]]
            rest = [*ops[:i], *ops[i + 1 :]]
            ops = rest if same_roles(forgot, i, rest) else forgot
        for p in range(len(ops) - 1, -1, -1):
            if ops[p].ret is not None:
                continue
            rest = [*ops[:p], *ops[p + 1 :]]
            if all(op.ret is None or needed(rest, j) for j, op in enumerate(rest)):
                ops = rest
    except _OutOfSteps:
        return ops, False
    return ops, True


def _forget(op: Operation[I, O]) -> Operation[I, O]:
    """``op`` as if its caller had crashed before the answer."""
    return Operation(op.input, op.call, None, None, op.client)


def _failing_prefix(
    ops: list[Operation[I, O]], stuck: int
) -> tuple[list[Operation[I, O]], list[Operation[I, O]]]:
    """The shortest failing prefix: the operations called before the return of
    ``stuck`` (the first return the search could not pass), the ones still in flight
    there made pending; and beside it, each operation as it was. (A prefix cut this way
    is linearizable whenever a longer one is: its order is the longer one's, cut.)"""
    events = sorted(
        [(op.call, 0, i) for i, op in enumerate(ops)]
        + [(op.ret, 1, i) for i, op in enumerate(ops) if op.ret is not None]
    )
    k = events.index((cast(float, ops[stuck].ret), 1, stuck))
    called = [i for _, kind, i in events[: k + 1] if kind == 0]
    returned = {i for _, kind, i in events[: k + 1] if kind == 1}
    prefix = [ops[i] if i in returned or ops[i].ret is None else _forget(ops[i]) for i in called]
    return prefix, [ops[i] for i in called]
