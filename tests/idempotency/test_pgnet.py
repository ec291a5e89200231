"""psycopg on gosim's netpoller (idempotency.stores._pgnet) against a real cluster:
queries of many goroutines in flight at once on one OS thread, errors as psycopg's,
a backend terminated under a waiting query."""

from __future__ import annotations

import threading
from typing import Any

import pytest

import gosim
from gosim import go, sync

psycopg = pytest.importorskip("psycopg", reason="the PostgreSQL driver (pip install .[postgres])")

from idempotency.stores._pgnet import NetpollConnection, ServerStalled  # noqa: E402

LOCK = 0x5EED


def test_many_goroutines_wait_on_their_queries_at_once_without_threads(
    postgres_server: Any,
) -> None:
    """20 goroutines each block in the server on a lock the test holds; a 21st sees
    all 20 waiting there (so every query is in flight at once, on procs=1), with no
    OS thread added, then releases the lock and every query completes."""
    n = 20

    async def main() -> tuple[list[int], int, int]:
        holder = await NetpollConnection.connect(postgres_server.dsn)
        conns = [await NetpollConnection.connect(postgres_server.dsn) for _ in range(n)]
        await holder.execute("SELECT pg_advisory_lock(%s)", (LOCK,))
        threads = {t.ident for t in threading.enumerate()}
        results = [0] * n
        wg = sync.WaitGroup()

        async def query(i: int) -> None:
            try:
                cur = await conns[i].execute(
                    "SELECT pg_advisory_lock_shared(%s), %s::int", (LOCK, i)
                )
                row = await cur.fetchone()
                assert row is not None
                results[i] = row[1]
            finally:
                wg.done()

        for i in range(n):
            wg.add(1)
            go(query, i)
        waiting = 0
        for _ in range(1000):  # bounded: until every query waits in the server
            cur = await holder.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                " AND query LIKE 'SELECT pg_advisory_lock_shared%%'"
            )
            row = await cur.fetchone()
            assert row is not None
            waiting = int(row[0])
            if waiting == n:
                break
            await gosim.sleep(0.01)
        # Threads that started while the queries waited (one that ended meanwhile, a
        # store's idle committer from an earlier test, say, is not an added one).
        during = {t.ident for t in threading.enumerate()} - threads
        await holder.execute("SELECT pg_advisory_unlock(%s)", (LOCK,))
        await wg.wait()
        for c in [holder, *conns]:
            await c.close()
        return results, waiting, len(during)

    results, waiting, added = gosim.run(main, procs=1)
    assert waiting == 20
    assert added == 0
    assert results == list(range(n))


def test_errors_are_psycopgs_and_the_connection_goes_on(postgres_server: Any) -> None:
    async def main() -> tuple[str, list[Any]]:
        c = await NetpollConnection.connect(postgres_server.dsn)
        try:
            try:
                await c.execute("SELECT * FROM no_such_table")
            except psycopg.errors.UndefinedTable as exc:
                what = exc.sqlstate or ""
            cur = await c.execute("SELECT %s::text || 'x', repeat('y', 100000)", ("a",))
            row = await cur.fetchone()
            assert row is not None
            return what, [row[0], len(row[1])]
        finally:
            await c.close()

    assert gosim.run(main) == ("42P01", ["ax", 100000])


def test_a_large_query_goes_out_whole(postgres_server: Any) -> None:
    """A query larger than the socket's buffers: libpq waits for output (and input)."""
    big = "z" * 4_000_000

    async def main() -> int:
        c = await NetpollConnection.connect(postgres_server.dsn)
        try:
            cur = await c.execute("SELECT length(%s::text)", (big,))
            row = await cur.fetchone()
            assert row is not None
            return int(row[0])
        finally:
            await c.close()

    assert gosim.run(main) == len(big)


def test_a_backend_terminated_under_a_waiting_query_raises(postgres_server: Any) -> None:
    async def main() -> str:
        victim = await NetpollConnection.connect(postgres_server.dsn, application_name="victim")
        killer = await NetpollConnection.connect(postgres_server.dsn)
        outcome = gosim.Chan[str](1)

        async def wait_long() -> None:
            try:
                await victim.execute("SELECT pg_sleep(60)")
                await outcome.send("returned")
            except psycopg.OperationalError as exc:
                await outcome.send(type(exc).__name__)

        go(wait_long)
        for _ in range(1000):  # bounded: until the query runs in the server
            cur = await killer.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE application_name = 'victim' AND state = 'active'"
            )
            if await cur.fetchall():
                break
            await gosim.sleep(0.01)
        got = await outcome.recv()
        await victim.close()
        await killer.close()
        return got

    assert gosim.run(main) in ("OperationalError", "AdminShutdown")


def test_a_wait_past_the_connections_deadline_closes_it(postgres_server: Any) -> None:
    """A query the server does not answer before the connection's ``deadline``: the
    wait ends with ServerStalled and the connection is closed (its protocol was cut
    short, so it is never used again); another connection is unaffected."""

    async def main() -> tuple[bool, bool, bool, int]:
        c = await NetpollConnection.connect(postgres_server.dsn)
        other = await NetpollConnection.connect(postgres_server.dsn)
        c.deadline = gosim.now() + 0.3
        try:
            with pytest.raises(ServerStalled):
                await c.execute("SELECT pg_sleep(30)")
            row = await (await other.execute("SELECT 7")).fetchone()
            assert row is not None
            return c.timed_out, c.closed, other.closed, int(row[0])
        finally:
            await c.close()
            await other.close()

    assert gosim.run(main) == (True, True, False, 7)
