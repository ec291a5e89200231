"""The ledger service: accounts, idempotent transfers committed with their records.

Schema (one SQLite file, shared with the idempotency records, so a transfer's balance
change and its record commit in one transaction):

* ``accounts(id INTEGER PRIMARY KEY, balance INTEGER NOT NULL)``
* ``transfers(caller TEXT, key TEXT, src INTEGER, dst INTEGER, amount INTEGER,
  fence INTEGER, PRIMARY KEY (caller, key))``: one row per applied transfer.

Methods: ``transfer(src, dst, amount)`` (idempotent, exactly once: the effect runs in
the store's transaction that completes the key's record), ``balance(account)``, and
``audit()`` (sum of balances, applied transfers).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import gosim
from gosim import net

from .. import ApplicationError, Call, Idempotency, SQLiteEffect, SQLiteStore
from ..rpc import Server

__all__ = ["INITIAL_BALANCE", "create_ledger", "serve"]

INITIAL_BALANCE = 1_000
#: How long a transfer's claim holds its key (seconds).
LEASE = 3.0

#: Application error codes (gRPC's FAILED_PRECONDITION and INVALID_ARGUMENT).
INSUFFICIENT_FUNDS = 9
BAD_TRANSFER = 3


def create_ledger(path: Path, accounts: int) -> None:
    """A new ledger file with ``accounts`` accounts of INITIAL_BALANCE each."""
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("CREATE TABLE accounts (id INTEGER PRIMARY KEY, balance INTEGER NOT NULL)")
        conn.execute(
            "CREATE TABLE transfers (caller TEXT NOT NULL, key TEXT NOT NULL,"
            " src INTEGER NOT NULL, dst INTEGER NOT NULL, amount INTEGER NOT NULL,"
            " fence INTEGER NOT NULL, PRIMARY KEY (caller, key))"
        )
        conn.executemany(
            "INSERT INTO accounts VALUES (?, ?)", [(i, INITIAL_BALANCE) for i in range(accounts)]
        )
    conn.close()


def _read(path: str, sql: str, args: tuple[Any, ...] = ()) -> list[Any]:
    """A read on a connection of its own (WAL: readers never wait for the writer)."""
    conn = sqlite3.connect(path, timeout=30)
    try:
        return conn.execute(sql, args).fetchall()
    finally:
        conn.close()


def make_server(path: Path, heartbeat: float, max_connections: int) -> tuple[Server, SQLiteStore]:
    store = SQLiteStore(path)
    srv = Server(
        # A transfer takes milliseconds: a short lease lets the keys a killed server
        # held be taken over within seconds of its restart (the default is a minute).
        idempotency=Idempotency(store, lease=LEASE),
        heartbeat_interval=heartbeat,
        max_connections=max_connections,
    )
    db = str(path)

    @srv.method(idempotent=True, pass_call=True)
    def transfer(call: Call, src: int, dst: int, amount: int) -> SQLiteEffect:
        if not (type(src) is int and type(dst) is int and type(amount) is int) or amount <= 0:
            raise ApplicationError(BAD_TRANSFER, "transfer needs two account ids and an amount > 0")
        if src == dst:
            raise ApplicationError(BAD_TRANSFER, "source and destination are the same account")

        def apply(conn: sqlite3.Connection) -> int:
            row = conn.execute("SELECT balance FROM accounts WHERE id = ?", (src,)).fetchone()
            if (
                row is None
                or conn.execute("SELECT 1 FROM accounts WHERE id = ?", (dst,)).fetchone() is None
            ):
                raise ApplicationError(BAD_TRANSFER, f"no account {src if row is None else dst}")
            if row[0] < amount:
                raise ApplicationError(INSUFFICIENT_FUNDS, f"account {src} has {row[0]}")
            conn.execute("UPDATE accounts SET balance = balance - ? WHERE id = ?", (amount, src))
            conn.execute("UPDATE accounts SET balance = balance + ? WHERE id = ?", (amount, dst))
            conn.execute(
                "INSERT INTO transfers VALUES (?, ?, ?, ?, ?, ?)",
                (call.caller, call.key, src, dst, amount, call.fence),
            )
            return call.fence

        return SQLiteEffect(apply)

    @srv.method()
    async def balance(account: int) -> int | None:
        rows = await gosim.syscall(
            _read, db, "SELECT balance FROM accounts WHERE id = ?", (account,)
        )
        return rows[0][0] if rows else None

    @srv.method()
    async def audit() -> dict[str, int]:
        total = await gosim.syscall(_read, db, "SELECT SUM(balance), COUNT(*) FROM accounts")
        applied = await gosim.syscall(_read, db, "SELECT COUNT(*) FROM transfers")
        return {"sum": total[0][0], "accounts": total[0][1], "transfers": applied[0][0]}

    return srv, store


def serve(path: Path, addr: str, heartbeat: float, max_connections: int) -> None:
    """Serve the ledger on ``addr`` until the process is killed; prints ``LISTEN addr``."""

    async def main() -> None:
        srv, _ = make_server(path, heartbeat, max_connections)
        ln = net.listen("tcp", addr)
        print("LISTEN", ln.addr(), flush=True)
        await srv.serve(ln)

    gosim.run(main, procs=1)
