"""The session server's C loop for concurrent handlers (``FramedConn.exchange`` with a
session, the C ``Exchange`` in session mode) against the Python loop it replaces
(``_read_connection``, ``_session_payloads``, ``_deliver``, ``_handle_concurrent``,
``_send_or_defer``), over real loopback TCP: the same replies and the same counts
whatever the handlers return (a reply, nothing, an exception, a coroutine, a Later, a
reply too large for the C writer) and whatever else the peer sends among its requests
(pings, a goaway, a bad frame), with handler slots and send-queue parts of every size;
and the states the loop hands back met by peers that are plain sockets in a thread (a
peer that reads nothing, one that breaks the protocol mid-burst)."""

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

from .test_exchange import ServerThread, _handler
from .test_exchange import _expected as _raw_expected

HEADER = struct.Struct(">I")

pytestmark = pytest.mark.skipif(
    conn_module._Exchange is None, reason="netframe._speedups not in use (pure Python)"
)


def _expected(op: str, payload: bytes) -> bytes | None:
    """The session frame a request (or a control frame) gets back, if any (``payload``:
    the frame's, after its kind byte)."""
    if op == "P":
        return b"\x02" + payload  # the PONG of a PING
    reply = _raw_expected(op, payload)
    return None if reply is None else b"\x00" + reply


def _wire(op: str, i: int) -> bytes:
    """The session frame payload the peer sends for ``op``."""
    if op == "P":
        return b"\x01" + struct.pack(">Q", i)
    if op == "G":
        return b"\x03" + struct.pack(">I", 0) + b"peer done"
    return b"\x00" + op.encode() + b"%d" % i


def _serve(
    ops: list[str], max_in_flight: int, send_queue: int, split: int
) -> tuple[list[bytes], dict[str, int], bool]:
    """Serve the frames of ``ops`` (sent in one write, or two at ``split``) on a fresh
    session server; the frames it sent back (sorted: concurrent handlers reply in any
    order), its counters, and whether the connection ran on an Exchange."""
    laters: list[tuple[netframe.Later, bytes]] = []
    frames = [_wire(op, i) for i, op in enumerate(ops)]
    want = sum(_expected(op, f[1:]) is not None for op, f in zip(ops, frames, strict=True))

    async def settle() -> None:
        while True:
            await gosim.sleep(0.001)
            while laters:
                pending, payload = laters.pop(0)
                pending.reply(b"later " + payload)

    async def main() -> tuple[list[bytes], dict[str, int], bool]:
        ln = net.listen("tcp", "127.0.0.1:0")
        server = netframe.Server(
            _handler([], laters),
            max_in_flight=max_in_flight,
            send_queue=send_queue,
            heartbeat_interval=None,
        )
        go(server.serve, ln)
        go(settle)
        fc = netframe.FramedConn(await net.dial("tcp", ln.addr()))
        await fc.write_frames(frames[:split])
        if split < len(frames):
            await gosim.sleep(0.001)
            await fc.write_frames(frames[split:])
        got: list[bytes] = []
        deadline = gosim.now() + 10
        while len(got) < want and gosim.now() < deadline:
            got += await fc.read_frames()
        await gosim.sleep(0.01)  # nothing more may come
        used = any(c.fc._exchange is not None for c in server._conns)
        stats = server.statistics()
        await fc.aclose()
        await server.shutdown(grace=0.5)
        counts = {
            "handler_errors": stats.handler_errors,
            "frames_received": stats.frames_received,
            "frames_sent": stats.frames_sent,
            "protocol_errors": stats.protocol_errors,
        }
        return sorted(got), counts, used

    return gosim.run(main, procs=1)


@given(
    ops=st.lists(st.sampled_from("pnraxsLgPG"), min_size=1, max_size=40),
    max_in_flight=st.sampled_from([2, 3, 64]),
    send_queue=st.sampled_from([1, 3, 1024]),
    split=st.integers(0, 40),
)
@settings(max_examples=40, deadline=None)
def test_the_c_session_loop_answers_as_the_python_loop(
    ops: list[str], max_in_flight: int, send_queue: int, split: int
) -> None:
    frames = [_wire(op, i) for i, op in enumerate(ops)]
    got, counts, used = _serve(ops, max_in_flight, send_queue, split)
    assert used
    want = [e for op, f in zip(ops, frames, strict=True) if (e := _expected(op, f[1:]))]
    assert got == sorted(want)
    assert counts["handler_errors"] == sum(op in "rx" for op in ops)
    assert counts["frames_received"] == len(ops)
    assert counts["frames_sent"] == len(want)
    saved = conn_module._Exchange
    conn_module._Exchange = None
    try:
        assert _serve(ops, max_in_flight, send_queue, split) == (got, counts, False)
    finally:
        conn_module._Exchange = saved


def _recv_frames(sock: socket.socket, count: int) -> list[bytes]:
    frames: list[bytes] = []
    buf = bytearray()
    while len(frames) < count:
        chunk = sock.recv(1 << 20)
        if not chunk:
            raise ConnectionError(f"closed after {len(frames)} of {count} frames")
        buf += chunk
        while len(buf) >= 4 and len(buf) >= 4 + HEADER.unpack_from(buf)[0]:
            n = HEADER.unpack_from(buf)[0]
            frames.append(bytes(buf[4 : 4 + n]))
            del buf[: 4 + n]
    return frames


def session_server(**options: Any) -> ServerThread:
    """test_exchange's echo server, in session mode with concurrent handlers."""
    return ServerThread(
        **{"raw": False, "max_in_flight": 64, "heartbeat_interval": None, **options}
    )


@pytest.mark.parametrize("loop", ["c", "python"])
def test_a_peer_that_pipelines_and_reads_late_gets_every_reply_in_order(
    loop: str, request: pytest.FixtureRequest
) -> None:
    """The server's replies meet a full socket (the peer reads nothing until it has
    sent everything): the loop hands the unsent rest to the writer goroutine, later
    replies queue behind it or wait for room in goroutines holding handler slots;
    every reply arrives once, and the peer's ping among the requests is answered.
    (Session replies carry the application's request ids, so their order is not
    promised: replies that waited for room may interleave with later ones.)"""
    if loop == "python":
        request.getfixturevalue("python_loop")
    bodies = [b"\x00%06d" % i + b"x" * 1000 for i in range(8000)]  # 8 MB each way
    bodies[4000] = b"\x01" + struct.pack(">Q", 77)  # a ping in the middle
    wire = b"".join(HEADER.pack(len(f)) + f for f in bodies)
    srv = session_server(max_in_flight=8, send_queue=64)
    sock = socket.create_connection(srv.addr)
    sender = threading.Thread(target=sock.sendall, args=(wire,), daemon=True)
    sender.start()
    time.sleep(0.5)  # the server fills the socket both ways and waits for room
    got = _recv_frames(sock, len(bodies))
    sender.join(10)
    sock.close()
    assert sorted(f for f in got if f[:1] == b"\x00") == [f for f in bodies if f[:1] == b"\x00"]
    assert [f for f in got if f[:1] != b"\x00"] == [b"\x02" + struct.pack(">Q", 77)]
    stats = srv.statistics_when_idle()
    srv.stop()
    assert stats.frames_received == stats.frames_sent == len(bodies)
    assert stats.handler_errors == 0


@pytest.mark.parametrize("loop", ["c", "python"])
def test_requests_before_a_bad_frame_are_answered_then_it_is_a_protocol_error(
    loop: str, request: pytest.FixtureRequest
) -> None:
    """A bad frame kind in the middle of a burst: the requests before it are answered,
    then GOAWAY(PROTOCOL_ERROR) and the close; nothing after it is handled."""
    if loop == "python":
        request.getfixturevalue("python_loop")
    srv = session_server()
    sock = socket.create_connection(srv.addr)
    good = [b"\x00%03d" % i for i in range(5)]
    after = [b"\x00late"]
    sock.sendall(b"".join(HEADER.pack(len(f)) + f for f in [*good, b"\x09bad", *after]))
    got = _recv_frames(sock, 6)
    assert got[:5] == good
    assert got[5][:1] == b"\x03"
    assert struct.unpack(">I", got[5][1:5])[0] == netframe.GoAwayCode.PROTOCOL_ERROR
    sock.settimeout(5)
    while sock.recv(100):  # the server drains, then closes
        pass
    sock.close()
    stats = srv.statistics_when_idle()
    srv.stop()
    assert stats.protocol_errors == 1
    assert stats.frames_sent == 6  # the five replies and the GOAWAY


def test_the_session_exchange_refuses_an_incomplete_session_mode() -> None:
    from netframe._speedups import Exchange  # noqa: PLC0415

    fmt = netframe.FrameFormat()
    reader = conn_module._FrameReader(4096, 1 << 20, *fmt._scan_params)
    writer = conn_module.FrameWriter(*fmt._encode_params, -1, 0)
    session = netframe.Session(0.0)
    with pytest.raises(TypeError):  # no start_pending
        Exchange(reader, writer, len, 4, None, session, time.monotonic, None, 8)
    with pytest.raises(TypeError):  # no handler slot
        Exchange(reader, writer, len, 4, None, session, time.monotonic, None, 0, print)


def test_peers_that_reset_mid_burst_leave_the_server_serving() -> None:
    """Peers that send a burst of requests with large replies and reset the connection
    at once, or after reading part of the replies: the loop's sends fail with the
    reset, and the connection's writes fail with them (a slow handler's reply, due
    after the failure while the connection waits for it, must not meet the loop's
    unsent replies in the writer). The server serves on, with nothing of those
    connections left."""
    srv = session_server(max_in_flight=16, heartbeat_interval=0.01)
    large = HEADER.pack(1 + 30_000) + b"\x00" + b"r" * 30_000  # echoed: 30 KB a reply
    small = HEADER.pack(1 + 1000) + b"\x00" + b"r" * 1000
    for i in range(30):
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(srv.addr)
        sock.settimeout(5)
        try:
            if i % 3 == 0:  # reset before the server can answer: its first send fails
                sock.sendall(HEADER.pack(5) + b"\x00slow" + small * 40)
            else:
                sock.sendall(large * 40)
            if i % 3 == 1:
                sock.recv(10_000)  # some of the replies, then the reset
        except OSError:
            pass  # the server may have found the connection broken already
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()
    stats = srv.statistics_when_idle()
    sock = socket.create_connection(srv.addr)
    sock.sendall(HEADER.pack(6) + b"\x00alive")
    assert _recv_frames(sock, 1) == [b"\x00alive"]
    sock.close()
    srv.stop()
    assert stats.connections == 0
    assert stats.accepted == 30


# --------------------------------------------- a client's reader on the C loop (on_data)


def _scripted_server(
    bodies: list[bytes], split: int, expect_back: int
) -> tuple[tuple[str, int], list[bytes], threading.Thread]:
    """A plain-socket server on a thread: accepts one connection, sends ``bodies`` as
    session frames (one write, or two at ``split``), keeps what the client sends back
    until ``expect_back`` frames came (or the client closed, or 10 s passed) and then
    for 0.1 s more (a frame too many is caught), then closes. Its address, the list the
    client's frames go to, and its thread."""
    ln = socket.create_server(("127.0.0.1", 0))
    ln.settimeout(10)
    got: list[bytes] = []

    def run() -> None:
        conn, _ = ln.accept()
        ln.close()
        wire = [HEADER.pack(len(b)) + b for b in bodies]
        conn.sendall(b"".join(wire[:split]))
        if split < len(wire):
            time.sleep(0.005)
            conn.sendall(b"".join(wire[split:]))
        # A loaded machine may take its time to answer: wait for what is due, then a
        # little longer for anything more.
        conn.settimeout(10 if expect_back else 0.1)
        buf = b""
        try:
            while chunk := conn.recv(65536):
                buf += chunk
                while len(buf) >= 4 and len(buf) >= 4 + HEADER.unpack_from(buf)[0]:
                    n = HEADER.unpack_from(buf)[0]
                    got.append(buf[4 : 4 + n])
                    buf = buf[4 + n :]
                if len(got) >= expect_back:
                    conn.settimeout(0.1)
        except OSError:
            pass
        conn.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return ln.getsockname()[:2], got, thread


def _client_run(ops: str, split: int) -> tuple[list[bytes], list[bytes], str, bool]:
    """What a netframe.Client with ``on_data`` makes of a server's scripted frames: the
    payloads on_data saw (those it was slow to take included), what the client sent
    back (pongs), why the connection ended, and whether its reader ran on an Exchange.
    ``ops``: ``d`` DATA, ``w`` DATA that on_data answers with an awaitable, ``P`` a
    PING, ``G`` a GOAWAY, ``b`` a bad frame kind."""
    bodies = []
    for i, op in enumerate(ops):
        if op in "dw":
            bodies.append(b"\x00" + op.encode() + b"%d" % i)
        elif op == "P":
            bodies.append(b"\x01" + struct.pack(">Q", i))
        elif op == "G":
            bodies.append(b"\x03" + struct.pack(">I", 0) + b"bye")
        else:
            bodies.append(b"\x09bad")
    # The pongs due: one a PING, unless a bad frame ends the connection first.
    expect_back = 0 if "b" in ops else ops.count("P")
    addr, sent_back, server = _scripted_server(bodies, split, expect_back)
    seen: list[bytes] = []

    async def take_slowly(payload: bytes) -> None:
        await gosim.sleep(0.001)
        seen.append(b"slow " + payload)

    def on_data(payload: bytes) -> Any:
        if payload[:1] == b"w":
            return take_slowly(payload)
        seen.append(payload)
        return None

    async def main() -> tuple[str, bool]:
        c = netframe.Client(
            lambda: net.dial("tcp", f"{addr[0]}:{addr[1]}"),
            heartbeat_interval=None,
            on_data=on_data,
        )
        await c.connect()
        conn = c._st
        assert conn is not None
        try:
            await c.recv(timeout=5)
            reason = "no end"
        except netframe.ConnectionLost as exc:
            reason = exc.reason
        await c.close()
        return reason, conn.fc._exchange is not None

    reason, used = gosim.run(main, procs=1)
    server.join(30)  # the scripted server's last look at what came back
    return seen, sent_back, reason, used


@given(ops=st.text("dwPGb", min_size=1, max_size=30), split=st.integers(0, 30))
@settings(max_examples=30, deadline=None)
def test_a_clients_c_reader_does_as_the_python_reader(ops: str, split: int) -> None:
    seen, sent_back, reason, used = _client_run(ops, split)
    assert used
    upto = ops.index("b") if "b" in ops else len(ops)
    want = [
        (b"slow " if op == "w" else b"") + op.encode() + b"%d" % i
        for i, op in enumerate(ops[:upto])
        if op in "dw"
    ]
    assert seen == want  # in order, the awaited ones included, nothing after a bad frame
    if "b" not in ops:  # a protocol error ends the connection: pongs due go unsent
        assert sent_back == [
            b"\x02" + struct.pack(">Q", i) for i, op in enumerate(ops) if op == "P"
        ]
    saved = conn_module._Exchange
    conn_module._Exchange = None
    try:
        assert _client_run(ops, split) == (seen, sent_back, reason, False)
    finally:
        conn_module._Exchange = saved


@pytest.mark.parametrize("loop", ["c", "python"])
@pytest.mark.parametrize("ending", ["oversized header", "end inside a frame"])
def test_requests_before_a_bad_ending_are_answered_then_it_is_a_protocol_error(
    loop: str, ending: str, request: pytest.FixtureRequest
) -> None:
    """The reader hands back (an invalid header) or the stream ends inside a frame: the
    requests of the same receive are answered first, then the general path reports
    the peer (a GOAWAY saying what was wrong, where the peer still reads)."""
    if loop == "python":
        request.getfixturevalue("python_loop")
    srv = session_server(format=netframe.FrameFormat(max_frame_length=1000))
    sock = socket.create_connection(srv.addr)
    good = [b"\x00%03d" % i for i in range(5)]
    bad = HEADER.pack(5000) if ending == "oversized header" else HEADER.pack(10) + b"abc"
    sock.sendall(b"".join(HEADER.pack(len(f)) + f for f in good) + bad)
    if ending == "end inside a frame":
        sock.shutdown(socket.SHUT_WR)
    got = _recv_frames(sock, 6)
    assert got[:5] == good
    assert got[5][:1] == b"\x03"
    assert struct.unpack(">I", got[5][1:5])[0] == netframe.GoAwayCode.PROTOCOL_ERROR
    sock.close()
    stats = srv.statistics_when_idle()
    srv.stop()
    assert stats.protocol_errors == 1
    assert stats.frames_received == 5


# ------------------------------------------ one DATA frame sent at once in C (send_data)


def test_send_data_sends_only_where_framed_conn_would_send_at_once() -> None:
    """send_data takes the fast case alone (bytes or bytearray, a session that may send
    DATA, nothing queued ahead); every other case is left to the general path, with
    nothing done. What it sends counts as FramedConn's sends do, and the session
    records the DATA sent."""

    async def main() -> list[Any]:
        ln = net.listen("tcp", "127.0.0.1:0")
        fc = netframe.FramedConn(await net.dial("tcp", ln.addr()))
        peer = netframe.FramedConn(await ln.accept())
        session = netframe.Session(0.0)
        clock = gosim.lowlevel.current_runtime().now
        before = (fc.frames_written, fc.writes)
        out = [
            conn_module._send_data(fc, session, b"one", clock),
            conn_module._send_data(fc, session, bytearray(b"two"), clock),
            conn_module._send_data(fc, session, memoryview(b"view"), clock),  # general path
            (fc.frames_written - before[0], fc.writes - before[1]),
            session.last_data > 0.0,
        ]
        fc._backlog += 1  # as if a frame waited for the writer goroutine
        out.append(conn_module._send_data(fc, session, b"queued", clock))
        fc._backlog -= 1
        session.close()
        out.append(conn_module._send_data(fc, session, b"closed", clock))
        out.append(await peer.read_frames())
        await fc.aclose()
        await peer.aclose()
        return out

    assert gosim.run(main) == [
        True,
        True,
        False,
        (2, 2),
        True,
        False,
        False,
        [b"\x00one", b"\x00two"],
    ]


def test_a_clients_sends_stay_in_order_when_the_socket_fills() -> None:
    """A client sends faster than the server reads: the first send the socket cannot
    take whole goes on in the writer goroutine, and the sends after it queue behind
    it; every request arrives, in the order sent."""
    ln = socket.create_server(("127.0.0.1", 0))
    ln.settimeout(10)
    port = ln.getsockname()[1]
    payloads = [b"%05d" % i + b"x" * 10_000 for i in range(1500)]  # 15 MB
    got: list[bytes] = []

    def read_late() -> None:
        conn, _ = ln.accept()
        time.sleep(0.3)  # the client's socket fills meanwhile
        conn.settimeout(10)
        got.extend(_recv_frames(conn, len(payloads)))
        conn.close()

    reader = threading.Thread(target=read_late, daemon=True)
    reader.start()

    async def main() -> bool:
        c = netframe.Client(lambda: net.dial("tcp", f"127.0.0.1:{port}"), heartbeat_interval=None)
        await c.connect()
        for p in payloads:
            await c.send(p, timeout=10)
        assert c._st is not None
        filled = c._st.fc._unfinished and c._st.fc._backlog > 0  # handed off, then queued
        await c.close(timeout=10)
        return filled

    filled = gosim.run(main)
    reader.join(10)
    ln.close()
    assert filled
    assert got == [b"\x00" + p for p in payloads]


def test_a_send_that_fails_in_c_fails_the_clients_later_sends() -> None:
    """The server resets the connection: the send that meets the reset raises
    ConnectionLost, and so does every send after it (FramedConn's writes failed)."""
    ln = socket.create_server(("127.0.0.1", 0))
    ln.settimeout(10)
    port = ln.getsockname()[1]

    def accept_and_reset() -> None:
        conn, _ = ln.accept()
        conn.recv(100)
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        conn.close()

    t = threading.Thread(target=accept_and_reset, daemon=True)
    t.start()

    async def main() -> tuple[int, int]:
        c = netframe.Client(lambda: net.dial("tcp", f"127.0.0.1:{port}"), heartbeat_interval=None)
        await c.connect()
        await c.send(b"first")
        await gosim.syscall(t.join, 10)
        sent = lost = 0
        for _ in range(50):
            try:
                await c.send(b"x" * 1000)
                sent += 1
            except netframe.ConnectionLost:
                lost += 1
        await c.close()
        return sent, lost

    sent, lost = gosim.run(main)
    ln.close()
    assert lost >= 49 and sent + lost == 50  # at most one send went out before the reset
