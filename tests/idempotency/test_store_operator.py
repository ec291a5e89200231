"""The operator's store methods (``inspect``, ``forget``; ``sweep`` is in the contract
suite), run unchanged against every store (the ``kit`` fixture): real SQLite files, a
real redis-server and a real PostgreSQL cluster."""

from __future__ import annotations

import sqlite3
from typing import Any

import msgpack
import pytest

import gosim
from idempotency import (
    ApplicationError,
    CorruptedRecord,
    Idempotency,
    InProgress,
    SQLiteStore,
    StaleClaim,
)
from idempotency._keys import fingerprint
from idempotency._outcome import encode_result
from idempotency._record import COMPLETED, IN_PROGRESS, ClaimKind
from idempotency.stores import Completion, Store, StoredRecord

LEASE = 100.0
TTL = 1000.0
FP = fingerprint("op", [1])


def done(value: Any) -> Completion:
    return Completion(True, encode_result(value), None, TTL, 1 << 20)


@pytest.fixture
def store(kit: Any, clock: Any) -> Any:
    s = kit.make(clock)
    yield s
    s.close()


def damage(store: Store, caller: str, key: str, how: str = "state") -> None:
    """Write a record the store cannot read back, behind its back."""
    if isinstance(store, SQLiteStore):
        with sqlite3.connect(store.path) as conn:
            conn.execute(
                "INSERT OR REPLACE INTO idempotency_records VALUES (?, ?, 7, ?, 1, 0, 1, NULL)",
                (caller, key, FP),
            )
        return
    if type(store).__name__ == "PostgresStore":
        import psycopg  # noqa: PLC0415 -- needs psycopg

        with psycopg.connect(store.dsn, autocommit=True) as pg:  # type: ignore[attr-defined]
            pg.execute(
                f'INSERT INTO "{store.schema}".idempotency_records'  # type: ignore[attr-defined]
                " VALUES (%s, %s, 7, %s, 1, 0, true, NULL) ON CONFLICT (caller, key)"
                " DO UPDATE SET state = 7, payload = NULL",
                (caller, key, FP),
            )
        return
    from idempotency import RedisStore  # noqa: PLC0415 -- needs redis-py

    assert isinstance(store, RedisStore)
    rkey = store.record_key(caller, key)
    store.client.delete(rkey)
    if how == "type":
        store.client.set(rkey, b"not a hash")
    else:
        store.client.hset(rkey, mapping={"s": 7, "fp": FP, "f": 1, "x": 1})


def test_inspect_shows_each_state_and_changes_nothing(store: Store, clock: Any) -> None:
    async def main() -> None:
        assert await store.inspect("c", "k") is None
        res = await store.claim("c", "k", FP, LEASE)
        assert res.kind is ClaimKind.CLAIMED
        seen = await store.inspect("c", "k")
        assert isinstance(seen, StoredRecord) and seen.state == "IN_PROGRESS"
        assert (seen.caller, seen.key, seen.problem) == ("c", "k", None)
        assert seen.record is not None and seen.record.state == IN_PROGRESS
        assert seen.record.fingerprint == FP and seen.record.fence == res.record.fence
        assert seen.record.expires_at == pytest.approx(clock.t + LEASE, abs=0.002)
        assert seen.now == pytest.approx(clock.t, abs=0.002)
        # Inspecting took nothing: the holder completes.
        rec = await store.complete("c", "k", res.record.fence, done({"n": 1}))
        seen = await store.inspect("c", "k")
        assert seen is not None and seen.state == "COMPLETED" and seen.record is not None
        assert seen.record.state == COMPLETED and seen.record.ok
        assert msgpack.unpackb(seen.record.payload) == {"n": 1}
        assert seen.record.fence == rec.fence
        clock.advance(TTL + 1)
        seen = await store.inspect("c", "k")
        assert await store.get("c", "k") is None  # expired: absent to the protocol
        # Kept until swept (on Redis, until the server's own clock passes its TTL).
        assert seen is not None and seen.state == "EXPIRED" and seen.record is not None
        assert await store.sweep() == 1
        assert await store.inspect("c", "k") is None

    gosim.run(main)


def test_an_error_outcome_is_inspected_as_recorded(store: Store) -> None:
    async def refuse(call: Any) -> Any:
        raise ApplicationError("no", "refused", {"why": 1})

    async def main() -> None:
        idem = Idempotency(store, ttl=TTL, lease=LEASE)
        out = await idem.run(caller="c", key="k", request=("op", [1]), handler=refuse)
        assert isinstance(out.error, ApplicationError)
        seen = await store.inspect("c", "k")
        assert seen is not None and seen.record is not None and not seen.record.ok
        assert msgpack.unpackb(seen.record.payload) == ["no", "refused", {"why": 1}]

    gosim.run(main)


def test_forget_refuses_a_live_claim_unless_forced(store: Store) -> None:
    async def main() -> None:
        res = await store.claim("c", "k", FP, LEASE)
        with pytest.raises(InProgress, match="'k' of caller 'c' is in progress"):
            await store.forget("c", "k")
        again = await store.claim("c", "k", FP, LEASE)  # kept: still held
        assert again.kind is ClaimKind.BUSY
        gone = await store.forget("c", "k", force=True)
        assert gone is not None and gone.state == "IN_PROGRESS"
        assert gone.record is not None and gone.record.fence == res.record.fence
        assert await store.inspect("c", "k") is None
        # The key is new: a new claim with a higher token; the old holder is stale.
        new = await store.claim("c", "k", FP, LEASE)
        assert new.kind is ClaimKind.CLAIMED and new.record.fence > res.record.fence
        with pytest.raises(StaleClaim):
            await store.complete("c", "k", res.record.fence, done(1))
        assert await store.forget("c", "absent") is None

    gosim.run(main)


def test_forget_deletes_completed_and_lapsed_records_without_force(
    store: Store, clock: Any
) -> None:
    async def handler(call: Any) -> int:
        fence: int = call.fence
        return fence

    async def main() -> None:
        idem = Idempotency(store, ttl=TTL, lease=LEASE)
        first = await idem.run(caller="c", key="done", request=("op", [1]), handler=handler)
        gone = await store.forget("c", "done")
        assert gone is not None and gone.state == "COMPLETED"
        again = await idem.run(caller="c", key="done", request=("op", [1]), handler=handler)
        assert not again.replayed and again.fence > first.fence  # it ran again
        await store.claim("c", "lapsed", FP, LEASE)
        clock.advance(LEASE + 1)
        gone = await store.forget("c", "lapsed")
        assert gone is not None and gone.state == "EXPIRED"
        assert await store.inspect("c", "lapsed") is None

    gosim.run(main)


def test_a_damaged_record_is_shown_and_can_be_forgotten(store: Store, kit: Any) -> None:
    if kit.kind == "memory":
        pytest.skip("MemoryStore keeps Python records: nothing can damage them")
    hows = ["state", "type"] if kit.kind == "redis" else ["state"]

    async def main() -> None:
        for how in hows:
            damage(store, "c", "k", how)
            with pytest.raises(CorruptedRecord):
                await store.claim("c", "k", FP, LEASE)
            seen = await store.inspect("c", "k")
            assert seen is not None and seen.state == "CORRUPTED" and seen.record is None
            assert seen.problem is not None and "'k'" in seen.problem
            assert ("not 1 or 2" if how == "state" else "not hold a hash") in seen.problem
            gone = await store.forget("c", "k")  # no force needed: nothing can hold it
            assert gone is not None and gone.state == "CORRUPTED"
            assert await store.inspect("c", "k") is None
            res = await store.claim("c", "k", FP, LEASE)
            assert res.kind is ClaimKind.CLAIMED
            await store.forget("c", "k", force=True)

    gosim.run(main)
