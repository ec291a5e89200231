"""Exactly-once effects under SIGKILL: a child process completes calls whose effect
commits with its record, and is killed at a random instant. Afterwards, for every key,
the record and the effect are both there or both absent; everything the child saw
acknowledged is there; and retrying every key applies each effect exactly once."""

from __future__ import annotations

import os
import random
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

import gosim
from idempotency import Call, Idempotency, InProgress, SQLiteEffect, SQLiteStore

N_KEYS = 400
WORKERS = 40

CHILD = textwrap.dedent(
    """
    import sys, sqlite3
    import gosim
    from idempotency import Idempotency, SQLiteEffect, SQLiteStore

    kind, where, prefix = sys.argv[1], sys.argv[2], sys.argv[3]
    n_keys, workers, one_step = int(sys.argv[4]), int(sys.argv[5]), sys.argv[6] == "1"

    def sqlite_effect(key):
        def fn(conn):
            conn.execute("INSERT INTO applied (key) VALUES (?)", (key,))
            conn.execute("UPDATE totals SET n = n + 1")
            return key
        return SQLiteEffect(fn)

    if kind == "sqlite":
        store = SQLiteStore(where)
        effect = sqlite_effect
    elif kind == "postgres":
        from idempotency import PostgresEffect, PostgresStore
        store = PostgresStore(where, schema=prefix, application_name=prefix)
        def effect(key):
            async def fn(conn):
                await conn.execute("INSERT INTO applied (key) VALUES (%s)", (key,))
                await conn.execute("UPDATE totals SET n = n + 1")
                return key
            return PostgresEffect(fn)
    else:
        from idempotency import LuaEffect, RedisStore
        store = RedisStore(where, prefix=prefix)
        script = (
            "redis.call('SADD', KEYS[1], ARGV[1]) "
            "redis.call('INCR', KEYS[2]) return ARGV[1]"
        )
        def effect(key):
            return LuaEffect(script, [prefix + "applied", prefix + "total"], [key])

    async def main():
        # Two steps: a killed run's claims lapse soon. One step leaves no claim to lapse:
        # an hour's lease, which a claim left behind would hold its key for.
        idem = Idempotency(store, lease=3600.0 if one_step else 1.0)
        done = gosim.Chan(workers)

        async def worker(w):
            for i in range(w, n_keys, workers):
                key = f"t{i}"
                out = await idem.run(caller="c", key=key, request=("apply", [key]),
                                     handler=lambda call, key=key: effect(key),
                                     one_step=one_step)
                sys.stdout.write(f"ack {key}\\n")
                sys.stdout.flush()
            await done.send(None)

        print("ready", flush=True)
        for w in range(workers):
            gosim.go(worker, w)
        for _ in range(workers):
            await done.recv()

    gosim.run(main)
    print("finished", flush=True)
    """
)


def _kill_child(
    kind: str, where: str, prefix: str, rnd: random.Random, one_step: bool = False
) -> set[str]:
    """Run the child, SIGKILL it at a random instant; return the keys it saw acknowledged."""
    step = "1" if one_step else "0"
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, kind, where, prefix, str(N_KEYS), str(WORKERS), step],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    try:
        assert proc.stdout.readline().strip() == "ready"
        # Kill mid-run: after a random number of acknowledgements, plus a random instant
        # (so the kill lands anywhere in a batch: claiming, in the effect, committing).
        acked = set()
        for _ in range(rnd.randint(1, N_KEYS // 2)):
            line = proc.stdout.readline()
            assert line.startswith("ack "), line
            acked.add(line.split()[1])
        time.sleep(rnd.uniform(0.0, 0.005))
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        acked |= {
            line.split()[1] for line in proc.stdout.read().splitlines() if line.startswith("ack ")
        }
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        proc.stdout.close()
    return acked


def _check_sqlite(path: Path) -> tuple[set[str], set[str]]:
    with sqlite3.connect(path) as conn:
        recorded = {
            k for (k,) in conn.execute("SELECT key FROM idempotency_records WHERE state = 2")
        }
        applied = [k for (k,) in conn.execute("SELECT key FROM applied")]
        (total,) = conn.execute("SELECT n FROM totals").fetchone()
    assert len(applied) == len(set(applied)) == total  # no effect twice, none half done
    return recorded, set(applied)


def _retry_all(store: Any, effect: Any, one_step: bool = False) -> int:
    """Run every key once more through ``store``, and close it whatever happens (a store
    left open by a failed run would leak its connections into the next test). One step:
    without waiting (``wait=False``), so a key still claimed fails with InProgress."""
    runs = 0

    async def main() -> None:
        nonlocal runs
        # The killed child's claims lapse by its own lease; this run's lease only has to
        # outlast one claim-to-complete span, which a loaded machine can stretch past a
        # second (a lapsed lease here fails the run with StaleClaim, as it should).
        idem = Idempotency(store, lease=10.0)

        def handler(call: Call) -> Any:
            nonlocal runs
            runs += 1
            return effect(call.args[0])

        for i in range(N_KEYS):
            key = f"t{i}"
            await idem.run(
                caller="c",
                key=key,
                request=("apply", [key]),
                handler=handler,
                timeout=30,
                one_step=one_step,
                wait=not one_step,
            )

    try:
        gosim.run(main)
    finally:
        store.close()
    return runs


def _sqlite_effect(key: str) -> SQLiteEffect:
    def fn(conn: sqlite3.Connection) -> str:
        conn.execute("INSERT INTO applied (key) VALUES (?)", (key,))
        conn.execute("UPDATE totals SET n = n + 1")
        return key

    return SQLiteEffect(fn)


def _kills(request: pytest.FixtureRequest) -> int:
    return 12 if request.config.getoption("--run-slow") else 3


def test_sigkill_while_completing_sqlite(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    rnd = random.Random(int(os.environ.get("IDEM_KILL_SEED", "14")))
    mid_run = 0
    for round_ in range(_kills(request)):
        path = tmp_path / f"kill{round_}.db"
        SQLiteStore(path).close()
        with sqlite3.connect(path) as conn:
            conn.execute("CREATE TABLE applied (key TEXT PRIMARY KEY)")
            conn.execute("CREATE TABLE totals (n INTEGER)")
            conn.execute("INSERT INTO totals VALUES (0)")
        acked = _kill_child("sqlite", str(path), "", rnd)
        recorded, applied = _check_sqlite(path)
        assert recorded == applied, (
            f"round {round_}: record without effect or effect without record"
        )
        assert acked <= recorded, f"round {round_}: an acknowledged call was lost"
        mid_run += len(recorded) < N_KEYS
        store = SQLiteStore(path)
        runs = _retry_all(store, _sqlite_effect)
        recorded2, applied2 = _check_sqlite(path)
        assert recorded2 == applied2 == {f"t{i}" for i in range(N_KEYS)}
        assert runs == N_KEYS - len(recorded)  # only the missing ones ran again
    assert mid_run, "every kill came after the child had finished: nothing was tested"


def _redis_round(redis_store: Any, url: str, prefix: str, acked: set[str]) -> bool:
    """Check one killed run on Redis, retry every key, check again; True when the kill
    came before the child finished."""
    store = redis_store.RedisStore(url, prefix=prefix)
    client = store.client

    def check() -> tuple[set[str], set[str]]:
        recorded = set()
        for rkey in client.scan_iter(match=f"{prefix}rec:*"):
            if client.hget(rkey, "s") == b"2":
                recorded.add(rkey.decode().rsplit(":", 1)[1])
        applied = {k.decode() for k in client.smembers(f"{prefix}applied")}
        assert int(client.get(f"{prefix}total") or 0) == len(applied)
        return recorded, applied

    recorded, applied = check()
    assert recorded == applied, "record without effect or effect without record"
    assert acked <= recorded, "an acknowledged call was lost"

    def effect(key: str) -> Any:
        return redis_store.LuaEffect(
            "redis.call('SADD', KEYS[1], ARGV[1]) redis.call('INCR', KEYS[2]) return ARGV[1]",
            [f"{prefix}applied", f"{prefix}total"],
            [key],
        )

    runs = _retry_all(store, effect)
    recorded2, applied2 = check()
    assert recorded2 == applied2 == {f"t{i}" for i in range(N_KEYS)}
    assert runs == N_KEYS - len(recorded)
    return len(recorded) < N_KEYS


def test_sigkill_while_completing_redis(redis_server: Any, request: pytest.FixtureRequest) -> None:
    redis_store = pytest.importorskip("idempotency.stores.redis", reason="needs redis-py")
    rnd = random.Random(int(os.environ.get("IDEM_KILL_SEED", "14")))
    mid_run = 0
    for round_ in range(_kills(request)):
        prefix = f"kill{os.getpid()}-{round_}:"
        acked = _kill_child("redis", redis_server.url, prefix, rnd)
        mid_run += _redis_round(redis_store, redis_server.url, prefix, acked)
    assert mid_run, "every kill came after the child had finished: nothing was tested"


@pytest.mark.parametrize("one_step", [False, True], ids=["two-step", "one-step"])
def test_sigkill_while_completing_postgres(
    postgres_server: Any, request: pytest.FixtureRequest, one_step: bool
) -> None:
    """The process running PostgresStore is killed mid-batch: its open transaction is
    rolled back by the server (the effect and the record go together), and what it saw
    committed stays. With ``one_step`` the claim commits only with its effect and
    record, so the kill leaves no claim: the retry finds every key free or completed
    (the child's lease is an hour, and the retry does not wait)."""
    from idempotency import PostgresEffect, PostgresStore  # noqa: PLC0415 -- needs psycopg

    rnd = random.Random(int(os.environ.get("IDEM_KILL_SEED", "14")))
    mid_run = 0
    for round_ in range(_kills(request)):
        schema = f"kill{os.getpid()}_{int(one_step)}_{round_}"
        PostgresStore(postgres_server.dsn, schema=schema).close()
        postgres_server.sql(
            f"CREATE TABLE {schema}.applied (key text PRIMARY KEY);"
            f"CREATE TABLE {schema}.totals (n integer); INSERT INTO {schema}.totals VALUES (0)"
        )

        def check(schema: str = schema) -> tuple[set[str], set[str]]:
            # One statement: one snapshot of the records, the effects and the total.
            ((recorded, applied, total),) = postgres_server.sql(
                f"SELECT ARRAY(SELECT key FROM {schema}.idempotency_records WHERE state = 2),"
                f" ARRAY(SELECT key FROM {schema}.applied), (SELECT n FROM {schema}.totals)"
            )
            assert len(applied) == len(set(applied)) == total  # none twice, none half done
            return set(recorded), set(applied)

        acked = _kill_child("postgres", postgres_server.dsn, schema, rnd, one_step)
        # The killed child's backends may still be running what it sent (a COMMIT
        # already on the wire): they end once they find their client gone.
        deadline = time.monotonic() + 60
        while postgres_server.sql(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (schema,)
        ) != [(0,)]:
            assert time.monotonic() < deadline, "the killed child's backends did not end"
            time.sleep(0.05)
        recorded, applied = check()
        assert recorded == applied, f"round {round_}: record without effect or the reverse"
        assert acked <= recorded, f"round {round_}: an acknowledged call was lost"
        mid_run += len(recorded) < N_KEYS
        if one_step:
            claims = postgres_server.sql(
                f"SELECT key FROM {schema}.idempotency_records WHERE state = 1"
            )
            assert claims == [], f"round {round_}: the kill left claims {claims[:5]}"

        def effect(key: str) -> PostgresEffect:
            async def fn(conn: Any) -> str:
                await conn.execute("INSERT INTO applied (key) VALUES (%s)", (key,))
                await conn.execute("UPDATE totals SET n = n + 1")
                return key

            return PostgresEffect(fn)

        store = PostgresStore(postgres_server.dsn, schema=schema)
        runs = _retry_all(store, effect, one_step)
        recorded2, applied2 = check()  # and no effect twice
        assert recorded2 == applied2 == {f"t{i}" for i in range(N_KEYS)}
        # Only the missing ones ran again; a one-step handler runs for a replay too (it
        # only builds the effect, which is then dropped).
        assert runs == (N_KEYS if one_step else N_KEYS - len(recorded))
    assert mid_run, "every kill came after the child had finished: nothing was tested"


SHARER = textwrap.dedent(
    """
    import sys
    import gosim
    from idempotency import Idempotency, SQLiteEffect, SQLiteStore

    path, n_keys = sys.argv[1], int(sys.argv[2])
    store = SQLiteStore(path, busy_timeout=60)

    def effect(key):
        def fn(conn):
            conn.execute("INSERT INTO applied (key) VALUES (?)", (key,))
            return [key, conn.execute("SELECT count(*) FROM applied").fetchone()[0]]
        return SQLiteEffect(fn)

    async def main():
        idem = Idempotency(store)
        done = gosim.Chan(20)

        async def worker(w):
            for i in range(w, n_keys, 20):
                key = f"t{i}"
                out = await idem.run(caller="c", key=key, request=("apply", [key]),
                                     handler=lambda call, key=key: effect(key), timeout=60)
                print(key, out.payload.hex(), int(out.replayed), flush=True)
            await done.send(None)

        for w in range(20):
            gosim.go(worker, w)
        for _ in range(20):
            await done.recv()

    gosim.run(main)
    """
)


def test_two_processes_share_one_sqlite_file(tmp_path: Path) -> None:
    """Two processes call the same keys at once through one file: every effect is
    applied once, and both processes get the same outcome for each key."""
    path = tmp_path / "shared.db"
    SQLiteStore(path).close()
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE applied (key TEXT PRIMARY KEY)")
    n = 200
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", SHARER, str(path), str(n)], stdout=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    outputs = []
    for proc in procs:
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0
        outputs.append({line.split()[0]: line.split()[1:] for line in out.splitlines()})
    assert all(len(o) == n for o in outputs)
    for key in outputs[0]:
        assert outputs[0][key][0] == outputs[1][key][0], key  # the same recorded bytes
        assert {outputs[0][key][1], outputs[1][key][1]} == {"0", "1"}  # one ran, one replayed
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT count(*) FROM applied").fetchone() == (n,)


HOLDER = textwrap.dedent(
    """
    import sys
    import gosim
    from idempotency import Idempotency, SQLiteStore

    kind, where, prefix, lease = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
    if kind == "sqlite":
        store = SQLiteStore(where)
    else:
        from idempotency import RedisStore
        store = RedisStore(where, prefix=prefix)

    async def forever(call):
        print("holding", call.fence, flush=True)
        await gosim.sleep(3600)  # far past its lease: only its keep-alive holds the key
        return "never"

    async def main():
        idem = Idempotency(store, lease=lease)
        await idem.run(caller="c", key="k", request=("op", []), handler=forever)

    gosim.run(main)
    """
)
HOLD_LEASE = 2.5  # the child renews every lease/4; a renewal may come half a lease late


@pytest.mark.parametrize("kind", ["sqlite", "redis"])
def test_a_live_holder_keeps_its_key_past_the_lease_and_a_killed_one_loses_it(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """A child process holds a key with a handler that runs for an hour. Two leases
    later the key is still held (the child renews it): a duplicate is refused with
    InProgress and does not run. After SIGKILL of the child, the duplicate waits and
    takes the key over once the lease lapses, with a higher fencing token."""
    if kind == "sqlite":
        where, prefix = str(tmp_path / "hold.db"), ""
        SQLiteStore(where).close()
    else:
        pytest.importorskip("redis", reason="needs redis-py")
        where, prefix = request.getfixturevalue("redis_server").url, f"hold{os.getpid()}:"
    child = subprocess.Popen(
        [sys.executable, "-c", HOLDER, kind, where, prefix, str(HOLD_LEASE)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        line = child.stdout.readline()  # blocks until the child holds the key
        assert line.startswith("holding"), line
        held_fence = int(line.split()[1])
        time.sleep(2 * HOLD_LEASE)

        def open_store() -> Any:
            if kind == "sqlite":
                return SQLiteStore(where)
            from idempotency import RedisStore  # noqa: PLC0415

            return RedisStore(where, prefix=prefix)

        runs: list[int] = []

        def handler(call: Call) -> str:
            runs.append(call.fence)
            return "taken over"

        async def refused() -> None:
            store = open_store()
            try:
                idem = Idempotency(store, lease=HOLD_LEASE)
                with pytest.raises(InProgress):
                    await idem.run(
                        caller="c", key="k", request=("op", []), handler=handler, wait=False
                    )
            finally:
                store.close()

        gosim.run(refused)
        assert runs == [] and child.poll() is None  # still held by the live child
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=30)
        assert child.stdout is not None
        child.stdout.close()

    async def takeover() -> Any:
        store = open_store()
        try:
            idem = Idempotency(store, lease=HOLD_LEASE)
            return await idem.run(
                caller="c", key="k", request=("op", []), handler=handler, timeout=60
            )
        finally:
            store.close()

    out = gosim.run(takeover)
    assert out.value == "taken over" and not out.replayed
    assert runs == [out.fence] and out.fence > held_fence
