"""Keys, callers and fingerprints: boundaries, canonical encoding, clear errors."""

from __future__ import annotations

import collections
import enum
import hashlib
import random
import struct
import types
from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from idempotency import (
    InvalidKey,
    InvalidRequest,
    _keys,
    fingerprint,
    validate_caller,
    validate_key,
)
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


# ------------------------------------------------------------ str subclasses, odd types


class Tricky(str):
    """A str subclass whose own methods lie: validation must look at the characters."""

    def __str__(self) -> str:
        return "not-me"

    def __len__(self) -> int:
        return 1

    def isprintable(self) -> bool:
        return True

    def isascii(self) -> bool:
        return True

    def __iter__(self) -> Any:
        return iter(())


class Colour(enum.StrEnum):
    RED = "red"
    BAD = "tab\there"


class Level(enum.IntEnum):
    ONE = 1


class Plain(str):
    pass


def test_str_subclass_keys_and_callers_are_the_str_they_hold() -> None:
    for value in [Colour.RED, Plain("k-1"), Tricky("abc")]:
        for validate in (validate_key, validate_caller):
            got = validate(value)
            assert type(got) is str and got == str.__str__(value), (validate, value)


def test_str_subclass_with_bad_contents_is_invalid_key_not_a_leak() -> None:
    with pytest.raises(InvalidKey, match=r"contains '\\t' at index 3"):
        validate_key(Colour.BAD)
    with pytest.raises(InvalidKey, match="unprintable"):
        validate_caller(Colour.BAD)
    with pytest.raises(InvalidKey, match="empty"):
        validate_key(Tricky(""))  # its __len__ says 1
    with pytest.raises(InvalidKey, match="256 characters long"):
        validate_key(Tricky("k" * 256))
    with pytest.raises(InvalidKey, match="index 1"):
        validate_key(Tricky("aé"))  # its isascii says True


@given(st.text(max_size=300))
def test_a_str_subclass_validates_as_its_str(text: str) -> None:
    def answer(fn: Any, value: Any) -> tuple[str, Any]:
        try:
            got = fn(value)
        except InvalidKey as exc:
            return ("raised", str(exc))
        return ("value", (type(got), got))

    for fn in (validate_key, validate_caller):
        assert answer(fn, Plain(text)) == answer(fn, text)
        assert answer(fn, Tricky(text)) == answer(fn, text)


class Bin(bytes):
    pass


@pytest.mark.parametrize("bad", [Bin(b"key"), bytearray(b"key"), Level.ONE, True])
def test_non_str_keys_of_every_kind_are_invalid_key(bad: Any) -> None:
    with pytest.raises(InvalidKey, match="must be a str"):
        validate_key(bad)
    with pytest.raises(InvalidKey, match="must be a str"):
        validate_caller(bad)


def test_a_str_subclass_operation_is_its_str() -> None:
    class Op(enum.StrEnum):
        TRANSFER = "transfer"
        EMPTY = ""

    assert fingerprint(Op.TRANSFER, [1]) == fingerprint("transfer", [1])
    assert fingerprint(Tricky("op"), [1]) == fingerprint("op", [1])
    with pytest.raises(InvalidRequest, match="non-empty str"):
        fingerprint(Op.EMPTY, [1])


def test_scalar_subclasses_in_arguments_are_their_msgpack_value() -> None:
    class F(float):
        pass

    same = [
        (["red", 1, 1.5, b"x"], [Colour.RED, Level.ONE, F(1.5), Bin(b"x")]),
        ([b"x"], [bytearray(b"x")]),
        ([b"x"], [memoryview(b"x")]),
        ({"red": 1}, {Colour.RED: Level.ONE}),
        ({"k": "red"}, {Plain("k"): Tricky("red")}),
    ]
    for a, b in same:
        assert fingerprint("op", a) == fingerprint("op", b), (a, b)
    differ = [([1], [True]), ([1], [1.0]), ([0.0], [-0.0]), (["x"], [b"x"]), ({1: 0}, {1.0: 0})]
    for a, b in differ:
        assert fingerprint("op", a) != fingerprint("op", b), (a, b)


# ------------------------------------------------------------ maps, arrays and other types


class MyDict(dict[Any, Any]):
    pass


class MyList(list[Any]):
    pass


class Point(NamedTuple):
    x: int
    y: Any


class ReadOnly(Mapping[Any, Any]):
    """A Mapping that is not a dict."""

    def __init__(self, items: list[tuple[Any, Any]]) -> None:
        self._items = items

    def __getitem__(self, k: Any) -> Any:
        for key, v in self._items:
            if key == k:
                return v
        raise KeyError(k)

    def __iter__(self) -> Iterator[Any]:
        return iter([k for k, _ in self._items])

    def __len__(self) -> int:
        return len(self._items)


def test_every_mapping_is_a_sorted_map() -> None:
    plain = fingerprint("op", {"a": 1, "b": [2, {"y": 1, "x": 2}]})
    inner = collections.OrderedDict([("x", 2), ("y", 1)])
    variants: list[Any] = [
        {"b": [2, {"x": 2, "y": 1}], "a": 1},
        collections.OrderedDict([("b", [2, inner]), ("a", 1)]),
        collections.defaultdict(int, [("b", (2, MyDict(x=2, y=1))), ("a", 1)]),
        MyDict([("b", MyList([2, {"y": 1, "x": 2}])), ("a", 1)]),
        types.MappingProxyType({"b": [2, inner], "a": 1}),
        ReadOnly([("b", [2, ReadOnly([("y", 1), ("x", 2)])]), ("a", 1)]),
        collections.ChainMap({"b": [2, {"x": 2, "y": 1}]}, {"a": 1}),
    ]
    for v in variants:
        assert fingerprint("op", v) == plain, v
    # A map nested in a list or tuple subclass is sorted too.
    assert fingerprint("op", MyList([{"b": 1, "a": 2}])) == fingerprint("op", [{"a": 2, "b": 1}])
    assert fingerprint("op", Point(1, {"b": 1, "a": 2})) == fingerprint("op", [1, {"a": 2, "b": 1}])


def test_arrays_are_ordered_and_one_type() -> None:
    assert fingerprint("op", [1, 2]) == fingerprint("op", (1, 2)) == fingerprint("op", Point(1, 2))
    assert fingerprint("op", MyList([1, 2])) == fingerprint("op", [1, 2])
    assert fingerprint("op", [1, 2]) != fingerprint("op", [2, 1])
    assert fingerprint("op", []) != fingerprint("op", {})


@pytest.mark.parametrize(
    "bad",
    [collections.deque([1]), range(2), {1, 2}, frozenset({1}), (x for x in [1]), iter([1])],
    ids=["deque", "range", "set", "frozenset", "generator", "iterator"],
)
def test_other_containers_are_invalid_requests(bad: Any) -> None:
    with pytest.raises(InvalidRequest, match="not msgpack-serialisable"):
        fingerprint("op", [bad])


def test_a_map_whose_keys_encode_alike_is_refused() -> None:
    nan1, nan2 = float("nan"), float("nan")
    with pytest.raises(InvalidRequest, match="two keys that are equal or encode alike"):
        fingerprint("op", {nan1: 1, nan2: 2})
    with pytest.raises(InvalidRequest, match="two keys"):
        fingerprint("op", ReadOnly([(1, "a"), (True, "b")]))  # equal in Python


# The documented rule as a model: two requests are the same exactly when their models
# are equal. Maps are sets of entries; arrays are tuples; scalars keep their msgpack type
# (floats by their bits).
def model(v: Any) -> Any:
    if v is None:
        return ("nil",)
    if isinstance(v, bool):
        return ("bool", bool(v))
    if isinstance(v, int):
        return ("int", int(v))
    if isinstance(v, float):
        return ("float", struct.pack(">d", v))
    if isinstance(v, str):
        return ("str", str.__str__(v))
    if isinstance(v, (bytes, bytearray, memoryview)):
        return ("bin", bytes(v))
    if isinstance(v, Mapping):
        return ("map", frozenset((model(k), model(x)) for k, x in v.items()))
    assert isinstance(v, (list, tuple))
    return ("array", tuple(model(x) for x in v))


plain_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-3, 3)
    | st.integers(-(2**63), 2**64 - 1)
    | st.sampled_from([0.0, -0.0, 1.0, 2.5, float("nan"), float("inf")])
    | st.floats()
    | st.text(max_size=3)
    | st.binary(max_size=3)
)
map_keys = st.text(max_size=2) | st.integers(0, 3) | st.binary(max_size=1)
plain_values = st.recursive(
    plain_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(map_keys, inner, max_size=4),
    max_leaves=12,
)


def disguise(v: Any, data: st.DataObject, as_key: bool = False) -> Any:
    """``v`` in other Python types and another insertion order: the same request."""
    draw = data.draw
    if isinstance(v, dict):
        items = [(disguise(k, data, True), disguise(x, data)) for k, x in v.items()]
        items = draw(st.permutations(items))
        kind = draw(st.sampled_from(["dict", "ordered", "default", "sub", "proxy", "readonly"]))
        if kind == "ordered":
            return collections.OrderedDict(items)
        if kind == "default":
            return collections.defaultdict(list, items)
        if kind == "sub":
            return MyDict(items)
        if kind == "proxy":
            return types.MappingProxyType(dict(items))
        if kind == "readonly":
            return ReadOnly(items)
        return dict(items)
    if isinstance(v, list):
        array: Any = draw(st.sampled_from([list, tuple, MyList]))
        return array([disguise(x, data) for x in v])
    if type(v) is str and draw(st.booleans()):
        return draw(st.sampled_from([Plain, Tricky]))(v)
    if type(v) is int and -(2**63) <= v < 2**64 and draw(st.booleans()):
        return IntSub(v)
    if type(v) is bytes and draw(st.booleans()):
        return Bin(v) if as_key else draw(st.sampled_from([Bin, bytearray, memoryview]))(v)
    return v


class IntSub(int):
    pass


def mutate(v: Any, data: st.DataObject) -> Any:
    """``v`` with one part maybe changed in type or value (1 -> 1.0, str -> bytes, ...)."""
    if isinstance(v, dict) and v and data.draw(st.booleans()):
        k = data.draw(st.sampled_from(sorted(v, key=repr)))
        return {**v, k: mutate(v[k], data)}
    if isinstance(v, list) and v and data.draw(st.booleans()):
        i = data.draw(st.integers(0, len(v) - 1))
        return [*v[:i], mutate(v[i], data), *v[i + 1 :]]
    options: list[Any] = [v, None, [v], {"k": v}]
    if type(v) is int and abs(v) < 2**53:
        options += [float(v), bool(v) if v in (0, 1) else v + 1]
    if type(v) is bool:
        options += [int(v), float(v)]
    if type(v) is float and v == v:
        options += [-v, int(v) if abs(v) < 2**63 else 0]
    if type(v) is str:
        options += [v.encode(), v + "x"]
    if type(v) is bytes:
        options += [v.decode("latin-1")]
    return data.draw(st.sampled_from(options))


FINGERPRINTS = [fingerprint]
if _keys._py_fingerprint is not fingerprint:  # the C twin is in use: check the reference too
    FINGERPRINTS.append(_keys._py_fingerprint)


@settings(max_examples=300)
@given(plain_values, st.data())
def test_equal_requests_by_the_rule_have_equal_fingerprints(v: Any, data: st.DataObject) -> None:
    w = disguise(v, data)
    for fp in FINGERPRINTS:
        assert fp("op", w) == fp("op", v)


@settings(max_examples=300)
@given(plain_values, st.data())
def test_requests_differ_exactly_when_the_rule_says(v: Any, data: st.DataObject) -> None:
    w = mutate(v, data)
    if data.draw(st.booleans()):
        w = disguise(w, data)
    for fp in FINGERPRINTS:
        assert (fp("op", v) == fp("op", w)) == (model(v) == model(w)), (v, w)


# Text that UTF-8 cannot encode: a lone surrogate anywhere in it (as a str made by
# decoding bytes with errors="surrogateescape" holds).
unencodable_text = st.builds(
    lambda before, c, after: before + c + after,
    st.text(max_size=8),
    st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF),
    st.text(max_size=8),
)


@settings(max_examples=200)
@given(unencodable_text, st.sampled_from(["operation", "argument", "map key"]))
def test_text_utf8_cannot_encode_is_an_invalid_request(text: str, where: str) -> None:
    """Every path of fingerprint (the C twin's and the reference) answers InvalidRequest,
    whether the surrogate is in the operation, an argument or a map's key."""
    op, args = {
        "operation": (text, [1]),
        "argument": ("op", [1, text]),
        "map key": ("op", [{text: 1}]),
    }[where]
    for fp in FINGERPRINTS:
        with pytest.raises(InvalidRequest, match=r"cannot be encoded|not msgpack-serialisable"):
            fp(op, args)
