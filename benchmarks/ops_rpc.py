"""An ``idempotency.rpc`` server's work for N calls, for counting its instructions.

The twin of ``benchmarks/ops_net.py`` for the RPC layer: the server runs in this
process, its client is a plain-socket child process that valgrind does not follow, so

    for n in 2000 12000; do
      PYTHONHASHSEED=0 valgrind --tool=callgrind --callgrind-out-file=/dev/null \\
          .venv/bin/python benchmarks/ops_rpc.py rpc-rr $n 2>&1 | grep Collected
    done

gives ``(Ir(12000) - Ir(2000)) / 10000``, the server's instructions per call. Compare
with ``ops_net.py session-rr`` (the same transport, a netframe handler that echoes its
payload) for the RPC layer's own cost. Workloads:

* ``rpc-rr``: one call in flight, ``echo`` a plain function (the framed transport);
* ``rpc-async-rr``: the same with ``echo`` an async function;
* ``rpc-pipe16``: 16 calls sent at once, their 16 replies read, again;
* ``rpc-stream-rr``: ``rpc-rr`` over the plain msgpack stream (``serve_stream``: no
  length prefix, msgpack-rpc's own wire);
* ``aio-stream-rr``: the same client against aio-msgpack-rpc's server (asyncio, the
  plain stream) in this process, the peer ``rpc-stream-rr`` is measured against;
* ``rpc-keyed-sqlite`` / ``rpc-keyed-memory``: ``echo`` idempotent, every call with a
  key of its own, through a durable ``SQLiteStore`` (a fresh file) or a ``MemoryStore``;
  100 calls sent at once, their replies read, again (the group commit needs concurrent
  calls: the benchmark suite's 100 connections with one call each);
* ``rpc-keyed-sqlite-one-step``: the same through ``SQLiteStore`` with ``echo``
  declared ``one_step`` (claim and record in one transaction);
* ``rpc-keyed-redis``: the same through a ``RedisStore`` on a redis-server of our own
  (a child process: its instructions are not counted);
* ``rpc-ledger``: the ledger demo's server (``idempotency.demo``: a durable SQLite
  ledger of 100 accounts) and its calls, ``transfer(src, dst, 1)`` with a key of its
  own and a 10 s timeout each, 1,000 at once over 200 connections (as the demo's
  1,000 connections with a call in flight each, and so its group commits' sizes);
* ``rpc-client-ledger``: the other side, the demo's clients (``idempotency.rpc.Client``
  as ``idempotency.demo`` configures it, one connection each, one call at a time,
  ``transfer`` with a key and a 10 s timeout) in this process, LEDGER_CONNECTIONS of
  them, against the Go server of ``benchmarks/go/rpc`` in a child process: the
  instructions counted are the client's per call.

With ``OPS_STATS=1`` the server prints its store's statistics (operations, batches) at
the end: instruction counts compare only between runs whose batches compare.

The request is the benchmark suite's: ``echo(1, "hello", [1, 2, 3])``.
"""

from __future__ import annotations

import contextlib
import os
import socket
import struct
import subprocess
import sys
import time

import msgpack

HEADER = struct.Struct(">I")
LEDGER_CONNECTIONS = 200
PARAMS = [1, "hello", [1, 2, 3]]


def _frame(msgid: int, keyed: bool = False, ledger: bool = False) -> bytes:
    request: list[object] = [0, msgid, "echo", PARAMS]
    if ledger:  # the demo's clients' calls: a transfer between two of 100 accounts
        src, dst = msgid % 100, (msgid * 7 + 1) % 100
        dst = (dst + 1) % 100 if dst == src else dst
        meta = {"key": f"t-{msgid}", "caller": "ops", "timeout": 10_000}
        request = [0, msgid, "transfer", [src, dst, 1], meta]
    elif keyed:
        request.append({"key": f"k-{msgid}", "caller": "ops"})
    body: bytes = b"\x00" + msgpack.packb(request)
    return HEADER.pack(len(body)) + body


def _read_frame(sock: socket.socket, buf: bytearray) -> bytes:
    while True:
        if len(buf) >= 4:
            (length,) = HEADER.unpack_from(buf)
            if len(buf) >= 4 + length:
                body = bytes(buf[4 : 4 + length])
                del buf[: 4 + length]
                return body
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("server closed the connection")
        buf += chunk


def stream_client(port: int, n: int) -> None:
    """``n`` plain-stream calls, one at a time, every reply checked; then close."""
    requests = [msgpack.packb([0, i, "echo", PARAMS]) for i in range(n)]
    replies = [msgpack.packb([1, i, None, PARAMS]) for i in range(n)]
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for request, reply in zip(requests, replies, strict=True):
        sock.sendall(request)
        got = b""
        while len(got) < len(reply):
            chunk = sock.recv(65536)
            if not chunk:
                raise AssertionError("server closed the stream")
            got += chunk
        if got != reply:
            raise AssertionError(f"bad reply {got!r}")
    sock.close()


def client(port: int, n: int, depth: int, keyed: bool = False, ledger: bool = False) -> None:
    """``n`` calls, ``depth`` at a time, every reply checked; then close. The ledger's
    calls go over LEDGER_CONNECTIONS connections, an equal share of each round on each
    (a server's in-flight limit is per connection).

    Requests and the replies expected are encoded before connecting, so the client
    answers as fast as ``ops_net.py``'s: a slower client lets the server fall idle
    between calls, and the instructions counted would then include idling in trio.
    """
    frames = [_frame(i, keyed, ledger) for i in range(n)]
    replies = [b"\x00" + msgpack.packb([1, i, None, PARAMS]) for i in range(n)]
    socks = []
    for _ in range(LEDGER_CONNECTIONS if ledger else 1):
        sock = socket.create_connection(("127.0.0.1", port))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        socks.append((sock, bytearray()))
    msgid = 0
    while msgid < n:
        k = min(depth, n - msgid)
        share = -(-k // len(socks))
        sent = []
        for j, (sock, _) in enumerate(socks):
            lo, hi = msgid + j * share, min(msgid + (j + 1) * share, msgid + k)
            if lo < hi:
                sock.sendall(b"".join(frames[lo:hi]))
                sent.append((sock, set(replies[lo:hi])))
        for sock, want in sent:
            buf = next(b for s_, b in socks if s_ is sock)
            while want:
                body = _read_frame(sock, buf)
                if body[:1] != b"\x00":
                    continue  # a heartbeat or control frame
                if ledger:  # the result is the transfer's fence: check the msgid, no error
                    reply = msgpack.unpackb(body[1:])
                    if reply[0] != 1 or reply[2] is not None or reply[1] >= n:
                        raise AssertionError(f"bad reply {reply!r}")
                    body = replies[reply[1]]
                if body not in want:
                    raise AssertionError(f"bad reply {body!r}")
                want.discard(body)
        msgid += k
    for sock, _ in socks:
        sock.close()


def client_side(n: int) -> None:
    """``rpc-client-ledger``: the demo's clients calling a Go server (see the docstring)."""
    import random  # noqa: PLC0415
    import tempfile  # noqa: PLC0415
    from pathlib import Path  # noqa: PLC0415

    import gosim  # noqa: PLC0415
    from gosim import Chan, go, net  # noqa: PLC0415
    from idempotency.rpc import Client, RetryPolicy  # noqa: PLC0415

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from benchmarks.procs import go_build  # noqa: PLC0415

    binary = go_build("rpc", Path(tempfile.mkdtemp(prefix="ops-rpc-")) / "rpc")
    proc = subprocess.Popen(
        [str(binary), "server", "-addr", "127.0.0.1:0"], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    addr = proc.stdout.readline().split()[1]
    per_conn = n // LEDGER_CONNECTIONS

    async def main() -> float:
        async def dial() -> object:
            return await net.dial("tcp", addr)

        clients = [
            Client(  # idempotency.demo._clients.run_fleet's settings
                dial,
                caller=f"c0-{i}",
                idempotent_methods={"transfer"},
                heartbeat_interval=10.0,
                connect_attempts=5,
                backoff_initial=0.05,
                backoff_max=0.5,
                retry=RetryPolicy(max_attempts=8, initial_backoff=0.05, max_backoff=1.0),
                rng=random.Random(i),
            )
            for i in range(LEDGER_CONNECTIONS)
        ]
        done: Chan[None] = Chan(LEDGER_CONNECTIONS)

        async def connection(i: int, c: Client) -> None:
            for k in range(per_conn):
                src, dst = k % 100, (k * 7 + 1 + i) % 100
                res = await c.call_result(
                    "transfer", src, dst, 1, idempotency_key=f"t{k}", timeout=10.0
                )
                if res.result != [src, dst, 1]:  # the Go server echoes the params
                    raise AssertionError(f"bad reply {res.result!r}")
            await done.send(None)

        started = time.perf_counter()
        for i, c in enumerate(clients):
            go(connection, i, c)
        for _ in clients:
            await done.recv()
        elapsed = time.perf_counter() - started
        for c in clients:
            await c.close()
        return elapsed

    try:
        elapsed = gosim.run(main)
    finally:
        proc.terminate()
        proc.wait()
    calls = per_conn * LEDGER_CONNECTIONS
    print(f"rpc-client-ledger: {calls} calls, {elapsed / calls * 1e6:.2f} us each (wall clock)")


def aio_server(n: int) -> None:
    """``aio-stream-rr``: aio-msgpack-rpc serves ``echo`` to the stream client."""
    import asyncio  # noqa: PLC0415

    from aio_msgpack_rpc import Server as AioServer  # noqa: PLC0415

    class Handler:
        def echo(self, *args: object) -> list[object]:
            return list(args)

    async def main() -> float:
        srv = await asyncio.start_server(AioServer(Handler()), "127.0.0.1", 0)
        port = srv.sockets[0].getsockname()[1]
        started = time.perf_counter()
        proc = await asyncio.create_subprocess_exec(
            sys.executable, __file__, "stream-client", str(port), str(n)
        )
        code = await proc.wait()
        elapsed = time.perf_counter() - started
        if code:
            raise SystemExit(f"client failed with {code}")
        srv.close()
        await srv.wait_closed()
        return elapsed

    elapsed = asyncio.run(main())
    print(f"aio-stream-rr: {n} calls, {elapsed / n * 1e6:.2f} us each (client wall clock)")


def server(workload: str, n: int) -> None:
    import tempfile  # noqa: PLC0415

    import gosim  # noqa: PLC0415
    from gosim import go, net  # noqa: PLC0415
    from idempotency import Idempotency, MemoryStore, SQLiteStore  # noqa: PLC0415
    from idempotency.rpc import Server  # noqa: PLC0415

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from benchmarks.procs import wait_child  # noqa: PLC0415

    depth = 16 if workload.endswith("pipe16") else 100 if "keyed" in workload else 1
    stack = contextlib.ExitStack()  # what the workload started (a redis-server)
    idem = None
    if workload == "rpc-ledger":
        from pathlib import Path  # noqa: PLC0415

        from idempotency.demo._ledger import LedgerSpec, create_ledger, make_server  # noqa: PLC0415

        spec = LedgerSpec("sqlite", Path(tempfile.mkdtemp(prefix="ops-rpc-")) / "ledger.db")
        create_ledger(spec, 100)
        srv = make_server(spec, 10.0, 1000)
        depth = 1000  # the demo's 1,000 connections with a call each: its batch sizes
    elif workload.startswith("rpc-keyed-sqlite"):
        idem = Idempotency(SQLiteStore(tempfile.mkdtemp(prefix="ops-rpc-") + "/records.db"))
    elif workload == "rpc-keyed-memory":
        idem = Idempotency(MemoryStore())
    elif workload == "rpc-keyed-redis":
        from benchmarks.bench_idempotency import redis_process  # noqa: PLC0415
        from idempotency import RedisStore  # noqa: PLC0415

        url, _pid = stack.enter_context(redis_process(tempfile.mkdtemp(prefix="ops-rpc-")))
        idem = Idempotency(RedisStore(url, prefix="ops:"))
    if workload != "rpc-ledger":
        srv = Server(idempotency=idem, heartbeat_interval=10.0)
    if workload == "rpc-ledger":
        pass  # make_server registered the ledger's methods
    elif idem is not None:

        def echo_keyed(*args: object) -> list[object]:
            return list(args)

        one_step = workload == "rpc-keyed-sqlite-one-step"
        srv.add_method(echo_keyed, "echo", idempotent=True, one_step=one_step)
    elif "async" in workload:

        async def echo_async(*args: object) -> list[object]:
            return list(args)

        srv.add_method(echo_async, "echo")
    else:

        def echo(*args: object) -> list[object]:
            return list(args)

        srv.add_method(echo, "echo")

    async def main() -> float:
        listener = net.listen("tcp", "127.0.0.1:0")
        port = int(listener.addr().rpartition(":")[2])
        started = time.perf_counter()
        if workload == "rpc-stream-rr":
            go(srv.serve_stream, listener)
            argv = ["stream-client", str(port), str(n)]
        else:
            go(srv.serve, listener)
            keyed = "2" if workload == "rpc-ledger" else "1" if idem is not None else "0"
            argv = ["client", str(port), str(n), str(depth), keyed]
        code = await wait_child([sys.executable, __file__, *argv])
        elapsed = time.perf_counter() - started
        if code:
            raise SystemExit(f"client failed with {code}")
        await srv.shutdown(grace=1.0)
        if os.environ.get("OPS_STATS") and srv.idempotency is not None:
            print(srv.idempotency.store.statistics(), file=sys.stderr)
        return elapsed

    elapsed = gosim.run(main)
    stack.close()
    print(f"{workload}: {n} calls, {elapsed / n * 1e6:.2f} us each (client wall clock)")


if __name__ == "__main__":
    if sys.argv[1] == "stream-client":
        stream_client(int(sys.argv[2]), int(sys.argv[3]))
    elif sys.argv[1] == "client":
        mode = sys.argv[5] if len(sys.argv) > 5 else "0"
        client(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), mode == "1", mode == "2")
    elif sys.argv[1] == "aio-stream-rr":
        aio_server(int(sys.argv[2]) if len(sys.argv) > 2 else 2000)
    elif sys.argv[1] == "rpc-client-ledger":
        client_side(int(sys.argv[2]) if len(sys.argv) > 2 else 2000)
    else:
        server(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 2000)
