"""PostgresStore against a real PostgreSQL cluster of the tests' own, where the contract
suite does not reach: a backend terminated mid-transaction, the server stopped and
started mid-effect, several processes writing the same keys at once, a sweep that never
waits for a writer, the pool's bound, and errors that name the server and SQLSTATE."""

from __future__ import annotations

import math
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from typing import Any

import pytest

import gosim
from gosim import sync
from idempotency import Call, Idempotency, StoreUnavailable
from idempotency._keys import fingerprint
from idempotency._record import ClaimKind
from idempotency.stores import Completion

from ._concurrently import gather

psycopg = pytest.importorskip("psycopg", reason="PostgresStore needs psycopg 3")

from idempotency import PostgresEffect, PostgresStore  # noqa: E402

SERVER = r"PostgresStore\('127\.0\.0\.1:\d+/postgres'"


def _schema(tag: str) -> str:
    return f"{tag}{os.getpid()}_{time.monotonic_ns()}"


def _applied_table(server: Any, schema: str) -> None:
    server.sql(f"CREATE TABLE {schema}.applied (key text PRIMARY KEY)")


def _applied(server: Any, schema: str) -> list[str]:
    return sorted(k for (k,) in server.sql(f"SELECT key FROM {schema}.applied"))


def _recorded(server: Any, schema: str) -> list[str]:
    rows = server.sql(f"SELECT key FROM {schema}.idempotency_records WHERE state = 2")
    return sorted(k for (k,) in rows)


def _insert(key: str) -> PostgresEffect:
    async def fn(conn: Any) -> str:
        await conn.execute("INSERT INTO applied VALUES (%s)", (key,))
        return key

    return PostgresEffect(fn)


def test_backend_terminated_mid_transaction(postgres_server: Any) -> None:
    """The first effect of a batch has its backend terminated (``pg_terminate_backend``)
    while its transaction is open: every call of the batch fails with StoreUnavailable
    naming the server and SQLSTATE 57P01, nothing of the batch is committed, the pool
    replaces the connection, and retries apply each effect exactly once."""
    schema = _schema("term")
    store = PostgresStore(postgres_server.dsn, schema=schema)
    _applied_table(postgres_server, schema)
    terminated: list[int] = []

    def effect(call: Call) -> PostgresEffect:
        key = call.key

        async def fn(conn: Any) -> str:
            await conn.execute("INSERT INTO applied VALUES (%s)", (key,))
            if not terminated:
                terminated.append(conn.info.backend_pid)
                postgres_server.sql("SELECT pg_terminate_backend(%s)", (terminated[0],))
            await conn.execute("SELECT 1")
            return key

        return PostgresEffect(fn)

    idem = Idempotency(store)
    keys = [f"k{i}" for i in range(8)]

    def run(key: str) -> Any:
        return lambda: idem.run(caller="c", key=key, request=("op", [key]), handler=effect)

    async def first() -> list[Any]:
        return await gather([run(k) for k in keys])

    results = gosim.run(first, procs=1)
    failed = [r for r in results if isinstance(r, StoreUnavailable)]
    assert failed, results
    for err in failed:
        assert "SQLSTATE 57P01" in str(err) and err.args, err
    assert all(re.search(SERVER, str(e)) for e in failed), failed
    assert len(terminated) == 1
    # The terminated transaction took its effects with it; the batch's others failed
    # with it (or, if they were in a batch of their own, completed).
    done = [k for k, r in zip(keys, results, strict=True) if not isinstance(r, Exception)]
    assert _applied(postgres_server, schema) == sorted(done) == _recorded(postgres_server, schema)

    async def again() -> list[Any]:
        return await gather([run(k) for k in keys])

    outcomes = gosim.run(again, procs=1)
    assert all(not isinstance(o, Exception) for o in outcomes), outcomes
    assert [o.value for o in outcomes] == keys
    assert _applied(postgres_server, schema) == sorted(keys) == _recorded(postgres_server, schema)
    # A connection that died while idle in the pool is found dead before anything of a
    # batch is sent on it: the batch goes on another, and the call does not fail.
    idle = [conn.info.backend_pid for conn in store._pool._idle]
    assert idle
    for pid in idle:
        postgres_server.sql("SELECT pg_terminate_backend(%s)", (pid,))

    async def after() -> Any:
        return await idem.run(caller="c", key="late", request=("op", []), handler=effect)

    assert gosim.run(after, procs=1).value == "late"
    for pid in [conn.info.backend_pid for conn in store._pool._idle]:
        postgres_server.sql("SELECT pg_terminate_backend(%s)", (pid,))

    async def operator() -> Any:  # the operator's tools find a live connection too
        return await store.inspect("c", "late")

    seen = gosim.run(operator, procs=1)
    assert seen is not None and seen.state == "COMPLETED"
    store.close()


def test_server_stopped_mid_effect_then_started(own_postgres: Any) -> None:
    """PostgreSQL is stopped (``pg_ctl stop -m immediate``: every process ends at once,
    recovery at the next start) while an effect's transaction is open: the call fails
    with StoreUnavailable, so do calls while the server is down, nothing acknowledged
    is lost, and once it is back the interrupted key runs once (its claim lapses)."""
    schema = _schema("stop")
    store = PostgresStore(own_postgres.dsn, schema=schema, connect_timeout=2)
    _applied_table(own_postgres, schema)
    runs: list[int] = []

    async def acknowledged() -> Any:
        return await Idempotency(store).run(
            caller="c", key="acked", request=("op", []), handler=lambda c: _insert("acked")
        )

    first = gosim.run(acknowledged)

    def stopper(call: Call) -> PostgresEffect:
        runs.append(call.fence)

        async def fn(conn: Any) -> str:
            await conn.execute("INSERT INTO applied VALUES ('k')")
            if len(runs) == 1:
                own_postgres.stop("immediate")  # the server dies in this transaction
            return "done"

        return PostgresEffect(fn)

    async def mid_effect() -> None:
        with pytest.raises(StoreUnavailable, match=SERVER):
            await Idempotency(store, lease=1.0).run(
                caller="c", key="k", request=("op", []), handler=stopper
            )
        with pytest.raises(StoreUnavailable, match=SERVER + r".*connecting"):
            await Idempotency(store).run(
                caller="c", key="other", request=("op", []), handler=stopper
            )

    gosim.run(mid_effect)
    own_postgres.start()  # the same data directory: WAL replayed

    async def back() -> tuple[Any, Any]:
        idem = Idempotency(store, lease=1.0)
        kept = await idem.run(
            caller="c", key="acked", request=("op", []), handler=lambda c: _insert("x")
        )
        retried = await idem.run(
            caller="c", key="k", request=("op", []), handler=stopper, timeout=10
        )
        return kept, retried

    kept, retried = gosim.run(back)
    assert kept.replayed and kept.payload == first.payload  # nothing acknowledged lost
    assert retried.value == "done" and not retried.replayed and len(runs) == 2
    assert runs[1] > runs[0]
    assert _applied(own_postgres, schema) == ["acked", "k"]  # each effect once
    store.close()


SHARER = textwrap.dedent(
    """
    import sys
    import gosim
    from idempotency import Idempotency, PostgresEffect, PostgresStore

    dsn, schema, n_keys = sys.argv[1], sys.argv[2], int(sys.argv[3])
    store = PostgresStore(dsn, schema=schema)

    def effect(key):
        async def fn(conn):
            await conn.execute("INSERT INTO applied (key) VALUES (%s)", (key,))
            await conn.execute("UPDATE totals SET n = n + 1")
            return key
        return PostgresEffect(fn)

    async def main():
        idem = Idempotency(store)
        done = gosim.Chan(20)

        async def worker(w):
            for i in range(w, n_keys, 20):
                key = f"t{i}"
                out = await idem.run(caller="c", key=key, request=("apply", [key]),
                                     handler=lambda call, key=key: effect(key), timeout=60)
                assert out.value == key
            await done.send(None)

        for w in range(20):
            gosim.go(worker, w)
        for _ in range(20):
            await done.recv()

    gosim.run(main)
    print(store.statistics().largest_batch, flush=True)
    """
)


def test_processes_share_the_keys_each_effect_once(postgres_server: Any) -> None:
    """Three processes run the same 300 keys at once, each with 20 concurrent callers:
    row locks and ``INSERT ... ON CONFLICT`` serialise them per key (no table lock),
    every effect is applied once, and every key is recorded once."""
    schema = _schema("share")
    n_keys = 300
    PostgresStore(postgres_server.dsn, schema=schema).close()
    postgres_server.sql(
        f"CREATE TABLE {schema}.applied (key text PRIMARY KEY);"
        f"CREATE TABLE {schema}.totals (n integer); INSERT INTO {schema}.totals VALUES (0)"
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", SHARER, postgres_server.dsn, schema, str(n_keys)],
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    try:
        outs = [p.communicate(timeout=300)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert [p.returncode for p in procs] == [0, 0, 0], outs
    assert max(int(o.split()[-1]) for o in outs) > 1  # group commit happened
    keys = sorted(f"t{i}" for i in range(n_keys))
    assert _applied(postgres_server, schema) == keys == _recorded(postgres_server, schema)
    assert postgres_server.sql(f"SELECT n FROM {schema}.totals") == [(n_keys,)]


def test_sweep_skips_rows_a_writer_holds_and_reads_the_index(postgres_server: Any) -> None:
    """The sweep deletes expired records without waiting for a transaction that holds
    one (``SKIP LOCKED``: that row is left for a later sweep), and finds expired rows
    through the ``expires_at`` index, not a scan of the table."""
    now = [1_700_000_000.0]
    schema = _schema("sweep")
    store = PostgresStore(postgres_server.dsn, schema=schema, clock=lambda: now[0])
    table = f"{schema}.idempotency_records"

    async def fill() -> None:
        for i in range(6):
            await store.claim("c", f"k{i}", fingerprint("op", [i]), 10.0)

    gosim.run(fill)
    now[0] += 20  # every claim has lapsed
    with psycopg.connect(postgres_server.dsn) as holder:  # a writer holding k0's row
        holder.execute(f"SELECT 1 FROM {table} WHERE key = 'k0' FOR UPDATE")

        async def sweep() -> int:
            return await store.sweep()

        assert gosim.run(sweep) == 5  # k0 skipped, not waited for
        holder.rollback()
    assert gosim.run(sweep) == 1
    # Many live records and a few expired: the planner reads the index.
    postgres_server.sql(
        f"INSERT INTO {table} SELECT 'bulk', i::text, 2, '\\x00', i, 1e12, true, '\\x00'"
        " FROM generate_series(1, 20000) i"
    )
    postgres_server.sql(f"ANALYZE {table}")
    plan = "\n".join(
        row[0]
        for row in postgres_server.sql(
            f"EXPLAIN DELETE FROM {table} WHERE ctid = ANY(ARRAY(SELECT ctid FROM {table}"
            " WHERE expires_at <= 1700000020 ORDER BY expires_at LIMIT 1000"
            " FOR UPDATE SKIP LOCKED))"
        )
    )
    assert "idempotency_records_expires_at" in plan, plan
    store.close()


def test_the_pool_is_bounded_and_its_wait_times_out(postgres_server: Any) -> None:
    """With one connection, an operator's read waits for the batch that holds it and
    gives up after ``pool_timeout`` with StoreUnavailable saying so."""
    schema = _schema("pool")
    store = PostgresStore(postgres_server.dsn, schema=schema, pool_size=1, pool_timeout=0.3)

    def slow(call: Call) -> PostgresEffect:
        async def fn(conn: Any) -> str:
            await conn.execute("SELECT pg_sleep(1.5)")
            return "slow"

        return PostgresEffect(fn)

    async def main() -> None:
        idem = Idempotency(store)
        out: gosim.Chan[Any] = gosim.Chan(1)

        async def holder() -> None:
            await out.send(await idem.run(caller="c", key="k", request=("op", []), handler=slow))

        gosim.go(holder)
        await gosim.sleep(0.5)  # the holder's batch has the only connection
        with pytest.raises(StoreUnavailable, match=SERVER + r".*no connection of the pool"):
            await store.inspect("c", "other")
        assert (await out.recv()).value == "slow"
        assert await store.inspect("c", "other") is None  # free again

    gosim.run(main)
    store.close()


def test_a_store_connection_fails_on_a_silent_server_within_a_bound(postgres_server: Any) -> None:
    """A batch waits on its connection's socket: the socket the store's connections use
    has TCP keep-alives on and a user timeout, so a server machine that vanishes (no
    reset, no answer) fails the connection, and so the batch, instead of holding it
    forever."""
    store = PostgresStore(postgres_server.dsn, schema=_schema("keepalive"))

    async def main() -> tuple[int, int, int]:
        await store.get("c", "k")  # a connection made and back in the pool
        conn = store._pool._idle[0]
        sock = socket.socket(fileno=os.dup(conn.pgconn.socket))
        try:
            return (
                sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE),
                sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT),
                sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE),
            )
        finally:
            sock.close()

    keepalive, user_timeout, idle = gosim.run(main)
    store.close()
    assert keepalive == 1
    assert user_timeout == 30_000
    assert idle == 10


def _add_one(stopped: list[int], backends: list[int]) -> Any:
    """A handler whose effect adds one to the counter ``t`` (table ``counters``); the
    first time, it then stops its own backend (SIGSTOP), so the batch's COMMIT meets a
    server that is connected but does not answer."""

    def handler(call: Call) -> PostgresEffect:
        async def fn(conn: Any) -> int:
            row = await (await conn.execute("SELECT pg_backend_pid()")).fetchone()
            backends.append(row[0])
            cur = await conn.execute(
                "INSERT INTO counters VALUES ('t', 1)"
                " ON CONFLICT (name) DO UPDATE SET n = counters.n + 1 RETURNING n"
            )
            n = (await cur.fetchone())[0]
            if not stopped:
                stopped.append(row[0])
                os.kill(row[0], signal.SIGSTOP)
            return int(n)

        return PostgresEffect(fn)

    return handler


def _resume(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass


# The runtimes a store serves: the netpoller's; a seeded one (waits inline on the
# driver, through gosim.syscall); a seeded one on a virtual clock (the store then needs
# a clock of the runtime's).
RUNTIMES = {
    "netpoller": {},
    "seeded": {"seed": 1},
    "virtual": {"seed": 1, "virtual_time": True},
}


@pytest.mark.parametrize("runtime", list(RUNTIMES))
def test_a_stopped_backend_fails_the_batch_at_its_deadline_and_effects_stay_once(
    postgres_server: Any, runtime: str
) -> None:
    """The backend of the store's connection is stopped (SIGSTOP: the server's kernel
    still acknowledges and keeps the connection, so no TCP timeout ends it) while a
    batch waits for its COMMIT. The call fails with StoreUnavailable naming the server
    and ``batch_timeout`` (not held forever); the connection is closed, not pooled.
    Once the backend runs again (SIGCONT) the store serves calls on a new connection,
    and a retry of the same key meets what the stalled COMMIT did: the effect ran once."""
    schema = _schema("stall")
    clock = (lambda: 1_700_000_000.0 + gosim.now()) if runtime == "virtual" else None
    store = PostgresStore(postgres_server.dsn, schema=schema, batch_timeout=2.0, clock=clock)
    postgres_server.sql(f"CREATE TABLE {schema}.counters (name text PRIMARY KEY, n bigint)")
    stopped: list[int] = []
    backends: list[int] = []
    idem = Idempotency(store, lease=1.0)
    handler = _add_one(stopped, backends)

    async def call(key: str) -> Any:
        return await idem.run(caller="c", key=key, request=("add", []), handler=handler)

    async def stalled() -> Any:
        try:
            return await call("k")
        except Exception as exc:
            return exc

    # Without a deadline of its own the call would wait forever (on a seeded runtime
    # the driver itself waits): resumed after 30 s, it would then succeed, and fail
    # the test instead of hanging it.
    watchdog = threading.Timer(30.0, _resume, (stopped,))
    watchdog.start()
    try:
        start = time.monotonic()
        failed = gosim.run(stalled, **RUNTIMES[runtime])
        took = time.monotonic() - start
        assert stopped, "the effect never ran"
        assert isinstance(failed, StoreUnavailable), failed
        stall = r".*no answer from the server within batch_timeout = 2 s"
        assert re.search(SERVER + stall, str(failed)), failed
        assert 2.0 <= took < 30.0
        assert all(c.info.backend_pid != stopped[0] for c in store._pool._idle)
    finally:
        watchdog.cancel()
        _resume(stopped)
    # The stalled backend reads the rest of the batch (its COMMIT) and then the end of
    # the connection; wait until it is gone (bounded).
    for _ in range(3000):
        if not postgres_server.sql("SELECT 1 FROM pg_stat_activity WHERE pid = %s", stopped):
            break
        time.sleep(0.01)
    else:
        raise AssertionError("the stalled backend did not end")

    async def after() -> tuple[Any, Any]:
        return await call("other"), await call("k")

    other, retried = gosim.run(after, **RUNTIMES[runtime])
    assert backends[1] != stopped[0]  # served on a new connection
    # The stalled backend had the batch's COMMIT in its socket before the connection's
    # end: it committed once it ran again, and the retry replays that completion.
    assert retried.replayed and retried.value == 1 and len(backends) == 2
    assert other.value == 2
    counter = postgres_server.sql(f"SELECT n FROM {schema}.counters WHERE name = 't'")
    assert counter == [(2,)], counter  # each key's effect once
    rows = postgres_server.sql(f"SELECT key, state FROM {schema}.idempotency_records ORDER BY key")
    assert rows == [("k", 2), ("other", 2)]
    store.close()


def test_an_operators_read_on_a_stopped_backend_fails_at_the_deadline(
    postgres_server: Any,
) -> None:
    """The backend of the pool's idle connection is stopped: an operator's read (which
    checks its connection with a round trip first) fails with StoreUnavailable naming
    the server and ``batch_timeout`` instead of waiting forever, and that connection
    leaves the pool; once the backend runs again, reads go through."""
    store = PostgresStore(postgres_server.dsn, schema=_schema("opstall"), batch_timeout=1.0)

    async def warm() -> int:
        await store.get("c", "k")  # a connection made and back in the pool
        return int(store._pool._idle[0].info.backend_pid)

    pid = gosim.run(warm)
    stopped = [pid]
    watchdog = threading.Timer(30.0, _resume, (stopped,))  # a regression fails, not hangs

    async def read() -> Any:
        try:
            return await store.inspect("c", "k")
        except StoreUnavailable as exc:
            return exc

    os.kill(pid, signal.SIGSTOP)
    watchdog.start()
    try:
        failed = gosim.run(read)
        assert isinstance(failed, StoreUnavailable), failed
        stall = r".*checking a connection: no answer from the server within batch_timeout = 1 s"
        assert re.search(SERVER + stall, str(failed)), failed
        assert all(c.info.backend_pid != pid for c in store._pool._idle)
    finally:
        watchdog.cancel()
        _resume(stopped)
    assert gosim.run(read) is None  # no record, read on a new connection
    store.close()


def test_a_seeded_runtime_gives_the_same_schedule_with_the_store(postgres_server: Any) -> None:
    """On a seeded runtime the store's waits run inline on the driver (gosim.syscall),
    so the server's timing cannot reorder goroutines: two runs with one seed finish
    their calls in the same order and make the same batches."""
    schema = _schema("seeded")
    store = PostgresStore(postgres_server.dsn, schema=schema)
    postgres_server.sql(f"CREATE TABLE {schema}.counters (name text PRIMARY KEY, n bigint)")
    handler = _add_one([0], [])  # not stopping: ``stopped`` is not empty

    async def main(run: int) -> list[str]:
        idem = Idempotency(store)
        order: list[str] = []
        wg = sync.WaitGroup()

        async def one(i: int) -> None:
            try:
                key = f"r{run}k{i}"
                await idem.run(caller="c", key=key, request=("add", [i]), handler=handler)
                order.append(f"k{i}")
                await gosim.gosched()
                await store.get("c", key)
                order.append(f"get{i}")
            finally:
                wg.done()

        for i in range(12):
            wg.add(1)
            gosim.go(one, i)
        await wg.wait()
        return order

    runs = []
    for run in range(2):
        before = store.statistics()
        order = gosim.run(main, run, procs=2, seed=11)
        after = store.statistics()
        runs.append((order, after.operations - before.operations, after.batches - before.batches))
    assert runs[0] == runs[1]
    assert sorted(runs[0][0]) == sorted([f"{w}{i}" for w in ("k", "get") for i in range(12)])
    assert postgres_server.sql(f"SELECT n FROM {schema}.counters") == [(24,)]
    store.close()


def test_a_virtual_clock_needs_the_stores_clock(postgres_server: Any) -> None:
    """On a virtual clock the server's clock (which judges leases by default) does not
    move with the runtime's: a caller waiting virtual seconds for a dead holder's lease
    to lapse would never see it lapse. The store refuses such a runtime, saying why;
    given a clock of the runtime's, it serves it, and the lease lapses in simulated
    time."""
    schema = _schema("virtual")
    fp = fingerprint("op", [])

    def handler(call: Call) -> PostgresEffect:
        async def fn(conn: Any) -> str:
            return "ran"

        return PostgresEffect(fn)

    async def take_over(store: PostgresStore) -> tuple[Any, float]:
        await store.claim("c", "k", fp, 1.0)  # a holder that dies
        start = gosim.now()
        out = await Idempotency(store, lease=1.0).run(
            caller="c", key="k", request=("op", []), handler=handler, timeout=30
        )
        return out, gosim.now() - start

    plain = PostgresStore(postgres_server.dsn, schema=schema)

    async def refused() -> None:
        why = r"refused on a virtual clock: leases and retention are judged by the database"
        with pytest.raises(RuntimeError, match=SERVER + ".*" + why):
            await take_over(plain)
        with pytest.raises(RuntimeError, match=why):
            await plain.inspect("c", "k")
        with pytest.raises(RuntimeError, match=why):
            await plain.sweep()

    gosim.run(refused, virtual_time=True)
    assert postgres_server.sql(f"SELECT count(*) FROM {schema}.idempotency_records") == [(0,)]
    plain.close()
    timed = PostgresStore(
        postgres_server.dsn, schema=schema, clock=lambda: 1_700_000_000.0 + gosim.now()
    )
    out, waited = gosim.run(take_over, timed, seed=2, virtual_time=True)
    assert out.value == "ran" and not out.replayed
    assert 1.0 <= waited < 30  # simulated seconds: the lease lapsed in virtual time
    timed.close()


@pytest.mark.parametrize("bad", [0, -1.0, math.nan, math.inf, "5", True, None])
def test_batch_timeout_is_checked(bad: Any) -> None:
    with pytest.raises(ValueError, match=r"batch_timeout must be a positive, finite number"):
        PostgresStore("postgresql://postgres@127.0.0.1:1/postgres", batch_timeout=bad)


def test_fences_rise_across_stores_of_one_database(postgres_server: Any) -> None:
    """Two stores (two processes' worth of connections) on one schema: tokens come
    from the database's sequence, so each claim's is above every earlier one's."""
    schema = _schema("fence")
    a = PostgresStore(postgres_server.dsn, schema=schema)
    b = PostgresStore(postgres_server.dsn, schema=schema)

    async def main() -> list[int]:
        fences = []
        for i in range(6):
            s = a if i % 2 else b
            res = await s.claim("c", f"k{i}", fingerprint("op", []), 60.0)
            assert res.kind is ClaimKind.CLAIMED
            fences.append(res.record.fence)
        # b sees a's claims: the same rows, the same database clock.
        busy = await b.claim("c", "k1", fingerprint("op", []), 60.0)
        assert busy.kind is ClaimKind.BUSY and busy.record.fence == fences[1]
        done = await b.complete("c", "k1", fences[1], Completion(True, b"\xc0", None, 60.0, 100))
        assert (await a.get("c", "k1")) == done
        return fences

    fences = gosim.run(main)
    assert fences == sorted(fences) and len(set(fences)) == 6
    a.close()
    b.close()


def test_an_unreachable_server_is_named(postgres_server: Any) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(StoreUnavailable, match=rf"127\.0\.0\.1:{port}/postgres.*connecting"):
        PostgresStore(f"postgresql://postgres@127.0.0.1:{port}/postgres", connect_timeout=2)


def test_a_key_inserted_meanwhile_by_another_process_reruns_the_batch(
    postgres_server: Any,
) -> None:
    """A batch reads a key as absent; before it writes, another process claims the key
    and commits (here: a row inserted from another connection while the batch's effect
    runs). The batch's insert meets the new row, the batch is rolled back and applied
    again, and this time sees the other claim: the call is refused as in progress,
    nothing of its first run is kept, and the other's record stands."""
    from idempotency import InProgress  # noqa: PLC0415

    schema = _schema("race")
    store = PostgresStore(postgres_server.dsn, schema=schema)
    fp = fingerprint("op", [])
    runs: list[int] = []

    def effect(call: Call) -> PostgresEffect:
        async def fn(conn: Any) -> str:
            runs.append(call.fence)
            if len(runs) == 1:  # the rival commits its claim now
                postgres_server.sql(
                    f"INSERT INTO {schema}.idempotency_records VALUES ('c', 'k', 1, %s,"
                    f" nextval('{schema}.idempotency_fence'), 'Infinity', true, NULL)",
                    (fp,),
                )
            return "mine"

        return PostgresEffect(fn)

    async def main() -> None:
        with pytest.raises(InProgress):
            await Idempotency(store).run(
                caller="c", key="k", request=("op", []), handler=effect, one_step=True,
                wait=False,
            )  # fmt: skip

    gosim.run(main)
    assert len(runs) == 1  # the second run saw the rival's claim: no effect ran again
    rows = postgres_server.sql(f"SELECT state, fence FROM {schema}.idempotency_records")
    assert len(rows) == 1 and rows[0][0] == 1 and rows[0][1] > runs[0]
    store.close()


def test_a_row_held_too_long_by_another_transaction_fails_the_batch_by_name(
    postgres_server: Any,
) -> None:
    """Another transaction holds a key's row (a slow effect elsewhere): the batch waits
    ``lock_timeout``, then its calls fail with StoreUnavailable naming the server and
    SQLSTATE 55P03; once the row is free the same call goes through."""
    schema = _schema("lock")
    store = PostgresStore(postgres_server.dsn, schema=schema, lock_timeout=0.3)
    fp = fingerprint("op", [])

    async def claim() -> Any:
        return await store.claim("c", "k", fp, 60.0)

    first = gosim.run(claim)
    with psycopg.connect(postgres_server.dsn) as holder:
        holder.execute(f"SELECT 1 FROM {schema}.idempotency_records WHERE key = 'k' FOR UPDATE")

        async def blocked() -> None:
            with pytest.raises(StoreUnavailable, match=SERVER + r".*SQLSTATE 55P03"):
                await store.claim("c", "k", fp, 60.0)  # a write: it locks the row

        gosim.run(blocked)
        holder.rollback()
    again = gosim.run(claim)
    assert again.kind is ClaimKind.BUSY and again.record.fence == first.record.fence
    store.close()
