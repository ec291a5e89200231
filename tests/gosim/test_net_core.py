"""gosim.net over real sockets on 127.0.0.1 and Unix sockets: echo at scale, half close,
deadlines, resets, busy and closed errors, and I/O waits in deadlock detection."""

from __future__ import annotations

import errno
import os
import socket
import struct
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gosim
from gosim import Chan, go, net
from gosim.net._net import _IOV_MAX


def run(main, *args):  # type: ignore[no-untyped-def]
    return gosim.run(main, *args, procs=2)


async def echo_server(ln: net.Listener) -> None:
    async def handle(c: net.Conn) -> None:
        try:
            while data := await c.read(65536):
                await c.write(data)
        except net.BrokenError:
            pass
        finally:
            c.close()

    while True:
        try:
            conn = await ln.accept()
        except net.ClosedError:
            return
        go(handle, conn)


def test_two_hundred_concurrent_echo_clients() -> None:
    async def main() -> int:
        ln = net.listen("tcp", "127.0.0.1:0")
        go(echo_server, ln)
        done: Chan[int] = Chan(200)

        async def client(k: int) -> None:
            c = await net.dial("tcp", ln.addr(), timeout=10)
            ok = 0
            for i in range(20):
                msg = b"%d:%d" % (k, i) * 50
                await c.write(msg)
                ok += await c.read_exactly(len(msg)) == msg
            c.close()
            await done.send(ok)

        for k in range(200):
            go(client, k)
        total = sum([await done.recv() or 0 for _ in range(200)])
        ln.close()
        return total

    assert run(main) == 4000


def test_large_writes_and_half_close() -> None:
    async def main() -> tuple[int, bytes]:
        ln = net.listen("tcp", "127.0.0.1:0")
        result: Chan[tuple[int, bytes]] = Chan(1)

        async def sink() -> None:
            c = await ln.accept()
            got = 0
            while data := await c.read(1 << 20):
                got += len(data)
            await c.write(b"bye")  # the write side is still open after the peer's half close
            c.close()
            await result.send((got, b""))

        go(sink)
        c = await net.dial("tcp", ln.addr())
        blob = bytes(range(256)) * 40_000  # 10 MB: many EAGAINs on the way
        assert await c.write(blob) == len(blob)
        c.close_write()
        tail = await c.read_exactly(3)
        got, _ = await result.recv() or (0, b"")
        c.close()
        ln.close()
        return got, tail

    assert run(main) == (10_240_000, b"bye")


def test_read_deadline_gives_go_timeout_error_and_can_be_cleared() -> None:
    async def main() -> tuple[str, bool, bytes]:
        ln = net.listen("tcp", "127.0.0.1:0")
        peer: Chan[net.Conn] = Chan(1)

        async def acceptor() -> None:
            await peer.send(await ln.accept())

        go(acceptor)
        c = await net.dial("tcp", ln.addr())
        server_side = await peer.recv()
        assert server_side is not None
        c.set_read_deadline(gosim.now() + 0.05)
        with pytest.raises(net.DeadlineExceeded) as info:
            await c.read(10)
        c.set_read_deadline(None)
        await server_side.write(b"late")
        data = await c.read(10)
        c.close()
        server_side.close()
        ln.close()
        return str(info.value), info.value.timeout(), data

    msg, timeout, data = run(main)
    assert "i/o timeout" in msg and timeout and data == b"late"
    assert issubclass(net.DeadlineExceeded, TimeoutError)


def test_early_eof_and_peer_reset_are_broken_errors() -> None:
    async def main() -> tuple[str, str]:
        ln = net.listen("tcp", "127.0.0.1:0")
        conns: Chan[net.Conn] = Chan(2)

        async def acceptor() -> None:
            for _ in range(2):
                await conns.send(await ln.accept())

        go(acceptor)
        a = await net.dial("tcp", ln.addr())
        a_srv = await conns.recv()
        assert a_srv is not None
        await a_srv.write(b"abc")
        a_srv.close()
        with pytest.raises(net.BrokenError) as eof:
            await a.read_exactly(10)
        b = await net.dial("tcp", ln.addr())
        b_srv = await conns.recv()
        assert b_srv is not None
        # SO_LINGER 0 then close: the kernel sends RST, not FIN.
        raw = socket.socket(fileno=b_srv.fileno())
        raw.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        raw.detach()
        b_srv.close()
        await gosim.sleep(0.05)
        with pytest.raises(net.BrokenError) as reset:
            await b.read(10)
            await b.read(10)
        for c in (a, b):
            c.close()
        ln.close()
        return str(eof.value), type(reset.value).__name__

    eof, reset = run(main)
    assert "unexpected EOF: 3 of 10" in eof
    assert reset == "BrokenError"


def test_busy_and_closed_errors() -> None:
    async def main() -> tuple[bool, bool, bool]:
        ln = net.listen("tcp", "127.0.0.1:0")
        go(echo_server, ln)
        c = await net.dial("tcp", ln.addr())
        first_reader_done: Chan[BaseException | None] = Chan(1)

        async def reader() -> None:
            try:
                await c.read(10)
                await first_reader_done.send(None)
            except BaseException as exc:
                await first_reader_done.send(exc)

        go(reader)
        await gosim.sleep(0.01)
        busy = False
        try:
            await c.read(10)
        except net.BusyError:
            busy = True
        c.close()  # the parked reader wakes with ClosedError
        woke = isinstance(await first_reader_done.recv(), net.ClosedError)
        ln.close()
        try:
            await ln.accept()
            closed = False
        except net.ClosedError as exc:
            closed = "use of closed network connection" in str(exc)
        return busy, woke, closed

    assert run(main) == (True, True, True)


def test_unix_sockets(tmp_path: Path) -> None:
    path = str(tmp_path / "echo.sock")

    async def main() -> bytes:
        ln = net.listen("unix", path)
        go(echo_server, ln)
        c = await net.dial("unix", path)
        await c.write(b"over unix")
        got = await c.read_exactly(9)
        c.close()
        ln.close()
        return got

    assert run(main) == b"over unix"
    assert not Path(path).exists()  # the listener removes its socket file


def test_io_wait_is_not_a_deadlock_but_a_blocked_channel_is() -> None:
    async def waits_on_io() -> str:
        ln = net.listen("tcp", "127.0.0.1:0")

        async def late_client() -> None:
            await gosim.syscall(__import__("time").sleep, 0.05)
            c = await net.dial("tcp", ln.addr())
            await c.write(b"hi")
            c.close()

        go(late_client)
        conn = await ln.accept()
        data = await conn.read(2)
        conn.close()
        ln.close()
        return data.decode()

    assert run(waits_on_io) == "hi"

    async def stuck() -> None:
        ln = net.listen("tcp", "127.0.0.1:0")
        ln.close()
        await Chan[int]().recv()

    with pytest.raises(gosim.Deadlock, match=r"goroutine 1 \[chan receive\]"):
        run(stuck)


def test_dial_errors_and_bad_addresses() -> None:
    async def main() -> None:
        ln = net.listen("tcp", "127.0.0.1:0")
        addr = ln.addr()
        ln.close()
        with pytest.raises(ConnectionRefusedError):
            await net.dial("tcp", addr)
        for bad in ("nohostport", "127.0.0.1:x", "127.0.0.1:70000"):
            with pytest.raises(net.AddrError):
                await net.dial("tcp", bad)
        with pytest.raises(net.AddrError):
            net.listen("udp", "127.0.0.1:0")

    run(main)


def test_listen_on_a_taken_port_raises_oserror_from_run() -> None:
    # The OSError of a goroutine reaches run's caller as itself (not wrapped), so
    # ``except OSError`` around run catches it; the goroutine it escaped is in a note.
    taken = socket.socket()
    try:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]

        async def serve(ready: Chan[None]) -> None:
            net.listen("tcp", f"127.0.0.1:{port}")
            await ready.send(None)

        async def main() -> None:
            ready: Chan[None] = Chan()
            go(serve, ready)
            await ready.recv()

        with pytest.raises(OSError) as info:
            run(main)
    finally:
        taken.close()
    assert info.value.errno == errno.EADDRINUSE
    (report,) = info.value.__notes__
    assert report.startswith(f"panic: {info.value}\n\ngoroutine 2 [running]:\n")
    assert ".<locals>.serve(...)\ncreated by " in report


def test_sockets_left_open_are_closed_when_the_runtime_ends() -> None:
    async def main() -> tuple[net.Conn, net.Listener]:
        ln = net.listen("tcp", "127.0.0.1:0")
        go(echo_server, ln)
        c = await net.dial("tcp", ln.addr())
        assert c.fileno() >= 0
        return c, ln

    c, ln = run(main)
    assert c.fileno() == -1  # closed by the runtime as it ended, like process exit
    assert ln._sock.fileno() == -1


@pytest.mark.parametrize("network", ["tcp", "unix"])
@given(
    chunks=st.lists(st.binary(min_size=1, max_size=3000), min_size=1, max_size=30),
    read_sizes=st.lists(st.integers(1, 5000), min_size=1, max_size=10),
    pauses=st.lists(st.sampled_from(["none", "gosched", "sleep"]), min_size=1, max_size=10),
)
@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
def test_reads_after_a_short_read_lose_and_stall_nothing(
    tmp_path: Path, network: str, chunks: list[bytes], read_sizes: list[int], pauses: list[str]
) -> None:
    # A read that returns fewer bytes than asked waits on the poller before its next
    # recv (the queue was empty). Whatever the timing of the writer (bytes arriving
    # before the next read, during it, or after the reader parked), every byte arrives.
    path = str(tmp_path / f"s{len(chunks)}-{len(read_sizes)}.sock")
    expected = b"".join(chunks)

    async def main() -> bytes:
        ln = net.listen(network, path if network == "unix" else "127.0.0.1:0")

        async def writer() -> None:
            c = await ln.accept()
            for i, chunk in enumerate(chunks):
                await c.write(chunk)
                pause = pauses[i % len(pauses)]
                if pause == "gosched":
                    await gosim.gosched()
                elif pause == "sleep":
                    await gosim.sleep(0.0005)
            c.close()

        go(writer)
        c = await net.dial(network, ln.addr() if network == "tcp" else path, timeout=10)
        c.set_read_deadline(gosim.now() + 10)  # a lost wake-up fails, not hangs
        got = bytearray()
        i = 0
        while data := await c.read(read_sizes[i % len(read_sizes)]):
            got += data
            i += 1
        c.close()
        ln.close()
        return bytes(got)

    assert run(main) == expected


def test_short_read_then_wait_skips_the_doomed_recv() -> None:
    # Request/response: after each short read the queue is empty, so the next read
    # parks without a recv that could only fail with EAGAIN.
    failed_recvs = 0

    class CountingSocket:
        def __init__(self, sock: socket.socket) -> None:
            self._sock = sock

        def recv(self, n: int) -> bytes:
            nonlocal failed_recvs
            try:
                return self._sock.recv(n)
            except BlockingIOError:
                failed_recvs += 1
                raise

        def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
            return getattr(self._sock, name)

    async def main() -> int:
        ln = net.listen("tcp", "127.0.0.1:0")
        go(echo_server, ln)
        c = await net.dial("tcp", ln.addr(), timeout=10)
        c._sock = CountingSocket(c._sock)  # type: ignore[assignment]
        for i in range(200):
            msg = b"%05d" % i
            await c.write(msg)
            assert await c.read(100) == msg
        c.close()
        ln.close()
        return failed_recvs

    # Each first read after a short one waits instead: at most a spurious wake-up's
    # retry now and then, not one failed recv per request.
    assert run(main) < 20


def test_write_buffers_gathers_many_buffers_through_partial_sends() -> None:
    # More buffers than one sendmsg takes (IOV_MAX), large ones that need several
    # sends while the reader is slow, empty ones, bytearrays and memoryviews of
    # wider items: all arrive in order, nothing copied or lost.
    parts: list[bytes | bytearray | memoryview] = []
    for i in range(_IOV_MAX + 300):
        if i % 97 == 0:
            parts.append(bytes([i % 251]) * 300_000)
        elif i % 5 == 0:
            parts.append(b"")
        elif i % 7 == 0:
            parts.append(bytearray(b"ba%d" % i))
        elif i % 11 == 0:
            parts.append(memoryview(struct.pack("<3i", i, -i, 7)).cast("i"))
        else:
            parts.append(b"%d," % i)
    expected = b"".join(bytes(p) for p in parts)

    async def main() -> tuple[int, bytes]:
        ln = net.listen("tcp", "127.0.0.1:0")
        got: Chan[bytes] = Chan(1)

        async def reader() -> None:
            c = await ln.accept()
            buf = bytearray()
            while data := await c.read(4096):
                buf += data
                if len(buf) % 7 == 0:
                    await gosim.sleep(0.0001)  # slow: the writer meets a full buffer
            c.close()
            await got.send(bytes(buf))

        go(reader)
        c = await net.dial("tcp", ln.addr(), timeout=10)
        written = await c.write_buffers(parts)
        c.close()
        data = await got.recv() or b""
        ln.close()
        return written, data

    written, data = run(main)
    assert written == len(expected)
    assert data == expected


def test_write_buffers_reports_errors_like_write() -> None:
    async def main() -> list[str]:
        ln = net.listen("tcp", "127.0.0.1:0")
        c = await net.dial("tcp", ln.addr(), timeout=10)
        peer = await ln.accept()
        peer._sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        peer.close()  # a reset: the next writes fail
        seen = []
        for _ in range(3):
            try:
                await c.write_buffers([b"x" * 100_000, b"y"])
            except net.BrokenError:
                seen.append("broken")
                break
        c.close()
        try:
            await c.write_buffers([b"z"])
        except net.ClosedError:
            seen.append("closed")
        ln.close()
        return seen

    assert run(main) == ["broken", "closed"]


def test_read_into_fills_the_callers_buffer() -> None:
    # Go's Read(p): as many bytes as are there (at most len(p)), 0 at end of stream,
    # 0 for an empty buffer, ClosedError after close.
    async def main() -> list[object]:
        ln = net.listen("tcp", "127.0.0.1:0")
        c = await net.dial("tcp", ln.addr(), timeout=10)
        peer = await ln.accept()
        await peer.write(b"hello world")
        buf = bytearray(5)
        seen: list[object] = [await c.read_into(buf), bytes(buf)]
        view = memoryview(bytearray(100))
        got = 0
        while got < 6:
            got += await c.read_into(view[got:])
        seen.append(bytes(view[:got]))
        seen.append(await c.read_into(bytearray()))
        peer.close()
        seen.append(await c.read_into(bytearray(10)))  # end of stream
        c.close()
        try:
            await c.read_into(bytearray(10))
        except net.ClosedError:
            seen.append("closed")
        ln.close()
        return seen

    assert run(main) == [5, b"hello", b" world", 0, 0, "closed"]


def test_raw_conn_calls_f_until_done_and_waits_on_the_netpoller_between() -> None:
    # Go's SyscallConn: f(fd) makes the system calls; False parks the goroutine in IO
    # wait until the socket is ready again. The call count shows waits, not spinning.
    payload = b"x" * 3_000_000  # more than the socket buffers hold: the writer waits

    async def main() -> tuple[bytes, int, bool, bool]:
        ln = net.listen("tcp", "127.0.0.1:0")
        go(echo_server, ln)
        c = await net.dial("tcp", ln.addr(), timeout=10)
        c.set_deadline(gosim.now() + 10)  # a lost wake-up fails instead of hanging
        raw = c.syscall_conn()
        got = bytearray()
        calls = 0

        def read_five(fd: int) -> bool:
            nonlocal calls
            calls += 1
            try:
                got.extend(os.read(fd, 5 - len(got)))
            except BlockingIOError:
                return False
            return len(got) == 5

        async def send_in_pieces() -> None:
            await gosim.sleep(0.05)
            await c.write(b"hel")
            await gosim.sleep(0.05)
            await c.write(b"lo")

        go(send_in_pieces)
        await raw.read(read_five)
        first_calls = calls

        sent = 0
        writes = 0

        def write_all(fd: int) -> bool:
            nonlocal sent, writes
            writes += 1
            try:
                sent += os.write(fd, payload[sent:])
            except BlockingIOError:
                return False
            return sent == len(payload)

        echoed = bytearray()
        done: Chan[None] = Chan()

        async def read_echo() -> None:  # a reader and a writer at once are allowed
            while len(echoed) < len(payload):
                echoed.extend(await c.read(1 << 16))
            await done.send(None)

        go(read_echo)
        await raw.write(write_all)
        await done.recv()
        seen: list[int] = []
        raw.control(seen.append)
        fd = c.fileno()
        c.close()
        ln.close()
        return bytes(got), first_calls, echoed == bytearray(payload), seen == [fd]

    got, calls, echoed_all, control_saw_fd = run(main)
    assert got == b"hello" and echoed_all and control_saw_fd
    assert calls <= 4  # echoes "hel", then "lo": a few tries around two waits


def test_raw_conn_keeps_the_connections_rules_and_error_mapping() -> None:
    async def main() -> list[str]:
        ln = net.listen("tcp", "127.0.0.1:0")
        peer: Chan[net.Conn] = Chan(1)

        async def accept() -> None:
            await peer.send(await ln.accept())

        go(accept)
        c = await net.dial("tcp", ln.addr(), timeout=10)
        server_side = await peer.recv()
        raw = c.syscall_conn()
        seen: list[str] = []

        # A deadline: Go's i/o timeout.
        c.set_read_deadline(gosim.now() + 0.05)
        try:
            await raw.read(lambda fd: False)
        except net.DeadlineExceeded as exc:
            seen.append(f"timeout {exc.timeout()}")
        c.set_read_deadline(None)

        # One reader at a time: a second one (plain read or raw) is refused.
        async def parked_reader() -> None:
            try:
                await raw.read(lambda fd: False)
            except net.ClosedError:
                seen.append("parked reader: closed")

        go(parked_reader)
        await gosim.gosched()
        try:
            await c.read(10)
        except net.BusyError:
            seen.append("busy")

        # OSError from f: a reset is the peer's doing (BrokenError); others pass through.
        def reset(fd: int) -> bool:
            raise ConnectionResetError(104, "Connection reset by peer")

        try:
            await raw.write(reset)
        except net.BrokenError:
            seen.append("broken")

        def other(fd: int) -> bool:
            raise PermissionError(1, "not permitted")

        try:
            await raw.write(other)
        except PermissionError:
            seen.append("oserror")

        c.close()  # wakes the parked reader with ClosedError
        await gosim.gosched()
        for call in (raw.read, raw.write):
            try:
                await call(lambda fd: True)
            except net.ClosedError:
                seen.append("closed")
        try:
            raw.control(lambda fd: None)
        except net.ClosedError:
            seen.append("control closed")
        try:
            c.syscall_conn()
        except net.ClosedError:
            seen.append("syscall_conn closed")
        server_side.close()
        ln.close()
        return seen

    # One P: gosched runs the parked reader before main goes on.
    assert gosim.run(main, procs=1) == [
        "timeout True",
        "busy",
        "broken",
        "oserror",
        "parked reader: closed",
        "closed",
        "closed",
        "control closed",
        "syscall_conn closed",
    ]


def test_raw_conn_read_retries_once_after_a_hang_up_instead_of_waiting() -> None:
    # The peer's last bytes and its close arrive in one edge, consumed by the wait
    # that woke this reader. An f that reports "nothing" once (as netframe's reader
    # does after a short receive) is retried at once: waiting would never end.
    async def main() -> bytes:
        ln = net.listen("tcp", "127.0.0.1:0")

        async def peer() -> None:
            s = await ln.accept()
            await gosim.sleep(0.05)  # the reader is parked by then
            await s.write(b"last")
            s.close()

        go(peer)
        c = await net.dial("tcp", ln.addr(), timeout=10)
        c.set_read_deadline(gosim.now() + 5)
        raw = c.syscall_conn()
        got = bytearray()
        state = {"eof": False, "short": False}

        def reader(fd: int) -> bool:
            if state["short"]:
                state["short"] = False
                return False  # "the last receive was short: wait first"
            try:
                data = os.read(fd, 100)
            except BlockingIOError:
                return False
            if not data:
                state["eof"] = True
                return True
            got.extend(data)
            state["short"] = True
            return False

        await gosim.sleep(0.1)  # data and FIN are both queued before the first call
        await raw.read(reader)
        c.close()
        ln.close()
        return bytes(got) if state["eof"] else b"no eof"

    assert run(main) == b"last"


@pytest.mark.parametrize("how", ["write", "write_buffers"])
def test_a_write_past_its_deadline_says_how_many_bytes_went_out(how: str) -> None:
    # Go's Write returns n with the timeout error. The peer reads nothing until the
    # deadline has passed, then everything: it receives exactly ``written`` bytes.
    payload = bytes(range(256)) * (32 * 1024)  # 8 MiB: more than the socket buffers

    async def main() -> tuple[int, int]:
        ln = net.listen("tcp", "127.0.0.1:0")
        peer: Chan[net.Conn] = Chan(1)

        async def acceptor() -> None:
            await peer.send(await ln.accept())

        go(acceptor)
        c = await net.dial("tcp", ln.addr())
        server_side = await peer.recv()
        assert server_side is not None
        c.set_write_deadline(gosim.now() + 0.2)
        try:
            if how == "write":
                await c.write(payload)
            else:
                await c.write_buffers([payload[:1000], payload[1000:]])
            raise AssertionError("no timeout")
        except net.DeadlineExceeded as exc:
            written = exc.written
        c.close()
        received = 0
        while data := await server_side.read(1 << 20):
            assert data == payload[received : received + len(data)]
            received += len(data)
        server_side.close()
        ln.close()
        return written, received

    written, received = run(main)
    assert 0 < written < len(payload)
    assert received == written


def test_listeners_with_reuse_port_share_a_port_and_its_connections() -> None:
    """SO_REUSEPORT: a second listener on a bound port is refused without it; with it on
    both, the kernel spreads connections over the two (64 dials all landing on one of
    two listeners would be a 2**-63 chance)."""

    async def main() -> tuple[int, int]:
        first = net.listen("tcp", "127.0.0.1:0", reuse_port=True)
        with pytest.raises(OSError):
            net.listen("tcp", first.addr())
        second = net.listen("tcp", first.addr(), reuse_port=True)
        accepted = [0, 0]
        done: Chan[None] = Chan(64)

        async def accept(i: int, ln: net.Listener) -> None:
            while True:
                try:
                    conn = await ln.accept()
                except net.ClosedError:
                    return
                accepted[i] += 1
                conn.close()
                await done.send(None)

        go(accept, 0, first)
        go(accept, 1, second)
        conns = [await net.dial("tcp", first.addr(), timeout=10) for _ in range(64)]
        for _ in conns:
            await done.recv()
        for c in conns:
            c.close()
        first.close()
        second.close()
        return accepted[0], accepted[1]

    a, b = run(main)
    assert a + b == 64
    assert a > 0 and b > 0
