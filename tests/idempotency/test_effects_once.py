"""Exactly-once effects on every path where an effect commits and its record might not:
a result too large or not encodable, an error raised after the effect wrote, a refusal
that cannot be recorded. Each test ends with a counter that the effect adds 1 to, and
checks it is exactly 1 after the retry: SQLite and Postgres roll the effect back and
release the key (the retry applies it once), Memory and Redis cannot undo an effect that ran, so
they complete the key with the final UNRECORDED_RESULT error (the retry replays it)."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import gosim
from idempotency import (
    ApplicationError,
    Call,
    Idempotency,
    InvalidResult,
    MemoryEffect,
    MemoryStore,
    SQLiteEffect,
    SQLiteStore,
)
from idempotency._outcome import UNRECORDED_RESULT, Outcome
from idempotency.stores import Effect, Store

LIMIT = 1000  # max_result_bytes of every test
BIG = "x" * 2000


class Counter:
    """A counter in the store's own data, and effects that add 1 to it.

    ``effect(result, fail_after)``: adds 1, then returns ``result`` (a value to record),
    or, with ``fail_after``, raises it (an exception or an ApplicationError) after the
    write. A store that cannot roll back (memory) can only honour a failure raised
    before the write: ``fail_before`` does that on every store."""

    def __init__(
        self, kind: str, store: Store, path: Path | None = None, server: Any = None
    ) -> None:
        self.kind = kind
        self.store = store
        self.path = path
        self.server = server  # postgres: the cluster
        self.n = 0  # memory's counter

    def effect(
        self,
        result: Any = "ok",
        fail_after: BaseException | None = None,
        fail_before: BaseException | None = None,
    ) -> Effect:
        if self.kind == "memory":

            def mem() -> Any:
                if fail_before is not None:
                    raise fail_before
                self.n += 1
                if fail_after is not None:
                    raise fail_after
                return result

            return MemoryEffect(mem)
        if self.kind == "sqlite":

            def sql(conn: sqlite3.Connection) -> Any:
                if fail_before is not None:
                    raise fail_before
                conn.execute("CREATE TABLE IF NOT EXISTS counter (n INTEGER)")
                conn.execute("INSERT INTO counter VALUES (1)")
                if fail_after is not None:
                    raise fail_after
                return result

            return SQLiteEffect(sql)
        if self.kind == "postgres":
            from idempotency import PostgresEffect  # noqa: PLC0415 -- needs psycopg

            async def pg(conn: Any) -> Any:
                if fail_before is not None:
                    raise fail_before
                await conn.execute("CREATE TABLE IF NOT EXISTS counter (n integer)")
                await conn.execute("INSERT INTO counter VALUES (1)")
                if fail_after is not None:
                    raise fail_after
                return result

            return PostgresEffect(pg)
        from idempotency import LuaEffect  # noqa: PLC0415 -- needs redis-py

        ckey = f"{self.store.prefix}counter"  # type: ignore[attr-defined]
        before = after = ""
        if isinstance(fail_before, ApplicationError):
            before = "idempotency_fail(ARGV[2], ARGV[3], ARGV[4])"
        elif fail_before is not None:
            before = "error(ARGV[3])"
        if isinstance(fail_after, ApplicationError):
            after = "idempotency_fail(ARGV[2], ARGV[3], ARGV[4])"
        elif fail_after is not None:
            after = "error(ARGV[3])"
        err = fail_after or fail_before
        code, message, data = "", "", ""
        if isinstance(err, ApplicationError):
            code, message, data = str(err.code), err.message, err.data
        elif err is not None:
            message = str(err)
        script = f"{before}\nredis.call('INCR', KEYS[1])\n{after}\nreturn ARGV[1]"
        return LuaEffect(script, [ckey], [result, code, message, data])

    def read(self) -> int:
        if self.kind == "memory":
            return self.n
        if self.kind == "sqlite":
            assert self.path is not None
            with sqlite3.connect(self.path) as conn:
                try:
                    return int(conn.execute("SELECT count(*) FROM counter").fetchone()[0])
                except sqlite3.OperationalError:
                    return 0
        if self.kind == "postgres":
            schema = self.store.schema  # type: ignore[attr-defined]
            if not self.server.sql("SELECT to_regclass(%s) IS NOT NULL", (f"{schema}.counter",))[0][
                0
            ]:
                return 0
            return int(self.server.sql(f"SELECT count(*) FROM {schema}.counter")[0][0])
        v = self.store.client.get(f"{self.store.prefix}counter")  # type: ignore[attr-defined]
        return int(v) if v is not None else 0


@pytest.fixture(params=["memory", "sqlite", "redis", "postgres"])
def counter(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Counter]:
    kind = request.param
    if kind == "memory":
        c = Counter(kind, MemoryStore())
    elif kind == "sqlite":
        path = tmp_path / "store.db"
        c = Counter(kind, SQLiteStore(path), path)
    elif kind == "postgres":
        from idempotency import PostgresStore  # noqa: PLC0415

        server = request.getfixturevalue("postgres_server")
        schema = f"once{time.monotonic_ns()}"
        c = Counter(kind, PostgresStore(server.dsn, schema=schema), server=server)
    else:
        from idempotency import RedisStore  # noqa: PLC0415

        server = request.getfixturevalue("redis_server")
        c = Counter(kind, RedisStore(server.url, prefix=f"once{time.monotonic_ns()}:"))
    yield c
    c.store.close()


def _first_then_retry(
    counter: Counter, first: Callable[[Call], Any], retry: Callable[[Call], Any]
) -> tuple[Outcome | BaseException, Outcome, int, int]:
    """Run ``first`` on a key, then ``retry`` on the same key and request; return the
    first's outcome or error, the retry's outcome, and the counter after each."""

    async def main() -> tuple[Outcome | BaseException, Outcome, int, int]:
        idem = Idempotency(counter.store, max_result_bytes=LIMIT)
        one: Outcome | BaseException
        try:
            one = await idem.run(caller="c", key="k", request=("op", []), handler=first)
        except Exception as exc:
            one = exc
        after_first = counter.read()
        two = await idem.run(caller="c", key="k", request=("op", []), handler=retry)
        return one, two, after_first, counter.read()

    return gosim.run(main, procs=2)


def _check_once(counter: Counter, first: Outcome | BaseException, retry: Outcome, why: str) -> None:
    """The rule: SQLite and Postgres rolled back (InvalidResult or the effect's error, nothing
    recorded, and the retry applied the effect); the others recorded the final
    UNRECORDED_RESULT error, which the retry replayed."""
    if counter.kind in ("sqlite", "postgres"):
        assert isinstance(first, Exception)
        assert not retry.replayed and retry.value == "ok"
        return
    assert isinstance(first, Outcome) and not first.ok, first
    err = first.error
    assert err is not None and err.code == UNRECORDED_RESULT and why in err.message
    assert retry.replayed and retry.payload == first.payload


def test_an_effect_whose_result_is_too_large_is_applied_once(counter: Counter) -> None:
    first, retry, after_first, end = _first_then_retry(
        counter,
        lambda call: counter.effect(result=BIG),
        lambda call: counter.effect(result="ok"),
    )
    _check_once(counter, first, retry, f"the limit is {LIMIT}")
    if counter.kind in ("sqlite", "postgres"):
        assert isinstance(first, InvalidResult) and after_first == 0
    assert end == 1


def test_an_effect_whose_result_cannot_be_encoded_is_applied_once(counter: Counter) -> None:
    if counter.kind == "redis":
        pytest.skip("a Lua script's result is always encodable (cmsgpack packs any value)")
    first, retry, _, end = _first_then_retry(
        counter,
        lambda call: counter.effect(result={1, 2}),
        lambda call: counter.effect(result="ok"),
    )
    _check_once(counter, first, retry, "not msgpack-serialisable")
    assert end == 1


def test_an_effect_that_fails_after_writing_is_applied_once(counter: Counter) -> None:
    if counter.kind == "memory":
        pytest.skip("a MemoryEffect must raise before it writes: nothing can undo it after")
    first, retry, _, end = _first_then_retry(
        counter,
        lambda call: counter.effect(fail_after=RuntimeError("broke after the write")),
        lambda call: counter.effect(result="ok"),
    )
    _check_once(counter, first, retry, "broke after the write")
    if counter.kind == "redis":
        assert first.error.message.startswith(  # type: ignore[union-attr]
            "the effect was applied but its result cannot be recorded: LuaEffect failed"
        )
    assert end == 1


def test_a_refusal_too_large_to_record_is_applied_once(counter: Counter) -> None:
    """A final refusal whose data cannot be recorded. Raised after the write: SQLite
    rolls back, Redis records UNRECORDED_RESULT. Memory's refusal comes before its
    write (its rule), so nothing happened and the key is released."""
    refusal = ApplicationError("refused", "no", BIG)
    if counter.kind == "memory":
        first_effect = counter.effect(fail_before=refusal)
    else:
        first_effect = counter.effect(fail_after=refusal)
    first, retry, after_first, end = _first_then_retry(
        counter, lambda call: first_effect, lambda call: counter.effect(result="ok")
    )
    if counter.kind == "memory":
        assert isinstance(first, InvalidResult) and after_first == 0
        assert not retry.replayed and retry.value == "ok"
    else:
        _check_once(counter, first, retry, f"the limit is {LIMIT}")
    assert end == 1


def test_an_effect_that_fails_before_writing_releases_the_key(counter: Counter) -> None:
    """Nothing was written, so nothing is recorded: the retry applies the effect."""
    first, retry, after_first, end = _first_then_retry(
        counter,
        lambda call: counter.effect(fail_before=RuntimeError("checked first")),
        lambda call: counter.effect(result="ok"),
    )
    assert isinstance(first, Exception) and "checked first" in str(first)
    assert after_first == 0 and not retry.replayed and retry.value == "ok" and end == 1


def test_a_lua_effect_that_only_read_before_too_large_a_result_releases(
    redis_server: Any,
) -> None:
    """Reads are not writes: a script that read and returned too much wrote nothing,
    so its key is released (InvalidResult), as for a plain value."""
    from idempotency import LuaEffect, RedisStore  # noqa: PLC0415

    store = RedisStore(redis_server.url, prefix=f"ro{time.monotonic_ns()}:")
    script = "redis.call('GET', KEYS[1]) return string.rep('x', 2000)"

    async def main() -> None:
        idem = Idempotency(store, max_result_bytes=LIMIT)
        with pytest.raises(InvalidResult, match="limit is 1000"):
            await idem.run(
                caller="c", key="k", request=("op", []),
                handler=lambda call: LuaEffect(script, [f"{store.prefix}x"]),
            )  # fmt: skip
        assert await store.get("c", "k") is None

    try:
        gosim.run(main, procs=2)
    finally:
        store.close()
