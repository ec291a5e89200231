"""Which refusals a key records, as the idempotency guide's "Refusals" section says,
through a real client and server on 127.0.0.1 over SQLite and PostgreSQL, two-step and
one-step: a final refusal is recorded (the same request replays it, a corrected one
under the same key is ``ALREADY_EXISTS``); a refusal raised as
``ApplicationError(status, ..., retryable=True)`` records nothing (the client gets the
status without resending, and a corrected request under the same key runs); nor does a
refusal before the claim (the wrong number of params)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from gosim import go, net
from idempotency import ApplicationError, Idempotency, SQLiteStore
from idempotency.rpc import Client, RPCError, Server, Status
from idempotency.stores import Store

from .test_rpc import run_bounded

CURRENCIES = ("EUR", "USD")


def _store(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> Store:
    if kind == "sqlite":
        return SQLiteStore(tmp_path / "records.db")
    from idempotency import PostgresStore  # noqa: PLC0415 -- needs psycopg

    server = request.getfixturevalue("postgres_server")
    return PostgresStore(server.dsn, schema=f"refusals{time.monotonic_ns()}")


@pytest.mark.parametrize("one_step", [False, True], ids=["two-step", "one-step"])
@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_recorded_and_unrecorded_refusals(
    kind: str, one_step: bool, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    store = _store(kind, tmp_path, request)
    runs: list[str] = []

    async def main() -> None:
        srv = Server(idempotency=Idempotency(store), heartbeat_interval=None)

        @srv.method(idempotent=True, one_step=one_step)
        def charge(account: str, cents: int, currency: str) -> str:
            runs.append(f"charge {currency}")
            if currency not in CURRENCIES:  # final: recorded under the key
                raise RPCError(Status.INVALID_ARGUMENT, f"unknown currency {currency!r}")
            return f"charged {cents} {currency}"

        @srv.method(idempotent=True, one_step=one_step)
        def charge_checked(account: str, cents: int, currency: str) -> str:
            runs.append(f"checked {currency}")
            if currency not in CURRENCIES:  # not recorded: the key stays free
                raise ApplicationError(
                    Status.INVALID_ARGUMENT, f"unknown currency {currency!r}", retryable=True
                )
            return f"charged {cents} {currency}"

        ln = net.listen("tcp", "127.0.0.1:0")
        go(srv.serve, ln)
        c = Client([ln.addr()], caller="shop", heartbeat_interval=None)

        # A final refusal: the same request replays it; the corrected request under
        # the same key is another request, refused as a reused key, and never runs.
        for _ in range(2):
            with pytest.raises(RPCError) as info:
                await c.call("charge", "acct-1", 500, "EURO", idempotency_key="k1")
            assert info.value.status is Status.INVALID_ARGUMENT
            assert "unknown currency 'EURO'" in info.value.message
        held = await store.inspect("shop", "k1")
        assert held is not None and held.state == "COMPLETED" and held.record is not None
        assert held.record.ok is False
        with pytest.raises(RPCError) as info:
            await c.call("charge", "acct-1", 500, "EUR", idempotency_key="k1")
        assert info.value.status is Status.ALREADY_EXISTS
        assert info.value.type_name == "KeyReused"
        # A corrected request under a new key runs.
        assert await c.call("charge", "acct-1", 500, "EUR", idempotency_key="k2") == (
            "charged 500 EUR"
        )
        # One step runs the method before its claim: for the replay and the reused key
        # too (what it built is dropped).
        if one_step:
            assert runs == ["charge EURO", "charge EURO", "charge EUR", "charge EUR"]
        else:
            assert runs == ["charge EURO", "charge EUR"]

        # A refusal raised retryable: the client gets its status once (INVALID_ARGUMENT
        # is not a status it resends), nothing is recorded, and the corrected request
        # under the same key runs.
        runs.clear()
        with pytest.raises(RPCError) as info:
            await c.call("charge_checked", "acct-1", 500, "EURO", idempotency_key="k3")
        assert info.value.status is Status.INVALID_ARGUMENT
        assert await store.inspect("shop", "k3") is None
        result = await c.call_result("charge_checked", "acct-1", 500, "EUR", idempotency_key="k3")
        assert (result.result, result.replayed, result.attempts) == ("charged 500 EUR", False, 1)
        assert runs == ["checked EURO", "checked EUR"]

        # A refusal before the claim (the wrong number of params): nothing recorded.
        with pytest.raises(RPCError) as info:
            await c.call("charge", "acct-1", 500, idempotency_key="k4")
        assert info.value.status is Status.INVALID_ARGUMENT
        assert await store.inspect("shop", "k4") is None
        assert await c.call("charge", "acct-1", 500, "USD", idempotency_key="k4") == (
            "charged 500 USD"
        )

        await c.close()
        await srv.shutdown(1.0)

    try:
        run_bounded(main, 60.0)
    finally:
        store.close()
