"""An idempotency.rpc Server in a process of its own, for tests that attack it from
outside (its memory, its connections, the process itself). Run by test_rpc_hostile.py
and test_rpc_resend.py.

python rpc_server_proc.py CONFIG_JSON

CONFIG_JSON: ``transport`` ("framed" or "stream"), ``shutdown_after`` (seconds after
the first call to ``slow`` at which the server starts its shutdown, for GOAWAY
tests), and any keyword arguments of ``Server`` (its limits as ``limits``: a dict of
Limits' fields). Methods: ``echo(x) -> x``, ``add(a, b)``, ``slow(seconds, x) -> x``
(sleeps first).

With ``store`` (a SQLite file holding a table ``charges(key, account, amount_cents,
currency)``), the server runs an ``Idempotency`` over it (``lease`` seconds, default
60) and has the idempotent method ``charge(account, amount_cents, currency)``: it
waits ``charge_delay`` seconds (default 0), then inserts its row in the transaction
that completes the key's record (exactly once per key). ``port`` (default 0: any) and
``reuse_port`` (SO_REUSEPORT) let a replacement process listen on the port of one
that died.

Prints ``PORT <n>``, then serves. Each line on stdin is a command: ``stats`` prints
the rpc and transport counters as one JSON line, with ``started``: how many calls of
each method entered it. End of stdin shuts the server down
and exits 0.
"""

from __future__ import annotations

import dataclasses
import json
import sqlite3
import sys
from typing import Any

import gosim
import netframe
from gosim import go, net
from idempotency import Call, Idempotency, SQLiteEffect, SQLiteStore
from idempotency.rpc import Limits, Server


def main() -> None:
    config: dict[str, Any] = json.loads(sys.argv[1])
    transport = config.pop("transport", "framed")
    shutdown_after: float | None = config.pop("shutdown_after", None)
    store_path: str | None = config.pop("store", None)
    lease: float = config.pop("lease", 60.0)
    charge_delay: float = config.pop("charge_delay", 0.0)
    port: int = config.pop("port", 0)
    reuse_port: bool = config.pop("reuse_port", False)
    if "limits" in config:
        config["limits"] = Limits(**config["limits"])
    # As a server should before taking traffic: without the C extension the frame scan
    # is a numba kernel, whose compilation would otherwise count in the first RSS rise.
    if not netframe._codec.C_ENABLED:
        netframe.load_kernel()

    async def run() -> None:
        store = None if store_path is None else SQLiteStore(store_path)
        if store is not None:
            config["idempotency"] = Idempotency(store, lease=lease)
        server = Server(**config)
        started = [False]
        entered: dict[str, int] = {}

        @server.method()
        def echo(x: Any) -> Any:
            return x

        @server.method()
        def add(a: int, b: int) -> int:
            return a + b

        @server.method()
        async def slow(seconds: float, x: Any) -> Any:
            entered["slow"] = entered.get("slow", 0) + 1
            if shutdown_after is not None and not started[0]:
                started[0] = True
                go(shutdown_later, shutdown_after)
            await gosim.sleep(seconds)
            return x

        async def shutdown_later(delay: float) -> None:
            await gosim.sleep(delay)
            await server.shutdown()

        if store is not None:

            @server.method(idempotent=True, pass_call=True)
            async def charge(
                call: Call, account: str, amount_cents: int, currency: str
            ) -> SQLiteEffect:
                entered["charge"] = entered.get("charge", 0) + 1
                await gosim.sleep(charge_delay)

                def apply(conn: sqlite3.Connection) -> str:
                    conn.execute(
                        "INSERT INTO charges VALUES (?, ?, ?, ?)",
                        (call.key, account, amount_cents, currency),
                    )
                    return f"charged {amount_cents} {currency} to {account}"

                return SQLiteEffect(apply)

        ln = net.listen("tcp", f"127.0.0.1:{port}", reuse_port=reuse_port)
        go(server.serve if transport == "framed" else server.serve_stream, ln)
        print("PORT", ln.addr().rsplit(":", 1)[1], flush=True)
        while True:
            line = await gosim.syscall(sys.stdin.readline)
            if not line:
                break
            if line.strip() == "stats":
                stats = {
                    "rpc": dataclasses.asdict(server.statistics()),
                    "framed": dataclasses.asdict(server.framed.statistics()),
                    "stream_connections": len(server._stream_links),
                    "started": entered,
                }
                print(json.dumps(stats), flush=True)
        await server.shutdown(grace=1.0)
        if store is not None:
            store.close()

    gosim.run(run, procs=1)


if __name__ == "__main__":
    main()
