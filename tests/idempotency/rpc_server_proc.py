"""An idempotency.rpc Server in a process of its own, for tests that attack it from
outside (its memory, its connections). Run by test_rpc_hostile.py.

python rpc_server_proc.py CONFIG_JSON

CONFIG_JSON: ``transport`` ("framed" or "stream"), ``shutdown_after`` (seconds after
the first call to ``slow`` at which the server starts its shutdown, for GOAWAY
tests), and any keyword arguments of ``Server`` (its limits as ``limits``: a dict of
Limits' fields). Methods: ``echo(x) -> x``, ``add(a, b)``, ``slow(seconds, x) -> x``
(sleeps first).

Prints ``PORT <n>``, then serves. Each line on stdin is a command: ``stats`` prints
the rpc and transport counters as one JSON line. End of stdin shuts the server down
and exits 0.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from typing import Any

import gosim
import netframe
from gosim import go, net
from idempotency.rpc import Limits, Server


def main() -> None:
    config: dict[str, Any] = json.loads(sys.argv[1])
    transport = config.pop("transport", "framed")
    shutdown_after: float | None = config.pop("shutdown_after", None)
    if "limits" in config:
        config["limits"] = Limits(**config["limits"])
    # As a server should before taking traffic: without the C extension the frame scan
    # is a numba kernel, whose compilation would otherwise count in the first RSS rise.
    if not netframe._codec.C_ENABLED:
        netframe.load_kernel()

    async def run() -> None:
        server = Server(**config)
        started = [False]

        @server.method()
        def echo(x: Any) -> Any:
            return x

        @server.method()
        def add(a: int, b: int) -> int:
            return a + b

        @server.method()
        async def slow(seconds: float, x: Any) -> Any:
            if shutdown_after is not None and not started[0]:
                started[0] = True
                go(shutdown_later, shutdown_after)
            await gosim.sleep(seconds)
            return x

        async def shutdown_later(delay: float) -> None:
            await gosim.sleep(delay)
            await server.shutdown()

        ln = net.listen("tcp", "127.0.0.1:0")
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
                }
                print(json.dumps(stats), flush=True)
        await server.shutdown(grace=1.0)

    gosim.run(run, procs=1)


if __name__ == "__main__":
    main()
