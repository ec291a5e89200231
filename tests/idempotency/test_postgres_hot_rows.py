"""Hot rows on PostgreSQL: effects of several processes' batches that lock the same rows
take turns (advisory locks in one global order) and never deadlock, with and without
``PostgresEffect(locks=...)``, in both modes; the turn each batch takes, read from
``pg_locks`` inside an effect; and the lock names' rules."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
import zlib
from typing import Any

import pytest

import gosim
from idempotency import Idempotency

psycopg = pytest.importorskip("psycopg", reason="PostgresStore needs psycopg 3")

from idempotency import PostgresEffect, PostgresStore  # noqa: E402
from idempotency.stores._postgres_sql import _TURN_ALL, _TURN_CLASS  # noqa: E402

HOT_ACCOUNTS = 20

# One process of the hot-rows test: 50 callers, each charge a key of its own, on one of
# 20 accounts picked at random; the effect upserts the account's balance and adds a
# ledger row, as a payments service would.
CHARGER = textwrap.dedent(
    """
    import random, sys
    import gosim
    from idempotency import Idempotency, PostgresEffect, PostgresStore

    dsn, schema, tag, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    one_step, declared = sys.argv[5] == "1", sys.argv[6] == "1"
    store = PostgresStore(dsn, schema=schema)
    rnd = random.Random(tag)

    def charge(account, key):
        async def fn(conn):
            await conn.execute(
                "INSERT INTO balances VALUES (%s, 1) ON CONFLICT (account)"
                " DO UPDATE SET cents = balances.cents + 1", (account,))
            await conn.execute("INSERT INTO ledger VALUES (%s, %s)", (key, account))
            return account
        named = {"locks": [f"account:{account}"]} if declared else {}
        return PostgresEffect(fn, **named)

    async def main():
        idem = Idempotency(store)
        done = gosim.Chan(50)

        async def caller(w):
            for i in range(w, n, 50):
                key, account = f"{tag}{i}", rnd.randrange(HOT)
                out = await idem.run(
                    caller="shop", key=key, request=("charge", [account]),
                    handler=lambda call, k=key, a=account: charge(a, k),
                    timeout=120, one_step=one_step)
                assert out.value == account
            await done.send(None)

        for w in range(50):
            gosim.go(caller, w)
        for _ in range(50):
            await done.recv()

    gosim.run(main)
    store.close()
    """
).replace("HOT", str(HOT_ACCOUNTS))


def _schema(tag: str) -> str:
    return f"{tag}{os.getpid()}_{time.monotonic_ns()}"


def _deadlocks(server: Any) -> int:
    rows = server.sql("SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()")
    return int(rows[0][0] or 0)


@pytest.mark.parametrize(
    ("one_step", "declared"),
    [(False, False), (True, True)],
    ids=["two-step, no locks named", "one-step, locks named"],
)
def test_two_processes_on_hot_rows_never_deadlock(
    own_postgres: Any, one_step: bool, declared: bool
) -> None:
    """Two processes, 1,000 charges each on 20 hot accounts, with the server's default
    ``deadlock_timeout``: PostgreSQL detects no deadlock (each would have stalled both
    batches for a second and run one again), and every charge is applied once."""
    schema = _schema("hot")
    PostgresStore(own_postgres.dsn, schema=schema).close()
    own_postgres.sql(
        f"CREATE TABLE {schema}.balances (account int PRIMARY KEY, cents bigint NOT NULL);"
        f"CREATE TABLE {schema}.ledger (key text PRIMARY KEY, account int NOT NULL)"
    )
    before = _deadlocks(own_postgres)
    n = 1000
    modes = ["1" if one_step else "0", "1" if declared else "0"]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CHARGER, own_postgres.dsn, schema, tag, str(n), *modes],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for tag in ("a", "b")
    ]
    try:
        outs = [p.communicate(timeout=300)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert [p.returncode for p in procs] == [0, 0], outs
    # A backend reports its deadlocks to the statistics by the time it ends: wait
    # (bounded) for the processes' backends to be gone before reading the count.
    deadline = time.monotonic() + 10
    while own_postgres.sql(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'idempotency'"
    ) != [(0,)]:
        assert time.monotonic() < deadline, "the processes' backends did not end"
        time.sleep(0.1)
    assert _deadlocks(own_postgres) - before == 0
    ledger = own_postgres.sql(f"SELECT count(*), count(DISTINCT key) FROM {schema}.ledger")
    assert ledger == [(2 * n, 2 * n)]
    cents = own_postgres.sql(f"SELECT sum(cents) FROM {schema}.balances")
    assert cents == [(2 * n,)]


def _own_turns(postgres_server: Any, locks: Any, one_step: bool) -> list[tuple[int, int, str]]:
    """The advisory locks the batch of one call holds while its effect runs (the
    store's kind: two int4 keys), as ``(first, second, mode)``."""
    schema = _schema("turns")
    store = PostgresStore(postgres_server.dsn, schema=schema)

    async def fn(conn: Any) -> list[tuple[int, int, str]]:
        cur = await conn.execute(
            "SELECT classid::int8, objid::int8, mode FROM pg_locks"
            " WHERE locktype = 'advisory' AND objsubid = 2 AND pid = pg_backend_pid()"
            " ORDER BY objid"
        )
        return [tuple(row) for row in await cur.fetchall()]

    async def main() -> Any:
        idem = Idempotency(store)
        out = await idem.run(
            caller="c",
            key="k",
            request=("look", []),
            handler=lambda call: PostgresEffect(fn, locks=locks),
            timeout=30,
            one_step=one_step,
        )
        return out.value

    try:
        return [tuple(row) for row in gosim.run(main, procs=1)]
    finally:
        store.close()


def _unsigned(n: int) -> int:
    return n & 0xFFFF_FFFF


@pytest.mark.parametrize("one_step", [False, True], ids=["two-step", "one-step"])
def test_a_batch_takes_the_turns_its_effects_name(postgres_server: Any, one_step: bool) -> None:
    every = (_unsigned(_TURN_CLASS), _unsigned(_TURN_ALL))
    # No names: the turn over every effect, exclusive.
    assert _own_turns(postgres_server, None, one_step) == [(*every, "ExclusiveLock")]
    # Names: that turn shared, and each name's own, exclusive.
    got = _own_turns(postgres_server, ["account:7", 42], one_step)
    ids = sorted(_unsigned(zlib.crc32(t) - 0x8000_0000) for t in (b"account:7", b"42"))
    assert sorted(got) == sorted(
        [(*every, "ShareLock")] + [(_unsigned(_TURN_CLASS), i, "ExclusiveLock") for i in ids]
    )
    # Locking nothing another effect locks: the shared turn alone.
    assert _own_turns(postgres_server, (), one_step) == [(*every, "ShareLock")]


def test_lock_names_are_text_and_checked() -> None:
    async def fn(conn: Any) -> None:
        return None

    assert PostgresEffect(fn, locks=[42]).locks == PostgresEffect(fn, locks=["42"]).locks
    named = PostgresEffect(fn, locks=["b", "a", "b"]).locks
    assert named is not None and len(named) == 2 and list(named) == sorted(named)
    assert _TURN_ALL not in named
    assert PostgresEffect(fn).locks is None
    assert PostgresEffect(fn, locks=()).locks == ()
    with pytest.raises(TypeError, match="collection of names"):
        PostgresEffect(fn, locks="account:1")
    with pytest.raises(TypeError, match="str or an int, not float"):
        PostgresEffect(fn, locks=[1.5])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="str or an int, not bool"):
        PostgresEffect(fn, locks=[True])
    with pytest.raises(ValueError, match="not valid text"):
        PostgresEffect(fn, locks=["a\udcff"])
