"""Peer echo servers and clients for the network benchmarks, one process each.

Frames are a 4-byte big-endian length (not counting itself) and a payload, the format
of ``benchmarks/go/net``. Every server echoes every frame; clients check each echo.

    python benchmarks/net_peers.py server trio|asyncio|uvloop [--addr 127.0.0.1:0]
        prints "LISTEN host:port", serves until killed
    python benchmarks/net_peers.py pipelined trio|asyncio|uvloop|netframe --addr A [--n N]
    python benchmarks/net_peers.py rr trio|asyncio|uvloop|netframe --addr A [--seconds 2]
        print one JSON object, as the Go client does
    python benchmarks/net_peers.py idle-server netframe [--heartbeat 1.0]
    python benchmarks/net_peers.py idle-clients netframe --addr A --conns N --seconds HOLD
        long idle session connections with heartbeats (netframe's Server and Client)

The servers are written the way each library is used at its best: the trio server
reads 64 KiB at a time and echoes every complete frame of a read with one ``send_all``
(batched); the asyncio server is a ``Protocol`` whose ``data_received`` does the same,
and the uvloop server is that ``Protocol`` on uvloop's event loop (what Python users
pick for a fast asyncio server).

Started by a benchmark, every peer applies ``$BENCH_GC_THRESHOLD`` first
(``benchmarks/procs.py``): all Python peers run under the same collector settings.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import struct
import sys
import time
from typing import cast

import trio
from procs import apply_gc_settings  # run as a script: this file's directory is on sys.path

import gosim
import netframe
from gosim import Chan, go, net

HEADER = struct.Struct(">I")


def split_frames(buf: bytearray) -> tuple[list[bytes], int]:
    """Complete frames at the start of buf and how many bytes they span."""
    frames = []
    pos = 0
    end = len(buf)
    while end - pos >= 4:
        (n,) = HEADER.unpack_from(buf, pos)
        if end - pos - 4 < n:
            break
        frames.append(bytes(buf[pos + 4 : pos + 4 + n]))
        pos += 4 + n
    return frames, pos


def parse_addr(addr: str) -> tuple[str, int]:
    host, _, port = addr.rpartition(":")
    return host, int(port)


# --------------------------------------------------------------------- servers


async def trio_server(addr: str) -> None:
    host, port = parse_addr(addr)

    async def handle(stream: trio.SocketStream) -> None:
        buf = bytearray()
        async with stream:
            while True:
                data = await stream.receive_some(65536)
                if not data:
                    return
                buf += data
                _, used = split_frames(buf)
                if used:
                    out = bytes(buf[:used])  # echo is the same bytes: frames unchanged
                    del buf[:used]
                    await stream.send_all(out)

    listeners = await trio.open_tcp_listeners(port, host=host)
    sockname = listeners[0].socket.getsockname()
    print(f"LISTEN {sockname[0]}:{sockname[1]}", flush=True)
    await trio.serve_listeners(handle, listeners)


class EchoProtocol(asyncio.Protocol):
    def __init__(self) -> None:
        self.buf = bytearray()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's TCPTransport has the Transport methods but not the class as a base
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        _, used = split_frames(buf)
        if used:
            assert self.transport is not None
            self.transport.write(bytes(buf[:used]))
            del buf[:used]


async def asyncio_server(addr: str) -> None:
    host, port = parse_addr(addr)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(EchoProtocol, host, port)
    sockname = server.sockets[0].getsockname()
    print(f"LISTEN {sockname[0]}:{sockname[1]}", flush=True)
    async with server:
        await server.serve_forever()


# --------------------------------------------------------------------- clients


def payload(size: int, seed: int) -> bytes:
    return bytes((seed + k) % 256 for k in range(size))


async def trio_pipelined(addr: str, n: int, size: int) -> dict[str, object]:
    host, port = parse_addr(addr)
    stream = await trio.open_tcp_stream(host, port)
    msg = payload(size, 7)
    frame = HEADER.pack(size) + msg
    batch = frame * 256
    start = time.perf_counter()
    async with stream, trio.open_nursery() as nursery:

        async def writer() -> None:
            sent = 0
            while sent < n:
                k = min(256, n - sent)
                await stream.send_all(batch if k == 256 else frame * k)
                sent += k

        nursery.start_soon(writer)
        buf = bytearray()
        got = 0
        while got < n:
            data = await stream.receive_some(65536)
            if not data:
                raise ConnectionError("server closed early")
            buf += data
            frames, used = split_frames(buf)
            del buf[:used]
            for f in frames:
                if f != msg:
                    raise AssertionError("echo mismatch")
            got += len(frames)
    el = time.perf_counter() - start
    return {"mode": "pipelined", "frames": n, "size": size, "seconds": el, "frames_per_s": n / el}


async def trio_rr(addr: str, conns: int, seconds: float, size: int) -> dict[str, object]:
    host, port = parse_addr(addr)
    total = 0
    start = time.perf_counter()
    deadline = trio.current_time() + seconds

    async def one(k: int) -> None:
        nonlocal total
        msg = payload(size, k)
        frame = HEADER.pack(size) + msg
        stream = await trio.open_tcp_stream(host, port)
        n = 0
        async with stream:
            buf = bytearray()
            while trio.current_time() < deadline:
                await stream.send_all(frame)
                while True:
                    frames, used = split_frames(buf)
                    if frames:
                        break
                    data = await stream.receive_some(65536)
                    if not data:
                        raise ConnectionError("server closed early")
                    buf += data
                del buf[:used]
                if frames != [msg]:
                    raise AssertionError("echo mismatch")
                n += 1
        total += n

    async with trio.open_nursery() as nursery:
        for k in range(conns):
            nursery.start_soon(one, k)
    el = time.perf_counter() - start
    return {
        "mode": "rr",
        "conns": conns,
        "requests": total,
        "seconds": el,
        "requests_per_s": total / el,
    }


async def asyncio_pipelined(addr: str, n: int, size: int) -> dict[str, object]:
    """The trio client's pipelined workload on asyncio streams (asyncio or uvloop)."""
    host, port = parse_addr(addr)
    reader, writer = await asyncio.open_connection(host, port)
    msg = payload(size, 7)
    frame = HEADER.pack(size) + msg
    batch = frame * 256
    start = time.perf_counter()

    async def write_all() -> None:
        sent = 0
        while sent < n:
            k = min(256, n - sent)
            writer.write(batch if k == 256 else frame * k)
            await writer.drain()
            sent += k

    sender = asyncio.create_task(write_all())
    buf = bytearray()
    got = 0
    while got < n:
        data = await reader.read(65536)
        if not data:
            raise ConnectionError("server closed early")
        buf += data
        frames, used = split_frames(buf)
        del buf[:used]
        if any(f != msg for f in frames):
            raise AssertionError("echo mismatch")
        got += len(frames)
    await sender
    el = time.perf_counter() - start
    writer.close()
    return {"mode": "pipelined", "frames": n, "size": size, "seconds": el, "frames_per_s": n / el}


async def asyncio_rr(addr: str, conns: int, seconds: float, size: int) -> dict[str, object]:
    """The trio client's request/response workload on asyncio streams."""
    host, port = parse_addr(addr)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    start = time.perf_counter()

    async def one(k: int) -> int:
        msg = payload(size, k)
        frame = HEADER.pack(size) + msg
        reader, writer = await asyncio.open_connection(host, port)
        buf = bytearray()
        n = 0
        while loop.time() < deadline:
            writer.write(frame)
            while True:
                frames, used = split_frames(buf)
                if frames:
                    break
                data = await reader.read(65536)
                if not data:
                    raise ConnectionError("server closed early")
                buf += data
            del buf[:used]
            if frames != [msg]:
                raise AssertionError("echo mismatch")
            n += 1
        writer.close()
        return n

    total = sum(await asyncio.gather(*(one(k) for k in range(conns))))
    el = time.perf_counter() - start
    return {
        "mode": "rr",
        "conns": conns,
        "requests": total,
        "seconds": el,
        "requests_per_s": total / el,
    }


# ------------------------------------------------------------ netframe (gosim)


def netframe_server(addr: str, kind: str = "netframe") -> None:
    """netframe's raw-mode Server: ``netframe``, an async handler called per frame;
    ``netframe-plain``, a plain-function handler per frame; ``netframe-batch``, a
    ``handle_batch`` handler (one call per receive)."""

    async def echo(payload: bytes) -> bytes:
        return payload

    def echo_plain(payload: bytes) -> bytes:
        return payload

    async def echo_batch(payloads: list[bytes]) -> list[bytes | None]:
        return list(payloads)

    async def main() -> None:
        # Compile the frame-scan kernel before serving, as a deployment warms up;
        # otherwise it compiles in the background while the first clients are served.
        netframe.load_kernel()
        ln = net.listen("tcp", addr)
        print(f"LISTEN {ln.addr()}", flush=True)
        if kind == "netframe-batch":
            server = netframe.Server(handle_batch=echo_batch, raw=True, heartbeat_interval=None)
        else:
            handler = echo_plain if kind == "netframe-plain" else echo
            server = netframe.Server(handler, raw=True, max_in_flight=1, heartbeat_interval=None)
        await server.serve(ln)

    gosim.run(main)


def idle_server(addr: str, heartbeat: float) -> None:
    """A netframe session server with heartbeats; prints LISTEN, then serves until killed.

    Every ``heartbeat`` seconds it prints one JSON line of its stats (connections,
    heartbeats missed, dead peers), so a benchmark can read them while it runs.
    """

    async def echo(payload: bytes) -> bytes:
        return payload

    async def main() -> None:
        ln = net.listen("tcp", addr)
        server = netframe.Server(echo, heartbeat_interval=heartbeat, max_connections=100_000)
        go(server.serve, ln)
        print(f"LISTEN {ln.addr()}", flush=True)
        while True:
            await gosim.sleep(heartbeat)
            st = server.statistics()
            line = {
                "connections": st.connections,
                "heartbeats_missed": st.heartbeats_missed,
                "dead_peers": st.dead_peers,
                "frames_received": st.frames_received,
            }
            print(json.dumps(line), flush=True)

    gosim.run(main)


def idle_clients(addr: str, conns: int, hold: float, heartbeat: float) -> dict[str, object]:
    """Open ``conns`` session connections (heartbeats on), print CONNECTED, stay idle for
    ``hold`` seconds, then make one request on each; report how many were answered."""

    async def main() -> dict[str, object]:
        clients: list[netframe.Client] = []
        start = time.perf_counter()

        async def dial() -> net.Conn:
            return await net.dial("tcp", addr, timeout=30)

        for _ in range(conns):
            c = netframe.Client(dial, heartbeat_interval=heartbeat)
            await c.connect()
            clients.append(c)
        connect_s = time.perf_counter() - start
        print("CONNECTED", flush=True)
        await gosim.sleep(hold)  # idle: only heartbeats cross the connections
        done: Chan[int] = Chan(conns)

        async def ask(k: int, c: netframe.Client) -> None:
            try:
                await c.send(b"%d" % k)
                ok = await c.recv() == b"%d" % k
            except netframe.ConnectionLost:
                ok = False
            await c.close()
            await done.send(int(ok))

        for k, c in enumerate(clients):
            go(ask, k, c)
        answered = 0
        for _ in range(conns):
            answered += await done.recv() or 0
        return {"mode": "idle", "conns": conns, "answered": answered, "connect_s": connect_s}

    result: dict[str, object] = gosim.run(main)
    return result


def netframe_client(
    mode: str, addr: str, n: int, size: int, conns: int, seconds: float
) -> dict[str, object]:

    async def pipelined() -> dict[str, object]:
        msg = payload(size, 7)
        fc = netframe.FramedConn(await net.dial("tcp", addr))
        start = time.perf_counter()

        async def writer() -> None:
            sent = 0
            while sent < n:
                k = min(256, n - sent)
                await fc.write_frames([msg] * k)
                sent += k

        go(writer)
        got = 0
        while got < n:
            frames = await fc.read_frames()
            if not frames:
                raise ConnectionError("server closed early")
            if any(f != msg for f in frames):
                raise AssertionError("echo mismatch")
            got += len(frames)
        el = time.perf_counter() - start
        fc.conn.close()
        return {
            "mode": "pipelined",
            "frames": n,
            "size": size,
            "seconds": el,
            "frames_per_s": n / el,
        }

    async def rr() -> dict[str, object]:
        done: Chan[int] = Chan(conns)
        start = time.perf_counter()
        deadline = gosim.now() + seconds

        async def one(k: int) -> None:
            msg = payload(size, k)
            fc = netframe.FramedConn(await net.dial("tcp", addr))
            count = 0
            while gosim.now() < deadline:
                await fc.write_frame(msg)
                if await fc.read_frame() != msg:
                    raise AssertionError("echo mismatch")
                count += 1
            fc.conn.close()
            await done.send(count)

        for k in range(conns):
            go(one, k)
        total = 0
        for _ in range(conns):
            total += await done.recv() or 0
        el = time.perf_counter() - start
        return {
            "mode": "rr",
            "conns": conns,
            "requests": total,
            "seconds": el,
            "requests_per_s": total / el,
        }

    netframe.load_kernel()  # before the clock starts, as for the server
    result: dict[str, object] = gosim.run(pipelined if mode == "pipelined" else rr)
    return result


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["server", "pipelined", "rr", "idle-server", "idle-clients"])
    ap.add_argument(
        "peer",
        choices=["trio", "asyncio", "uvloop", "netframe", "netframe-plain", "netframe-batch"],
    )
    ap.add_argument("--addr", default="127.0.0.1:0")
    ap.add_argument("--n", type=int, default=200_000)
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--conns", type=int, default=100)
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--heartbeat", type=float, default=1.0)
    args = ap.parse_args(argv)
    apply_gc_settings()
    if args.mode == "idle-server":
        idle_server(args.addr, args.heartbeat)
        return
    if args.mode == "idle-clients":
        out = idle_clients(args.addr, args.conns, args.seconds, args.heartbeat)
        print(json.dumps(out))
        return
    if args.mode == "server":
        if args.peer == "trio":
            trio.run(trio_server, args.addr)
        elif args.peer.startswith("netframe"):
            netframe_server(args.addr, args.peer)
        elif args.peer == "uvloop":
            import uvloop  # noqa: PLC0415 -- a dev dependency, only this peer needs it

            uvloop.run(asyncio_server(args.addr))
        else:
            asyncio.run(asyncio_server(args.addr))
        return
    if args.peer == "netframe":
        out = netframe_client(args.mode, args.addr, args.n, args.size, args.conns, args.seconds)
        print(json.dumps(out))
        return
    if args.peer in ("asyncio", "uvloop"):
        if args.mode == "pipelined":
            coro = asyncio_pipelined(args.addr, args.n, args.size)
        else:
            coro = asyncio_rr(args.addr, args.conns, args.seconds, args.size)
        if args.peer == "uvloop":
            import uvloop  # noqa: PLC0415 -- a dev dependency, only this peer needs it

            out = uvloop.run(coro)
        else:
            out = asyncio.run(coro)
        print(json.dumps(out))
        return
    if args.peer != "trio":
        raise SystemExit("clients: trio, asyncio, uvloop and netframe (and the Go client)")
    if args.mode == "pipelined":
        out = trio.run(trio_pipelined, args.addr, args.n, args.size)
    else:
        out = trio.run(trio_rr, args.addr, args.conns, args.seconds, args.size)
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1:])
