"""A payments service on two servers sharing one PostgreSQL, as a user builds it from the
docs (issue 42's scenario): ``charge(account, amount_cents, currency)`` idempotent by
key, its balance upsert and ledger row one ``PostgresEffect`` (no ``locks`` named: the
default must hold on hot rows) committed with the record; two server processes on one
port (``SO_REUSEPORT``); 3,000 keyed charges on 20 hot accounts over 8 connections, 5%
of first tries with a 1 ms deadline (resent under the key their ``CallTimeout``
carries), 3% sent twice at once; one server killed with SIGKILL after 1,000
acknowledgements and restarted. The throwaway cluster keeps PostgreSQL's default
``deadlock_timeout``.

The audit: no keyed call surfaces as ``Unavailable``; PostgreSQL's log has no
``deadlock detected``; every charge is in the ledger once and the balances are the sums
of the acknowledged charges; a charge sent twice at once got one outcome."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

import gosim
from gosim import Chan, go
from idempotency.rpc import CallTimeout, Client, RetryPolicy, RPCError, Unavailable

psycopg = pytest.importorskip("psycopg", reason="PostgresStore needs psycopg 3")

from idempotency import PostgresStore  # noqa: E402

CHARGES = 3000
ACCOUNTS = 20
CONNECTIONS = 8
WORKERS = 64  # calls in flight, spread over the connections
KILL_AFTER = 1000
BOUND = 120.0  # seconds: no wait of the test is longer

SERVER = textwrap.dedent(
    """
    import sys
    import gosim
    from gosim import net
    from idempotency import Idempotency, PostgresEffect, PostgresStore
    from idempotency.rpc import Server

    dsn, schema, port, one_step = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1"

    async def main():
        store = PostgresStore(dsn, schema=schema)  # blocking, before serving
        srv = Server(idempotency=Idempotency(store, lease=1.0))

        @srv.method(idempotent=True, pass_call=True, one_step=one_step)
        def charge(call, account, amount_cents, currency):
            async def apply(conn):
                await conn.execute(
                    "INSERT INTO balances VALUES (%s, %s) ON CONFLICT (account)"
                    " DO UPDATE SET cents = balances.cents + excluded.cents",
                    (account, amount_cents),
                )
                await conn.execute(
                    "INSERT INTO ledger VALUES (%s, %s, %s, %s)",
                    (call.key, account, amount_cents, currency),
                )
                return f"charged {amount_cents} {currency} to {account}"
            return PostgresEffect(apply)

        ln = net.listen("tcp", f"127.0.0.1:{port}", reuse_port=True)
        print("PORT", ln.addr().rsplit(":", 1)[1], flush=True)
        await srv.serve(ln)

    gosim.run(main)
    """
)


class _Server:
    def __init__(self, dsn: str, schema: str, port: int, one_step: bool) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", SERVER, dsn, schema, str(port), "1" if one_step else "0"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line.startswith("PORT "):
            self.proc.kill()
            err = self.proc.stderr.read() if self.proc.stderr else ""
            self.kill()
            raise AssertionError(f"server did not start: {line!r} {err}")
        self.port = int(line.split()[1])

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()  # SIGKILL, by its PID: our own child
        self.proc.wait(timeout=30)
        for pipe in (self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                pipe.close()


@pytest.mark.slow
@pytest.mark.parametrize("one_step", [False, True], ids=["two-step", "one-step"])
def test_two_servers_kill_nine_hot_accounts(own_postgres: Any, one_step: bool) -> None:
    schema = f"payments{os.getpid()}_{time.monotonic_ns()}"
    PostgresStore(own_postgres.dsn, schema=schema).close()
    own_postgres.sql(
        f"CREATE TABLE {schema}.balances (account int PRIMARY KEY, cents bigint NOT NULL);"
        f"CREATE TABLE {schema}.ledger (key text PRIMARY KEY, account int NOT NULL,"
        " cents bigint NOT NULL, currency text NOT NULL)"
    )
    log = Path(own_postgres.dir) / "log"
    log_from = log.stat().st_size
    rng = random.Random(42)
    plan = [
        (f"charge-{i}", rng.randrange(ACCOUNTS), rng.randrange(1, 500), rng.random())
        for i in range(CHARGES)
    ]
    first = _Server(own_postgres.dsn, schema, 0, one_step)
    port = first.port
    servers = [first, _Server(own_postgres.dsn, schema, port, one_step)]
    unavailable: list[str] = []
    other_errors: list[str] = []
    acked: dict[str, str] = {}
    twice_disagreed: list[str] = []

    async def main() -> None:
        clients = [
            Client(
                f"127.0.0.1:{port}",
                caller="shop",
                connect_attempts=400,
                backoff_initial=0.02,
                backoff_max=0.1,
                # A key claimed by the killed server stays busy until its lease (1 s)
                # lapses: enough resends of a busy answer to outlast it.
                retry=RetryPolicy(max_attempts=12, initial_backoff=0.02, max_backoff=0.3),
            )
            for _ in range(CONNECTIONS)
        ]
        work: Chan[int] = Chan(CHARGES)
        for i in range(CHARGES):
            await work.send(i)
        work.close()
        done: Chan[None] = Chan(WORKERS)
        restarted: Chan[None] = Chan(1)
        killed = [False]

        async def one(c: Client, key: str, account: int, cents: int, timeout: float) -> Any:
            return await c.call(
                "charge", account, cents, "EUR", idempotency_key=key, timeout=timeout
            )

        async def charge(c: Client, i: int) -> str:
            key, account, cents, draw = plan[i]
            if draw < 0.05:  # a first try with a 1 ms deadline, then the documented resend
                try:
                    return str(await one(c, key, account, cents, 0.001))
                except CallTimeout as exc:
                    assert exc.key == key, exc
                    return str(await one(c, exc.key, account, cents, 30.0))
            if draw < 0.08:  # sent twice at once, on two connections
                twin: Chan[Any] = Chan(1)
                other = clients[(clients.index(c) + 1) % len(clients)]

                async def second() -> None:
                    try:
                        await twin.send(await one(other, key, account, cents, 30.0))
                    except RPCError as exc:
                        await twin.send(exc)

                go(second)
                mine = await one(c, key, account, cents, 30.0)
                theirs = await twin.recv()
                if isinstance(theirs, BaseException):
                    raise theirs
                if theirs != mine:
                    twice_disagreed.append(f"{key}: {mine!r} and {theirs!r}")
                return str(mine)
            return str(await one(c, key, account, cents, 30.0))

        async def worker(w: int) -> None:
            c = clients[w % CONNECTIONS]
            async for i in work:
                key = plan[i][0]
                try:
                    acked[key] = await charge(c, i)
                except Unavailable as exc:
                    unavailable.append(f"{key}: {exc}")
                except RPCError as exc:
                    other_errors.append(f"{key}: {type(exc).__name__}: {exc}")
                if len(acked) >= KILL_AFTER and not killed[0]:
                    killed[0] = True
                    go(kill_and_restart)
            await done.send(None)

        def restart() -> None:
            servers[0].kill()
            servers[0] = _Server(own_postgres.dsn, schema, port, one_step)

        async def kill_and_restart() -> None:
            await gosim.syscall(restart)
            await restarted.send(None)

        for w in range(WORKERS):
            go(worker, w)
        deadline = gosim.after(BOUND)
        for _ in range(WORKERS):
            i, _, _ = await gosim.select(gosim.recv(done), gosim.recv(deadline))
            assert i == 0, f"the charges did not end within {BOUND} s ({len(acked)} acked)"
        for c in clients:
            await c.close()
        assert killed[0]
        # The restart runs on a thread of its own; it must have put its server in
        # `servers` before the cleanup below kills them all, or that server outlives
        # the test (the charges can all end while it is still starting).
        i, _, _ = await gosim.select(gosim.recv(restarted), gosim.recv(deadline))
        assert i == 0, f"the restarted server did not start within {BOUND} s"

    try:
        gosim.run(main)
    finally:
        for s in servers:
            s.kill()
    assert unavailable == [], unavailable[:5]
    assert other_errors == [], other_errors[:5]
    assert twice_disagreed == [], twice_disagreed[:5]
    assert len(acked) == CHARGES
    with log.open("rb") as f:
        f.seek(log_from)
        logged = f.read().decode(errors="replace")
    assert "deadlock detected" not in logged, logged[logged.find("deadlock detected") - 500 :][
        :2000
    ]
    rows = own_postgres.sql(f"SELECT count(*), count(DISTINCT key) FROM {schema}.ledger")
    assert rows == [(CHARGES, CHARGES)]  # nothing lost, nothing doubled
    want: dict[int, int] = {}
    for _, account, cents, _ in plan:
        want[account] = want.get(account, 0) + cents
    got = dict(own_postgres.sql(f"SELECT account, cents FROM {schema}.balances"))
    assert got == want
