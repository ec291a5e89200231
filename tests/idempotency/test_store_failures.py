"""Stores under failure and load: group commit, savepoints, durability across restarts,
a corrupted SQLite row, a locked database, a Redis server killed mid-call."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

import gosim
from idempotency import (
    ApplicationError,
    Call,
    CorruptedRecord,
    Idempotency,
    SQLiteEffect,
    SQLiteStore,
    StoreUnavailable,
)


def grun(fn: Any, *args: Any) -> Any:
    return gosim.run(fn, *args, procs=2)


def _counter(name: str, amount: int) -> SQLiteEffect:
    def fn(conn: sqlite3.Connection) -> int:
        conn.execute("CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, n INTEGER)")
        conn.execute(
            "INSERT INTO counters VALUES (?, ?) ON CONFLICT(name) DO UPDATE SET n = n + ?",
            (name, amount, amount),
        )
        if amount == 13:
            raise ValueError("unlucky")  # after writing: its savepoint must undo it
        return int(conn.execute("SELECT n FROM counters WHERE name = ?", (name,)).fetchone()[0])

    return SQLiteEffect(fn)


def _read(path: Path, sql: str, *args: Any) -> Any:
    with sqlite3.connect(path) as conn:
        return conn.execute(sql, args).fetchall()


def test_group_commit_shares_transactions_and_replies_after_commit(tmp_path: Path) -> None:
    path = tmp_path / "g.db"
    store = SQLiteStore(path)
    n = 50

    async def main() -> None:
        idem = Idempotency(store)
        done: gosim.Chan[Any] = gosim.Chan(n)

        async def one(i: int) -> None:
            try:
                out = await idem.run(
                    caller="c", key=f"k{i}", request=("add", [i]),
                    handler=lambda call: _counter(f"n{i % 5}", 13 if i == 7 else 1),
                )  # fmt: skip
            except ValueError as exc:
                await done.send((i, exc))
                return
            # The reply left only after its commit: another connection sees the record.
            rows = await gosim.syscall(
                _read, path, "SELECT state, payload FROM idempotency_records WHERE key = ?", f"k{i}"
            )
            await done.send((i, (out, rows)))

        for i in range(n):
            gosim.go(one, i)
        results = dict([await done.recv() for _ in range(n)])
        assert isinstance(results.pop(7), ValueError)
        for out, rows in results.values():
            assert rows == [(2, out.payload)]

    grun(main)
    stats = store.statistics()
    assert stats.largest_batch > 1 and stats.batches < stats.operations
    # The failing effect (i == 7, counter n2) rolled back alone; every other effect stayed.
    counts = dict(_read(path, "SELECT name, n FROM counters"))
    assert counts == {"n0": 10, "n1": 10, "n2": 9, "n3": 10, "n4": 10}
    assert _read(path, "SELECT count(*) FROM idempotency_records WHERE key = 'k7'") == [(0,)]
    store.close()


def test_records_survive_a_restart(tmp_path: Path) -> None:
    runs = []

    async def handler(call: Call) -> Any:
        runs.append(call.fence)
        return _counter("n", 5)

    async def once() -> Any:
        store = SQLiteStore(tmp_path / "r.db")
        try:
            return await Idempotency(store).run(
                caller="c", key="k", request=("add", [5]), handler=handler
            )
        finally:
            store.close()

    first = grun(once)
    again = grun(once)
    assert again.replayed and again.payload == first.payload and len(runs) == 1
    assert _read(tmp_path / "r.db", "SELECT n FROM counters") == [(5,)]


def test_rows_are_written_with_their_sql_types(tmp_path: Path) -> None:
    """Blobs go in as blobs, the ok flag as an integer and an in-progress payload as
    NULL, whichever Python types the store binds them with (it avoids the ones sqlite3
    must adapt)."""
    release = gosim.Chan[None]()

    async def slow(call: Call) -> Any:
        await release.recv()
        return "done"

    async def main() -> None:
        store = SQLiteStore(tmp_path / "t.db")
        idem = Idempotency(store)
        try:
            done = gosim.Chan[Any](1)

            async def first() -> None:
                await done.send(
                    await idem.run(caller="c", key="k1", request=("op", [1]), handler=slow)
                )

            gosim.go(first)
            while not _read(tmp_path / "t.db", "SELECT 1 FROM idempotency_records"):
                await gosim.sleep(0.005)
            row = _read(
                tmp_path / "t.db",
                "SELECT state, typeof(fingerprint), typeof(fence), typeof(expires_at),"
                " typeof(ok), typeof(payload) FROM idempotency_records",
            )
            assert row == [(1, "blob", "integer", "real", "integer", "null")]
            await release.send(None)
            outcome = await done.recv()
            await idem.run(caller="c", key="k2", request=("op", [2]), handler=_refuse)
        finally:
            store.close()
        assert outcome.value == "done"

    grun(main)
    rows = _read(
        tmp_path / "t.db",
        "SELECT key, state, typeof(fingerprint), length(fingerprint), typeof(ok), ok,"
        " typeof(payload) FROM idempotency_records ORDER BY key",
    )
    assert rows == [
        ("k1", 2, "blob", 32, "integer", 1, "blob"),
        ("k2", 2, "blob", 32, "integer", 0, "blob"),
    ]


async def _refuse(call: Call) -> Any:
    raise ApplicationError("no", "refused")


def test_corrupted_row_is_named_and_does_not_break_the_batch(tmp_path: Path) -> None:
    path = tmp_path / "c.db"
    store = SQLiteStore(path)

    async def seed() -> None:
        idem = Idempotency(store)
        for k in ("bad", "good"):
            await idem.run(caller="c", key=k, request=("op", []), handler=lambda call: 1)

    grun(seed)
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE idempotency_records SET state = 7 WHERE key = 'bad'")

    async def main() -> None:
        idem = Idempotency(store)
        out: gosim.Chan[Any] = gosim.Chan(3)

        async def one(k: str) -> None:
            try:
                await out.send(
                    await idem.run(caller="c", key=k, request=("op", []), handler=lambda call: 2)
                )
            except CorruptedRecord as exc:
                await out.send(exc)

        for k in ("bad", "good", "new"):
            gosim.go(one, k)
        got = [await out.recv() for _ in range(3)]
        errors = [g for g in got if isinstance(g, CorruptedRecord)]
        assert len(errors) == 1
        msg = str(errors[0])
        assert str(path) in msg and "key='bad'" in msg and "state 7" in msg
        assert sorted((g.value, g.replayed) for g in got if g is not errors[0]) == [
            (1, True),
            (2, False),
        ]

    grun(main)
    store.close()


def test_damaged_file_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "junk.db"
    path.write_bytes(b"this is not a database" * 100)
    with pytest.raises(CorruptedRecord, match=r"junk\.db.*(damaged|not a database)"):
        SQLiteStore(path)


LOCKER = textwrap.dedent(
    """
    import sqlite3, sys, time
    conn = sqlite3.connect(sys.argv[1], isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")
    print("locked", flush=True)
    sys.stdin.readline()
    conn.execute("ROLLBACK")
    """
)


def test_locked_database_is_unavailable_and_does_not_stall_goroutines(tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    store = SQLiteStore(path, busy_timeout=0.3)
    locker = subprocess.Popen(
        [sys.executable, "-c", LOCKER, str(path)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert locker.stdout is not None and locker.stdout.readline().strip() == "locked"

        async def main() -> int:
            ticks = 0
            stop: gosim.Chan[None] = gosim.Chan()

            async def ticker() -> None:
                nonlocal ticks
                while True:
                    i, _, _ = await gosim.select(gosim.recv(stop), gosim.recv(gosim.after(0.01)))
                    if i == 0:
                        return
                    ticks += 1

            gosim.go(ticker)
            with pytest.raises(StoreUnavailable, match=r"l\.db.*locked"):
                await Idempotency(store).run(
                    caller="c", key="k", request=("op", []), handler=lambda c: 1
                )
            stop.close()
            return ticks

        ticks = grun(main)
        assert ticks >= 3  # the ticker kept running while the claim waited for the lock
    finally:
        assert locker.stdin is not None
        locker.stdin.write("\n")
        locker.stdin.close()
        locker.wait(timeout=10)
        assert locker.stdout is not None
        locker.stdout.close()

    async def after() -> Any:
        return await Idempotency(store).run(
            caller="c", key="k", request=("op", []), handler=lambda c: 1
        )

    out = grun(after)  # the store is back: the same key runs
    assert out.value == 1 and not out.replayed
    store.close()


def test_redis_killed_mid_call_then_back(own_redis: Any) -> None:
    redis_store = pytest.importorskip("idempotency.stores.redis", reason="needs redis-py")
    store = redis_store.RedisStore(own_redis.url, socket_timeout=2.0)
    runs = []

    async def acknowledged() -> Any:
        return await Idempotency(store).run(
            caller="c", key="acked", request=("op", []), handler=lambda c: "kept"
        )

    first = grun(acknowledged)

    async def killer(call: Call) -> str:
        runs.append(call.fence)
        if len(runs) == 1:
            own_redis.kill()  # the server dies while this call is in flight
        return "done"

    async def mid_call() -> None:
        with pytest.raises(StoreUnavailable, match=r"RedisStore\('redis://127\.0\.0\.1"):
            await Idempotency(store, lease=1.0).run(
                caller="c", key="k", request=("op", []), handler=killer
            )
        with pytest.raises(StoreUnavailable):
            await Idempotency(store).run(
                caller="c", key="other", request=("op", []), handler=killer
            )

    grun(mid_call)
    own_redis.start()  # the same port and directory: the append-only file is replayed

    async def back() -> tuple[Any, Any]:
        idem = Idempotency(store, lease=1.0)
        kept = await idem.run(caller="c", key="acked", request=("op", []), handler=killer)
        # The interrupted call's claim is in the file; it lapses with its lease and the
        # retry runs the handler again (its completion was never acknowledged).
        retried = await idem.run(
            caller="c", key="k", request=("op", []), handler=killer, timeout=10
        )
        return kept, retried

    kept, retried = grun(back)
    assert kept.replayed and kept.payload == first.payload  # nothing acknowledged was lost
    assert retried.value == "done" and not retried.replayed and len(runs) == 2
    assert runs[1] > runs[0]
    store.close()


def test_sqlite_sweeps_expired_records_as_it_goes(tmp_path: Path) -> None:
    now = [1_700_000_000.0]
    store = SQLiteStore(tmp_path / "s.db", clock=lambda: now[0], sweep_every=4)

    async def calls(tag: str, n: int) -> None:
        idem = Idempotency(store, ttl=10.0)
        for i in range(n):
            await idem.run(caller="c", key=f"{tag}{i}", request=("op", []), handler=lambda c: 1)

    grun(calls, "old", 3)
    now[0] += 10.0  # the three are expired now
    grun(calls, "new", 2)  # four more batches: one of them sweeps
    rows = _read(tmp_path / "s.db", "SELECT key FROM idempotency_records ORDER BY key")
    assert rows == [("new0",), ("new1",)]
    store.close()


def test_sqlite_automatic_sweep_walks_the_whole_table(tmp_path: Path) -> None:
    path = tmp_path / "w.db"
    now = [1_700_000_000.0]
    store = SQLiteStore(path, clock=lambda: now[0], sweep_every=1)
    store.close()
    with sqlite3.connect(path) as conn:  # 1,200 expired records and one live one
        conn.executemany(
            "INSERT INTO idempotency_records VALUES ('c', ?, 2, zeroblob(32), ?, ?, 1, x'01')",
            [(f"k{i:04d}", i + 1, now[0] - 1) for i in range(1200)],
        )
        conn.execute(
            "INSERT INTO idempotency_records"
            " VALUES ('c', 'k0600x', 2, zeroblob(32), 9999, ?, 1, x'01')",
            (now[0] + 100,),
        )
    store = SQLiteStore(path, clock=lambda: now[0], sweep_every=1)

    async def reads(n: int) -> None:
        for _ in range(n):
            await store.get("c", "nothing")  # one batch each; each sweeps a step

    grun(reads, 2)
    left = _read(path, "SELECT count(*) FROM idempotency_records")[0][0]
    assert 1 < left < 1201  # two steps of 512 rows: partway through
    grun(reads, 2)
    assert _read(path, "SELECT key FROM idempotency_records") == [("k0600x",)]
    store.close()


def test_claim_batches_skip_the_fsync_but_fences_never_go_back(tmp_path: Path) -> None:
    from idempotency.stores.sqlite import FENCE_RESERVE  # noqa: PLC0415

    path = tmp_path / "f.db"
    store = SQLiteStore(path)

    def meta() -> dict[str, int]:
        return dict(_read(path, "SELECT name, value FROM idempotency_meta"))

    async def claims(n: int, tag: str = "k") -> list[int]:
        fp = b"\x00" * 32
        return [(await store.claim("c", f"{tag}{i}", fp, 60.0)).record.fence for i in range(n)]

    # The first claim batch finds no reservation: it is redone durably and reserves.
    assert grun(claims, 3) == [1, 2, 3]
    assert meta() == {"fence": 3, "fence_ceiling": 1 + FENCE_RESERVE}
    store.close()
    # A power loss could have lost claim commits made without an fsync; a store that
    # opens resumes above every token that may have been handed out.
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE idempotency_meta SET value = 1 WHERE name = 'fence'")
    store = SQLiteStore(path)
    assert meta()["fence"] == 1 + FENCE_RESERVE
    (fence,) = grun(claims, 1, "new")
    assert fence == 2 + FENCE_RESERVE
    store.close()
