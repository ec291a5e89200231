"""The plain-stream server's reader on netframe's C loop (the Exchange's frameless mode):
in the steady state the C loop handles every message of a connection, and each case it
hands back to the Python reader (a message split over receives, an awaitable result,
the owed-bytes bound, a send the socket did not take whole, the cutter's error, the
end of the stream) behaves as the Python reader alone does.

Each test runs on both builds: with the C extension it also checks which path handled
the messages (``StreamLink.exchanged``); with ``GOSIM_PURE_PYTHON=1`` the Python reader
handles them all and ``exchanged`` stays 0."""

from __future__ import annotations

import select
import socket
import threading
import time
from typing import Any

import msgpack
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

import gosim
from gosim import Chan, go, net
from idempotency.rpc import Server
from idempotency.rpc import _stream as stream_module
from idempotency.rpc._stream import StreamLink
from netframe import _conn as conn_module

C_LOOP = conn_module._Exchange is not None
BOUND = 10.0  # seconds any wait of these tests may take before it is a failure


def _call(msgid: int, method: str, *params: Any) -> bytes:
    return bytes(msgpack.packb([0, msgid, method, list(params)]))


def _server(**options: Any) -> tuple[Server, Chan[None]]:
    """A stream server with ``echo``, ``aecho`` (async, at once) and ``gate`` (async:
    waits until the test sends on the returned channel)."""
    srv = Server(heartbeat_interval=None, **options)
    gate: Chan[None] = Chan(1)

    @srv.method()
    def echo(x: Any) -> Any:
        return x

    @srv.method()
    async def aecho(x: Any) -> Any:
        return x

    @srv.method(name="gate")
    async def gated(x: Any) -> Any:
        await gate.recv()
        return x

    return srv, gate


async def _link_of(srv: Server) -> StreamLink:
    deadline = gosim.now() + BOUND
    while not srv._stream_links:
        assert gosim.now() < deadline, "the server never took the connection"
        await gosim.sleep(0.001)
    (sc,) = srv._stream_links
    return sc.link


async def _until(check: Any, what: str) -> None:
    """Poll ``check()`` until true: the server's state, not the clock, decides."""
    deadline = gosim.now() + BOUND
    while not check():
        assert gosim.now() < deadline, f"never: {what}"
        await gosim.sleep(0.001)


class _Replies:
    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.unpacker = msgpack.Unpacker()
        self.got: list[Any] = []

    async def take(self, n: int) -> list[Any]:
        """The next ``n`` replies; a reply missing fails the test (a read deadline)."""
        self.conn.set_read_deadline(gosim.now() + BOUND)
        while len(self.got) < n:
            data = await self.conn.read(65536)
            assert data, f"the server closed the stream after {self.got}"
            self.unpacker.feed(data)
            self.got.extend(self.unpacker)
        out, self.got = self.got[:n], self.got[n:]
        return out


def test_the_c_loop_serves_a_plain_connection_in_the_steady_state() -> None:
    async def main() -> tuple[int, int, int, int]:
        srv, _ = _server()
        ln = net.listen("tcp", "127.0.0.1:0")
        go(srv.serve_stream, ln)
        conn = await net.dial("tcp", ln.addr())
        replies = _Replies(conn)
        for i in range(200):  # one call at a time: one whole message a receive
            await conn.write(_call(i, "echo", i))
            assert await replies.take(1) == [[1, i, None, i]]
        link = await _link_of(srv)
        counts = (link.messages_read, link.exchanged, link.messages_written)
        conn.close()
        await srv.shutdown(grace=1.0)
        ln.close()
        return (*counts, len(srv._stream_links))

    read, exchanged, written, left = gosim.run(main)
    assert read == written == 200
    assert exchanged == (200 if C_LOOP else 0)
    assert left == 0


def test_a_message_trickled_byte_by_byte_is_answered_and_the_c_loop_takes_over_again() -> None:
    first, second = _call(1, "echo", "trickled"), _call(2, "echo", "whole")

    async def main() -> tuple[list[Any], int, int]:
        srv, _ = _server()
        ln = net.listen("tcp", "127.0.0.1:0")
        go(srv.serve_stream, ln)
        conn = await net.dial("tcp", ln.addr())
        replies = _Replies(conn)
        await conn.write(first[:1])
        link = await _link_of(srv)
        for i in range(1, len(first)):
            # Each byte its own receive: wait until the server holds the bytes so far.
            await _until(lambda i=i: link.cutter.buffered == i, f"{i} bytes buffered")
            await conn.write(first[i : i + 1])
        got = await replies.take(1)
        trickled = link.exchanged
        await conn.write(second)
        got += await replies.take(1)
        after = link.exchanged - trickled
        conn.close()
        await srv.shutdown(grace=1.0)
        ln.close()
        return got, trickled, after

    got, trickled, after = gosim.run(main)
    assert got == [[1, 1, None, "trickled"], [1, 2, None, "whole"]]
    # The split message is the Python reader's (its read deadline is kept there); the
    # next whole one is the C loop's again.
    assert trickled == 0
    assert after == (1 if C_LOOP else 0)


def test_pipelined_calls_split_across_receives_are_answered_in_order() -> None:
    wire = b"".join(_call(i, "echo", "x" * (i % 7)) for i in range(40))
    cut = len(wire) // 2 + 3  # inside a message

    async def main() -> tuple[list[Any], int, int]:
        srv, _ = _server()
        ln = net.listen("tcp", "127.0.0.1:0")
        go(srv.serve_stream, ln)
        conn = await net.dial("tcp", ln.addr())
        replies = _Replies(conn)
        await conn.write(wire[:cut])
        link = await _link_of(srv)
        await _until(lambda: link.cutter.buffered > 0, "the cut message begun")
        first = link.messages_read
        await conn.write(wire[cut:])
        got = await replies.take(40)
        # A further burst after the split: whole messages, the C loop's again.
        before = link.exchanged
        await conn.write(b"".join(_call(100 + i, "echo", i) for i in range(5)))
        got += await replies.take(5)
        again = link.exchanged - before
        conn.close()
        await srv.shutdown(grace=1.0)
        ln.close()
        return got, first, again

    got, first, again = gosim.run(main)
    assert [r[1] for r in got] == [*range(40), *range(100, 105)]
    assert all(r[0] == 1 and r[2] is None for r in got)
    assert 0 < first < 40
    assert again == (5 if C_LOOP else 0)


def test_an_async_call_between_plain_ones_keeps_the_reply_order() -> None:
    # One receive: echo 1, gate 2 (waits for the test), echo 3, aecho 4, echo 5. The
    # replies before an awaitable leave before it is awaited; the plain calls after it
    # are answered while it waits; its reply comes when it ends.
    wire = (
        _call(1, "echo", 1)
        + _call(2, "gate", 2)
        + _call(3, "echo", 3)
        + _call(4, "aecho", 4)
        + _call(5, "echo", 5)
    )

    async def main() -> tuple[list[Any], list[Any], int, int]:
        srv, gate = _server()
        ln = net.listen("tcp", "127.0.0.1:0")
        go(srv.serve_stream, ln)
        conn = await net.dial("tcp", ln.addr())
        replies = _Replies(conn)
        await conn.write(wire)
        early = await replies.take(4)  # the gated call still waits
        await gate.send(None)
        late = await replies.take(1)
        link = await _link_of(srv)
        counts = link.messages_read, link.exchanged
        conn.close()
        await srv.shutdown(grace=1.0)
        ln.close()
        return early, late, *counts

    early, late, read, exchanged = gosim.run(main)
    # echo 1's reply left before gate 2 was awaited, echo 3's before aecho 4 was.
    assert early[:2] == [[1, 1, None, 1], [1, 3, None, 3]]
    assert sorted(r[1] for r in early[2:]) == [4, 5]
    assert late == [[1, 2, None, 2]]
    assert read == 5
    # The C loop called on_message for all five (the awaitables were handed back).
    assert exchanged == (5 if C_LOOP else 0)


def _flood(addr: str, wire: bytes, out: dict[str, Any], stop: threading.Event) -> None:
    """Send ``wire`` on a socket with a small receive buffer, reading nothing until
    ``stop``; then read every reply. Bounded in time: it never blocks in a call."""
    host, port = addr.rsplit(":", 1)
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.settimeout(BOUND)
    s.connect((host, int(port)))
    s.setblocking(False)
    sent, data, end = 0, memoryview(wire), time.monotonic() + 3 * BOUND
    try:
        while not stop.is_set() and time.monotonic() < end:
            try:
                sent += s.send(data[sent : sent + 65536]) if sent < len(data) else 0
            except BlockingIOError:
                pass
            out["sent"] = sent
            stop.wait(0.01)
        # Now read every reply, sending the rest of the calls as the server takes them.
        unpacker = msgpack.Unpacker(max_bin_len=1 << 20)
        replies: list[Any] = []
        while len(replies) < out["calls"] and time.monotonic() < end:
            writable = [s] if sent < len(data) else []
            readable, writable, _ = select.select([s], writable, [], 0.1)
            if writable:
                try:
                    sent += s.send(data[sent : sent + 65536])
                except BlockingIOError:
                    pass
            if readable:
                chunk = s.recv(1 << 16)
                if not chunk:
                    break
                unpacker.feed(chunk)
                replies.extend(unpacker)
        out["replies"] = replies
    finally:
        s.close()


def test_a_peer_that_does_not_read_is_held_at_the_owed_bound_then_answered_in_order() -> None:
    calls, blob, max_owed = 128, b"b" * 65536, 65536
    wire = b"".join(_call(i, "echo", blob) for i in range(calls))
    out: dict[str, Any] = {"calls": calls}
    stop = threading.Event()

    async def main() -> tuple[int, int, int]:
        srv, _ = _server(max_owed_bytes=max_owed, write_timeout=None)
        ln = net.listen("tcp", "127.0.0.1:0")
        go(srv.serve_stream, ln)
        peer = threading.Thread(target=_flood, args=(ln.addr(), wire, out, stop))
        peer.start()
        link = await _link_of(srv)
        # The server stops taking calls once it owes the peer max_owed bytes: it holds
        # the rest in the sockets until the peer reads.
        await _until(lambda: link.owed > max_owed, "the owed bound reached")
        read = link.messages_read
        owed = link.owed
        stop.set()
        await gosim.syscall(peer.join, 3 * BOUND)
        await srv.shutdown(grace=1.0)
        ln.close()
        return read, owed, link.messages_read

    read, owed, total = gosim.run(main)
    reply_size = len(msgpack.packb([1, 0, None, blob]))
    assert read < calls
    assert owed <= max_owed + reply_size  # one reply over it at most (its check is before)
    assert [r[1] for r in out["replies"]] == list(range(calls))
    assert all(r[3] == blob for r in out["replies"])
    assert total == calls


def test_a_malformed_message_after_good_ones_ends_the_link_after_their_replies() -> None:
    wire = _call(1, "echo", 1) + _call(2, "echo", 2) + b"\xc1" + _call(3, "echo", 3)

    async def main() -> tuple[list[Any], bytes, str, int, int]:
        srv, _ = _server()
        ln = net.listen("tcp", "127.0.0.1:0")
        go(srv.serve_stream, ln)
        conn = await net.dial("tcp", ln.addr())
        replies = _Replies(conn)
        await conn.write(_call(0, "echo", 0))
        got = await replies.take(1)
        link = await _link_of(srv)
        await conn.write(wire)
        got += await replies.take(2)
        conn.set_read_deadline(gosim.now() + BOUND)
        rest = await conn.read(65536)  # then the end of the stream
        await _until(lambda: link.closed, "the link ended")
        conn.close()
        await srv.shutdown(grace=1.0)
        ln.close()
        return got, rest, link.reason, link.messages_read, link.exchanged

    got, rest, reason, read, exchanged = gosim.run(main)
    assert [r[1] for r in got] == [0, 1, 2]
    assert rest == b""
    assert reason.startswith("protocol error from the peer: undecodable msgpack: byte 0xc1")
    assert read == 3
    assert exchanged == (3 if C_LOOP else 0)


def test_a_peer_that_shuts_its_write_side_after_its_calls_gets_every_reply() -> None:
    async def main() -> tuple[list[Any], bytes]:
        srv, gate = _server()
        ln = net.listen("tcp", "127.0.0.1:0")
        go(srv.serve_stream, ln)
        conn = await net.dial("tcp", ln.addr())
        replies = _Replies(conn)
        await conn.write(_call(1, "echo", 1) + _call(2, "gate", 2) + _call(3, "echo", 3))
        conn.close_write()
        got = await replies.take(2)
        await gate.send(None)
        got += await replies.take(1)
        conn.set_read_deadline(gosim.now() + BOUND)
        rest = await conn.read(65536)
        conn.close()
        await srv.shutdown(grace=1.0)
        ln.close()
        return got, rest

    got, rest = gosim.run(main)
    assert [r[1] for r in got] == [1, 3, 2]
    assert rest == b""


def test_with_an_idle_timeout_the_python_reader_serves() -> None:
    # The idle deadline is renewed before every receive, which the C loop does not do.
    async def main() -> tuple[int, int]:
        srv, _ = _server(idle_timeout=30.0)
        ln = net.listen("tcp", "127.0.0.1:0")
        go(srv.serve_stream, ln)
        conn = await net.dial("tcp", ln.addr())
        replies = _Replies(conn)
        for i in range(5):
            await conn.write(_call(i, "echo", i))
            assert await replies.take(1) == [[1, i, None, i]]
        link = await _link_of(srv)
        counts = link.messages_read, link.exchanged
        conn.close()
        await srv.shutdown(grace=1.0)
        ln.close()
        return counts

    assert gosim.run(main) == (5, 0)


# ------------------------------------------- the C loop against the Python reader

KINDS = hs.sampled_from(["sync", "async", "note", "bad", "big"])


def _message(kind: str, msgid: int) -> bytes:
    shape: list[Any] = {
        "sync": [0, msgid, "echo", [msgid]],
        "async": [0, msgid, "aecho", [msgid]],
        "note": [2, "echo", [msgid]],
        "bad": [0, msgid, 7, []],
        "big": [0, msgid, "echo", ["q" * 3000]],  # over the small owed bound below
    }[kind]
    return bytes(msgpack.packb(shape))


def _serve_stream(chunks: list[bytes], answers: int, tail: bytes) -> tuple[Any, ...]:
    """The chunks sent one by one, then ``tail`` (the end of the stream, or a byte
    that is not msgpack first); the replies read until ``answers`` and the end."""

    async def main() -> tuple[Any, ...]:
        srv, _ = _server(max_owed_bytes=4096)
        ln = net.listen("tcp", "127.0.0.1:0")
        go(srv.serve_stream, ln)
        conn = await net.dial("tcp", ln.addr())
        replies = _Replies(conn)
        for chunk in chunks:
            await conn.write(chunk)
            await gosim.sleep(0)  # the server may take this chunk as a receive of its own
        link = await _link_of(srv)
        got = await replies.take(answers)
        if tail:
            await conn.write(tail)
        else:
            conn.close_write()
        conn.set_read_deadline(gosim.now() + BOUND)
        rest = await conn.read(65536)
        await _until(lambda: link.closed, "the link ended")
        conn.close()
        await srv.shutdown(grace=1.0)
        ln.close()
        return got, rest, link.reason, link.messages_read, link.messages_written

    return gosim.run(main)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hs.lists(KINDS, min_size=1, max_size=25), hs.data(), hs.booleans())
def test_the_c_loop_answers_any_stream_as_the_python_reader(
    kinds: list[str], data: hs.DataObject, malformed: bool
) -> None:
    wire = b"".join(_message(kind, i) for i, kind in enumerate(kinds))
    cuts = sorted(data.draw(hs.sets(hs.integers(1, max(1, len(wire) - 1))), label="cuts"))
    chunks = [wire[a:b] for a, b in zip([0, *cuts], [*cuts, len(wire)], strict=True) if a < b]
    answers = sum(kind != "note" for kind in kinds)
    tail = b"\xc1" if malformed else b""
    outcomes = [_serve_stream(chunks, answers, tail)]
    if C_LOOP:
        saved = stream_module.__dict__["message_exchange"]
        stream_module.__dict__["message_exchange"] = lambda *a: None  # the Python reader alone
        try:
            outcomes.append(_serve_stream(chunks, answers, tail))
        finally:
            stream_module.__dict__["message_exchange"] = saved
    for got, rest, reason, read, written in outcomes:
        assert sorted(int(r[1]) for r in got) == [i for i, k in enumerate(kinds) if k != "note"]
        plain = [int(r[1]) for r in got if kinds[int(r[1])] != "async"]
        assert plain == sorted(plain)  # the reader's own replies keep the request order
        assert rest == b""
        assert read == len(kinds)
        assert written == answers
        if malformed:
            assert reason.startswith("protocol error from the peer: undecodable msgpack")
        else:
            assert reason == "peer closed the connection"
    # Byte for byte the same replies, whichever reader served.
    assert all(sorted(map(repr, o[0])) == sorted(map(repr, outcomes[0][0])) for o in outcomes)
