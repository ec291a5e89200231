"""PostgresStore in databases whose encoding is not UTF-8 (``SQL_ASCII``, ``LATIN1``): a
call whose caller or key the database cannot hold fails alone, with the library's
``InvalidRequest`` naming it, and the calls that shared its batch complete; text the
encoding holds comes back as written."""

from __future__ import annotations

import os
import time
from typing import Any

import pytest

import gosim
from idempotency import InvalidRequest
from idempotency._keys import fingerprint
from idempotency._record import ClaimKind
from idempotency.stores import Completion

from ._concurrently import gather

psycopg = pytest.importorskip("psycopg", reason="PostgresStore needs psycopg 3")

from idempotency import PostgresStore  # noqa: E402

CYRILLIC = "Жора"


@pytest.fixture(scope="module", params=["SQL_ASCII", "LATIN1"])
def encoded_dsn(request: Any, postgres_server: Any) -> str:
    """A database of the cluster whose server encoding is the parameter's."""
    name = f"enc_{request.param.lower()}_{os.getpid()}_{time.monotonic_ns()}"
    postgres_server.sql(
        f"CREATE DATABASE {name} TEMPLATE template0 ENCODING '{request.param}'"
        " LC_COLLATE 'C' LC_CTYPE 'C'"
    )
    return postgres_server.dsn.rsplit("/", 1)[0] + "/" + name


def _batch(dsn: str, callers: list[str], keys: list[str]) -> tuple[list[Any], int]:
    """Claim and complete each (caller, key) at once (their operations share batches);
    what each call ended with, and the store's largest batch."""
    store = PostgresStore(dsn, schema="enc")
    fp = fingerprint("op", [])

    async def one(caller: str, key: str) -> Any:
        claimed = await store.claim(caller, key, fp, 60.0)
        assert claimed.kind is ClaimKind.CLAIMED
        fence = claimed.record.fence
        done = await store.complete(caller, key, fence, Completion(True, b"\x01", None, 3600, 64))
        got = await store.get(caller, key)
        assert got == done
        return got

    async def main() -> list[Any]:
        return await gather(
            [lambda c=c, k=k: one(c, k) for c, k in zip(callers, keys, strict=True)]
        )

    try:
        return gosim.run(main, procs=1), store.statistics().largest_batch
    finally:
        store.close()


def test_a_caller_the_encoding_lacks_fails_alone(encoded_dsn: str) -> None:
    tag = str(time.monotonic_ns())
    callers = ["shop", "shop", CYRILLIC, "shop", "shop"]
    keys = [f"{tag}-{i}" for i in range(len(callers))]
    results, largest = _batch(encoded_dsn, callers, keys)
    assert largest > 1  # the bad call shared a batch
    bad = results[2]
    assert isinstance(bad, InvalidRequest), bad
    assert repr(CYRILLIC) in str(bad) and repr(keys[2]) in str(bad)
    assert "cannot be stored in this database (server encoding" in str(bad)
    for i in (0, 1, 3, 4):
        assert not isinstance(results[i], Exception), results[i]
        assert results[i].state == 2


def test_a_key_the_encoding_lacks_fails_alone_and_held_text_round_trips(encoded_dsn: str) -> None:
    tag = str(time.monotonic_ns())
    # "é" is in LATIN1 (SQL_ASCII holds only ASCII through the store's escapes).
    latin1 = encoded_dsn.rsplit("/", maxsplit=1)[-1].startswith("enc_latin1")
    held = f"{tag}-café" if latin1 else f"{tag}-cafe"
    keys = [f"{tag}-a", f"{tag}-{CYRILLIC}", held]
    results, _ = _batch(encoded_dsn, ["shop"] * 3, keys)
    assert isinstance(results[1], InvalidRequest), results[1]
    assert repr(keys[1]) in str(results[1])
    assert results[0].state == 2 and results[2].state == 2
