"""The C twins of idempotency/_speedups.c against their Python references.

Every twin must answer exactly what its reference answers: the same result (types of the
record's fields included) or the same exception with the same message. Hypothesis draws
the inputs, bad ones included; the suite's other tests then run on the twins, and CI
runs everything once more with GOSIM_PURE_PYTHON=1, on the references alone.
"""

from __future__ import annotations

import collections
import hashlib
import types
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from idempotency import _keys, _record
from idempotency._accel import speedups
from idempotency._errors import InvalidRequest
from idempotency._record import COMPLETED, IN_PROGRESS, Record
from idempotency.stores import _contract, memory

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
    import gc  # noqa: PLC0415
    import sys  # noqa: PLC0415
    import tracemalloc  # noqa: PLC0415

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

    work(500)  # caches warm (the prefix cache, hypothesis-free)
    gc.collect()
    refs = sys.getrefcount(fp)
    tracemalloc.start()
    try:
        work(3000)
        gc.collect()
        live = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert sys.getrefcount(fp) == refs
    assert live < 64 * 1024, f"{live} bytes still live after the calls"
