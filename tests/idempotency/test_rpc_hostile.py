"""idempotency.rpc's server against hostile and unusual peers (issue 28).

The server runs in a process of its own (rpc_server_proc.py), where its memory and its
connections are what is attacked; the peers are plain blocking sockets speaking the
bytes by hand. Every wait is bounded, so a regression fails instead of hanging.
"""

from __future__ import annotations

import json
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest

SERVER_PROC = Path(__file__).with_name("rpc_server_proc.py")
BOUND = 10.0  # seconds any single wait in these tests may take before it is a failure


class ServerProcess:
    """rpc_server_proc.py in a process of its own."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(SERVER_PROC), json.dumps(config)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            line = self._line(3 * BOUND)
            if not line.startswith("PORT "):
                self.proc.wait(BOUND)  # it ended: its stderr says why
                raise AssertionError(line + self._stderr())
        except BaseException:
            self.close()  # no process or pipe left behind for later tests to trip on
            raise
        self.port = int(line.split()[1])

    def _line(self, bound: float = BOUND) -> str:
        result: list[str] = []
        t = threading.Thread(target=lambda: result.append(self.proc.stdout.readline()))  # type: ignore[union-attr]
        t.start()
        t.join(bound)
        assert result, "the server process said nothing" + self._stderr()
        return result[0]

    def _stderr(self) -> str:
        if self.proc.poll() is None:
            return ""
        assert self.proc.stderr is not None
        return "\n" + self.proc.stderr.read()[-3000:]

    def stats(self) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write("stats\n")
        self.proc.stdin.flush()
        line = self._line()
        assert line, "the server process ended" + self._stderr()
        stats: dict[str, Any] = json.loads(line)
        return stats

    def rss(self) -> int:
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        raise AssertionError("no VmRSS")

    def close(self) -> None:
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            try:
                self.proc.stdin.close()
            except BrokenPipeError:
                pass
        try:
            self.proc.wait(BOUND)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(BOUND)
        for f in (self.proc.stdout, self.proc.stderr):
            if f is not None:
                f.close()


def server(**config: Any) -> Iterator[ServerProcess]:
    proc = ServerProcess(config)
    try:
        yield proc
    finally:
        proc.close()


def connect(port: int, rcvbuf: int | None = None) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf is not None:  # before connecting, so the window is small from the start
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.settimeout(BOUND)
    sock.connect(("127.0.0.1", port))
    return sock


def request(msgid: int, method: str, *params: Any) -> bytes:
    return msgpack.packb([0, msgid, method, list(params)], use_bin_type=True)


def framed(payload: bytes) -> bytes:
    """One session DATA frame: 4-byte big-endian length, kind byte 0, the payload."""
    return struct.pack(">I", len(payload) + 1) + b"\x00" + payload


def read_stream_until_end(sock: socket.socket) -> list[Any]:
    """Every message of a plain msgpack stream until the server closes it."""
    unpacker = msgpack.Unpacker(raw=False)
    out: list[Any] = []
    while True:
        chunk = sock.recv(1 << 16)
        if not chunk:
            return out
        unpacker.feed(chunk)
        out.extend(unpacker)


def read_frames_until_end(sock: socket.socket) -> list[tuple[int, bytes]]:
    """Every session frame (kind, body) until the server closes the connection."""
    buf = b""
    while True:
        chunk = sock.recv(1 << 16)
        if not chunk:
            break
        buf += chunk
    frames = []
    while len(buf) >= 4:
        (n,) = struct.unpack(">I", buf[:4])
        body = buf[4 : 4 + n]
        frames.append((body[0], body[1:]))
        buf = buf[4 + n :]
    return frames


def closed_within(sock: socket.socket, bound: float) -> float | None:
    """Seconds until the server ended the connection (reading and dropping what it
    sends), or None when it still held it after ``bound``."""
    start = time.monotonic()
    sock.settimeout(0.2)
    while time.monotonic() - start < bound:
        try:
            if not sock.recv(1 << 16):
                return time.monotonic() - start
        except TimeoutError:
            continue
        except ConnectionResetError:
            return time.monotonic() - start
    return None


# ------------------------------------------------------------- half-close (item 9)


@pytest.fixture
def stream_server() -> Iterator[ServerProcess]:
    yield from server(transport="stream")


def test_stream_peer_that_shuts_its_write_side_gets_every_reply(
    stream_server: ServerProcess,
) -> None:
    # nc -N: send the calls, shut the write side, read until the server closes. An
    # immediate call, a waiting one and a pipelined burst are all answered.
    with connect(stream_server.port) as sock:
        calls = [request(1, "add", 1, 2), request(2, "slow", 0.3, "late")]
        calls += [request(10 + i, "echo", i) for i in range(50)]
        sock.sendall(b"".join(calls))
        sock.shutdown(socket.SHUT_WR)
        replies = read_stream_until_end(sock)
    by_id = {r[1]: r for r in replies}
    assert sorted(by_id) == [1, 2, *range(10, 60)]
    assert by_id[1] == [1, 1, None, 3]
    assert by_id[2] == [1, 2, None, "late"]
    assert all(by_id[10 + i][3] == i for i in range(50))


# ------------------------------------------------- no new work after GOAWAY (item 12)


def _read_frame(sock: socket.socket) -> tuple[int, bytes] | None:
    head = b""
    while len(head) < 4:
        chunk = sock.recv(4 - len(head))
        if not chunk:
            return None
        head += chunk
    (n,) = struct.unpack(">I", head)
    body = b""
    while len(body) < n:
        chunk = sock.recv(n - len(body))
        assert chunk, "end of stream inside a frame"
        body += chunk
    return body[0], body[1:]


def test_framed_server_refuses_a_request_sent_after_its_goaway() -> None:
    # The server starts shutting down while a call runs: it sends GOAWAY(NO_ERROR). A
    # peer that ignores the GOAWAY and sends a new call gets UNAVAILABLE (the method
    # never runs), and the call it started first still gets its reply.
    for proc in server(transport="framed", shutdown_after=0.2, heartbeat_interval=None):
        with connect(proc.port) as sock:
            sock.sendall(framed(request(1, "slow", 1.0, "first")))
            while True:
                got = _read_frame(sock)
                assert got is not None, "closed before any GOAWAY"
                if got[0] == 3:  # GOAWAY
                    assert struct.unpack(">I", got[1][:4])[0] == 0  # NO_ERROR
                    break
            sock.sendall(framed(request(2, "add", 1, 2)))
            replies = {}
            while len(replies) < 2:
                got = _read_frame(sock)
                assert got is not None, f"closed with replies {replies}"
                if got[0] == 0:
                    msg = msgpack.unpackb(got[1], raw=False)
                    replies[msg[1]] = msg
        assert replies[1][2] is None and replies[1][3] == "first"
        error = replies[2][2]
        assert replies[2][3] is None and error is not None, replies[2]
        assert error[0] == 14, error  # UNAVAILABLE


# ------------------------------------------------------- slowloris (item 10)


@pytest.mark.parametrize("transport", ["stream", "framed"])
def test_a_call_trickled_a_byte_at_a_time_is_closed_at_its_read_deadline(transport: str) -> None:
    # One byte every 0.25 s renews the idle timeout forever; the message must arrive
    # whole within read_timeout of its first byte (1 s here), so the connection ends
    # well within 8 s. The old server held it as long as the peer kept trickling.
    body = request(1, "echo", "x" * 100)
    wire = body if transport == "stream" else framed(body)
    for proc in server(
        transport=transport, read_timeout=1.0, idle_timeout=60.0, heartbeat_interval=None
    ):
        with connect(proc.port) as sock:
            start = time.monotonic()
            sock.settimeout(0.25)
            ended = None
            for i in range(len(wire)):
                if time.monotonic() - start > 8.0:
                    break
                try:
                    sock.sendall(wire[i : i + 1])
                    while True:  # drop what the server says (a GOAWAY), until the end
                        got = sock.recv(1 << 16)
                        if not got:
                            ended = time.monotonic() - start
                            break
                except TimeoutError:
                    continue
                except OSError:
                    ended = time.monotonic() - start
                if ended is not None:
                    break
        assert ended is not None, "the server held a trickling peer past 8 s"
        assert ended >= 0.9
        # The server still serves.
        with connect(proc.port) as sock:
            call = request(2, "add", 2, 3)
            sock.sendall(call if transport == "stream" else framed(call))
            if transport == "stream":
                reply = msgpack.Unpacker(raw=False)
                while True:
                    reply.feed(sock.recv(1 << 16))
                    got_reply = next(iter(reply), None)
                    if got_reply is not None:
                        break
            else:
                while True:
                    frame_got = _read_frame(sock)
                    assert frame_got is not None
                    if frame_got[0] == 0:
                        got_reply = msgpack.unpackb(frame_got[1], raw=False)
                        break
            assert got_reply == [1, 2, None, 5]


# ------------------------------------------------- owed replies in bytes (item 8)

BIG = 512 * 1024
CALLS = 400  # 200 MiB of echo calls: the old server held most of it as replies


def _attack(
    port: int,
    transport: str,
    method: str,
    stalled: threading.Event,
    stop: threading.Event,
    sent: list[int],
    dropped: threading.Event,
) -> None:
    """Send big echo calls and never read. Once the server stops reading (no send
    progress for 2 s) or CALLS calls are sent, say so (``stalled``) and hold the
    connection, reading nothing, until told to stop or the server closes it. A send
    that fails says the server closed the connection (``dropped``): on a loaded machine
    its write deadline can come before this side's 2 s stall is measured."""
    with connect(port, rcvbuf=4096) as sock:
        sock.settimeout(0.25)
        stalled_since: float | None = None
        try:
            for i in range(CALLS):
                args = (b"z" * BIG,) if method == "echo" else (0.0, b"z" * BIG)
                body = request(i, method, *args)
                wire = memoryview(body if transport == "stream" else framed(body))
                while wire and not stop.is_set():
                    try:
                        n = sock.send(wire)
                    except TimeoutError:
                        now = time.monotonic()
                        stalled_since = stalled_since or now
                        if now - stalled_since > 2.0:
                            break
                        continue
                    stalled_since = None
                    sent[0] += n
                    wire = wire[n:]
                if wire or stop.is_set():
                    break
        except OSError:
            dropped.set()
            return  # the server closed the connection
        finally:
            stalled.set()
        stop.wait(HOLD)


HOLD = 3 * BOUND


def _call_once(port: int, transport: str) -> Any:
    with connect(port) as sock:
        call = request(7, "add", 20, 22)
        sock.sendall(call if transport == "stream" else framed(call))
        if transport == "stream":
            unpacker = msgpack.Unpacker(raw=False)
            while True:
                chunk = sock.recv(1 << 16)
                assert chunk, "closed without an answer"
                unpacker.feed(chunk)
                for msg in unpacker:
                    return msg
        while True:
            got = _read_frame(sock)
            assert got is not None, "closed without an answer"
            if got[0] == 0:
                return msgpack.unpackb(got[1], raw=False)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the RSS from /proc")
@pytest.mark.parametrize("transport", ["stream", "framed"])
@pytest.mark.parametrize("method", ["echo", "slow"])  # replied at once, or by a goroutine
def test_a_peer_that_never_reads_holds_a_bounded_amount_of_reply_memory(
    transport: str, method: str
) -> None:
    # 400 echo calls of 512 KiB from a peer that never reads: the server owed it up to
    # 1024 replies whatever their size (330 MiB of RSS on the stream, 201 MiB framed).
    # Now it stops reading that peer once it owes it max_owed_bytes (default 4 MiB),
    # so its RSS grows by a few times that at most (the bound below leaves room for a
    # loaded machine's allocator, far under what the old server reached); a
    # well-behaved client is served meanwhile; and the attacker, which takes none of
    # its replies, is dropped at its write deadline.
    limits = {"max_bin_len": 1 << 20, "max_message_size": 2 << 20}
    for proc in server(
        transport=transport, limits=limits, write_timeout=2.0, heartbeat_interval=None
    ):
        assert _call_once(proc.port, transport) == [1, 7, None, 42]  # warm
        base = proc.rss()
        stop, stalled, dropped = threading.Event(), threading.Event(), threading.Event()
        sent = [0]
        attacker = threading.Thread(
            target=_attack, args=(proc.port, transport, method, stalled, stop, sent, dropped)
        )
        attacker.start()
        peak = base
        try:
            deadline = time.monotonic() + 3 * BOUND
            while not stalled.is_set() and time.monotonic() < deadline:
                peak = max(peak, proc.rss())
                time.sleep(0.1)
            peak = max(peak, proc.rss())
            assert _call_once(proc.port, transport) == [1, 7, None, 42]
            grown = peak - base
            assert grown < 64 * 1024 * 1024, (
                f"RSS grew {grown >> 20} MiB ({sent[0] >> 20} MiB sent)"
            )
            assert sent[0] < CALLS * BIG // 2, "the server read nearly everything sent"
            # Dropped at its write deadline (2 s here, closed within 5 s) while it holds on.
            end = time.monotonic() + BOUND
            while time.monotonic() < end:
                stats = proc.stats()
                if transport == "framed":
                    if stats["framed"]["write_timeouts"] >= 1:
                        break
                elif stats["stream_connections"] == 0:
                    break
                time.sleep(0.2)
            else:
                raise AssertionError(f"the attacker was not dropped: {stats}")
            # Still holding on, or closed by the server mid-send: either way the drop
            # is the server's doing, not the attacker leaving.
            assert attacker.is_alive() or dropped.is_set(), "the attacker left by itself"
        finally:
            stop.set()
            attacker.join(BOUND)


# ------------------------------------- a str header over its limit (item 11)


def test_stream_server_drops_a_str_header_over_its_limit_at_once(
    stream_server: ServerProcess,
) -> None:
    # A request whose one param announces a 2 MiB str (max_str_len is 1 MiB): the
    # header alone loses the stream, at once. The old server waited for
    # max_message_size (16 MiB) to arrive, or for as long as the peer held on.
    head = b"\x94\x00\x01\xa4echo\x91" + b"\xdb" + (2 << 20).to_bytes(4, "big")
    with connect(stream_server.port) as sock:
        sock.sendall(head + b"x" * 100)
        assert closed_within(sock, 5.0) is not None, "the header did not end the stream"
    # The server still serves.
    with connect(stream_server.port) as sock:
        sock.sendall(request(2, "add", 2, 3))
        unpacker = msgpack.Unpacker(raw=False)
        while True:
            chunk = sock.recv(1 << 16)
            assert chunk
            unpacker.feed(chunk)
            got = next(iter(unpacker), None)
            if got is not None:
                break
        assert got == [1, 2, None, 5]


def test_a_call_that_ends_after_its_peer_left_leaves_the_stream_server_serving(
    stream_server: ServerProcess,
) -> None:
    # The call's link has ended (its writer gone) by the time the call finishes and
    # gives back what it held against max_owed_bytes.
    with connect(stream_server.port) as sock:
        sock.sendall(request(1, "slow", 0.5, "orphan"))
        time.sleep(0.1)
        # A reset, not an end of stream (which the server would answer first).
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    time.sleep(1.0)
    with connect(stream_server.port) as sock:
        sock.sendall(request(2, "add", 2, 3))
        sock.shutdown(socket.SHUT_WR)
        assert read_stream_until_end(sock) == [[1, 2, None, 5]]
