"""msgpack-rpc servers for the RPC benchmarks, one process each; every one serves ``echo``
(its params back as the result), and prints ``LISTEN host:port`` when it is ready.

    python benchmarks/rpc_peers.py rpc            idempotency.rpc, netframe session frames
    python benchmarks/rpc_peers.py rpc-async      the same, echo as an async function
    python benchmarks/rpc_peers.py rpc-stream     idempotency.rpc, plain msgpack stream
    python benchmarks/rpc_peers.py rpc-sqlite     echo idempotent, SQLite store (durable)
    python benchmarks/rpc_peers.py rpc-sqlite-one-step   the same, echo one_step=True
    python benchmarks/rpc_peers.py rpc-memory     echo idempotent, MemoryStore
    python benchmarks/rpc_peers.py aio            aio-msgpack-rpc (asyncio, plain stream)

The Go load generator (``benchmarks/go/rpc``) drives them all.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from pathlib import Path
from typing import Any

from aio_msgpack_rpc import Server as AioServer
from procs import apply_gc_settings  # run as a script: this file's directory is on sys.path

import gosim
from gosim import net
from idempotency import Idempotency, MemoryStore, SQLiteStore
from idempotency.rpc import Server


def rpc_server(kind: str) -> None:
    async def main() -> None:
        idem = None
        if kind.startswith("rpc-sqlite"):
            tmp = Path(tempfile.mkdtemp(prefix="rpcbench-"))
            idem = Idempotency(SQLiteStore(tmp / "records.db"))
        elif kind == "rpc-memory":
            idem = Idempotency(MemoryStore())
        srv = Server(idempotency=idem, heartbeat_interval=None)
        if kind == "rpc-async":

            async def echo_async(*args: Any) -> list[Any]:
                return list(args)

            srv.add_method(echo_async, "echo")
        else:

            def echo(*args: Any) -> list[Any]:
                return list(args)

            # one_step: echo only builds its outcome, so the claim and the record commit
            # together (one group commit, not two) and the call waits on no goroutine.
            one_step = kind == "rpc-sqlite-one-step"
            srv.add_method(echo, "echo", idempotent=idem is not None, one_step=one_step)
        ln = net.listen("tcp", "127.0.0.1:0")
        print("LISTEN", ln.addr(), flush=True)
        if kind == "rpc-stream":
            await srv.serve_stream(ln)
        else:
            await srv.serve(ln)

    gosim.run(main, procs=1)  # as the netframe servers of bench_net_procs.py


def aio_server() -> None:
    class Handler:
        def echo(self, *args: Any) -> list[Any]:
            return list(args)

    async def main() -> None:
        server = await asyncio.start_server(AioServer(Handler()), "127.0.0.1", 0)
        host, port = server.sockets[0].getsockname()[:2]
        print(f"LISTEN {host}:{port}", flush=True)
        await server.serve_forever()

    asyncio.run(main())


def main(argv: list[str]) -> None:
    kind = argv[0] if argv else ""
    apply_gc_settings()  # the same collector settings for every Python peer
    if kind.startswith("rpc"):
        rpc_server(kind)
    elif kind == "aio":
        aio_server()
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
