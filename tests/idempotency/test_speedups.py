"""The C twins of idempotency/_speedups.c against their Python references.

Every twin must answer exactly what its reference answers: the same result (types of the
record's fields included) or the same exception with the same message. Hypothesis draws
the inputs, bad ones included; the suite's other tests then run on the twins, and CI
runs everything once more with GOSIM_PURE_PYTHON=1, on the references alone.
"""

from __future__ import annotations

import collections
import hashlib
import math
import types
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from idempotency import _keys, _record
from idempotency._accel import speedups
from idempotency._errors import CorruptedRecord, InvalidRequest
from idempotency._record import COMPLETED, IN_PROGRESS, Record
from idempotency.stores import _contract, memory
from idempotency.stores import sqlite as sqlite_store
from idempotency.stores._batch import Op, OpKind

from ._leaks import leaks

pytestmark = pytest.mark.skipif(
    speedups is None, reason="idempotency._speedups not in use (not built, or GOSIM_PURE_PYTHON=1)"
)

FINGERPRINTS = [b"\x01" * 32, b"\x02" * 32]
times = st.one_of(
    st.floats(min_value=-1e6, max_value=1e6, allow_nan=False),
    st.integers(min_value=-1000, max_value=1000),  # an int clock: the reference's case
)
records = st.one_of(
    st.none(),
    st.builds(
        lambda state, fp, fence, exp, ok, payload: Record(
            state, fp, fence, exp, ok, payload if state == COMPLETED else None
        ),
        st.sampled_from([IN_PROGRESS, COMPLETED]),
        st.sampled_from(FINGERPRINTS),
        st.integers(min_value=0, max_value=5),
        times,
        st.booleans(),
        st.binary(max_size=8),
    ),
)


def outcome_of(fn: Any, *args: Any, **kwargs: Any) -> tuple[str, Any]:
    """What a call answered, comparable between twins: the value with the types of its
    parts, or the exception's type and message."""
    try:
        got = fn(*args, **kwargs)
    except Exception as exc:
        return ("raised", (type(exc), str(exc)))
    if isinstance(got, tuple):
        parts = [tuple((type(p), p) for p in x) if isinstance(x, tuple) else x for x in got]
        return ("value", (type(got), parts))
    return ("value", (type(got), got))


def test_the_twins_are_in_place() -> None:
    assert _record.claim is speedups.claim and _record.complete is speedups.complete
    assert _keys.fingerprint is speedups.fingerprint
    assert memory._Table is speedups.MemoryTable


@settings(max_examples=400)
@given(records, st.sampled_from(FINGERPRINTS), times, times, st.integers(0, 9))
def test_claim_matches_the_reference(
    record: Record | None, fp: bytes, now: float, lease: float, fence: int
) -> None:
    assert outcome_of(speedups.claim, record, fp, now, lease, fence) == outcome_of(
        _record._py_claim, record, fp, now, lease, fence
    )


@settings(max_examples=400)
@given(records, st.integers(0, 5), st.booleans(), st.binary(max_size=8), times, times)
def test_complete_matches_the_reference(
    record: Record | None, fence: int, ok: bool, payload: bytes, now: float, ttl: float
) -> None:
    args = (record, fence, ok, payload, now, ttl, "caller", "key")
    assert outcome_of(speedups.complete, *args) == outcome_of(_record._py_complete, *args)


class Unpackable:
    pass


class StrSub(str):
    pass


class IntSub(int):
    pass


class ListSub(list[Any]):
    pass


class DictSub(dict[Any, Any]):
    pass


scalars = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),  # past 64 bits: msgpack refuses
    st.floats(allow_nan=False),
    st.text(max_size=6),
    st.binary(max_size=6),
    st.booleans(),
    st.none(),
    # Subclasses and other types of the same msgpack values: the reference's cases.
    st.text(max_size=6).map(StrSub),
    st.integers(min_value=-(2**63), max_value=2**64 - 1).map(IntSub),
    st.binary(max_size=6).map(bytearray),
)
arguments = st.recursive(
    scalars | st.builds(Unpackable),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.lists(inner, max_size=4).map(tuple)
        | st.lists(inner, max_size=4).map(ListSub)
        | st.dictionaries(st.text(max_size=3), inner, max_size=3)
        | st.dictionaries(st.text(max_size=3), inner, max_size=3).map(DictSub)
        | st.dictionaries(st.text(max_size=3), inner, max_size=3).map(
            lambda d: collections.OrderedDict(reversed(d.items()))
        )
        | st.dictionaries(st.text(max_size=3), inner, max_size=3).map(types.MappingProxyType)
        | st.sets(st.integers(0, 3), max_size=2)  # no msgpack form: refused by both
    ),
    max_leaves=8,
)


@settings(max_examples=400)
@given(
    st.one_of(
        st.sampled_from(["op", "transfer", ""]),
        st.text(max_size=4),
        st.text(max_size=4).map(StrSub),
        st.integers(),
    ),
    arguments,
    st.integers(min_value=0, max_value=64),
)
def test_fingerprint_matches_the_reference(operation: Any, args: Any, max_bytes: int) -> None:
    # The twin's fast path needs the operation's prefix cached: call the reference first
    # on half of the examples.
    if max_bytes % 2:
        outcome_of(_keys._py_fingerprint, operation, args)
    assert outcome_of(speedups.fingerprint, operation, args, max_bytes) == outcome_of(
        _keys._py_fingerprint, operation, args, max_bytes
    )


def test_fingerprint_errors_are_the_references() -> None:
    with pytest.raises(InvalidRequest, match="encode to"):
        speedups.fingerprint("op", [b"x" * 100], 10)
    with pytest.raises(InvalidRequest, match="not msgpack-serialisable"):
        speedups.fingerprint("op", [Unpackable()])
    with pytest.raises(InvalidRequest, match="non-empty str"):
        speedups.fingerprint("", [1])
    assert speedups.fingerprint("op", [1, "a"], max_bytes=100) == _keys._py_fingerprint(
        "op", [1, "a"]
    )


class Clock:
    """A settable clock: floats, or ints to send the C table to its reference."""

    def __init__(self) -> None:
        self.t: float = 0.0

    def __call__(self) -> float:
        return self.t


steps = st.lists(
    st.one_of(
        st.tuples(st.just("claim"), st.sampled_from(["a", "b"]), st.sampled_from(FINGERPRINTS),
                  st.sampled_from([5.0, 0.5, 3])),
        st.tuples(st.just("complete"), st.sampled_from(["a", "b"]), st.integers(0, 6),
                  st.sampled_from([b"", b"\x01"]), st.sampled_from([10.0, 2])),
        st.tuples(st.just("advance"), times),
    ),
    max_size=25,
)  # fmt: skip


@settings(max_examples=300)
@given(steps)
def test_memory_table_matches_the_reference(program: list[tuple[Any, ...]]) -> None:
    clock_c, clock_py = Clock(), Clock()
    c_table = speedups.MemoryTable(clock_c)
    py_table = memory._MemoryTable(clock_py)
    for step in program:
        if step[0] == "advance":
            clock_c.t = clock_py.t = step[1]
            continue
        if step[0] == "claim":
            _, key, fp, lease = step
            args: tuple[Any, ...] = ("caller", key, fp, lease)
        else:
            _, key, fence, payload, ttl = step
            completion = _contract.new_completion(
                _contract.Completion, (True, payload, None, ttl, 1 << 20)
            )
            args = ("caller", key, fence, completion)
        name = step[0]
        assert outcome_of(getattr(c_table, name), *args) == outcome_of(
            getattr(py_table, name), *args
        ), step
        assert c_table.fence == py_table.fence
        assert c_table.operations == py_table.operations
        assert c_table.records == py_table.records


@pytest.mark.parametrize(
    ("caller", "key"),
    [("c" * 255, "k" * 255), ("c", "k" * 256), ("語" * 256, "k"), (7, "k"), ("c", b"k")],
)
def test_memory_table_refuses_past_the_bound_as_the_reference(caller: Any, key: Any) -> None:
    """A caller or key past MAX_KEY_LENGTH characters (or not a str), and an outcome
    past MAX_PAYLOAD_BYTES: the C table refuses them as the reference does, with the
    same error, and changes nothing."""
    c_table = speedups.MemoryTable(Clock())
    py_table = memory._MemoryTable(Clock())
    for table in (c_table, py_table):
        table.claim("c", "held", FINGERPRINTS[0], 5.0)
    args = (caller, key, FINGERPRINTS[0], 5.0)
    assert outcome_of(c_table.claim, *args) == outcome_of(py_table.claim, *args)
    over = _contract.new_completion(
        _contract.Completion, (True, bytes(_contract.MAX_PAYLOAD_BYTES + 1), None, 9.0, 1 << 20)
    )
    c_out, py_out = (
        outcome_of(c_table.complete, "c", "held", 1, over),
        outcome_of(py_table.complete, "c", "held", 1, over),
    )
    assert c_out == py_out
    assert "InvalidResult" in repr(c_out), c_out
    assert c_table.records == py_table.records and c_table.operations == py_table.operations


def test_memory_table_takes_keywords_and_effects_through_the_reference() -> None:
    clock = Clock()
    table = speedups.MemoryTable(clock)
    res = table.claim(caller="c", key="k", fingerprint=FINGERPRINTS[0], lease=5.0)
    assert res.kind is _record.ClaimKind.CLAIMED and table.fence == 1
    effect = memory.MemoryEffect(lambda: 42)
    completion = _contract.new_completion(_contract.Completion, (True, None, effect, 10.0, 1 << 20))
    done = table.complete("c", "k", res.record.fence, completion)
    assert done.state == COMPLETED and done.payload == b"\x2a"
    with pytest.raises(TypeError):
        table.claim("c", "k")


@settings(max_examples=300)
@given(
    st.binary(max_size=300)
    | st.integers(0, 5000).map(lambda n: bytes(range(256)) * (n // 256) + bytes(n % 256))
)
def test_sha256_on_the_cpu_extensions_is_sha256(data: bytes) -> None:
    got = speedups.sha256_ni(data)
    if got is None:
        pytest.skip("this CPU has no SHA extensions: the fingerprint uses hashlib's SHA-256")
    assert got == hashlib.sha256(data).digest()


def test_sha256_block_boundaries() -> None:
    # Lengths around the padding's edges: 55 bytes fit one block with the length, 56 not.
    for n in [0, 1, 55, 56, 57, 63, 64, 65, 119, 120, 127, 128, 129, 1 << 16]:
        data = bytes((i * 7) & 0xFF for i in range(n))
        got = speedups.sha256_ni(data)
        if got is None:
            pytest.skip("this CPU has no SHA extensions: the fingerprint uses hashlib's SHA-256")
        assert got == hashlib.sha256(data).digest(), n


def test_the_twins_leak_nothing() -> None:
    """Every fast path and every hand-off to a reference, many times: no object is left
    behind (tracemalloc's live total does not grow) and no reference count creeps."""

    fp = FINGERPRINTS[0]
    completion = _contract.new_completion(_contract.Completion, (True, b"\x01", None, 10.0, 1024))

    def work(n: int) -> None:
        table = speedups.MemoryTable(lambda: 1.0)
        for i in range(n):
            speedups.fingerprint("op", [i, "x", [1, (2, 3)]])
            outcome_of(speedups.fingerprint, "op", [{"a": 1}, Unpackable()])  # reference
            res = speedups.claim(None, fp, 1.0, 5.0, i)
            speedups.claim(res.record, fp, 2.0, 5.0, i)
            speedups.claim(res.record, FINGERPRINTS[1], 2.0, 5.0, i)
            speedups.complete(res.record, i, True, b"p", 2.0, 10.0, "c", "k")
            outcome_of(speedups.complete, res.record, i + 1, True, b"p", 2.0, 10.0, "c", "k")
            key = str(i % 20)
            got = table.claim("c", key, fp, 5.0)
            if got.kind is _record.ClaimKind.CLAIMED:
                table.complete("c", key, got.record.fence, completion)
            outcome_of(table.complete, "c", key, -1, completion)  # stale: reference
            speedups.sha256_ni(b"abc" * (i % 40))
            ops = [
                Op(sqlite_store._CLAIM, ("c", key, fp, 5.0)),
                Op(sqlite_store._COMPLETE, ("c", key, i + 1, completion)),
                Op(sqlite_store._COMPLETE, ("c", key, -1, completion)),  # stale: reference
                Op(sqlite_store._RELEASE, ("c", key, 1)),
            ]
            ws: dict[Any, Any] = dict.fromkeys(speedups.batch_keys(ops))
            dirty: dict[Any, Any] = {}
            speedups.decode_into([("c", key, 1, fp, 1, 1.0, 1, None)], ws, lambda row: None)
            speedups.decide(ops, 0, ws, dirty, 2.0, i)
            speedups.rows(dirty)
            # The held-claim steps: the common batch, then shapes that go to the reference.
            held = {("c", key): (i + 1, fp), ("c", "x"): (1, fp)}
            done = Op(sqlite_store._COMPLETE, ("c", key, i + 1, completion))
            claimed = Op(sqlite_store._CLAIM, ("c", "new", fp, 5.0))
            claimed.result = _CLAIMED_RESULT
            batch = [claimed, done, Op(sqlite_store._RELEASE, ("c", "x", 1))]
            mine, _ = speedups.split_held(batch, held)
            speedups.held_params(mine, held, 2.0)
            speedups.held_records(mine, held, 2.0)
            speedups.note_held(batch, held)
            outcome_of(speedups.held_params, mine, {}, 2.0)  # a KeyError: the reference
            bad = [Op(sqlite_store._COMPLETE, ("c", key))]
            outcome_of(speedups.split_held, bad, held)  # the reference's ValueError
            speedups.note_held([Op("odd", ("c", key))], held)  # the reference

    moved, live = leaks(work, fp, warm=500, runs=3000)  # warm: the prefix cache
    assert moved == [0]
    assert live < 64 * 1024, f"{live} bytes still live after the calls"


# ----------------------------------------------------- SQLiteStore's batch record work


class _Call:
    """What claim_and_complete is given as ``call``: its fence is set when it claims."""

    def __init__(self) -> None:
        self.fence = 0

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Call) and other.fence == self.fence

    def __hash__(self) -> int:
        return 0


_KEYS = [("c", "a"), ("c", "b"), ("d", "a")]
_CC = sqlite_store._CLAIM_COMPLETE
completions = st.builds(
    lambda ok, payload, effect, ttl: _contract.new_completion(
        _contract.Completion, (ok, payload, effect, ttl, 1 << 20)
    ),
    st.booleans(),
    st.sampled_from([b"", b"\x01"]),
    st.sampled_from([None, None, None, sqlite_store.SQLiteEffect(lambda conn: 1)]),
    st.sampled_from([10.0, 0.5, 3, math.inf]),
)
batch_ops = st.lists(
    st.one_of(
        st.builds(lambda rk, fp, lease: (sqlite_store._CLAIM, (*rk, fp, lease)),
                  st.sampled_from(_KEYS), st.sampled_from(FINGERPRINTS),
                  st.sampled_from([5.0, 0.5, 3, 1e-300, math.inf])),
        st.builds(lambda rk, fence, c: (sqlite_store._COMPLETE, (*rk, fence, c)),
                  st.sampled_from(_KEYS), st.integers(0, 6), completions),
        st.builds(lambda rk, fp, lease, c: (_CC, (*rk, fp, lease, "call", c)),
                  st.sampled_from(_KEYS), st.sampled_from(FINGERPRINTS),
                  st.sampled_from([5.0, 3, math.inf]), completions),
        st.builds(lambda rk, fence: (sqlite_store._RELEASE, (*rk, fence)),
                  st.sampled_from(_KEYS), st.integers(0, 6)),
        st.just((sqlite_store._SWEEP, ())),
        st.builds(lambda rk: (sqlite_store._CLAIM, rk), st.sampled_from(_KEYS)),  # short args
        st.builds(lambda rk: (sqlite_store._CLAIM, (*rk, b"fp", 1.0)), st.just(("c", "zz"))),
    ),
    max_size=12,
)  # fmt: skip
working_sets = st.dictionaries(
    st.sampled_from(_KEYS), st.one_of(records, st.just(CorruptedRecord("damaged"))), max_size=3
)


def _ops_of(spec: list[tuple[int, tuple[Any, ...]]]) -> list[Op]:
    return [Op(kind, tuple(_Call() if a == "call" else a for a in args)) for kind, args in spec]


def _seen(ops: list[Op]) -> list[Any]:
    """What the operations were left with, comparable between twins."""
    out = []
    for op in ops:
        err = None if op.error is None else (type(op.error), str(op.error))
        calls = [a.fence for a in op.args if isinstance(a, _Call)]
        out.append((op.result, type(op.result), err, calls))
    return out


@settings(max_examples=400)
@given(batch_ops, working_sets, st.integers(0, 3), times, st.integers(0, 5))
def test_decide_matches_the_reference(
    spec: list[tuple[int, tuple[Any, ...]]],
    ws: dict[tuple[str, str], Any],
    start: int,
    now: float,
    fence: int,
) -> None:
    for rk in _KEYS:
        if rk not in ws and rk != ("d", "a"):
            ws[rk] = None  # read and absent; ("d", "a") not read: a missing key
    got = []
    for decide in (speedups.decide, sqlite_store._py_decide):
        ops, ws_ = _ops_of(spec), dict(ws)
        dirty: dict[tuple[str, str], Record | None] = {("x", "y"): None}
        answer = decide(ops, start, ws_, dirty, now, fence)
        got.append((answer, [type(x) for x in answer], _seen(ops), ws_, dirty))
    assert got[0] == got[1]


def test_decide_answers_the_stores_own_operations_itself(monkeypatch: Any) -> None:
    """The operations a store submits (their kinds OpKind members, an int subclass) take
    the C path: none is handed to the reference. (An exact-int check on the kind once
    sent every one of them there, with the same answers, so only this notices.)"""
    handed: list[Any] = []

    def spy(op: Op, *rest: Any) -> Any:
        handed.append(op.kind)
        return sqlite_store._decide_one(op, *rest)

    def configure(decide_one: Any) -> None:
        speedups.configure_sqlite(
            decide_one=decide_one,
            keyed=sqlite_store._KEYED,
            claim=sqlite_store._CLAIM,
            complete=sqlite_store._COMPLETE,
            claim_complete=sqlite_store._CLAIM_COMPLETE,
        )

    fp = FINGERPRINTS[0]
    completion = _contract.new_completion(_contract.Completion, (True, b"\x01", None, 10.0, 64))
    held = Record(IN_PROGRESS, fp, 7, 100.0, None, None)
    ops = [
        Op(sqlite_store._CLAIM, ("c", "new", fp, 5.0)),
        Op(sqlite_store._COMPLETE, ("c", "held", 7, completion)),
        Op(sqlite_store._CLAIM_COMPLETE, ("c", "one", fp, 5.0, _Call(), completion)),
    ]
    assert all(type(op.kind) is OpKind for op in ops)
    ws: dict[Any, Any] = {("c", "new"): None, ("c", "held"): held, ("c", "one"): None}
    configure(spy)
    try:
        answer = speedups.decide(ops, 0, ws, {}, 1.0, 10)
    finally:
        configure(sqlite_store._decide_one)
    assert handed == []
    assert answer == (3, 12)
    assert [op.error for op in ops] == [None, None, None]


@settings(max_examples=200)
@given(batch_ops)
def test_batch_keys_match_the_reference(spec: list[tuple[int, tuple[Any, ...]]]) -> None:
    spec = [s for s in spec if len(s[1]) >= 2 or s[0] == sqlite_store._SWEEP]
    ops = _ops_of(spec)
    assert speedups.batch_keys(ops) == sqlite_store._py_batch_keys(ops)


row_values = st.tuples(
    st.sampled_from([1, 2, 3, "1", None]),
    st.sampled_from([b"\x01" * 32, b"\x01" * 31, "x" * 32, None]),
    st.sampled_from([1, 7, 0, -1, 1 << 70, 2.0, None]),
    st.sampled_from([5.0, 3, -1.5, "soon", None]),
    st.sampled_from([0, 1, 2, True, None]),
    st.sampled_from([None, b"", b"\x01", "text"]),
)


@settings(max_examples=400)
@given(st.lists(st.tuples(st.sampled_from(_KEYS), row_values), max_size=6))
def test_decode_into_matches_the_reference(
    tmp_path_factory: pytest.TempPathFactory, rows: list[tuple[tuple[str, str], tuple[Any, ...]]]
) -> None:
    store = sqlite_store.SQLiteStore(tmp_path_factory.mktemp("db") / "r.db")
    try:
        got = []
        for decode_into in (speedups.decode_into, sqlite_store._py_decode_into):
            ws: dict[Any, Any] = dict.fromkeys(_KEYS)
            decode_into([(*rk, *row) for rk, row in rows], ws, store._decode_row)
            got.append(
                {
                    rk: (type(v), str(v))
                    if isinstance(v, Exception)
                    else (type(v), v, None if v is None else [type(x) for x in v])
                    for rk, v in ws.items()
                }
            )
        assert got[0] == got[1]
    finally:
        store.close()


@settings(max_examples=300)
@given(st.dictionaries(st.sampled_from(_KEYS), st.one_of(st.none(), records), max_size=3))
def test_rows_match_the_reference(dirty: dict[tuple[str, str], Any]) -> None:
    c_rows, py_rows = speedups.rows(dirty), sqlite_store._py_rows(dirty)
    assert c_rows == py_rows
    for c_list, py_list in zip(c_rows, py_rows, strict=True):
        for c_row, py_row in zip(c_list, py_list, strict=True):
            assert [type(x) for x in c_row] == [type(x) for x in py_row]


# ------------------------------------------------- SQLiteStore's held claims, its twins

_CLAIMED_RESULT = _record.ClaimResult(
    _record.ClaimKind.CLAIMED, Record(IN_PROGRESS, FINGERPRINTS[0], 4, 9.0, None, None)
)
_REPLAY_RESULT = _record.ClaimResult(
    _record.ClaimKind.REPLAY, Record(COMPLETED, FINGERPRINTS[1], 3, 9.0, True, b"\x01")
)
# What the store keeps of a held claim, and some things it never keeps.
held_entries = st.one_of(
    st.tuples(st.integers(0, 6), st.sampled_from(FINGERPRINTS)),
    st.sampled_from([(2,), (2, "not bytes"), [2, FINGERPRINTS[0]]]),
)
held_maps = st.dictionaries(st.sampled_from(_KEYS), held_entries, max_size=4)
held_ops = st.lists(
    st.one_of(
        batch_ops.flatmap(lambda spec: st.just(spec[0]) if spec else st.nothing()),
        st.builds(lambda rk, fence, c: (sqlite_store._COMPLETE, (*rk, fence, c)),
                  st.sampled_from(_KEYS), st.integers(0, 6), completions),
        st.builds(lambda rk: (sqlite_store._COMPLETE, (*rk, 1)), st.sampled_from(_KEYS)),
        st.builds(lambda rk: (sqlite_store._GET, rk), st.sampled_from(_KEYS)),
    ),
    max_size=10,
)  # fmt: skip
op_outcomes = st.lists(
    st.sampled_from([(None, None), (_CLAIMED_RESULT, None), (_REPLAY_RESULT, None),
                     (_CLAIMED_RESULT, ValueError("x")), ("odd", None)]),
    min_size=10, max_size=10,
)  # fmt: skip


def _held_ops(spec: list[tuple[int, tuple[Any, ...]]], outcomes: list[Any]) -> list[Op]:
    ops = _ops_of(spec)
    for op, (result, error) in zip(ops, outcomes, strict=False):
        op.result, op.error = result, error
    return ops


_EFFECT_COMPLETION = _contract.new_completion(
    _contract.Completion, (True, None, sqlite_store.SQLiteEffect(lambda conn: 1), 10.0, 64)
)
_PLAIN_COMPLETION = _contract.new_completion(_contract.Completion, (True, b"v", None, 10.0, 64))


@settings(max_examples=400)
@given(held_ops, held_maps)
@example([(sqlite_store._COMPLETE, ("c", "a", 2, _EFFECT_COMPLETION))], {("c", "a"): (2, b"f")})
@example(
    [(sqlite_store._COMPLETE, ("c", "a", 2, _PLAIN_COMPLETION)), (sqlite_store._GET, ("c", "a"))],
    {("c", "a"): (2, b"f")},
)
@example(
    [
        (sqlite_store._COMPLETE, ("c", "a", 2, _PLAIN_COMPLETION)),
        (sqlite_store._COMPLETE, ("c", "a", 2, _PLAIN_COMPLETION)),
    ],
    {("c", "a"): (2, b"f")},
)
def test_split_held_matches_the_reference(
    spec: list[tuple[int, tuple[Any, ...]]], held: dict[Any, Any]
) -> None:
    got = []
    for split in (speedups.split_held, sqlite_store._py_split_held):
        ops = _ops_of(spec)
        answer = outcome_of(split, ops, dict(held))
        if answer[0] == "value" and answer[1][1] is not None:  # the ops by position
            mine, rest = answer[1][1]
            answer = ("value", ([ops.index(o) for o in mine], [ops.index(o) for o in rest]))
        got.append(answer)
    assert got[0] == got[1]


@settings(max_examples=400)
@given(held_ops, held_maps, st.sampled_from([1.5, 0.0, 7]))
def test_held_params_and_records_match_the_reference(
    spec: list[tuple[int, tuple[Any, ...]]], held: dict[Any, Any], now: float
) -> None:
    for twin, ref in [
        (speedups.held_params, sqlite_store._py_held_params),
        (speedups.held_records, sqlite_store._py_held_records),
    ]:
        got = []
        for fn in (twin, ref):
            ops = _ops_of(spec)
            answer = outcome_of(fn, ops, dict(held), now)
            if answer[0] == "value" and isinstance(answer[1][1], list):
                answer = ("value", [[(type(x), x) for x in row] for row in answer[1][1]])
            got.append((answer, _seen(ops)))
        assert got[0] == got[1]


@settings(max_examples=400)
@given(held_ops, op_outcomes, held_maps, st.sampled_from([1, 2, 100]))
def test_note_held_matches_the_reference(
    spec: list[tuple[int, tuple[Any, ...]]],
    outcomes: list[Any],
    held: dict[Any, Any],
    held_max: int,
) -> None:
    got = []
    for note in (speedups.note_held, sqlite_store._py_note_held):
        monkey = pytest.MonkeyPatch()
        monkey.setattr(sqlite_store, "_HELD_MAX", held_max)
        _configure_held(held_max)
        try:
            h = dict(held)
            answer = outcome_of(note, _held_ops(spec, outcomes), h)
        finally:
            monkey.undo()
            _configure_held(sqlite_store._HELD_MAX)
        got.append((answer, h))
    assert got[0] == got[1]


def _configure_held(held_max: int) -> None:
    speedups.configure_held(
        split_held=sqlite_store._py_split_held,
        held_params=sqlite_store._py_held_params,
        held_records=sqlite_store._py_held_records,
        note_held=sqlite_store._py_note_held,
        release=sqlite_store._RELEASE,
        held_max=held_max,
    )


def test_the_held_twins_answer_the_stores_own_batches_themselves() -> None:
    """A batch as the store forms it takes the C paths: no reference is called."""
    handed: list[str] = []

    def spy(name: str) -> Any:
        ref = getattr(sqlite_store, f"_py_{name}")
        return lambda *a: handed.append(name) or ref(*a)

    fp = FINGERPRINTS[0]
    completion = _contract.new_completion(_contract.Completion, (True, b"\x01", None, 10.0, 64))
    claim = Op(sqlite_store._CLAIM, ("c", "new", fp, 5.0))
    claim.result = _CLAIMED_RESULT
    ops = [claim, Op(sqlite_store._COMPLETE, ("c", "held", 7, completion))]
    held = {("c", "held"): (7, fp)}
    speedups.configure_held(
        split_held=spy("split_held"), held_params=spy("held_params"),
        held_records=spy("held_records"), note_held=spy("note_held"),
        release=sqlite_store._RELEASE, held_max=sqlite_store._HELD_MAX,
    )  # fmt: skip
    try:
        mine, rest = speedups.split_held(ops, held)
        assert (mine, rest) == ([ops[1]], [ops[0]])
        [row] = speedups.held_params(mine, held, 2.0)
        assert row[0] == 12.0 and row[3:6] == ("c", "held", 7) and row[6] == bytearray(fp)
        speedups.held_records(mine, held, 2.0)
        assert ops[1].result == Record(COMPLETED, fp, 7, 12.0, True, b"\x01")
        speedups.note_held(ops, held)
        assert held == {("c", "new"): (4, FINGERPRINTS[0])}
    finally:
        _configure_held(sqlite_store._HELD_MAX)
    assert handed == []


# --------------------------------------------------------------- the RPC request's parse

# Requests near every edge parse() checks, most of them well formed: the kinds, msgids
# and attempts at the uint32 bounds, bools where ints go, a raw (bytes) method name, keys
# and callers at and past their lengths, a non-ASCII caller, negative and huge
# timeouts, nil fields; and some messages that are no request at all.
_EDGE_INTS = st.sampled_from([0, 1, 2, -1, 2**32 - 1, 2**32, 2**64, -(2**64), True, False])


def _mostly(good: st.SearchStrategy[Any], other: st.SearchStrategy[Any]) -> Any:
    """``good`` three times in four: the fast path must see many requests it takes."""
    return st.one_of(good, good, good, other)


_uint32 = st.one_of(st.integers(0, 2**32 - 1), st.sampled_from([0, 1, 2**32 - 1]))
_scalars = st.one_of(
    st.none(), _EDGE_INTS, st.integers(), st.floats(allow_nan=False), st.text(max_size=3),
    st.binary(max_size=3),
)  # fmt: skip
_texts = _mostly(
    st.one_of(st.sampled_from(["k", "k" * 255, "c" * 255]), st.text("ab-", max_size=4)),
    st.sampled_from(["é", "ü" * 128, "k" * 256, "c" * 256, "", None, b"k", 1, True]),
)
_meta_values = {
    "key": _texts,
    "caller": _texts,
    "timeout": _mostly(
        st.integers(0, 10**6), st.sampled_from([None, 1.5, "1", -1, True, 2**70, -(2**70)])
    ),
    "attempt": _mostly(_uint32.filter(bool), st.sampled_from([None, 0, 2**32, 1.0, "1", True])),
}
_metas = _mostly(
    st.fixed_dictionaries({}, optional=_meta_values),
    st.one_of(
        st.fixed_dictionaries({}, optional={**_meta_values, "other": _scalars, b"key": _scalars}),
        st.sampled_from([None, [], "meta", 1]),
    ),
)
_requests = st.tuples(
    _mostly(st.just(0), _EDGE_INTS),
    _mostly(_uint32, _EDGE_INTS),
    _mostly(st.sampled_from(["echo", "", "é"]), st.sampled_from([b"echo", b"\xff", None, 1])),
    _mostly(st.lists(_scalars, max_size=3), st.sampled_from([(), None, "p"])),
)
_messages = st.one_of(
    _requests.map(list),
    st.tuples(_requests, _metas).map(lambda rm: [*rm[0], rm[1]]),
    st.tuples(_requests, _metas).map(lambda rm: [*rm[0], rm[1]]),
    st.tuples(_requests, _metas, _scalars).map(lambda rm: [*rm[0], rm[1], rm[2]]),
    st.lists(_scalars, max_size=6),
    _scalars,
    _requests,  # a tuple: no list, no request
)


# Well-formed requests whose metadata carries the edges: the fast path's own ground.
_keyed_requests = st.tuples(
    _uint32, st.sampled_from(["echo", "", "é"]), st.lists(_scalars, max_size=3),
    st.fixed_dictionaries({}, optional=_meta_values),
).map(lambda r: [0, *r])  # fmt: skip


@settings(max_examples=1500)
@given(st.one_of(_messages, _keyed_requests))
@example([0, 1, "m", [], {"attempt": 0}])
@example([0, 1, "m", [], {"attempt": 2**32}])
@example([0, 1, "m", [], {"attempt": 2**32 - 1}])
@example([0, 1, "m", [], {"attempt": True}])
@example([0, 1, "m", [], {"attempt": None}])
@example([0, 1, "m", [], {"key": "k" * 256}])
@example([0, 1, "m", [], {"key": "k" * 255}])
@example([0, 1, "m", [], {"key": b"k"}])
@example([0, 1, "m", [], {"caller": "é"}])
@example([0, 1, "m", [], {"caller": "c" * 256}])
@example([0, 1, "m", [], {"timeout": -1}])
@example([0, 1, "m", [], {"timeout": 2**70}])
@example([0, 1, "m", [], {"timeout": -(2**70)}])
@example([0, 1, "m", [], {"timeout": True}])
@example([0, 1, "m", [], {"timeout": 0}])
@example([True, 1, "m", []])
@example([0, True, "m", []])
@example([0, 2**32, "m", []])
@example([0, 1, b"m", []])
@example([0, 1, "m", ()])
def test_parse_request_matches_the_reference(obj: Any) -> None:
    """parse_request answers a request exactly as parse() does (the same Request, its
    fields the same objects' types), or None, and then only where parse() refuses the
    message or it is no request, or parse() must read the method name or the caller."""
    from idempotency.rpc import _protocol  # noqa: PLC0415

    fast = speedups.parse_request(obj)
    reference = outcome_of(_protocol.parse, obj)
    if fast is None:
        if reference[0] == "value" and reference[1][0] is _protocol.Request:
            msg = reference[1][1]
            # Left to parse(): a raw (bytes) method name, a caller that is not ASCII.
            raw_method = type(obj[2]) is bytes
            caller = msg.meta.caller if msg.meta is not None else None
            assert raw_method or (caller is not None and not caller.isascii()), obj
        return
    assert reference[0] == "value", (obj, reference)
    msg = reference[1][1]
    assert type(fast) is _protocol.Request and fast == msg
    assert [type(x) for x in (fast.msgid, fast.method, fast.params)] == [
        type(x) for x in (msg.msgid, msg.method, msg.params)
    ]
    if msg.meta is None:
        assert fast.meta is None
    else:
        assert type(fast.meta) is _protocol.CallMeta
        assert (fast.meta.key, fast.meta.caller, fast.meta.timeout_ms, fast.meta.attempt) == (
            msg.meta.key, msg.meta.caller, msg.meta.timeout_ms, msg.meta.attempt,
        )  # fmt: skip


def test_parse_request_answers_the_common_requests() -> None:
    """The fast path is taken, not only allowed: a plain call and a keyed call with
    every metadata field."""
    from idempotency.rpc import _protocol  # noqa: PLC0415

    plain = speedups.parse_request([0, 7, "echo", [1, "a"]])
    assert plain == _protocol.Request(7, "echo", [1, "a"], None)
    wire = {"key": "k-1", "caller": "svc", "timeout": 5000, "attempt": 2}
    keyed = speedups.parse_request([0, 2**32 - 1, "transfer", [1, 2, 3], wire])
    meta = _protocol.CallMeta("k-1", "svc", 5000, 2)
    assert keyed == _protocol.Request(2**32 - 1, "transfer", [1, 2, 3], meta)
    assert speedups.parse_request([0, 1, "m", [], None]) == _protocol.Request(1, "m", [], None)
