"""The raw one-handler-at-a-time server's C loop (``FramedConn.exchange``, the C
``Exchange``) against the Python loop it replaces (``_read_connection``, ``_deliver``,
``_handle_inline``), over real loopback TCP: the same replies in the same order and the
same counts whatever the handlers do, and every state the loop stops in (a handler to
await, a send the socket cannot take at once, replies the C writer declines, the end
of the stream, an invalid header) met by peers that are plain sockets in a thread."""

from __future__ import annotations

import socket
import struct
import threading
import time
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gosim
import netframe
from gosim import go, net
from netframe import _conn as conn_module

HEADER = struct.Struct(">I")
BIG = 70_000  # a reply the C writer declines (at least GATHER_MIN_BYTES: gathered)

pytestmark = pytest.mark.skipif(
    conn_module._Exchange is None, reason="netframe._speedups not in use (pure Python)"
)


def _handler(log: list[str], laters: list[tuple[netframe.Later, bytes]] | None = None) -> Any:
    """The handler of every op (the first byte of a request): ``L`` returns a
    :class:`netframe.Later` that the test settles (kept in ``laters``)."""

    async def later(payload: bytes) -> bytes:
        await gosim.sleep(0.001)  # really waits: the loop stops for it
        return b"late " + payload

    async def at_once(payload: bytes) -> bytes:
        return b"async " + payload

    async def failing(payload: bytes) -> bytes:
        await gosim.gosched()  # waits too (a yield)
        raise ValueError("async failure")

    def handler(payload: bytes) -> Any:
        log.append(payload.decode(errors="replace")[:8])
        op = payload[:1]
        if op == b"p":
            return b"plain " + payload
        if op == b"n":
            return None
        if op == b"r":
            raise ValueError("plain failure")
        if op == b"a":
            return at_once(payload)
        if op == b"s":
            return later(payload)
        if op == b"x":
            return failing(payload)
        if op == b"g":
            return b"G" * BIG
        if op == b"L" and laters is not None:
            pending = netframe.Later()
            laters.append((pending, payload))
            return pending
        raise AssertionError(op)

    return handler


def _expected(op: str, payload: bytes) -> bytes | None:
    """The reply a request gets (``L``: once the test settles its Later), if any."""
    return {
        "p": b"plain " + payload,
        "a": b"async " + payload,
        "s": b"late " + payload,
        "L": b"later " + payload,
        "g": b"G" * BIG,
    }.get(op)


def _serve(payloads: list[bytes], send_queue: int) -> tuple[list[bytes], dict[str, int], bool]:
    """Serve ``payloads`` sent in one write on a fresh server; the replies, counters,
    and whether the connection ran on an Exchange."""
    log: list[str] = []

    async def main() -> tuple[list[bytes], dict[str, int], bool]:
        ln = net.listen("tcp", "127.0.0.1:0")
        server = netframe.Server(_handler(log), raw=True, max_in_flight=1, send_queue=send_queue)
        go(server.serve, ln)
        fc = netframe.FramedConn(await net.dial("tcp", ln.addr()))
        await fc.write_frames([*payloads, b"pend"])  # a last reply marks the end
        got: list[bytes] = []
        while not got or got[-1] != b"plain pend":
            got += await fc.read_frames()
        used = any(c.fc._exchange is not None for c in server._conns)
        stats = server.statistics()
        await fc.aclose()
        await server.shutdown(grace=0.5)
        counts = {"handler_errors": stats.handler_errors, "frames": stats.frames_received}
        return got[:-1], counts, used

    return gosim.run(main, procs=1)


@given(
    ops=st.lists(st.sampled_from("pnraxsg"), min_size=1, max_size=40),
    send_queue=st.sampled_from([1, 3, 64]),
)
@settings(max_examples=40, deadline=None)
def test_the_c_loop_answers_as_the_python_loop(ops: list[str], send_queue: int) -> None:
    payloads = [op.encode() + b"%d" % i for i, op in enumerate(ops)]
    got, counts, used = _serve(payloads, send_queue)
    assert used
    want = [r for op, p in zip(ops, payloads, strict=True) if (r := _expected(op, p))]
    assert got == want
    assert counts["handler_errors"] == sum(op in "rx" for op in ops)
    saved = conn_module._Exchange
    conn_module._Exchange = None
    try:
        assert _serve(payloads, send_queue) == (got, counts, False)
    finally:
        conn_module._Exchange = saved


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(min(1 << 20, n - len(buf)))
        if not chunk:
            raise ConnectionError(f"closed after {len(buf)} of {n} bytes")
        buf += chunk
    return bytes(buf)


class ServerThread:
    """An echo server on a runtime in a thread of its own (the peer under test is a
    plain socket in the test's thread); stopped by ``stop()``, or after 20 s. Raw, one
    handler at a time, unless ``options`` say otherwise; a payload that starts with
    ``s`` is echoed by an async handler after 50 ms."""

    def __init__(self, **options: Any) -> None:
        self._ready = threading.Event()
        self._stop = threading.Event()
        self.server: netframe.Server | None = None
        self.addr = ("", 0)
        self._thread = threading.Thread(target=self._run, args=(options,), daemon=True)
        self._thread.start()
        assert self._ready.wait(10)

    def _run(self, options: dict[str, Any]) -> None:
        async def slow_echo(payload: bytes) -> bytes:
            await gosim.sleep(0.05)
            return payload

        def echo(payload: bytes) -> Any:
            return slow_echo(payload) if payload[:1] == b"s" else payload

        async def main() -> None:
            ln = net.listen("tcp", "127.0.0.1:0")
            server = netframe.Server(echo, **{"raw": True, "max_in_flight": 1, **options})
            self.server = server
            host, port = ln.addr().rsplit(":", 1)
            self.addr = (host, int(port))
            go(server.serve, ln)
            self._ready.set()
            started = gosim.now()
            while not self._stop.is_set() and gosim.now() - started < 20:
                await gosim.sleep(0.02)
            await server.shutdown(grace=0.5)

        gosim.run(main, procs=1)

    def statistics_when_idle(self) -> netframe.ServerStatistics:
        """The server's counters once its connections have ended (at most 5 s)."""
        assert self.server is not None
        deadline = time.monotonic() + 5
        while self.server.statistics().connections and time.monotonic() < deadline:
            time.sleep(0.02)
        return self.server.statistics()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)


@pytest.mark.parametrize("loop", ["c", "python"])
def test_a_peer_that_pipelines_and_reads_late_gets_every_reply_in_order(
    loop: str, request: pytest.FixtureRequest
) -> None:
    """The server's sends meet a full socket (the peer reads nothing until it has sent
    everything): the loop stops to wait for room, then goes on; nothing is lost or
    reordered, and the server holds at most send_queue replies meanwhile."""
    if loop == "python":
        request.getfixturevalue("python_loop")
    frames = [b"%06d" % i + b"x" * 1000 for i in range(8000)]  # 8 MB each way
    wire = b"".join(HEADER.pack(len(f)) + f for f in frames)
    srv = ServerThread()
    sock = socket.create_connection(srv.addr)
    sender = threading.Thread(target=sock.sendall, args=(wire,), daemon=True)
    sender.start()
    time.sleep(0.5)  # the server fills the socket both ways and waits for room
    echoed = _recv_exactly(sock, len(wire))
    sender.join(10)
    assert echoed == wire
    sock.close()
    stats = srv.statistics_when_idle()
    srv.stop()
    assert stats.frames_received == stats.frames_sent == len(frames)
    assert stats.handler_errors == 0


@pytest.mark.parametrize("loop", ["c", "python"])
@pytest.mark.parametrize("ending", ["oversized header", "end inside a frame"])
def test_frames_before_a_bad_ending_are_answered_then_it_is_a_protocol_error(
    loop: str, ending: str, request: pytest.FixtureRequest
) -> None:
    """The reader hands back (an invalid header) or ends inside a frame: the frames of
    the same receive are answered first, then the general path reports the peer."""
    if loop == "python":
        request.getfixturevalue("python_loop")
    fmt = netframe.FrameFormat(max_frame_length=1000)
    srv = ServerThread(format=fmt)
    sock = socket.create_connection(srv.addr)
    good = b"".join(HEADER.pack(3) + b"%03d" % i for i in range(5))
    bad = HEADER.pack(5000) if ending == "oversized header" else HEADER.pack(10) + b"abc"
    sock.sendall(good + bad)
    if ending == "end inside a frame":
        sock.shutdown(socket.SHUT_WR)
    assert _recv_exactly(sock, len(good)) == good
    sock.settimeout(5)
    assert sock.recv(100) == b""  # then the server closes
    sock.close()
    stats = srv.statistics_when_idle()
    srv.stop()
    assert stats.protocol_errors == 1
    assert stats.frames_received == stats.frames_sent == 5


def test_the_exchange_refuses_misuse() -> None:
    from netframe._speedups import Exchange  # noqa: PLC0415

    fmt = netframe.FrameFormat()
    reader = conn_module._FrameReader(4096, 1 << 20, *fmt._scan_params)
    writer = conn_module.FrameWriter(*fmt._encode_params, -1, 0)
    with pytest.raises(TypeError):
        Exchange(object(), writer, len, 1, None)
    with pytest.raises(ValueError):
        Exchange(reader, writer, len, 0, None)
    ex = Exchange(reader, writer, len, 4, None)
    with pytest.raises(RuntimeError):
        ex.take_pending()
    with pytest.raises(RuntimeError):
        ex.resume(b"x")
    assert ex.take_errors() == 0 and ex.take_replies() == []
    assert (ex.frames_in, ex.frames_out, ex.writes) == (0, 0, 0)


def test_an_ended_connections_loop_is_freed_without_the_collector() -> None:
    """The loop and its connection hold each other while serving; at the end the
    server breaks that, so connections that come and go free theirs at once."""
    import gc  # noqa: PLC0415

    async def main() -> int:
        ln = net.listen("tcp", "127.0.0.1:0")
        server = netframe.Server(lambda p: p, raw=True, max_in_flight=1)
        go(server.serve, ln)
        for i in range(100):
            fc = netframe.FramedConn(await net.dial("tcp", ln.addr()))
            await fc.write_frame(b"%d" % i)
            assert await fc.read_frame() == b"%d" % i
            await fc.aclose()
        while server.statistics().connections:
            await gosim.sleep(0.01)
        live = sum(type(o).__name__ == "Exchange" for o in gc.get_objects())
        await server.shutdown(grace=0.5)
        return live

    gc.collect()
    gc.disable()
    try:
        assert gosim.run(main, procs=1) == 0
    finally:
        gc.enable()
