"""msgpack-rpc servers for the RPC benchmarks, one process each; every one serves ``echo``
(its params back as the result), and prints ``LISTEN host:port`` when it is ready.

    python benchmarks/rpc_peers.py rpc            idempotency.rpc, netframe session frames
    python benchmarks/rpc_peers.py rpc-async      the same, echo as an async function
    python benchmarks/rpc_peers.py rpc-stream     idempotency.rpc, plain msgpack stream
    python benchmarks/rpc_peers.py rpc-sqlite     echo idempotent, SQLite store (durable)
    python benchmarks/rpc_peers.py rpc-sqlite-one-step   the same, echo one_step=True
    python benchmarks/rpc_peers.py rpc-memory     echo idempotent, MemoryStore
    python benchmarks/rpc_peers.py rpc-redis URL PREFIX   echo idempotent, RedisStore
    python benchmarks/rpc_peers.py rpc-postgres DSN [SCHEMA]   echo idempotent, PostgresStore
    python benchmarks/rpc_peers.py rpc-postgres-one-step DSN [SCHEMA]   the same, one_step=True
    python benchmarks/rpc_peers.py hand-written DB   asyncio + msgpack + sqlite3 by hand
    python benchmarks/rpc_peers.py demo DIR       the ledger demo's server, 100 accounts
    python benchmarks/rpc_peers.py hot DSN SCHEMA one-step|two-step ADDR
                                                  the demo's server over PostgreSQL
    python benchmarks/rpc_peers.py aio            aio-msgpack-rpc (asyncio, plain stream)

``rpc-sqlite`` and ``rpc-sqlite-one-step`` take the directory of their store as an
optional argument (default: a fresh temporary one); ``rpc-postgres`` and
``rpc-postgres-one-step`` the server's connection string and the store's schema (default
``public``; created when missing, as PostgresStore does). The Go load generator
(``benchmarks/go/rpc``) drives them all.
"""

from __future__ import annotations

import asyncio
import hashlib
import sqlite3
import struct
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import msgpack
from aio_msgpack_rpc import Server as AioServer
from procs import apply_gc_settings  # run as a script: this file's directory is on sys.path

import gosim
from gosim import net
from idempotency import Idempotency, MemoryStore, RedisStore, SQLiteStore
from idempotency.rpc import Server


def rpc_server(kind: str, args: list[str]) -> None:
    postgres = None
    if kind.startswith("rpc-postgres"):
        from idempotency import PostgresStore  # noqa: PLC0415 -- needs psycopg

        # Its constructor connects and creates the tables, blocking: before the runtime.
        postgres = PostgresStore(args[0], schema=args[1] if len(args) > 1 else "public")

    async def main() -> None:
        idem = None
        if postgres is not None:
            idem = Idempotency(postgres)
        elif kind.startswith("rpc-sqlite"):
            tmp = Path(args[0]) if args else Path(tempfile.mkdtemp(prefix="rpcbench-"))
            idem = Idempotency(SQLiteStore(tmp / "records.db"))
        elif kind == "rpc-memory":
            idem = Idempotency(MemoryStore())
        elif kind == "rpc-redis":
            idem = Idempotency(RedisStore(args[0], prefix=args[1]))
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
            one_step = kind.endswith("-one-step")
            srv.add_method(echo, "echo", idempotent=idem is not None, one_step=one_step)
        ln = net.listen("tcp", "127.0.0.1:0")
        print("LISTEN", ln.addr(), flush=True)
        if kind == "rpc-stream":
            await srv.serve_stream(ln)
        else:
            await srv.serve(ln)

    gosim.run(main)  # the default procs, as the netframe servers of bench_net_procs.py


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


# ------------------------------------------------------------------- hand-written

HEADER = struct.Struct(">I")
SCHEMA = """
CREATE TABLE IF NOT EXISTS calls (
    caller      TEXT NOT NULL,
    key         TEXT NOT NULL,
    fingerprint BLOB NOT NULL,
    created_at  REAL NOT NULL,
    result      BLOB NOT NULL,
    PRIMARY KEY (caller, key)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
INSERT OR IGNORE INTO counters VALUES ('echo', 0);
"""


def hand_written_server(path: str) -> None:
    """What a user writes without this project: asyncio streams, msgpack, sqlite3 in WAL
    with ``synchronous=FULL``, one transaction per keyed call (look the key up; if new,
    run the handler, insert the key's row with the result and update a counter as the
    call's effect; commit), on the event loop's thread. It speaks the framed protocol
    (PROTOCOL.md) the Go load generator speaks: replays carry ``{"replayed": true}``,
    a key reused with another request gets ALREADY_EXISTS, a call without a key
    FAILED_PRECONDITION."""
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    db.executescript(SCHEMA)

    def handle(msgid: int, method: str, params: list[object], meta: dict[str, object]) -> bytes:
        if method != "echo":
            return msgpack.packb([1, msgid, [12, "no such method", None], None])
        key, caller = meta.get("key"), meta.get("caller", "anonymous")
        if not isinstance(key, str):
            return msgpack.packb([1, msgid, [9, "a key is required", None], None])
        fingerprint = hashlib.sha256(msgpack.packb([method, params])).digest()
        db.execute("BEGIN IMMEDIATE")
        try:
            row = db.execute(
                "SELECT fingerprint, result FROM calls WHERE caller = ? AND key = ?",
                (caller, key),
            ).fetchone()
            if row is None:
                out = list(params)  # the handler: echo
                result = msgpack.packb(out)
                db.execute(
                    "INSERT INTO calls VALUES (?, ?, ?, ?, ?)",
                    (caller, key, fingerprint, time.time(), result),
                )
                db.execute("UPDATE counters SET value = value + 1 WHERE name = 'echo'")
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        if row is None:
            return msgpack.packb([1, msgid, None, out])
        if row[0] != fingerprint:
            return msgpack.packb([1, msgid, [6, "key reused", {"type": "KeyReused"}], None])
        return msgpack.packb([1, msgid, None, msgpack.unpackb(row[1]), {"replayed": True}])

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                (length,) = HEADER.unpack(await reader.readexactly(4))
                body = await reader.readexactly(length)
                if body[:1] == b"\x01":  # PING: PONG
                    writer.write(HEADER.pack(length) + b"\x02" + body[1:])
                    continue
                msg = msgpack.unpackb(body[1:])
                meta = msg[4] if len(msg) > 4 else {}
                reply = handle(msg[1], msg[2], msg[3], meta)
                writer.write(HEADER.pack(len(reply) + 1) + b"\x00" + reply)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def main() -> None:
        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        host, port = server.sockets[0].getsockname()[:2]
        print(f"LISTEN {host}:{port}", flush=True)
        await server.serve_forever()

    asyncio.run(main())


def demo_server(directory: str) -> None:
    """``idempotency.demo``'s server as ``python -m idempotency.demo`` runs it (its
    make_server: a durable SQLite ledger, ``transfer`` one-step with its effect), over a
    fresh ledger of 100 accounts in ``directory``."""
    from idempotency.demo._ledger import LedgerSpec, create_ledger, make_server  # noqa: PLC0415

    spec = LedgerSpec("sqlite", Path(directory) / "ledger.db")
    create_ledger(spec, 100)

    async def main() -> None:
        srv = make_server(spec, 10.0, 1000)
        ln = net.listen("tcp", "127.0.0.1:0")
        print("LISTEN", ln.addr(), flush=True)
        await srv.serve(ln)

    gosim.run(main)


def hot_server(dsn: str, schema: str, mode: str, addr: str) -> None:
    """The ledger demo's server over the PostgreSQL ledger already under ``schema``
    (``transfer`` in ``mode``: one-step or two-step), listening on ``addr`` with
    ``SO_REUSEPORT`` (several of them share one port)."""
    from idempotency.demo._ledger import LedgerSpec, make_server  # noqa: PLC0415

    spec = LedgerSpec("postgres", url=dsn, prefix=schema)

    async def main() -> None:
        # Its store connects and creates its tables, blocking: before serving.
        srv = make_server(spec, 10.0, 1000, one_step=mode == "one-step")
        ln = net.listen("tcp", addr, reuse_port=True)
        print("LISTEN", ln.addr(), flush=True)
        await srv.serve(ln)

    gosim.run(main)


def main(argv: list[str]) -> None:
    kind = argv[0] if argv else ""
    apply_gc_settings()  # the same collector settings for every Python peer
    if kind.startswith("rpc"):
        rpc_server(kind, argv[1:])
    elif kind == "hand-written" and len(argv) == 2:
        hand_written_server(argv[1])
    elif kind == "demo" and len(argv) == 2:
        demo_server(argv[1])
    elif kind == "hot" and len(argv) == 5 and argv[3] in ("one-step", "two-step"):
        hot_server(argv[1], argv[2], argv[3], argv[4])
    elif kind == "aio":
        aio_server()
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
