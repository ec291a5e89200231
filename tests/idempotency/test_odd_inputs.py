"""Odd but legal inputs through ``Idempotency.run`` on every store: str subclasses as
keys, callers and operations, mappings of other types and orders, numbers of other
types. Each is the request the documented rule says it is (``idempotency._keys``), or
is refused with the documented error; never an internal exception."""

from __future__ import annotations

import collections
import enum
import types
from typing import Any

import pytest

import gosim
from idempotency import Call, Idempotency, InvalidKey, InvalidRequest, KeyReused
from idempotency.stores import Store


class Tenant(enum.StrEnum):
    ACME = "acme"


class Key(str):
    """A str subclass whose __str__ (and so its f-string form) is not its value."""

    def __str__(self) -> str:
        return "something-else"


class Op(enum.StrEnum):
    TRANSFER = "transfer"


class Cents(enum.IntEnum):
    HUNDRED = 100


class Sub(dict[str, Any]):
    pass


class Runs:
    def __init__(self) -> None:
        self.calls: list[Call] = []

    async def __call__(self, call: Call) -> Any:
        self.calls.append(call)
        return len(self.calls)


@pytest.fixture
def store(kit: Any, clock: Any) -> Any:
    s = kit.make(clock)
    yield s
    s.close()


def test_str_subclass_key_and_caller_are_stored_as_the_plain_str(store: Store) -> None:
    h = Runs()

    async def main() -> None:
        idem = Idempotency(store)
        first = await idem.run(
            caller=Tenant.ACME, key=Key("k-1"), request=(Op.TRANSFER, [1]), handler=h
        )
        assert type(h.calls[0].key) is str and h.calls[0].key == "k-1"
        assert type(h.calls[0].caller) is str and h.calls[0].caller == "acme"
        # The record is the plain strs' record: a retry in plain strs replays it.
        again = await idem.run(caller="acme", key="k-1", request=("transfer", [1]), handler=h)
        assert again.replayed and again.value == first.value == 1 and len(h.calls) == 1
        rec = await store.get("acme", "k-1")
        assert rec is not None and rec.fence == first.fence

    gosim.run(main)


def test_str_subclass_with_a_bad_character_is_invalid_key(store: Store) -> None:
    class Bad(enum.StrEnum):
        TAB = "a\tb"

    async def main() -> None:
        idem = Idempotency(store)
        with pytest.raises(InvalidKey, match="index 1"):
            await idem.run(caller="c", key=Bad.TAB, request=("op", []), handler=Runs())
        with pytest.raises(InvalidKey, match="unprintable"):
            await idem.run(caller=Bad.TAB, key="k", request=("op", []), handler=Runs())

    gosim.run(main)


def test_an_equal_mapping_of_another_type_or_order_replays(store: Store) -> None:
    h = Runs()
    args = {"to": "bob", "amount": 5, "meta": {"a": 1, "b": 2}}
    same: list[Any] = [
        collections.OrderedDict([("meta", {"b": 2, "a": 1}), ("amount", 5), ("to", "bob")]),
        collections.defaultdict(int, [("amount", 5), ("to", "bob"), ("meta", {"b": 2, "a": 1})]),
        types.MappingProxyType(
            {"meta": collections.OrderedDict(b=2, a=1), "to": "bob", "amount": 5}
        ),
        Sub(meta=Sub(b=2, a=1), amount=5, to="bob"),
    ]

    async def main() -> None:
        idem = Idempotency(store)
        first = await idem.run(caller="c", key="k", request=("pay", args), handler=h)
        for other in same:
            again = await idem.run(caller="c", key="k", request=("pay", other), handler=h)
            assert again.replayed and again.fence == first.fence, other
        assert len(h.calls) == 1

    gosim.run(main)


def test_int_and_float_are_different_requests_and_enums_are_their_values(store: Store) -> None:
    h = Runs()

    async def main() -> None:
        idem = Idempotency(store)
        await idem.run(caller="c", key="k", request=("pay", [100]), handler=h)
        for other in ([100.0], [True], ["100"]):
            with pytest.raises(KeyReused):
                await idem.run(caller="c", key="k", request=("pay", other), handler=h)
        again = await idem.run(caller="c", key="k", request=("pay", (Cents.HUNDRED,)), handler=h)
        assert again.replayed and len(h.calls) == 1

    gosim.run(main)


def test_containers_without_a_msgpack_form_are_invalid_requests(store: Store) -> None:
    async def main() -> None:
        idem = Idempotency(store)
        for bad in ({1, 2}, collections.deque([1]), range(3)):
            with pytest.raises(InvalidRequest, match="not msgpack-serialisable"):
                await idem.run(caller="c", key="k", request=("op", [bad]), handler=Runs())
        assert await store.get("c", "k") is None

    gosim.run(main)
