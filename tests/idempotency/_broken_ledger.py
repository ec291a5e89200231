"""Ledger servers broken on purpose, for the demo's audit tests.

Each has :func:`idempotency.demo._ledger.make_server`'s signature, so the demo's server
subcommand runs it when ``LEDGER_DEMO_TEST_SERVER_FACTORY`` names it
(``_broken_ledger:refuse_all``, this directory on ``PYTHONPATH``), and a test can serve
it in its own runtime. Only ``transfer`` is broken (``balance`` reads the ledger as
it is); the store, the idempotency and the transport are the real ones, so every broken
answer is recorded and replayed as a real one would be.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

from idempotency import ApplicationError, Call, Idempotency
from idempotency.demo._ledger import (
    BAD_TRANSFER,
    INSUFFICIENT_FUNDS,
    LEASE,
    LedgerSpec,
    _check,
    _sqlite_methods,
)
from idempotency.rpc import Server
from idempotency.stores import Effect


def _server(
    spec: LedgerSpec,
    heartbeat: float,
    max_connections: int,
    transfer: Callable[[Callable[[Call, int, int, int], Effect], Call, int, int, int], object],
) -> Server:
    assert spec.kind == "sqlite" and spec.path is not None
    store, make_effect, read = _sqlite_methods(spec.path)
    srv = Server(
        idempotency=Idempotency(store, lease=LEASE),
        heartbeat_interval=heartbeat,
        max_connections=max_connections,
    )

    def method(call: Call, src: int, dst: int, amount: int) -> object:
        _check(src, dst, amount)
        return transfer(make_effect, call, src, dst, amount)

    async def balance(account: int) -> object:
        return await read("balance", account)

    srv.add_method(method, "transfer", idempotent=True, pass_call=True)
    srv.add_method(balance, "balance")
    return srv


def _share(call: Call) -> float:
    """A stable number in [0, 1) per transfer: the same answer on every retry."""
    digest = hashlib.blake2b(f"{call.caller}/{call.key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


def correct(spec: LedgerSpec, heartbeat: float, max_connections: int) -> Server:
    """The ledger as it should be, through this module's plumbing (the control)."""
    return _server(spec, heartbeat, max_connections, lambda eff, call, s, d, a: eff(call, s, d, a))


def refuse_all(spec: LedgerSpec, heartbeat: float, max_connections: int) -> Server:
    """Refuses every transfer for want of funds: a ledger that does nothing."""

    def transfer(eff: object, call: Call, src: int, dst: int, amount: int) -> object:
        raise ApplicationError(INSUFFICIENT_FUNDS, f"account {src} has 0")

    return _server(spec, heartbeat, max_connections, transfer)


def refuse_some(spec: LedgerSpec, heartbeat: float, max_connections: int) -> Server:
    """Refuses three transfers in ten for want of funds it has; applies the others."""

    def transfer(
        eff: Callable[[Call, int, int, int], Effect], call: Call, src: int, dst: int, amount: int
    ) -> object:
        if _share(call) < 0.3:
            raise ApplicationError(INSUFFICIENT_FUNDS, f"account {src} has 0")
        return eff(call, src, dst, amount)

    return _server(spec, heartbeat, max_connections, transfer)


def fail_all(spec: LedgerSpec, heartbeat: float, max_connections: int) -> Server:
    """Answers every transfer with an error the workload never provokes."""

    def transfer(eff: object, call: Call, src: int, dst: int, amount: int) -> object:
        raise ApplicationError(BAD_TRANSFER, f"no account {dst}")

    return _server(spec, heartbeat, max_connections, transfer)


def ack_nothing(spec: LedgerSpec, heartbeat: float, max_connections: int) -> Server:
    """Acknowledges every transfer and applies none."""

    def transfer(eff: object, call: Call, src: int, dst: int, amount: int) -> object:
        return 1

    return _server(spec, heartbeat, max_connections, transfer)
