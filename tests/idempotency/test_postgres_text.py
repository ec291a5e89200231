"""PostgresStore's batches send their data as escaped literals and read rows back as
text: any caller, key and payload must come back exactly as written, whatever the
session's own settings for strings, blobs and floats, and a value the server refuses
must fail its own operation only."""

from __future__ import annotations

import itertools
import math
import time
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import gosim
from idempotency import InvalidRequest
from idempotency._keys import fingerprint
from idempotency._record import ClaimKind, Record
from idempotency.stores import Completion

from ._concurrently import gather

psycopg = pytest.importorskip("psycopg", reason="PostgresStore needs psycopg 3")

from psycopg.conninfo import make_conninfo  # noqa: E402

from idempotency import PostgresStore  # noqa: E402

# Text PostgreSQL stores (no NUL), with what a literal could trip on weighted in.
_TEXT = st.text(
    st.one_of(
        st.sampled_from("'\\\";%s$-\n\t{}[],:é€😀"),
        st.characters(exclude_characters="\x00", exclude_categories=("Cs",)),
    ),
    max_size=24,
)
# A session whose own settings would mangle literals and text results if the store
# relied on them: backslashes as escapes in '...', blobs in escape format, floats with
# 3 digits.
_HOSTILE = "-c standard_conforming_strings=off -c bytea_output=escape -c extra_float_digits=-12"
_PICKED = itertools.count()


@pytest.fixture(scope="module", params=["default session", "hostile session"])
def store(request: Any, postgres_server: Any) -> Any:
    dsn = postgres_server.dsn
    if request.param == "hostile session":
        dsn = make_conninfo(dsn, options=_HOSTILE)
    # A clock with a fraction no short decimal gives: a float that loses digits shows.
    s = PostgresStore(dsn, schema=f"lit{time.monotonic_ns()}", clock=lambda: math.pi * 1e8)
    yield s
    s.close()


def _round_trip(store: PostgresStore, caller: str, keys: list[str], payloads: list[bytes]) -> None:
    """Claim every key in one batch, complete them in one batch, read them back: each
    answer is the key's own, and what is read is what was written."""
    fp = fingerprint("op", [caller])

    async def main() -> None:
        claimed = await gather([lambda k=k: store.claim(caller, k, fp, 61.7) for k in keys])
        fences = []
        for res in claimed:
            assert not isinstance(res, Exception), res
            assert res.kind is ClaimKind.CLAIMED
            fences.append(res.record.fence)
        assert len(set(fences)) == len(keys)
        done = await gather(
            [
                lambda k=k, f=f, p=p: store.complete(
                    caller, k, f, Completion(True, p, None, 3600.25, 1 << 20)
                )
                for k, f, p in zip(keys, fences, payloads, strict=True)
            ]
        )
        got = await gather([lambda k=k: store.get(caller, k) for k in keys])
        for k, f, p, d, g in zip(keys, fences, payloads, done, got, strict=True):
            want = Record(2, fp, f, math.pi * 1e8 + 3600.25, True, p)
            assert d == want, (k, d)
            assert g == want, (k, g)
            seen = await store.inspect(caller, k)
            assert seen is not None and seen.record == want and seen.key == k
        # The operator's forget finds and deletes the very row.
        gone = await store.forget(caller, keys[0])
        assert gone is not None and gone.key == keys[0] and gone.record == got[0]
        assert await store.get(caller, keys[0]) is None
        assert await store.inspect(caller, keys[-1]) is not None or len(keys) == 1

    gosim.run(main)


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    caller=_TEXT,
    keys=st.lists(_TEXT, min_size=1, max_size=12, unique=True),
    payload=st.binary(max_size=64),
)
@example(caller="'", keys=["\\", "'; DROP TABLE x; --", "%s", "$$", "E'\\\\'"], payload=b"\\x00'")
@example(caller="c", keys=["é€😀", "{}", "\\x41"], payload=b"")
def test_any_text_and_bytes_come_back_as_written(
    store: PostgresStore, caller: str, keys: list[str], payload: bytes
) -> None:
    # A caller of its own for each example: keys drawn again meet no earlier record.
    caller = f"{next(_PICKED)}:{caller}"
    payloads = [payload + bytes([i]) for i in range(len(keys))]
    _round_trip(store, caller, keys, payloads)


def test_a_key_the_server_refuses_fails_alone(store: PostgresStore) -> None:
    """A NUL (PostgreSQL text cannot hold one) in one key of a batch: that claim fails,
    the others in its batch are claimed."""
    caller = f"{next(_PICKED)}:nul"
    fp = fingerprint("op", [])
    keys = ["a", "b\x00c", "d"]

    async def main() -> list[Any]:
        return await gather([lambda k=k: store.claim(caller, k, fp, 60.0) for k in keys])

    first, bad, last = gosim.run(main)
    assert first.kind is ClaimKind.CLAIMED and last.kind is ClaimKind.CLAIMED
    assert isinstance(bad, InvalidRequest), bad  # the library's error, naming the call
    assert repr("b\x00c") in str(bad) and "SQLSTATE 22P05" in str(bad)
