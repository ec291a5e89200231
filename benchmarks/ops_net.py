"""A netframe server's work for N requests, for counting its instructions with callgrind.

The server runs in this process; its client is a plain-socket child process that
valgrind does not follow (``--trace-children=no``, the default), so the instructions
counted are the server's alone, whatever the load on the machine:

    for n in 2000 12000; do
      PYTHONHASHSEED=0 valgrind --tool=callgrind --callgrind-out-file=/dev/null \\
          .venv/bin/python benchmarks/ops_net.py session-rr $n 2>&1 | grep Collected
    done

and ``(Ir(12000) - Ir(2000)) / 10000`` is the server's instructions per request
(start-up, accept and shutdown cancel out). Workloads:

* ``raw-rr``: raw mode, a plain handler, one request in flight (``max_in_flight=1``);
* ``session-rr``: session mode with the defaults (``max_in_flight=64``), a plain
  handler, one request in flight: the shape of ``idempotency.rpc``'s server;
* ``session-async-rr``: the same with an async handler;
* ``raw-pipe64`` / ``session-pipe64``: 64 frames of 64 bytes sent at once, their 64
  replies read, again (N frames in all): the pipelined cost per frame;
* ``session-ping``: PING frames, one in flight, each answered by its PONG: what a
  heartbeat costs the side that answers it; ``session-ping-fan64``: the same on 64
  connections at once, one PING in flight on each (N in all), as a server holding
  many connections answers them;
* ``uvloop-fan64``: not netframe: the benchmarks' uvloop ``Protocol`` echo server
  (``net_peers.py``) on raw-fan64's client, the peer issue 17 compares server CPU with;
* ``session-hb64``: 64 connections whose client sends nothing but PONGs, the server
  pinging each when quiet (a 0.2 s interval), until N pings are answered: a
  heartbeat's cost to the side that keeps it (its timer's wake, the PING, the PONG read);
  ``session-hbc64``: the client pings all 64 every 0.2 s (N in all) and the server, with
  the same interval, only answers: a server's heartbeat cost per client ping, its own
  timers included.

Run without valgrind it prints the wall-clock time per request of the client too, a
figure the load moves (use the instruction counts to compare builds).
"""

from __future__ import annotations

import os
import selectors
import socket
import struct
import sys
import time
from typing import cast

HEADER = struct.Struct(">I")
PAYLOAD = b"x" * 64


def _recv_exactly(sock: socket.socket, n: int, buf: bytearray) -> None:
    while len(buf) < n:
        chunk = sock.recv(max(65536, n - len(buf)))
        if not chunk:
            raise ConnectionError("server closed the connection")
        buf += chunk


def client(
    port: int, n: int, session: bool, depth: int, ping: bool, conns: int, pause: float = 0.0
) -> None:
    """``n`` requests (``ping``: PING frames) over ``conns`` connections, ``depth`` at a
    time on each, each reply checked (a PING's is its PONG), ``pause`` seconds between
    rounds; then close."""
    body = (b"\x00" if session else b"") + PAYLOAD
    frame = HEADER.pack(len(body)) + body
    reply = frame
    if ping:
        frame = HEADER.pack(9) + b"\x01" + b"12345678"
        reply = HEADER.pack(9) + b"\x02" + b"12345678"
    socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(conns)]
    for sock in socks:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buf = bytearray()
    sent = 0
    while sent < n:
        k = min(depth, (n - sent) // conns or 1)
        for sock in socks:  # every connection's requests go out before any reply is read
            sock.sendall(frame * k)
        sent += k * conns
        want = k * len(reply)
        for sock in socks:
            _recv_exactly(sock, want, buf)
            if bytes(buf[:want]) != reply * k:
                raise AssertionError("a reply did not answer its request")
            del buf[:want]
        if pause:
            time.sleep(pause)
    for sock in socks:
        sock.close()


def answer_pings(port: int, n: int, conns: int) -> None:
    """Hold ``conns`` session connections that send nothing of their own and answer
    the server's PINGs with PONGs, until ``n`` PINGs have been answered; then close."""
    socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(conns)]
    bufs = {sock.fileno(): bytearray() for sock in socks}
    sel = selectors.DefaultSelector()
    for sock in socks:
        sel.register(sock, selectors.EVENT_READ)
    answered = 0
    while answered < n:
        for key, _ in sel.select(timeout=30):
            sock = cast(socket.socket, key.fileobj)
            chunk = sock.recv(65536)
            if not chunk:
                raise ConnectionError("the server closed a connection (declared it dead?)")
            buf = bufs[sock.fileno()]
            buf += chunk
            while len(buf) >= 4 and len(buf) >= 4 + HEADER.unpack_from(buf)[0]:
                size = HEADER.unpack_from(buf)[0]
                body = bytes(buf[4 : 4 + size])
                del buf[: 4 + size]
                if body[:1] == b"\x01":
                    sock.sendall(HEADER.pack(9) + b"\x02" + body[1:])
                    answered += 1
    for sock in socks:
        sock.close()


def uvloop_server(n: int) -> None:
    """uvloop-fan64: the uvloop peer of benchmarks/net_peers.py for ``n`` requests."""
    import asyncio  # noqa: PLC0415

    import uvloop  # noqa: PLC0415
    from net_peers import EchoProtocol  # noqa: PLC0415  # this directory is on sys.path

    async def main() -> float:
        loop = asyncio.get_running_loop()
        srv = await loop.create_server(EchoProtocol, "127.0.0.1", 0)
        port = srv.sockets[0].getsockname()[1]
        started = time.perf_counter()
        proc = await asyncio.create_subprocess_exec(
            sys.executable, __file__, "client", str(port), str(n), "0", "1", "0", "64"
        )
        if await proc.wait():
            raise SystemExit("client failed")
        srv.close()
        return time.perf_counter() - started

    elapsed = uvloop.run(main())
    print(f"uvloop-fan64: {n} requests, {elapsed / n * 1e6:.2f} us each (client wall clock)")


def server(workload: str, n: int) -> None:
    # Here, not at the top: the client process (this file too) stays a plain-socket
    # program that never loads the runtime.
    if workload == "uvloop-fan64":
        uvloop_server(n)
        return
    import gosim  # noqa: PLC0415
    import netframe  # noqa: PLC0415
    from gosim import go, net  # noqa: PLC0415

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from benchmarks.procs import wait_child  # noqa: PLC0415

    session = workload.startswith("session")
    depth = 64 if workload.endswith("pipe64") else 1
    conns = 64 if workload.endswith("fan64") else 1
    ping = "-ping" in workload

    def echo_plain(payload: bytes) -> bytes:
        return payload

    async def echo_async(payload: bytes) -> bytes:
        return payload

    handler = echo_async if "async" in workload else echo_plain
    if workload == "session-hb64":
        conns, ping = 64, 2  # the client only answers the server's pings
        srv = netframe.Server(handler, heartbeat_interval=0.2)
    elif workload == "session-hbc64":
        conns, ping = 64, 3  # the client pings every connection every 0.2 s
        srv = netframe.Server(handler, heartbeat_interval=0.2)
    elif session:
        srv = netframe.Server(handler, heartbeat_interval=10.0)
    else:
        srv = netframe.Server(handler, raw=True, max_in_flight=1, heartbeat_interval=None)

    async def main() -> float:
        listener = net.listen("tcp", "127.0.0.1:0")
        port = int(listener.addr().rpartition(":")[2])
        go(srv.serve, listener)
        args = [sys.executable, __file__, "client", str(port), str(n), str(int(session))]
        started = time.perf_counter()
        code = await wait_child([*args, str(depth), str(int(ping)), str(conns)])
        elapsed = time.perf_counter() - started
        if code:
            raise SystemExit(f"client failed with {code}")
        await srv.shutdown(grace=1.0)
        return elapsed

    elapsed = gosim.run(main)
    print(f"{workload}: {n} requests, {elapsed / n * 1e6:.2f} us each (client wall clock)")


if __name__ == "__main__":
    if sys.argv[1] == "client":
        port, n, session, depth, ping, conns = map(int, sys.argv[2:8])
        if ping == 2:
            answer_pings(port, n, conns)
        elif ping == 3:
            client(port, n, session == 1, depth, True, conns, pause=0.2)
        else:
            client(port, n, session == 1, depth, ping == 1, conns)
    else:
        server(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 2000)
