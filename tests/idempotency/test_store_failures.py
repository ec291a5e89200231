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
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

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


def test_a_batch_reads_its_working_set_with_a_few_prepared_statements(tmp_path: Path) -> None:
    # Every batch size reads back exactly its keys' records (the last key repeated to
    # fill a fixed-size statement), with one of a few statements whatever the size.
    from idempotency.stores._batch import Op  # noqa: PLC0415
    from idempotency.stores.sqlite import _GET, _LOAD_SIZES  # noqa: PLC0415

    path = tmp_path / "load.db"
    store = SQLiteStore(path)
    with sqlite3.connect(path) as conn:
        conn.executemany(
            "INSERT INTO idempotency_records VALUES ('c', ?, 2, zeroblob(32), ?, 1e12, 1, x'01')",
            [(f"k{i}", i + 1) for i in range(0, 300, 2)],  # every even key stored
        )
    statements: set[str] = set()
    conn = store._conn  # type: ignore[attr-defined]
    assert conn is not None
    conn.set_trace_callback(statements.add)
    for n in (1, 2, 5, 6, 7, 63, 64, 65, 128, 129, 300):
        ops = [Op(_GET, ("c", f"k{i}")) for i in range(n)]
        ws = store._load(conn, ops)  # type: ignore[attr-defined]
        assert sorted(ws) == sorted(("c", f"k{i}") for i in range(n))
        found = {k for (_, k), rec in ws.items() if rec is not None}
        assert found == {f"k{i}" for i in range(0, n, 2)}
        assert all(rec.fence == int(k[1:]) + 1 for (_, k), rec in ws.items() if rec is not None)
    conn.set_trace_callback(None)
    sizes = {sql.count(" OR ") + 1 for sql in statements if "idempotency_records" in sql}
    assert sizes <= set(_LOAD_SIZES)  # statements of fixed sizes only: all kept prepared
    assert sizes == {1, 2, 6, 8, 64, 96, 128, 48}  # 5 -> 6, 7 -> 8, 129 -> 128 + 1, ...
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


# The records table of files made before the rowid layout: clustered on the key.
_CLUSTERED_ON_KEY_SCHEMA = """
CREATE TABLE idempotency_records (
    caller TEXT NOT NULL, key TEXT NOT NULL, state INTEGER NOT NULL,
    fingerprint BLOB NOT NULL, fence INTEGER NOT NULL, expires_at REAL NOT NULL,
    ok INTEGER NOT NULL, payload BLOB, PRIMARY KEY (caller, key)
) WITHOUT ROWID;
"""


def _table_sql(path: Path) -> str:
    rows = _read(path, "SELECT sql FROM sqlite_master WHERE name = 'idempotency_records'")
    return str(rows[0][0])


@pytest.mark.parametrize("layout", ["rowid", "clustered-on-key"])
def test_sqlite_automatic_sweep_walks_the_whole_table(tmp_path: Path, layout: str) -> None:
    path = tmp_path / "w.db"
    now = [1_700_000_000.0]
    if layout == "clustered-on-key":
        with sqlite3.connect(path) as conn:
            conn.executescript(_CLUSTERED_ON_KEY_SCHEMA)
    store = SQLiteStore(path, clock=lambda: now[0], sweep_every=1)
    store.close()
    assert ("WITHOUT ROWID" in _table_sql(path)) == (layout == "clustered-on-key")
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


def test_sqlite_file_of_the_older_layout_keeps_its_records_and_layout(tmp_path: Path) -> None:
    """A file whose records table is clustered on the key (the layout before the rowid
    one) opens as it is: its records replay, new calls claim and complete in it."""
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as conn:
        conn.executescript(_CLUSTERED_ON_KEY_SCHEMA)
    store = SQLiteStore(path)
    runs: list[str] = []

    def handler(call: Any) -> str:
        runs.append(call.key)
        return f"did {call.key}"

    async def calls() -> list[Any]:
        idem = Idempotency(store)
        return [
            await idem.run(caller="c", key=k, request=("op", [k]), handler=handler)
            for k in ("a", "b", "a")
        ]

    first = grun(calls)
    assert [o.value for o in first] == ["did a", "did b", "did a"]
    assert [o.replayed for o in first] == [False, False, True]
    store.close()
    store = SQLiteStore(path)
    again = grun(calls)
    assert all(o.replayed for o in again) and runs == ["a", "b"]
    store.close()
    assert "WITHOUT ROWID" in _table_sql(path)


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


# ------------------------------------------------------------- atomic effects

# What an effect does, in order: "w" writes its row and adds to the total, "R" refuses
# (a final ApplicationError), "T" refuses retryably, "B" raises a plain exception, "U"
# returns a result that cannot be recorded; reaching the end returns its index.
BEHAVIOURS = ("w", "R", "wR", "T", "B", "wB", "wU")


def _ledger_table(path: Path) -> None:
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE rows (name TEXT PRIMARY KEY, n INTEGER NOT NULL)")
        conn.execute("INSERT INTO rows VALUES ('total', 0)")


def _scripted(i: int, script: str, atomic: bool, runs: list[int]) -> SQLiteEffect:
    def fn(conn: sqlite3.Connection) -> Any:
        runs[i] += 1
        for step in script:
            if step == "w":
                conn.execute("INSERT INTO rows VALUES (?, 1)", (f"r{i}",))
                conn.execute("UPDATE rows SET n = n + 1 WHERE name = 'total'")
            elif step == "R":
                raise ApplicationError("refused", f"effect {i} refuses")
            elif step == "T":
                raise ApplicationError("busy", f"effect {i} is busy", retryable=True)
            elif step == "B":
                raise RuntimeError(f"effect {i} broke")
            else:
                return object()
        return i

    return SQLiteEffect(fn, atomic=atomic)


def _run_scripts(
    path: Path, scripts: list[str], atomic: list[bool], one_step: list[bool]
) -> tuple[list[Any], list[int], list[str]]:
    """Every script as a call of its own, all at once (so they share batches); returns
    each call's outcome or exception, each effect's run count, and the statements the
    store ran."""
    store = SQLiteStore(path, synchronous="NORMAL")
    statements: list[str] = []
    assert store._conn is not None
    store._conn.set_trace_callback(statements.append)
    runs = [0] * len(scripts)

    async def main() -> list[Any]:
        idem = Idempotency(store)
        done: gosim.Chan[tuple[int, Any]] = gosim.Chan(len(scripts))

        async def one(i: int) -> None:
            def handler(call: Call) -> SQLiteEffect:
                return _scripted(i, scripts[i], atomic[i], runs)

            try:
                out: Any = await idem.run(
                    caller="c", key=f"k{i}", request=("op", [i]), handler=handler,
                    one_step=one_step[i],
                )  # fmt: skip
            except Exception as exc:
                out = exc
            await done.send((i, out))

        for i in range(len(scripts)):
            gosim.go(one, i)
        results = dict([await done.recv() for _ in scripts])
        return [results[i] for i in range(len(scripts))]

    try:
        return grun(main), runs, statements
    finally:
        store.close()


def _check_outcomes(path: Path, scripts: list[str], outcomes: list[Any]) -> None:
    """Each call got what its script asks for, and the file holds exactly the writes of
    the effects that succeeded, once each, and their records."""
    from idempotency import IdempotencyError  # noqa: PLC0415

    rows = dict(_read(path, "SELECT name, n FROM rows"))
    records = {k: ok for k, ok in _read(path, "SELECT key, ok FROM idempotency_records")}
    succeeded = 0
    for i, (script, out) in enumerate(zip(scripts, outcomes, strict=True)):
        last = script[-1]
        if last == "w":
            assert out.ok and out.value == i, (i, script, out)
            assert rows.get(f"r{i}") == 1 and records.get(f"k{i}") == 1
            succeeded += 1
            continue
        assert f"r{i}" not in rows, (i, script)  # nothing of a failed effect is kept
        if last == "R":
            assert not out.ok and out.error.code == "refused", (i, script, out)
            assert records.get(f"k{i}") == 0  # the refusal is recorded
        else:
            expected = {"T": ApplicationError, "B": RuntimeError, "U": IdempotencyError}[last]
            assert isinstance(out, expected), (i, script, out)
            assert f"k{i}" not in records  # nothing recorded: the call may be retried
    assert rows["total"] == succeeded


def test_an_atomic_effect_runs_without_a_savepoint(tmp_path: Path) -> None:
    """Atomic effects that succeed or fail before writing run with no savepoint of the
    store's; each runs once, and outcomes and writes are as with savepoints."""
    path = tmp_path / "a.db"
    _ledger_table(path)
    scripts = [("w", "R", "T", "B")[i % 4] for i in range(40)]
    n = len(scripts)
    outcomes, runs, statements = _run_scripts(
        path, scripts, [True] * n, [i % 2 == 0 for i in range(n)]
    )
    _check_outcomes(path, scripts, outcomes)
    assert not [s for s in statements if "SAVEPOINT" in s]
    assert runs == [1] * n


def test_an_atomic_effect_that_fails_after_writing_redoes_its_batch_with_savepoints(
    tmp_path: Path,
) -> None:
    """An effect that says atomic but writes before it fails (a refusal, a bug, a result
    that cannot be recorded): the batch is rolled back and applied again with
    savepoints, so its writes go and every other effect of the batch commits once."""
    for liar in ("wR", "wB", "wU"):
        path = tmp_path / f"{liar}.db"
        _ledger_table(path)
        scripts = ["w"] * 30
        scripts[17] = liar
        outcomes, runs, statements = _run_scripts(path, scripts, [True] * 30, [True] * 30)
        _check_outcomes(path, scripts, outcomes)
        assert "ROLLBACK" in statements and any("SAVEPOINT" in s for s in statements), liar
        assert runs[17] == 2  # its batch ran twice: once without savepoints, once with


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    calls=st.lists(
        st.tuples(st.sampled_from(BEHAVIOURS), st.booleans(), st.booleans()),
        min_size=1,
        max_size=24,
    )
)
def test_effects_in_shared_batches_keep_exactly_the_writes_of_those_that_succeed(
    tmp_path_factory: pytest.TempPathFactory, calls: list[tuple[str, bool, bool]]
) -> None:
    """Any mix of effects, atomic or not, honest or not, one step or two, run at once:
    every caller gets its effect's outcome, and the file keeps the writes of the effects
    that succeeded, once each, with their records."""
    path = tmp_path_factory.mktemp("mix") / "m.db"
    _ledger_table(path)
    scripts = [c[0] for c in calls]
    outcomes, _, _ = _run_scripts(path, scripts, [c[1] for c in calls], [c[2] for c in calls])
    _check_outcomes(path, scripts, outcomes)


def _statements(store: SQLiteStore) -> list[str]:
    """Every SQL statement the store's connection runs from now on (its committer's)."""
    seen: list[str] = []
    assert store._conn is not None
    store._conn.set_trace_callback(seen.append)
    return seen


def test_sqlite_completes_its_own_claims_without_reading_their_rows(tmp_path: Path) -> None:
    """A completion of a claim this store granted is one conditional write: no read of
    the row, and the record it answers is what complete() makes."""
    from idempotency.stores._contract import Completion  # noqa: PLC0415

    store = SQLiteStore(tmp_path / "h.db")
    fp = b"\x07" * 32

    async def calls() -> tuple[Any, list[str], Any]:
        claimed = [await store.claim("c", f"k{i}", fp, 60.0) for i in range(3)]
        seen = _statements(store)
        done = [
            await store.complete(
                "c", f"k{i}", r.record.fence, Completion(True, b"\x01", None, 60.0, 9)
            )
            for i, r in enumerate(claimed)
        ]
        during = list(seen)  # the completions' statements alone
        return done, during, await store.get("c", "k1")

    done, seen, stored = grun(calls)
    store.close()
    reads = [q for q in seen if q.lstrip().upper().startswith("SELECT") and "caller = " in q]
    writes = [q for q in seen if "fingerprint = " in q and q.startswith("UPDATE")]
    assert reads == [] and len(writes) == 3
    assert [(r.state, r.fingerprint, r.ok, r.payload) for r in done] == [(2, fp, True, b"\x01")] * 3
    assert stored == done[1]


def test_sqlite_a_held_claim_that_went_stale_fails_as_complete_says(tmp_path: Path) -> None:
    """The conditional write finds the row changed (another store on the file took the
    key over after the lease; a row damaged meanwhile): nothing is written that way, and
    the completion is read and decided as usual: StaleClaim, CorruptedRecord."""
    from idempotency import StaleClaim  # noqa: PLC0415
    from idempotency.stores._contract import Completion  # noqa: PLC0415

    path = tmp_path / "s.db"
    now = [1_700_000_000.0]
    mine = SQLiteStore(path, clock=lambda: now[0])
    other = SQLiteStore(path, clock=lambda: now[0])
    fp = b"\x07" * 32
    c = Completion(True, b"\x01", None, 60.0, 9)

    async def calls() -> list[Any]:
        took = await mine.claim("c", "k", fp, 1.0)
        dmg = await mine.claim("c", "d", fp, 60.0)
        now[0] += 2.0  # mine's lease on k lapsed: the other store takes the key over
        over = await other.claim("c", "k", fp, 60.0)
        with sqlite3.connect(path) as conn:
            conn.execute("UPDATE idempotency_records SET expires_at = 'soon' WHERE key = 'd'")
        got: list[Any] = [over.record.fence > took.record.fence]
        for key, res in (("k", took), ("d", dmg)):
            try:
                got.append(await mine.complete("c", key, res.record.fence, c))
            except Exception as exc:
                got.append(type(exc))
        got.append(await other.complete("c", "k", over.record.fence, c))
        return got

    newer, stale, damaged, theirs = grun(calls)
    mine.close()
    other.close()
    assert newer and stale is StaleClaim and damaged is CorruptedRecord
    assert theirs.state == 2 and theirs.payload == b"\x01"
