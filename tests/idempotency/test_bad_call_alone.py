"""One call never fails its batch-mates: on every store, a batch that mixes calls the
store cannot apply with good calls answers each alone (the store contract's rule).
Real components: a SQLite file, a redis-server process and a PostgreSQL cluster of the
tests' own. ``procs=1``
and goroutines started together put the calls in one batch (checked by the store's
statistics), as concurrent requests of a server would be."""

from __future__ import annotations

import math
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import gosim
from idempotency import (
    CorruptedRecord,
    Idempotency,
    MemoryEffect,
    MemoryStore,
    SQLiteEffect,
    SQLiteStore,
)
from idempotency._keys import fingerprint
from idempotency.stores import Completion, Store
from idempotency.stores._batch import Op

from ._concurrently import gather

GOOD = 8


@pytest.fixture(params=["memory", "sqlite", "redis", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    kind = request.param
    s: Store
    if kind == "memory":
        s = MemoryStore()
    elif kind == "sqlite":
        s = SQLiteStore(tmp_path / "store.db")
    elif kind == "postgres":
        from idempotency import PostgresStore  # noqa: PLC0415 -- needs psycopg

        server = request.getfixturevalue("postgres_server")
        s = PostgresStore(server.dsn, schema=f"alone{time.monotonic_ns()}")
    else:
        from idempotency import RedisStore  # noqa: PLC0415 -- needs redis-py

        server = request.getfixturevalue("redis_server")
        s = RedisStore(server.url, prefix=f"alone{time.monotonic_ns()}:")
    yield s
    s.close()


def _in_one_runtime(main: Any) -> None:
    """One runtime per test: a MemoryStore's clock is its runtime's."""
    gosim.run(main, procs=1)


def test_infinite_and_finite_ttls_share_a_batch(store: Store) -> None:
    """``math.inf`` is accepted as a TTL and a lease on every store (no expiry), and an
    Idempotency with it shares batches with one of a finite TTL."""
    forever = Idempotency(store, ttl=math.inf, lease=math.inf)
    daily = Idempotency(store, ttl=86400.0)

    def call(idem: Idempotency, key: str) -> Any:
        return lambda: idem.run(caller="c", key=key, request=("op", [key]), handler=lambda c: c.key)

    calls = [call(forever if i % 2 else daily, f"k{i}") for i in range(10)]

    async def main() -> None:
        results = await gather(calls)
        assert [r.value for r in results] == [f"k{i}" for i in range(10)], results
        if not isinstance(store, MemoryStore):
            assert store.statistics().largest_batch >= 10  # one batch: else it proves nothing
        for i in range(10):
            rec = await store.get("c", f"k{i}")
            assert rec is not None
            assert (rec.expires_at == math.inf) == bool(i % 2), (i, rec)
        # A claim with an infinite lease never lapses either.
        res = await store.claim("c", "held", fingerprint("op", []), math.inf)
        rec = await store.get("c", "held")
        assert rec is not None and rec.expires_at == math.inf and rec.fence == res.record.fence
        if hasattr(store, "client"):  # Redis: no TTL on the key, a TTL on the finite ones
            assert store.client.pttl(store.record_key("c", "k1")) == -1  # type: ignore[attr-defined]
            assert store.client.pttl(store.record_key("c", "held")) == -1  # type: ignore[attr-defined]
            assert store.client.pttl(store.record_key("c", "k0")) > 0  # type: ignore[attr-defined]

    _in_one_runtime(main)


def test_a_bad_lease_or_ttl_is_refused_naming_its_call(store: Store) -> None:
    async def main() -> None:
        fp = fingerprint("op", [])
        for bad in (float("nan"), 0, -1.0, "60"):
            with pytest.raises(ValueError, match=r"claim of caller 'c', key 'bad'.*lease"):
                await store.claim("c", "bad", fp, bad)  # type: ignore[arg-type]
        res = await store.claim("c", "k", fp, 10.0)
        with pytest.raises(ValueError, match=r"completion of caller 'c', key 'k'.*ttl"):
            await store.complete("c", "k", res.record.fence, Completion(True, b"\xc0", None, -1, 9))
        with pytest.raises(TypeError, match=r"completion of caller 'c', key 'k'.*bytes"):
            await store.complete("c", "k", res.record.fence, Completion(True, None, None, 9, 9))
        with pytest.raises(ValueError, match=r"renewal of caller 'c', key 'k'.*lease"):
            await store.renew("c", "k", res.record.fence, float("nan"))
        assert (await store.get("c", "k")) == res.record  # nothing changed

    if isinstance(store, MemoryStore):
        pytest.skip("MemoryStore has no batch to protect; Idempotency checks ttl and lease")
    _in_one_runtime(main)


def _effects(store: Store) -> tuple[Any, Any, Any]:
    """A counting effect, how to read the count, and bad calls of this store's kind
    that reach its batch (each: a factory and the error it must fail with)."""
    if isinstance(store, MemoryStore):
        box = [0]

        def bump() -> int:
            box[0] += 1
            return box[0]

        def raises() -> int:
            raise RuntimeError("this call's own failure")

        bad: list[Any] = [(MemoryEffect(raises), RuntimeError, "this call's own failure")]
        return (lambda: MemoryEffect(bump)), (lambda: box[0]), bad
    if isinstance(store, SQLiteStore):
        with sqlite3.connect(store.path) as conn:
            conn.executescript(
                "CREATE TABLE n (x INTEGER);"
                "CREATE TABLE parent (id INTEGER PRIMARY KEY);"
                "CREATE TABLE child (pid INTEGER REFERENCES parent (id)"
                " DEFERRABLE INITIALLY DEFERRED);"
            )
        # An application that enforces foreign keys on the store's connection: a
        # deferred one is checked at COMMIT, after every effect of the batch ran.
        store._conn.execute("PRAGMA foreign_keys=ON")  # type: ignore[union-attr]

        def add(conn: sqlite3.Connection) -> int:
            conn.execute("INSERT INTO n VALUES (1)")
            return 1

        def orphan(conn: sqlite3.Connection) -> int:
            conn.execute("INSERT INTO child VALUES (42)")  # no parent 42: fails at COMMIT
            return 1

        def read() -> int:
            with sqlite3.connect(store.path) as conn:
                return int(conn.execute("SELECT count(*) FROM n").fetchone()[0])

        bad = [
            (SQLiteEffect(orphan), sqlite3.IntegrityError, "FOREIGN KEY"),
            (SQLiteEffect(lambda conn: 1 // 0), ZeroDivisionError, "division"),
        ]
        return (lambda: SQLiteEffect(add)), read, bad
    if type(store).__name__ == "PostgresStore":
        return _postgres_effects(store)
    from idempotency import LuaEffect  # noqa: PLC0415

    prefix = store.prefix  # type: ignore[attr-defined]
    bad = [
        (LuaEffect("return redis.call('INCR' KEYS[1])", [prefix + "n"]), RuntimeError,
         "does not compile"),
        (LuaEffect("return redis.call('NOSUCHCOMMAND')", [prefix + "n"]), RuntimeError,
         "LuaEffect failed"),
    ]  # fmt: skip
    return (
        lambda: LuaEffect("return redis.call('INCR', KEYS[1])", [prefix + "n"]),
        lambda: int(store.client.get(prefix + "n") or 0),  # type: ignore[attr-defined]
        bad,
    )


def _postgres_effects(store: Any) -> tuple[Any, Any, Any]:
    import psycopg  # noqa: PLC0415 -- needs psycopg

    from idempotency import PostgresEffect  # noqa: PLC0415

    schema = store.schema
    with psycopg.connect(store.dsn, autocommit=True) as conn:
        conn.execute(
            f"CREATE TABLE {schema}.n (x integer);"
            f"CREATE TABLE {schema}.parent (id integer PRIMARY KEY);"
            f"CREATE TABLE {schema}.child (pid integer REFERENCES {schema}.parent (id)"
            " DEFERRABLE INITIALLY DEFERRED)"
        )

    async def add(conn: Any) -> int:
        await conn.execute("INSERT INTO n VALUES (1)")
        return 1

    async def orphan(conn: Any) -> int:
        await conn.execute("INSERT INTO child VALUES (42)")  # no parent 42: fails at COMMIT
        return 1

    async def divide(conn: Any) -> int:
        return 1 // 0

    async def misspelt(conn: Any) -> int:
        await conn.execute("SELEC 1")
        return 1

    async def swallowed(conn: Any) -> int:
        try:
            await conn.execute("SELECT 1 / 0")
        except psycopg.errors.DivisionByZero:
            pass  # the transaction is failed all the same
        return 1

    def read() -> int:
        with psycopg.connect(store.dsn, autocommit=True) as conn:
            row = conn.execute(f"SELECT count(*) FROM {schema}.n").fetchone()
            assert row is not None
            return int(row[0])

    bad = [
        (PostgresEffect(orphan), psycopg.errors.ForeignKeyViolation, "child"),
        (PostgresEffect(divide), ZeroDivisionError, "division"),
        (PostgresEffect(misspelt), psycopg.errors.SyntaxError, "SELEC"),
        (PostgresEffect(swallowed), RuntimeError, "caught an error of its own SQL"),
    ]  # fmt: skip
    return (lambda: PostgresEffect(add)), read, bad


def test_a_bad_call_fails_alone_and_its_batch_mates_complete(store: Store) -> None:
    idem = Idempotency(store)
    good_effect, read, bad = _effects(store)

    def run(key: str, effect: Any) -> Any:
        return lambda: idem.run(
            caller="c", key=key, request=("op", [key]), handler=lambda call: effect
        )

    calls = [run(f"good{i}", good_effect()) for i in range(GOOD)]
    expect: list[tuple[type[BaseException], str]] = []
    for i, (effect, error, text) in enumerate(bad):
        calls.insert(2 * i + 1, run(f"bad{i}", effect))
        expect.append((error, text))
    if not isinstance(store, MemoryStore):
        # Operations no Idempotency would send, put straight in the batch: a lease the
        # table cannot hold (NaN) and, on Redis, a record that is not a hash.
        fp = fingerprint("op", [])
        nan_claim = Op(0, ("c", "nan", fp, float("nan")))
        calls.append(lambda: store._committer.submit(nan_claim))  # type: ignore[attr-defined]
        if isinstance(store, SQLiteStore):
            expect.append((sqlite3.IntegrityError, "expires_at"))
        elif type(store).__name__ == "PostgresStore":
            import psycopg  # noqa: PLC0415

            expect.append((psycopg.errors.CheckViolation, "expires_at"))
        else:
            expect.append((TypeError, "claim of caller 'c', key 'nan' cannot be sent"))
            store.client.set(store.record_key("c", "str"), "not a hash")  # type: ignore[attr-defined]
            calls.append(lambda: idem.run(caller="c", key="str", request=("op", []),
                                          handler=lambda call: 1))  # fmt: skip
            expect.append((CorruptedRecord, "does not hold a hash"))

    async def main() -> None:
        results = await gather(calls)
        goods = [r for r in results if not isinstance(r, BaseException)]
        errors = [r for r in results if isinstance(r, BaseException)]
        assert len(goods) == GOOD and all(not r.replayed for r in goods), results
        assert read() == GOOD
        assert len(errors) == len(expect), results
        for err, (kind, text) in zip(errors, expect, strict=True):
            assert isinstance(err, kind) and text in str(err), (err, kind, text)
        if not isinstance(store, MemoryStore):
            assert store.statistics().largest_batch >= len(calls)  # they shared a batch
        for i in range(len(bad)):  # the bad calls left nothing held: a retry may run
            assert await store.get("c", f"bad{i}") is None
        again = await idem.run(caller="c", key="good0", request=("op", ["good0"]),
                               handler=lambda call: good_effect())  # fmt: skip
        assert again.replayed

    _in_one_runtime(main)
    assert read() == GOOD
