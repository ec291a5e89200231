"""Keys, callers and fingerprints: boundaries, canonical encoding, clear errors."""

from __future__ import annotations

import hashlib
import random
from typing import Any

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from idempotency import InvalidKey, InvalidRequest, fingerprint, validate_caller, validate_key
from idempotency._keys import canonical_packb


def test_key_length_boundaries() -> None:
    assert validate_key("a") == "a"
    assert validate_key("k" * 255) == "k" * 255
    with pytest.raises(InvalidKey, match="256 characters long; at most 255"):
        validate_key("k" * 256)
    with pytest.raises(InvalidKey, match="empty"):
        validate_key("")


def test_key_printable_ascii_only() -> None:
    assert validate_key(" ~!") == " ~!"
    assert validate_key("8e03978e-40d5-43e8-bc93-6894a57f9324")
    for bad, at in [("ab\ncd", 2), ("é", 0), ("x\x7f", 1), ("\x00", 0), ("ok\u2028", 2)]:
        with pytest.raises(InvalidKey, match=f"at index {at}"):
            validate_key(bad)


@pytest.mark.parametrize("bad", [None, 1, b"key", ["k"]])
def test_key_must_be_str(bad: Any) -> None:
    with pytest.raises(InvalidKey, match="must be a str"):
        validate_key(bad)
    with pytest.raises(InvalidKey, match="must be a str"):
        validate_caller(bad)


def test_invalid_key_is_a_value_error() -> None:
    assert issubclass(InvalidKey, ValueError)
    assert issubclass(InvalidRequest, TypeError)


def test_caller_rules() -> None:
    assert validate_caller("Zoë-7") == "Zoë-7"  # any printable script
    assert validate_caller("c" * 255)
    with pytest.raises(InvalidKey, match="at most 255"):
        validate_caller("c" * 256)
    with pytest.raises(InvalidKey, match="empty"):
        validate_caller("")
    with pytest.raises(InvalidKey, match="unprintable"):
        validate_caller("a\tb")


def test_fingerprint_distinguishes_what_msgpack_distinguishes() -> None:
    base = fingerprint("op", [1, "a"])
    assert len(base) == 32
    assert fingerprint("op", (1, "a")) == base  # msgpack has one array type
    for other in [
        ("op", [1, b"a"]),
        ("op", [True, "a"]),
        ("op", [1.0, "a"]),
        ("op2", [1, "a"]),
        ("op", [1, "a", None]),
    ]:
        assert fingerprint(*other) != base, other


def test_fingerprint_is_canonical_for_maps() -> None:
    a = fingerprint("op", {"b": 1, "a": {"y": 2, "x": [3, {"q": 1, "p": 2}]}})
    b = fingerprint("op", {"a": {"x": [3, {"p": 2, "q": 1}], "y": 2}, "b": 1})
    assert a == b
    assert fingerprint("op", {1: "x", "1": "y"}) == fingerprint("op", {"1": "y", 1: "x"})


scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.text(max_size=5)
    | st.binary(max_size=5)
    | st.floats(allow_nan=False)
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.text(max_size=3) | st.integers(0, 9), inner, max_size=4)
    ),
    max_leaves=20,
)


def _shuffled(v: Any, rnd: random.Random) -> Any:
    if isinstance(v, dict):
        items = list(v.items())
        rnd.shuffle(items)
        return {k: _shuffled(x, rnd) for k, x in items}
    if isinstance(v, list):
        return [_shuffled(x, rnd) for x in v]
    return v


@given(values, st.integers(0, 2**32))
def test_fingerprint_ignores_map_order(v: Any, seed: int) -> None:
    assert fingerprint("op", v) == fingerprint("op", _shuffled(v, random.Random(seed)))
    # The canonical form decodes to the same value.
    assert msgpack.unpackb(canonical_packb(v), raw=False, strict_map_key=False) == v


@pytest.mark.parametrize("bad", [{1, 2}, object(), [1, 2**64], {"x": 1j}])
def test_unencodable_arguments_are_invalid_requests(bad: Any) -> None:
    with pytest.raises(InvalidRequest, match="arguments of 'op' are not msgpack-serialisable"):
        fingerprint("op", bad)


@pytest.mark.parametrize("op", ["", None, 3, b"op"])
def test_operation_must_be_a_nonempty_str(op: Any) -> None:
    with pytest.raises(InvalidRequest, match="operation must be a non-empty str"):
        fingerprint(op, [])


def test_argument_size_limit_boundary() -> None:
    payload = b"x" * 100
    size = len(msgpack.packb(["op", [payload]], use_bin_type=True))
    assert fingerprint("op", [payload], max_bytes=size)
    with pytest.raises(InvalidRequest, match=f"encode to {size} bytes; the limit is {size - 1}"):
        fingerprint("op", [payload], max_bytes=size - 1)


@given(st.text(min_size=1, max_size=40), values)
def test_fingerprint_is_the_sha256_of_the_canonical_request(op: str, v: Any) -> None:
    # The definition records are stored under: a change of encoding or hash must keep
    # it, or every stored key would answer KeyReused to its own retry.
    assert fingerprint(op, v) == hashlib.sha256(canonical_packb([op, v])).digest()
    assert fingerprint(op, v) == fingerprint(op, v)  # the second time from the cache
