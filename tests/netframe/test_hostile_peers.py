"""netframe's Server and Client against hostile and unlucky peers (issue 11).

The attackers are what a real one would be: plain blocking sockets on OS threads of
their own (or the server in a process of its own, server_proc.py, where its
descriptor limit or its memory is what is attacked). Every wait is bounded, so a
regression fails instead of hanging.
"""

from __future__ import annotations

import errno
import json
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import gosim
import netframe
from gosim import Chan, go, net, recv, select
from netframe import _server

SERVER_PROC = Path(__file__).with_name("server_proc.py")
BOUND = 10.0  # seconds any single wait in these tests may take before it is a failure
HOLD = 3 * BOUND  # how long a peer holds out at most: longer than any wait on it


# ----------------------------------------------------------------- plain-socket peers


def frame(payload: bytes) -> bytes:
    """One frame in the default format: 4-byte big-endian length, then the payload."""
    return struct.pack(">I", len(payload)) + payload


def data(payload: bytes) -> bytes:
    """A session DATA frame (kind byte 0)."""
    return frame(b"\x00" + payload)


def goaway_frame(code: int, reason: bytes) -> bytes:
    return frame(b"\x03" + struct.pack(">I", code) + reason)


def read_frame(sock: socket.socket) -> bytes | None:
    """The next frame's payload from a blocking socket; None at a clean end of stream."""
    head = _read_exactly(sock, 4)
    if head is None:
        return None
    (n,) = struct.unpack(">I", head)
    body = _read_exactly(sock, n)
    assert body is not None, "end of stream inside a frame"
    return body


def _read_exactly(sock: socket.socket, n: int) -> bytes | None:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            assert not buf, "end of stream inside a frame"
            return None
        buf += chunk
    return buf


def connect(port: int, rcvbuf: int | None = None) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf is not None:  # before connecting, so the window is small from the start
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.settimeout(BOUND)
    sock.connect(("127.0.0.1", port))
    return sock


def reset(sock: socket.socket) -> None:
    """Close with SO_LINGER 0: the peer gets a reset, not an end of stream."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def send_until_blocked(sock: socket.socket, chunk: bytes, seconds: float = 2.0) -> int:
    """Send ``chunk`` again and again until the peer's window and our buffer are full
    (a send times out) or ``seconds`` pass; how many bytes went out."""
    sock.settimeout(0.2)
    sent = 0
    end = time.monotonic() + seconds
    try:
        while time.monotonic() < end:
            sent += sock.send(chunk)
    except (TimeoutError, BlockingIOError):
        pass
    finally:
        sock.settimeout(BOUND)
    return sent


class Peer(threading.Thread):
    """A plain-socket peer on an OS thread: runs ``script(port, release)`` and keeps its
    result (or exception); ``release`` is set by the test when the peer may finish."""

    def __init__(self, script: Callable[[int, threading.Event], Any], port: int) -> None:
        super().__init__(daemon=True)
        self.script = script
        self.port = port
        self.release = threading.Event()
        self.result: Any = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.result = self.script(self.port, self.release)
        except BaseException as exc:
            self.error = exc

    async def finish(self) -> Any:
        """Let the peer finish and wait for it without blocking the runtime: a peer may
        be waiting on the server for a reply (joining here would stop the server)."""
        self.release.set()
        await wait_until(lambda: not self.is_alive())
        self.join(0.1)
        assert not self.is_alive(), "the peer thread did not finish"
        if self.error is not None:
            raise self.error
        return self.result


def port_of(ln: Any) -> int:
    return int(ln.addr().rsplit(":", 1)[1])


async def wait_until(cond: Callable[[], bool], bound: float = BOUND) -> bool:
    """Poll ``cond`` every 10 ms for at most ``bound`` seconds; its last value."""
    end = gosim.now() + bound
    while not cond():
        if gosim.now() >= end:
            return False
        await gosim.sleep(0.01)
    return True


async def within(bound: float, fn: Callable[..., Any], *args: Any) -> tuple[bool, Any]:
    """Run ``fn(*args)`` in a goroutine; (True, its result or the exception it raised)
    if it ended within ``bound`` seconds, (False, None) if not (it is left running).
    Callers check which: an exception is not a success."""
    done: Chan[Any] = Chan(1)

    async def run() -> None:
        try:
            result = await fn(*args)
        except Exception as exc:
            result = exc
        await done.send(result)

    go(run)
    i, value, _ = await select(recv(done), recv(gosim.after(bound)))
    return (True, value) if i == 0 else (False, None)


def big_reply(payload: bytes) -> bytes:
    return b"r" * (256 * 1024)


# ------------------------------------------- 1. heartbeat and closes behind a full queue


def test_a_peer_that_neither_sends_nor_reads_is_found_dead_with_a_full_send_queue() -> None:
    # The peer asks for large replies, never reads them and never sends again: the
    # replies fill the socket buffers, then the send queue. The heartbeat's ping must
    # not wait behind them: the peer is dead at the heartbeat timeout, its connection
    # and goroutines released.
    def script(port: int, release: threading.Event) -> None:
        sock = connect(port, rcvbuf=4096)
        sock.sendall(b"".join(data(b"%d" % i) for i in range(40)))
        release.wait(HOLD)
        sock.close()

    async def main() -> tuple[bool, int, int, int]:
        base = gosim.num_goroutine()
        ln = net.listen("tcp", "127.0.0.1:0")
        server = netframe.Server(
            big_reply, heartbeat_interval=0.2, heartbeat_timeout=0.5, send_queue=4
        )
        go(server.serve, ln)
        peer = Peer(script, port_of(ln))
        peer.start()
        await wait_until(lambda: server.statistics().accepted == 1)
        gone = await wait_until(
            lambda: server.statistics().dead_peers == 1 and server.statistics().connections == 0
        )
        await gosim.sleep(0.1)  # the handlers blocked on the queue wind up
        left = gosim.num_goroutine() - base
        await peer.finish()
        stats = server.statistics()
        await server.shutdown(grace=0.1)
        return gone, stats.dead_peers, stats.connections, left

    gone, dead, connections, left = gosim.run(main, procs=2)
    assert (gone, dead, connections) == (True, 1, 0)
    assert left <= 1  # the accept loop; nothing of the dead connection


def test_a_protocol_error_closes_even_with_the_send_queue_full() -> None:
    # Replies fill the queue; then the peer breaks the protocol. The goaway cannot
    # wait behind the queue (the peer reads nothing): the connection still closes.
    def script(port: int, release: threading.Event) -> None:
        sock = connect(port, rcvbuf=4096)
        sock.sendall(b"".join(data(b"%d" % i) for i in range(20)))
        time.sleep(0.3)  # the replies are queued by now
        sock.sendall(frame(b"\x09bad kind"))
        release.wait(HOLD)
        sock.close()

    async def main() -> tuple[bool, netframe.ServerStatistics]:
        ln = net.listen("tcp", "127.0.0.1:0")
        server = netframe.Server(big_reply, heartbeat_interval=None, send_queue=4)
        go(server.serve, ln)
        peer = Peer(script, port_of(ln))
        peer.start()
        await wait_until(lambda: server.statistics().accepted == 1)
        closed = await wait_until(lambda: server.statistics().connections == 0)
        await peer.finish()
        stats = server.statistics()
        await server.shutdown(grace=0.1)
        return closed, stats

    closed, stats = gosim.run(main, procs=2)
    assert closed
    assert stats.protocol_errors == 1


def _frozen_server(port_box: list[int], ready: threading.Event, release: threading.Event) -> None:
    """Accept one connection, then neither read nor write until released."""
    with socket.create_server(("127.0.0.1", 0)) as ln:
        port_box.append(ln.getsockname()[1])
        ready.set()
        ln.settimeout(BOUND)
        conn, _ = ln.accept()
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        release.wait(HOLD)
        conn.close()


def _start_frozen_server() -> tuple[int, threading.Event, threading.Thread]:
    port_box: list[int] = []
    ready, release = threading.Event(), threading.Event()
    t = threading.Thread(target=_frozen_server, args=(port_box, ready, release), daemon=True)
    t.start()
    assert ready.wait(BOUND)
    return port_box[0], release, t


async def _fill_client_queue(c: netframe.Client) -> bool:
    """Send from a goroutine until the client's send queue is full (it then blocks)."""

    async def flood() -> None:
        try:
            for _ in range(100_000):
                await c.send(b"x" * 1024)
        except netframe.ConnectionLost:
            pass

    go(flood)
    st = c._st
    assert st is not None
    return await wait_until(lambda: st.fc.statistics().send_queue >= 1024)


def test_client_finds_a_frozen_server_dead_with_its_send_queue_full() -> None:
    port, release, t = _start_frozen_server()

    async def main() -> tuple[bool, bool, str, bool, int]:
        c = netframe.Client(
            lambda: net.dial("tcp", f"127.0.0.1:{port}"),
            heartbeat_interval=0.2,
            heartbeat_timeout=0.5,
        )
        await c.connect()
        full = await _fill_client_queue(c)
        reason = ""

        async def lost() -> str:
            try:
                await c.recv()
            except netframe.ConnectionLost as exc:
                return exc.reason
            return "a payload from a frozen server"

        noticed, reason = await within(BOUND, lost)
        closed, error = await within(BOUND, c.close)
        return full, noticed, reason, closed and error is None, c.servers_found_dead

    try:
        full, noticed, reason, closed, found_dead = gosim.run(main, procs=2)
    finally:
        release.set()
        t.join(BOUND)
    assert full and noticed and closed
    assert reason == "server missed its heartbeats"
    assert found_dead == 1


def test_client_close_is_bounded_by_default_against_a_server_that_does_not_read() -> None:
    # No heartbeat to notice the server; the queue is full and nothing drains it:
    # close() gives up writing after DEFAULT_CLOSE_TIMEOUT and closes.
    port, release, t = _start_frozen_server()

    async def main() -> tuple[bool, bool, Any]:
        c = netframe.Client(lambda: net.dial("tcp", f"127.0.0.1:{port}"), heartbeat_interval=None)
        await c.connect()
        full = await _fill_client_queue(c)
        closed, error = await within(BOUND, c.close)
        return full, closed, error

    try:
        assert gosim.run(main, procs=2) == (True, True, None)
    finally:
        release.set()
        t.join(BOUND)


def test_client_send_and_close_take_timeouts() -> None:
    port, release, t = _start_frozen_server()

    async def main() -> tuple[bool, str, bool]:
        c = netframe.Client(lambda: net.dial("tcp", f"127.0.0.1:{port}"), heartbeat_interval=None)
        await c.connect()
        full = await _fill_client_queue(c)
        try:
            await c.send(b"one more", timeout=0.2)
            outcome = "queued"
        except TimeoutError:
            outcome = "timeout"
        closed, error = await within(BOUND, c.close, 0.3)
        return full, outcome, closed and error is None

    try:
        full, outcome, closed = gosim.run(main, procs=2)
    finally:
        release.set()
        t.join(BOUND)
    assert (full, outcome, closed) == (True, "timeout", True)


# ----------------------------------------------- 2. shutdown returns after the grace


@pytest.mark.parametrize(("raw", "max_in_flight"), [(False, 64), (False, 1), (True, 64), (True, 1)])
def test_shutdown_returns_after_the_grace_period_with_a_peer_that_never_reads(
    raw: bool, max_in_flight: int
) -> None:
    def script(port: int, release: threading.Event) -> None:
        sock = connect(port, rcvbuf=4096)
        request = frame(b"give") if raw else data(b"give")
        sock.sendall(request * 40)
        release.wait(HOLD)
        sock.close()

    async def main() -> tuple[bool, int, int]:
        ln = net.listen("tcp", "127.0.0.1:0")
        server = netframe.Server(
            big_reply,
            raw=raw,
            max_in_flight=max_in_flight,
            heartbeat_interval=None,
            send_queue=4,
        )
        go(server.serve, ln)
        peer = Peer(script, port_of(ln))
        peer.start()
        await wait_until(lambda: server.statistics().connections == 1)
        await gosim.sleep(0.5)  # the peer's window is full: writes are stuck
        opened = server.statistics().connections
        returned, error = await within(BOUND, server.shutdown, 0.3)
        assert error is None
        connections = server.statistics().connections
        await peer.finish()
        return returned, opened, connections

    assert gosim.run(main, procs=2) == (True, 1, 0)


# ------------------------------------------------- 3. the limit holds under a burst


def test_the_connection_limit_holds_under_a_burst() -> None:
    # 100 connections wait in the backlog before the accept loop starts: it takes them
    # one after another without a pause, which is when a count made later (in each
    # connection's goroutine) lets them all in.
    sockets: list[socket.socket] = []

    async def main() -> tuple[netframe.ServerStatistics, int]:
        ln = net.listen("tcp", "127.0.0.1:0")
        port = port_of(ln)

        def burst() -> None:
            sockets.extend(connect(port) for _ in range(100))

        await gosim.syscall(burst)
        server = netframe.Server(big_reply, max_connections=20, heartbeat_interval=None)
        peak = 0

        async def watch() -> None:
            nonlocal peak
            while True:
                peak = max(peak, server.statistics().connections)
                await gosim.sleep(0.001)

        go(watch)
        go(server.serve, ln)
        await wait_until(lambda: server.statistics().accepted + server.statistics().rejected >= 100)
        stats = server.statistics()
        await server.shutdown(grace=0.1)
        return stats, peak

    try:
        stats, peak = gosim.run(main, procs=2)
    finally:
        for s in sockets:
            s.close()
    assert (stats.accepted, stats.rejected) == (20, 80)
    assert stats.connections == 20 and peak <= 20


# ------------------------------------------------ 4. out of descriptors: back off


class _ServerProcess:
    """server_proc.py in a process of its own; ``stats()`` asks it for its stats."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(SERVER_PROC), json.dumps(config)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        try:
            line = self._line(3 * BOUND)  # the frame kernel may be compiled first
            if not line.startswith("PORT "):
                self.proc.wait(BOUND)  # it ended: its stderr says why
                raise AssertionError(line + self._stderr())
        except BaseException:
            self.close()  # no process or pipe left behind for later tests to trip on
            raise
        self.port = int(line.split()[1])

    def _line(self, bound: float = BOUND) -> str:
        assert self.proc.stdout is not None
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

    def alive(self) -> bool:
        return self.proc.poll() is None

    def statistics(self) -> dict[str, int]:
        assert self.proc.stdin is not None
        self.proc.stdin.write("stats\n")
        self.proc.stdin.flush()
        line = self._line()
        assert line, "the server process ended" + self._stderr()
        stats: dict[str, int] = json.loads(line)
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


def _echo_once(port: int) -> bytes | None:
    """A session client as a plain socket: one DATA frame, its reply's payload."""
    with connect(port) as sock:
        sock.sendall(data(b"hello"))
        while True:
            payload = read_frame(sock)
            if payload is None or payload[:1] == b"\x00":
                return payload
            # a PING or a GOAWAY: not the reply


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="uses RLIMIT_NOFILE and /proc")
def test_running_out_of_descriptors_does_not_kill_the_server() -> None:
    # Under a descriptor limit of 64 and a connection limit far above it, 150 peers
    # make accept fail with EMFILE. The server must back off and keep going: when the
    # peers leave, a new client is served.
    server = _ServerProcess({"nofile": 64, "max_connections": 1000, "heartbeat_interval": None})
    held: list[socket.socket] = []
    try:
        assert _echo_once(server.port) == b"\x00hello"
        held.extend(connect(server.port) for _ in range(150))
        time.sleep(0.5)  # the accept loop meets EMFILE meanwhile
        alive_under_attack = server.alive()
        for s in held:
            s.close()
        held.clear()
        time.sleep(0.5)
        served = None
        for _ in range(50):  # the connections in the backlog are drained first
            served = _echo_once(server.port)
            if served is not None:
                break
        assert alive_under_attack and server.alive(), server._stderr()
        stats = server.statistics()
    finally:
        for s in held:
            s.close()
        server.close()
    assert served == b"\x00hello"
    assert stats["accept_errors"] > 0


def test_temporary_accept_errors_back_off_and_reach_the_hook() -> None:
    # A listener whose accept fails with EMFILE four times, then works: the hook sees
    # each error with Go's waits (5 ms doubling), and the server goes on serving.
    seen: list[tuple[int | None, float]] = []

    class Flaky:
        def __init__(self, ln: Any) -> None:
            self.ln = ln
            self.failures = 4

        async def accept(self) -> Any:
            if self.failures:
                self.failures -= 1
                raise OSError(errno.EMFILE, "Too many open files")
            return await self.ln.accept()

        def close(self) -> None:
            self.ln.close()

    async def main() -> tuple[bytes, int]:
        ln = net.listen("tcp", "127.0.0.1:0")
        server = netframe.Server(
            lambda p: p,
            heartbeat_interval=None,
            on_accept_error=lambda exc, delay: seen.append((exc.errno, delay)),
        )
        go(server.serve, Flaky(ln))
        c = netframe.Client(lambda: net.dial("tcp", ln.addr()), heartbeat_interval=None)
        await c.connect()
        await c.send(b"still serving")
        reply = await c.recv()
        await c.close()
        errors = server.statistics().accept_errors
        await server.shutdown(grace=0.1)
        return reply, errors

    assert gosim.run(main) == (b"still serving", 4)
    assert seen == [(errno.EMFILE, d) for d in (0.005, 0.01, 0.02, 0.04)]


def test_default_connection_limit_stays_below_the_descriptor_limit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    resource = pytest.importorskip("resource")
    limits = {1024: 794, 4096: 4096 - 128 - 409, 1 << 20: 10_000, 100: 1}
    for soft, expected in limits.items():
        monkeypatch.setattr(resource, "getrlimit", lambda _which, s=soft: (s, s))
        assert _server.default_max_connections() == expected
    monkeypatch.setattr(resource, "getrlimit", lambda _which: (resource.RLIM_INFINITY,) * 2)
    assert _server.default_max_connections() == 10_000


# ------------------------------------------------------- 5. the refusal's reason


def test_client_keeps_the_goaway_reason_when_a_reset_follows() -> None:
    # A scripted server says GOAWAY(CONNECTION_LIMIT), then resets the connection.
    def serve_once(ln: socket.socket) -> None:
        conn, _ = ln.accept()
        conn.sendall(goaway_frame(3, b"connection limit"))
        time.sleep(0.2)  # the client reads the goaway; then the reset arrives
        reset(conn)

    async def main() -> list[str]:
        reasons = []
        with socket.create_server(("127.0.0.1", 0)) as ln:
            ln.settimeout(BOUND)
            port = ln.getsockname()[1]
            for _ in range(5):
                t = threading.Thread(target=serve_once, args=(ln,), daemon=True)
                t.start()
                c = netframe.Client(
                    lambda: net.dial("tcp", f"127.0.0.1:{port}"), heartbeat_interval=None
                )
                await c.connect()
                await c.send(b"request")
                ok, lost = await within(BOUND, c.recv)
                reasons.append(lost.reason if ok else "hung")
                await gosim.syscall(t.join, BOUND)
                try:
                    await c.send(b"after")
                except netframe.ConnectionLost as exc:
                    reasons.append(exc.reason)
                await c.close()
        return reasons

    assert gosim.run(main, procs=2) == ["server sent GOAWAY(3): connection limit"] * 10


def test_a_refused_peer_reads_the_goaway_and_an_end_of_stream_not_a_reset() -> None:
    # The refused peer's request is unread when the server closes: a plain close
    # would reset the connection. The server shuts its write side and reads first.
    def refused(port: int, release: threading.Event) -> list[bytes | str]:
        got: list[bytes | str] = []
        for _ in range(10):
            with connect(port) as sock:
                sock.sendall(data(b"x" * 1000))
                time.sleep(0.05)  # the server has closed by now, the request unread
                try:
                    got.append(read_frame(sock) or b"EOF")
                    got.append(read_frame(sock) or b"EOF")
                except ConnectionResetError:
                    got.append("reset")
        return got

    async def main() -> tuple[list[bytes | str], int]:
        ln = net.listen("tcp", "127.0.0.1:0")
        server = netframe.Server(lambda p: p, max_connections=1, heartbeat_interval=None)
        go(server.serve, ln)
        holder = await net.dial("tcp", ln.addr())
        await wait_until(lambda: server.statistics().connections == 1)
        peer = Peer(refused, port_of(ln))
        peer.start()
        ok = await wait_until(lambda: not peer.is_alive(), bound=30)
        assert ok
        got = await peer.finish()
        rejected = server.statistics().rejected
        holder.close()
        await server.shutdown(grace=0.1)
        return got, rejected

    got, rejected = gosim.run(main, procs=2)
    goaway = b"\x03" + struct.pack(">I", 3) + b"connection limit"
    assert got == [goaway, b"EOF"] * 10
    assert rejected == 10


def test_netframe_clients_refused_at_the_limit_all_learn_why() -> None:
    # Thirty clients at once, each with a request on its way as it is refused: the
    # server must not reset them before they read why, and the client must keep the
    # reason when a reset comes after it anyway.
    n = 30

    async def main() -> list[str]:
        ln = net.listen("tcp", "127.0.0.1:0")
        server = netframe.Server(lambda p: p, max_connections=1, heartbeat_interval=None)
        go(server.serve, ln)
        holder = await net.dial("tcp", ln.addr())
        await wait_until(lambda: server.statistics().connections == 1)
        out: Chan[str] = Chan(n)

        async def refused() -> None:
            c = netframe.Client(lambda: net.dial("tcp", ln.addr()), heartbeat_interval=None)
            await c.connect()
            try:
                await c.send(b"x" * 100_000)
            except netframe.ConnectionLost as exc:
                await out.send(exc.reason)
            else:
                ok, lost = await within(BOUND, c.recv)
                await out.send(lost.reason if ok else "hung")
            await c.close()

        for _ in range(n):
            go(refused)
        reasons = []
        for _ in range(n):
            i, reason, _ = await select(recv(out), recv(gosim.after(BOUND)))
            reasons.append(reason if i == 0 else "no answer")
        holder.close()
        await server.shutdown(grace=0.1)
        return reasons

    assert gosim.run(main, procs=2) == ["server sent GOAWAY(3): connection limit"] * n


# ---------------------------------------------------- 6. raw mode: order, memory


def test_raw_mode_replies_in_request_order_with_concurrent_handlers() -> None:
    # Later requests finish first (shorter sleeps); a plain length-prefixed peer has
    # only the order to match replies by, so the order must be the requests'.
    n = 200

    async def slow_first(payload: bytes) -> bytes:
        i = int(payload)
        await gosim.sleep(0.001 * (9 - i % 10))
        return payload

    def script(port: int, release: threading.Event) -> list[bytes]:
        with connect(port) as sock:
            sock.sendall(b"".join(frame(b"%d" % i) for i in range(n)))
            got = []
            for _ in range(n):
                payload = read_frame(sock)
                assert payload is not None
                got.append(payload)
            return got

    async def main() -> list[bytes]:
        ln = net.listen("tcp", "127.0.0.1:0")
        server = netframe.Server(slow_first, raw=True)  # max_in_flight: the default, 64
        go(server.serve, ln)
        peer = Peer(script, port_of(ln))
        peer.start()
        await wait_until(lambda: not peer.is_alive())
        got: list[bytes] = await peer.finish()
        await server.shutdown(grace=0.1)
        return got

    assert gosim.run(main, procs=2) == [b"%d" % i for i in range(n)]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads VmRSS from /proc")
def test_raw_server_memory_stays_bounded_by_send_queue_with_non_reading_peers() -> None:
    # Three peers pipeline small requests whose replies are 400 times larger and never
    # read. One handler at a time (max_in_flight=1) and send_queue=16: the server may
    # hold 16 replies per peer, not the replies to all it has read.
    server = _ServerProcess({"raw": True, "max_in_flight": 1, "send_queue": 16, "amplify": 400})
    socks: list[socket.socket] = []
    try:
        assert server.statistics()["connections"] == 0
        before = server.rss()
        request = frame(b"12345678") * 4096
        for _ in range(3):
            s = connect(server.port, rcvbuf=4096)
            socks.append(s)
        for s in socks:
            send_until_blocked(s, request)
        time.sleep(0.5)
        grown = server.rss() - before
        assert server.statistics()["connections"] == 3
    finally:
        for s in socks:
            reset(s)
        server.close()
    assert grown < 32 << 20, f"RSS grew {grown >> 20} MiB"


# -------------------------------------------------------------- also missing


def test_raw_idle_timeout_closes_silent_and_slow_peers() -> None:
    # One peer sends nothing; another sends half a frame and stalls; a third keeps
    # talking. The first two are closed at the idle timeout; the third is not.
    def silent(port: int, release: threading.Event) -> bytes:
        with connect(port) as sock:
            return sock.recv(10)  # b"" when the server closes

    def slow(port: int, release: threading.Event) -> bytes:
        with connect(port) as sock:
            sock.sendall(frame(b"0123456789")[:7])
            return sock.recv(10)

    def chatty(port: int, release: threading.Event) -> int:
        with connect(port) as sock:
            answered = 0
            while not release.is_set():
                sock.sendall(frame(b"ping"))
                answered += read_frame(sock) == b"ping"
                time.sleep(0.05)
            return answered

    async def main() -> tuple[bytes, bytes, int, int, int]:
        ln = net.listen("tcp", "127.0.0.1:0")
        # 1.5 s: the chatty peer (a thread of this process, which a loaded machine
        # may hold up for a while) answers far more often than that.
        server = netframe.Server(lambda p: p, raw=True, max_in_flight=1, idle_timeout=1.5)
        go(server.serve, ln)
        peers = [Peer(f, port_of(ln)) for f in (silent, slow, chatty)]
        for p in peers:
            p.start()
        await wait_until(lambda: not peers[0].is_alive() and not peers[1].is_alive())
        await gosim.sleep(3.0)  # the chatty peer outlives two more timeouts
        left = server.statistics().connections
        results = [await p.finish() for p in peers]
        idle = server.statistics().idle_closed
        await server.shutdown(grace=0.1)
        return results[0], results[1], results[2], left, idle

    silent_end, slow_end, answered, left, idle = gosim.run(main, procs=2)
    assert (silent_end, slow_end, left, idle) == (b"", b"", 1, 2)
    assert answered > 5


@pytest.mark.parametrize(
    ("wire", "reason"),
    [
        (b"\x80\x00\x00\x00", b"frame of 2147483648 bytes announced, at most 16777216 allowed"),
        (frame(b"\x09"), b"unknown frame kind 9"),
        (frame(b"\x01abc"), b"PING carries 3 bytes, not 8"),
    ],
)
def test_a_protocol_error_goaway_says_what_was_wrong(wire: bytes, reason: bytes) -> None:
    def script(port: int, release: threading.Event) -> list[bytes | None]:
        with connect(port) as sock:
            sock.sendall(wire)
            return [read_frame(sock), read_frame(sock)]

    async def main() -> list[bytes | None]:
        ln = net.listen("tcp", "127.0.0.1:0")
        server = netframe.Server(lambda p: p, heartbeat_interval=None)
        go(server.serve, ln)
        peer = Peer(script, port_of(ln))
        peer.start()
        await wait_until(lambda: not peer.is_alive())
        got: list[bytes | None] = await peer.finish()
        await server.shutdown(grace=0.1)
        return got

    assert gosim.run(main, procs=2) == [b"\x03" + struct.pack(">I", 1) + reason, None]


def test_framed_conn_aclose_is_bounded_behind_a_stuck_write() -> None:
    port, release, t = _start_frozen_server()

    async def main() -> tuple[bool, bool]:
        fc = netframe.FramedConn(await net.dial("tcp", f"127.0.0.1:{port}"), send_queue=8)

        async def flood() -> str:
            try:
                for _ in range(100_000):
                    await fc.send(b"x" * 4096)
            except netframe.ClosedError:
                return "closed"
            return "all queued"

        go(flood)
        full = await wait_until(lambda: fc.statistics().send_queue >= 8)
        closed, error = await within(BOUND, fc.aclose, True, 0.3)
        return full, closed and error is None

    try:
        assert gosim.run(main, procs=2) == (True, True)
    finally:
        release.set()
        t.join(BOUND)


def test_later_replies_to_a_peer_that_never_reads_stay_bounded_and_are_released() -> None:
    # Replies settled later (netframe.Later, as a group commit settles them: in bursts,
    # by one goroutine) to a peer that floods requests and reads nothing: the replies
    # that meet the full send queue wait in at most max_in_flight goroutines, the
    # reader stops taking requests, and once the peer is found dead every goroutine
    # and slot of the connection is released.
    max_in_flight = 8

    def script(port: int, release: threading.Event) -> None:
        sock = connect(port, rcvbuf=4096)
        try:
            sock.sendall(b"".join(data(b"%d" % i) for i in range(200)))
        except OSError:
            pass  # the server stopped reading: backpressure
        release.wait(HOLD)
        sock.close()

    async def main() -> tuple[bool, int, int, int, int]:
        base = gosim.num_goroutine()
        waiting: list[netframe.Later] = []

        def handler(payload: bytes) -> netframe.Later:
            later = netframe.Later()
            waiting.append(later)
            return later

        async def settle_in_bursts() -> None:
            while True:
                await gosim.sleep(0.01)
                burst = waiting[:]
                waiting.clear()
                for later in burst:
                    later.reply(b"r" * (64 * 1024))

        ln = net.listen("tcp", "127.0.0.1:0")
        server = netframe.Server(
            handler,
            heartbeat_interval=0.2,
            heartbeat_timeout=0.5,
            send_queue=2,
            max_in_flight=max_in_flight,
        )
        go(server.serve, ln)
        go(settle_in_bursts)
        peer = Peer(script, port_of(ln))
        peer.start()
        await wait_until(lambda: server.statistics().accepted == 1)
        await gosim.sleep(0.3)  # stuck: the queue full, the slots taken
        stuck = gosim.num_goroutine() - base
        gone = await wait_until(
            lambda: server.statistics().dead_peers == 1 and server.statistics().connections == 0
        )
        await gosim.sleep(0.1)  # the replies waiting for room wind up
        left = gosim.num_goroutine() - base
        await peer.finish()
        stats = server.statistics()
        await server.shutdown(grace=0.1)
        return gone, stuck, left, stats.connections, stats.handler_errors

    gone, stuck, left, connections, errors = gosim.run(main, procs=2)
    assert gone and connections == 0 and errors == 0
    # accept loop, settler, the connection's reader, heartbeat and writer (5, with room
    # for a transient one or two), and at most one goroutine per in-flight slot waiting
    # for room: not one per request sent (200)
    assert stuck <= 7 + max_in_flight
    assert left <= 2  # the accept loop and the settler: nothing of the dead connection


# ---------------------------------------------- 8. a peer that answers GOAWAY with its own


def _slow_echo_server(**kwargs: Any) -> netframe.Server:
    async def slow(payload: bytes) -> bytes:
        await gosim.sleep(0.3)  # still running when the goaways cross
        return b"late " + payload

    return netframe.Server(slow, heartbeat_interval=None, **kwargs)


def _frames_until_end(sock: socket.socket) -> list[bytes]:
    got = []
    while (body := read_frame(sock)) is not None:
        got.append(body)
    return got


def test_a_goaway_answered_during_shutdown_still_gets_the_replies_owed() -> None:
    """PROTOCOL.md lets a peer answer the server's GOAWAY with its own. The replies the
    server owes for requests it already received still go out, and nothing panics
    (the reply once met a session that refused DATA after both goaways and took the
    whole process down)."""

    def script(port: int, release: threading.Event) -> list[bytes]:
        sock = connect(port)
        sock.sendall(data(b"a") + data(b"b"))
        first = read_frame(sock)  # the server's GOAWAY(NO_ERROR)
        sock.sendall(goaway_frame(0, b"fine, me too"))
        rest = _frames_until_end(sock)
        sock.close()
        return [first or b"", *rest]

    async def main() -> tuple[list[bytes], int]:
        ln = net.listen("tcp", "127.0.0.1:0")
        server = _slow_echo_server()
        go(server.serve, ln)
        peer = Peer(script, port_of(ln))
        peer.start()
        await wait_until(lambda: server.statistics().frames_received == 2)
        await server.shutdown(grace=2.0)
        got = await peer.finish()
        return got, server.statistics().handler_errors

    got, errors = gosim.run(main, procs=1)
    assert got[0][:1] == b"\x03"  # GOAWAY first
    assert sorted(got[1:]) == [b"\x00late a", b"\x00late b"]
    assert errors == 0


def test_a_peer_goaway_then_a_protocol_error_leaves_the_server_serving() -> None:
    """A peer says GOAWAY, then breaks the protocol while a handler runs: the server
    answers GOAWAY(PROTOCOL_ERROR) and drains the connection before it closes; the
    handler's reply, due meanwhile, is dropped (the write side is shut), and the server
    goes on serving others."""

    def hostile(port: int, release: threading.Event) -> list[bytes]:
        sock = connect(port)
        sock.sendall(data(b"x") + goaway_frame(0, b"done") + frame(b"\x09bad kind"))
        got = _frames_until_end(sock)  # the GOAWAY, then the server's write side shut
        time.sleep(0.45)  # hold the connection open while the server drains it
        sock.close()
        return got

    async def main() -> tuple[list[bytes], bytes]:
        ln = net.listen("tcp", "127.0.0.1:0")
        server = _slow_echo_server()
        go(server.serve, ln)
        peer = Peer(hostile, port_of(ln))
        peer.start()
        got = await peer.finish()
        await gosim.sleep(0.4)  # the slow handler ends after its connection did
        c = netframe.Client(lambda: net.dial("tcp", ln.addr()), heartbeat_interval=None)
        await c.connect()
        await c.send(b"after")
        reply = await c.recv(timeout=BOUND)
        await c.close()
        await server.shutdown(grace=1.0)
        return got, reply

    got, reply = gosim.run(main, procs=1)
    assert [body[:1] for body in got] == [b"\x03"]
    assert struct.unpack(">I", got[0][1:5])[0] == netframe.GoAwayCode.PROTOCOL_ERROR
    assert reply == b"late after"


# ------------------------------------------------- per-frame read deadline (issue 28)


def _trickle(sock: socket.socket, wire: bytes, interval: float, bound: float) -> float | None:
    """Send ``wire`` one byte every ``interval`` seconds: the seconds until the server
    ended the connection (a send or a read fails, or the end of stream), or None when
    it still held the connection after ``bound`` seconds."""
    start = time.monotonic()
    sock.settimeout(interval)
    for i in range(len(wire)):
        if time.monotonic() - start > bound:
            return None
        try:
            sock.sendall(wire[i : i + 1])
            got = sock.recv(1 << 16)  # waits up to interval: the pace of the trickle
        except TimeoutError:
            continue
        except OSError:  # reset, broken pipe: closed
            return time.monotonic() - start
        if not got:
            return time.monotonic() - start
        # Session mode: a GOAWAY first; the close follows.
        while got:
            try:
                got = sock.recv(1 << 16)
            except TimeoutError:
                break
            except OSError:
                return time.monotonic() - start
        if not got:
            return time.monotonic() - start
    return None


READ_TIMEOUT = 1.0  # small, so the tests are short; closes come within 1.25 times it


@pytest.mark.parametrize("raw", [True, False], ids=["raw", "session"])
def test_a_frame_trickled_a_byte_at_a_time_is_closed_at_its_read_deadline(raw: bool) -> None:
    # Slowloris: one byte every 0.25 s renews any idle timeout forever. The frame must
    # arrive whole within read_timeout of its first byte: the connection is closed
    # then (well within 8 s; the old server held it for as long as the peer liked).
    config: dict[str, Any] = {"raw": raw, "read_timeout": READ_TIMEOUT, "idle_timeout": 60.0}
    if raw:
        config["max_in_flight"] = 1  # the C exchange loop, where it is built
    else:
        config["heartbeat_interval"] = None
    proc = _ServerProcess(config)
    try:
        body = b"x" * 100
        wire = frame(body) if raw else data(body)
        with connect(proc.port) as sock:
            took = _trickle(sock, wire, 0.25, 8.0)
        assert took is not None, "the server held a trickling peer past 8 s"
        assert took >= READ_TIMEOUT * 0.9  # not before the deadline (clocks differ a bit)
        stats = proc.statistics()
        assert stats["read_timeouts"] == 1
        assert proc.alive()
    finally:
        proc.close()


def test_a_session_peer_closed_at_its_read_deadline_is_told_why() -> None:
    proc = _ServerProcess({"read_timeout": READ_TIMEOUT, "heartbeat_interval": None})
    try:
        with connect(proc.port) as sock:
            sock.sendall(data(b"hello")[:3])  # a frame begun, never finished
            got = read_frame(sock)
            assert got is not None and got[:1] == b"\x03", got  # GOAWAY
            assert struct.unpack(">I", got[1:5])[0] == 2  # IDLE_TIMEOUT
            assert got[5:] == b"frame not received whole within 1 s"
    finally:
        proc.close()


@pytest.mark.parametrize("raw", [True, False], ids=["raw", "session"])
def test_frames_that_each_arrive_in_time_keep_their_connection(raw: bool) -> None:
    # The deadline is per frame, not per connection: frames sent a byte at a time, each
    # whole well within the read deadline, keep a connection open for several
    # deadlines, and every one is answered.
    config: dict[str, Any] = {"raw": raw, "read_timeout": READ_TIMEOUT}
    if not raw:
        config["heartbeat_interval"] = None
    proc = _ServerProcess(config)
    try:
        with connect(proc.port) as sock:
            start = time.monotonic()
            answered = 0
            while time.monotonic() - start < 3 * READ_TIMEOUT:
                wire = frame(b"ping") if raw else data(b"ping")
                for i in range(len(wire)):
                    sock.sendall(wire[i : i + 1])
                    time.sleep(0.02)
                reply = read_frame(sock)
                assert reply == (b"ping" if raw else b"\x00ping"), reply
                answered += 1
        assert answered >= 3
        assert proc.statistics()["read_timeouts"] == 0
    finally:
        proc.close()
