"""The limits every store checks at the door (the store contract's "Limits"), against
real servers: names a store builds (PostgreSQL's schema, Redis' prefix) that the server
would truncate or that another store could share, callers and keys past what every
server can index, outcomes past what every server can take. Each is refused with a clear
error before anything reaches the server, and a refused call fails alone: its
batch-mates complete. ``procs=1`` and goroutines started together put calls in one batch
(checked by the store's statistics)."""

from __future__ import annotations

import math
import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import gosim
from idempotency import (
    Idempotency,
    InvalidKey,
    InvalidResult,
    MemoryEffect,
    MemoryStore,
    SQLiteEffect,
    SQLiteStore,
)
from idempotency._keys import fingerprint
from idempotency.stores import MAX_KEY_LENGTH, MAX_PAYLOAD_BYTES, Completion, Store

from ._concurrently import gather
from .conftest import FakeClock

FP = fingerprint("op", [])
GOOD = 6
# Characters of 1, 2, 3 and 4 bytes in UTF-8: a bound in characters must hold for each.
WIDTHS = {1: (0x21, 0x7E), 2: (0xA1, 0x7FF), 3: (0x4E00, 0x9FFF), 4: (0x20000, 0x2A6DF)}


def _text(n: int, width: int, seed: int) -> str:
    """``n`` random printable characters of ``width`` bytes each: random, so that no
    server's compression shrinks them under its limit."""
    rng = random.Random(seed)
    lo, hi = WIDTHS[width]
    return "".join(chr(rng.randint(lo, hi)) for _ in range(n))


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
        s = PostgresStore(server.dsn, schema=f"limits{time.monotonic_ns()}")
    else:
        from idempotency import RedisStore  # noqa: PLC0415 -- needs redis-py

        server = request.getfixturevalue("redis_server")
        s = RedisStore(server.url, prefix=f"limits{time.monotonic_ns()}:")
    yield s
    s.close()


def _batched(store: Store) -> bool:
    return not isinstance(store, MemoryStore)


# ------------------------------------------------------------------ callers and keys


def test_an_over_long_key_in_a_batch_fails_alone(store: Store) -> None:
    """A claim whose key is 3,000 random characters (past PostgreSQL's btree entry
    limit, 2,704 bytes: the whole batch failed there) is refused with InvalidKey before
    it joins the batch, and its batch-mates claim as if it had not been there."""
    long_key = _text(3000, 1, 1)
    keys = [f"k{i}" for i in range(GOOD)]
    keys.insert(GOOD // 2, long_key)
    calls = [lambda k=k: store.claim("c", k, FP, 30.0) for k in keys]

    async def main() -> None:
        results = await gather(calls)
        bad = results.pop(GOOD // 2)
        assert isinstance(bad, InvalidKey), bad
        assert "the key is 3000 characters (3000 bytes) long" in str(bad)
        assert f"at most MAX_KEY_LENGTH = {MAX_KEY_LENGTH} characters" in str(bad)
        assert [r.kind.name for r in results] == ["CLAIMED"] * GOOD, results
        if _batched(store):
            assert store.statistics().largest_batch >= GOOD  # one batch: else it proves nothing
        assert await store.get("c", long_key) is None
        assert [await store.get("c", k) is not None for k in keys if k != long_key] == [True] * GOOD

    gosim.run(main, procs=1)


def test_over_long_callers_and_keys_are_refused_on_every_claim_form(store: Store) -> None:
    """Every way to claim refuses a caller or key past the bound, and a non-str one,
    with InvalidKey naming the call; nothing is written."""
    over = "x" * (MAX_KEY_LENGTH + 1)
    fast = Completion(True, b"\xc0", None, 60.0, 1 << 20)

    async def main() -> None:
        for caller, key, what in [("c", over, "key"), (over, "k", "caller"), (5, "k", "caller")]:
            with pytest.raises(InvalidKey, match=rf"claim.*the {what}"):
                await store.claim(caller, key, FP, 30.0)  # type: ignore[arg-type]
            if hasattr(store, "claim_and_complete"):
                with pytest.raises(InvalidKey, match=rf"claim.*the {what}"):
                    await store.claim_and_complete(caller, key, FP, 30.0, None, fast)  # type: ignore[arg-type]
            if hasattr(store, "claim_later"):
                got: list[Any] = []
                later = store.claim_later  # type: ignore[attr-defined]
                later(caller, key, FP, 30.0, lambda r, e, got=got: got.append((r, e)))
                assert len(got) == 1 and isinstance(got[0][1], InvalidKey), got
        assert store.statistics().operations == 0  # nothing reached the store

    gosim.run(main, procs=1)


@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    n=st.integers(MAX_KEY_LENGTH - 2, MAX_KEY_LENGTH + 2),
    width=st.sampled_from(sorted(WIDTHS)),
    seed=st.integers(0, 2**32),
)
@example(n=MAX_KEY_LENGTH, width=4, seed=7)  # the most bytes the bound lets through
@example(n=MAX_KEY_LENGTH + 1, width=1, seed=7)
def test_the_bound_counts_characters_and_holds_in_bytes(
    store: Store, n: int, width: int, seed: int
) -> None:
    """A caller and a key of ``n`` random characters of ``width`` bytes each (up to
    1,020 bytes apiece, incompressible): every store claims, completes and reads back
    both at the bound -- PostgreSQL indexes them in one entry -- and refuses one
    character more with InvalidKey."""
    caller, key = _text(n, width, seed), _text(n, width, seed + 1)

    async def main() -> None:
        if n > MAX_KEY_LENGTH:
            with pytest.raises(
                InvalidKey, match=rf"the caller is {n} characters \({n * width} bytes\)"
            ):
                await store.claim(caller, key, FP, 30.0)
            return
        res = await store.claim(caller, key, FP, 30.0)
        assert res.kind.name == "CLAIMED"
        done = await store.complete(
            caller, key, res.record.fence, Completion(True, b"\xc3", None, 60.0, 9)
        )
        assert await store.get(caller, key) == done
        held = await store.inspect(caller, key)
        assert held is not None and (held.caller, held.key, held.state) == (
            caller,
            key,
            "COMPLETED",
        )

    gosim.run(main, procs=1)


# ------------------------------------------------------------------ outcomes


def test_max_result_bytes_is_bounded_at_construction() -> None:
    """``Idempotency(max_result_bytes=...)`` above what every store records (or NaN,
    which would let every outcome through) is refused when it is made."""
    store = MemoryStore()
    assert (
        Idempotency(store, max_result_bytes=MAX_PAYLOAD_BYTES).max_result_bytes == MAX_PAYLOAD_BYTES
    )
    for bad in (MAX_PAYLOAD_BYTES + 1, 1 << 31, math.inf, math.nan, "1000"):
        with pytest.raises(
            ValueError, match=r"max_result_bytes must be a number of at most 268435456"
        ):
            Idempotency(store, max_result_bytes=bad)  # type: ignore[arg-type]


def _effect_of(store: Store) -> Any:
    if isinstance(store, MemoryStore):
        return MemoryEffect(lambda: 1)
    if isinstance(store, SQLiteStore):
        return SQLiteEffect(lambda conn: 1)
    if type(store).__name__ == "RedisStore":
        from idempotency import LuaEffect  # noqa: PLC0415 -- needs redis-py

        return LuaEffect("return 1")
    from idempotency import PostgresEffect  # noqa: PLC0415 -- needs psycopg

    async def fn(conn: Any) -> int:
        return 1

    return PostgresEffect(fn)


def test_an_over_long_outcome_in_a_batch_fails_alone(store: Store) -> None:
    """A completion whose payload is one byte past MAX_PAYLOAD_BYTES (or whose effect may
    make one: its ``max_result_bytes`` above it) is refused before it joins the batch,
    with InvalidResult (ValueError); the claim stays, and its batch-mates complete."""
    huge = bytes(MAX_PAYLOAD_BYTES + 1)
    keys = [f"k{i}" for i in range(GOOD)]

    async def main() -> None:
        claims = [await store.claim("c", k, FP, 30.0) for k in [*keys, "huge", "greedy"]]
        fences = {k: r.record.fence for k, r in zip([*keys, "huge", "greedy"], claims, strict=True)}
        small = Completion(True, b"\xc3", None, 60.0, 1 << 20)
        greedy = Completion(True, None, _effect_of(store), 60.0, MAX_PAYLOAD_BYTES + 1)
        calls = [lambda k=k: store.complete("c", k, fences[k], small) for k in keys]
        calls.insert(
            2, lambda: store.complete("c", "huge", fences["huge"], small._replace(payload=huge))
        )
        calls.insert(4, lambda: store.complete("c", "greedy", fences["greedy"], greedy))
        results = await gather(calls)
        too_big, too_greedy = results.pop(2), results.pop(3)
        assert isinstance(too_big, InvalidResult), too_big
        assert f"the outcome is {len(huge)} bytes; a store takes at most" in str(too_big)
        assert isinstance(too_greedy, ValueError), too_greedy
        assert "max_result_bytes must be a number of at most" in str(too_greedy)
        assert [r.payload for r in results] == [b"\xc3"] * GOOD, results
        for k in ("huge", "greedy"):  # still held by its claim: nothing was written
            rec = await store.get("c", k)
            assert rec is not None and rec.state == 1 and rec.fence == fences[k]

    gosim.run(main, procs=1)


# ------------------------------------------------------------------ PostgreSQL's names


def _pg_store(server: Any, schema: str, **kw: Any) -> Any:
    from idempotency import PostgresStore  # noqa: PLC0415 -- needs psycopg

    return PostgresStore(server.dsn, schema=schema, **kw)


def test_two_schemas_alike_in_their_first_63_bytes_never_share_records(
    postgres_server: Any,
) -> None:
    """PostgreSQL truncates a name to 63 bytes silently: two services whose schemas
    differ only past that would share one records table (one's outcome replayed to the
    other, or KeyReused). Such a schema is refused at construction, naming the
    parameter, the limit and its length; a schema of 63 bytes (multibyte characters
    counted in bytes) is kept whole, distinct from one that differs in its last byte."""
    tag = f"svc{time.monotonic_ns()}_"
    long = tag + "x" * (63 - len(tag))
    orders, payments = long + "_orders", long + "_payments"
    with pytest.raises(
        ValueError,
        match=r"schema 'svc.*_orders' is 70 bytes long in UTF-8 \(70 characters\);"
        r" PostgreSQL keeps at most 63 bytes",
    ):
        _pg_store(postgres_server, orders)
    with pytest.raises(ValueError, match=r"schema .* is 72 bytes long"):
        _pg_store(postgres_server, payments)
    # At the bound, in two-byte characters: 63 bytes, 32 characters.
    stem = tag + "é" * ((62 - len(tag)) // 2)
    stem += "x" * (62 - len(stem.encode()))
    a, b = _pg_store(postgres_server, stem + "a"), _pg_store(postgres_server, stem + "b")
    with pytest.raises(ValueError, match=r"is 64 bytes long in UTF-8 \(\d+ characters\)"):
        _pg_store(postgres_server, stem + "é")

    async def main() -> None:
        assert (await a.claim("c", "k", FP, 30.0)).kind.name == "CLAIMED"
        assert (await b.claim("c", "k", FP, 30.0)).kind.name == "CLAIMED"  # not BUSY

    try:
        gosim.run(main, procs=1)
    finally:
        a.close()
        b.close()
    names = {
        n
        for (n,) in postgres_server.sql(
            "SELECT nspname FROM pg_namespace WHERE nspname LIKE %s", (tag + "%",)
        )
    }
    assert names == {stem + "a", stem + "b"}


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.lists(st.sampled_from(["a", "é", "語", "𠀀", "Z", "_"]), min_size=1, max_size=70).map(
        "".join
    )
)
@example("x" * 63)
@example("x" * 64)
@example("é" * 31 + "x")
@example("é" * 32)
def test_a_schema_is_accepted_exactly_when_the_server_keeps_it_whole(
    postgres_server: Any, schema: str
) -> None:
    """The bound is the server's own: PostgreSQL's ``name`` keeps the schema as given
    exactly when the store accepts it (the check counts bytes, not characters)."""
    from idempotency.stores.postgres import _check_schema  # noqa: PLC0415 -- needs psycopg

    (kept,) = postgres_server.sql("SELECT %s::text::name::text", (schema,))[0]
    try:
        _check_schema(schema)
    except ValueError as exc:
        assert kept != schema, exc
    else:
        assert kept == schema


def test_find_store_refuses_a_schema_no_store_can_have(postgres_server: Any) -> None:
    """``find_store`` (the tools' look-up) would find the truncated name's table: it
    refuses the schema as the store does."""
    from idempotency.stores.postgres import find_store  # noqa: PLC0415 -- needs psycopg

    tag = f"fs{time.monotonic_ns()}_"
    short = tag + "x" * (63 - len(tag))
    _pg_store(postgres_server, short).close()
    assert find_store(postgres_server.dsn, short)
    with pytest.raises(ValueError, match="is 64 bytes long"):
        find_store(postgres_server.dsn, short + "y")
    for bad in ("", "a\0b"):
        with pytest.raises(ValueError, match="schema must be a non-empty name without NUL"):
            _pg_store(postgres_server, bad)


def test_lock_timeout_within_the_servers_int(postgres_server: Any) -> None:
    """``lock_timeout`` goes to the server as an int of milliseconds: one past it (or
    infinite) is refused at construction, not by the server at the first connection."""
    schema = f"lt{time.monotonic_ns()}"
    for bad in (2_147_484.0, 1e12, math.inf):
        with pytest.raises(ValueError, match=r"lock_timeout must be .* at most 2147483\.647"):
            _pg_store(postgres_server, schema, lock_timeout=bad)
    _pg_store(postgres_server, schema, lock_timeout=2_147_483.647).close()


# ------------------------------------------------------------------ Redis' prefixes


def test_a_prefix_that_could_be_another_stores_key_is_refused(redis_server: Any) -> None:
    """The store of ``"app:"`` keeps caller ``bob``'s key ``x:rec:1:c:k`` where the
    store of ``"app:rec:3:bob:x:"`` keeps caller ``c``'s key ``k``: the second prefix
    is refused at construction (every such prefix has ``rec:`` in it)."""
    from idempotency import RedisStore  # noqa: PLC0415 -- needs redis-py

    app = f"app{time.monotonic_ns()}:"
    first = RedisStore(redis_server.url, prefix=app)
    assert first.record_key("bob", "x:rec:1:c:k") == f"{app}rec:3:bob:x:rec:1:c:k"
    with pytest.raises(ValueError, match=r"prefix must be a str without 'rec:' in it"):
        RedisStore(redis_server.url, prefix=f"{app}rec:3:bob:x:")
    first.close()


_PREFIX_CHARS = st.sampled_from(["a", ":", "r", "e", "c", "f", "n", "1", "3", "*", "é"])
_prefixes = st.lists(_PREFIX_CHARS, max_size=12).map("".join).filter(lambda p: "rec:" not in p)
_names = st.lists(_PREFIX_CHARS, min_size=1, max_size=10).map("".join)


@given(_prefixes, _names, _names, _prefixes, _names, _names)
@example("a:", "bob", "x:fence", "a:re", "c", "k")
@example("", "c", "k", "fen", "c", "k")
def test_accepted_prefixes_never_share_a_key(
    p: str, c1: str, k1: str, q: str, c2: str, k2: str
) -> None:
    """Between two prefixes the store accepts, a record key or fence key of one is
    never a key of the other, unless it is the same store's same record."""
    from idempotency import RedisStore  # noqa: PLC0415 -- needs redis-py

    a = RedisStore("redis://127.0.0.1:1/0", prefix=p)  # never connects
    b = RedisStore("redis://127.0.0.1:1/0", prefix=q)
    keys_a = {("rec", c1, k1): a.record_key(c1, k1), ("fence",): f"{p}fence"}
    keys_b = {("rec", c2, k2): b.record_key(c2, k2), ("fence",): f"{q}fence"}
    for what_a, ka in keys_a.items():
        for what_b, kb in keys_b.items():
            if ka == kb:
                assert p == q and what_a == what_b, (p, what_a, q, what_b, ka)


def test_the_sweep_matches_its_prefix_literally(redis_server: Any) -> None:
    """A prefix with glob characters (``svc*``) sweeps its own records only: another
    store's record that its pattern would match (``svcB:``), expired by the first
    store's clock, is left alone."""
    from idempotency import RedisStore  # noqa: PLC0415 -- needs redis-py

    tag = f"sw{time.monotonic_ns()}"
    later = FakeClock(1_700_000_000.0 + 10_000)
    mine = RedisStore(redis_server.url, prefix=f"{tag}*", clock=later)
    other = RedisStore(redis_server.url, prefix=f"{tag}B:", clock=FakeClock())

    async def main() -> None:
        await other.claim("c", "k", FP, 60.0)
        await mine.claim("c", "k", FP, 60.0)
        later.advance(120.0)  # mine's claim lapsed; other's, by its own clock, did not
        assert await mine.sweep() == 1
        assert await other.get("c", "k") is not None

    try:
        gosim.run(main, procs=1)
    finally:
        mine.close()
        other.close()
