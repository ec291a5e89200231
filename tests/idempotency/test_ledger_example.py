"""The package docstring's ledger transfer, run: duplicates, refusals and concurrent
transfers leave every balance right and the sum unchanged."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import gosim
from idempotency import ApplicationError, Call, Idempotency, SQLiteEffect, SQLiteStore


def transfer(call: Call) -> SQLiteEffect:
    src, dst, amount = call.args

    def apply(conn: sqlite3.Connection) -> int:
        (balance,) = conn.execute("SELECT balance FROM accounts WHERE id = ?", (src,)).fetchone()
        if balance < amount:
            raise ApplicationError("insufficient_funds", f"{src} has {balance}")
        conn.execute("UPDATE accounts SET balance = balance - ? WHERE id = ?", (amount, src))
        conn.execute("UPDATE accounts SET balance = balance + ? WHERE id = ?", (amount, dst))
        return int(balance - amount)

    return SQLiteEffect(apply)


def test_ledger_transfers_are_exactly_once(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "ledger.db")
    accounts = ["a", "b", "c", "d"]

    async def main() -> tuple[list[Any], list[tuple[str, int]]]:
        await store.transact(
            lambda conn: conn.execute("CREATE TABLE accounts (id TEXT PRIMARY KEY, balance INT)")
        )
        await store.transact(
            lambda conn: conn.executemany(
                "INSERT INTO accounts VALUES (?, 100)", [(a,) for a in accounts]
            )
        )
        idem = Idempotency(store)
        plan = [(f"t{i}", accounts[i % 4], accounts[(i + 1) % 4], 30 + i % 7) for i in range(40)]
        out: gosim.Chan[Any] = gosim.Chan(len(plan) * 3)

        async def client(key: str, src: str, dst: str, amount: int) -> None:
            o = await idem.run(
                caller="bank", key=key, request=("transfer", [src, dst, amount]),
                handler=transfer, timeout=30,
            )  # fmt: skip
            await out.send((key, o))

        for step in plan:
            for _ in range(3):  # every transfer sent three times, concurrently
                gosim.go(client, *step)
        results = [await out.recv() for _ in range(len(plan) * 3)]
        balances = await store.transact(
            lambda conn: conn.execute("SELECT id, balance FROM accounts ORDER BY id").fetchall()
        )
        return results, balances

    results, balances = gosim.run(main, procs=2)
    by_key: dict[str, set[bytes]] = {}
    for key, o in results:
        by_key.setdefault(key, set()).add(o.payload)
    assert all(len(p) == 1 for p in by_key.values())  # duplicates got one outcome
    assert sum(not o.replayed for _, o in results) == 40  # each transfer ran once
    assert sum(b for _, b in balances) == 400  # conserved
    assert all(b >= 0 for _, b in balances)
    # The balances are exactly the start plus the transfers that were applied (each
    # once, whole), whichever order they committed in.
    model = dict.fromkeys(accounts, 100)
    for i in range(40):
        src, dst, amount = accounts[i % 4], accounts[(i + 1) % 4], 30 + i % 7
        if next(o for k, o in results if k == f"t{i}").ok:
            model[src] -= amount
            model[dst] += amount
    assert dict(balances) == model
    refused = {k for k, o in results if not o.ok}
    assert all(
        o.error is not None and o.error.code == "insufficient_funds"
        for k, o in results
        if k in refused
    )
    store.close()
