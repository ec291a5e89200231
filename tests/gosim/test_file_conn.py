"""gosim.net.file_conn (Go's net.FileConn): a socket opened elsewhere put on the
netpoller over a duplicate of its descriptor. Reads park the goroutine until the peer
writes; closing the Conn leaves the caller's descriptor open; a RawConn over it waits
for a descriptor whose reads the caller makes itself (a driver's own protocol state)."""

from __future__ import annotations

import os
import socket
import threading

import pytest

import gosim
from gosim import go, net, sync


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_a_file_conn_reads_and_writes_and_leaves_the_callers_socket_open() -> None:
    a, b = socket.socketpair()
    try:

        async def main() -> bytes:
            conn = net.file_conn(a)
            assert conn.network == "unix" and conn.fileno() != a.fileno()
            got = gosim.Chan[bytes](1)

            async def reader() -> None:
                await got.send(await conn.read_exactly(5))

            go(reader)
            await gosim.sleep(0.05)  # the reader is parked in IO wait by now
            b.sendall(b"hello")
            data = await got.recv()
            await conn.write(b"back")
            conn.close()
            return data

        assert gosim.run(main) == b"hello"
        assert b.recv(16) == b"back"
        a.sendall(b"still open")  # the caller's descriptor outlived the Conn
        assert b.recv(16) == b"still open"
    finally:
        a.close()
        b.close()


def test_a_raw_conn_over_a_foreign_descriptor_waits_for_the_callers_own_reads() -> None:
    """The driver's pattern: the caller reads on its own descriptor; the netpoller only
    waits. Many goroutines parked at once on one OS thread, all woken by their peers."""
    pairs = [socket.socketpair() for _ in range(50)]
    for a, _ in pairs:
        a.setblocking(False)
    threads = threading.active_count()

    async def main() -> list[bytes]:
        out: list[bytes] = [b""] * len(pairs)
        done = sync.WaitGroup()

        async def wait_one(i: int, a: socket.socket) -> None:
            conn = net.file_conn(a.fileno())
            raw = conn.syscall_conn()
            buf = bytearray()

            def step(fd: int) -> bool:
                try:
                    buf.extend(a.recv(64))  # the caller's descriptor, not the Conn's
                except BlockingIOError:
                    return False
                return buf.endswith(b".")

            try:
                await raw.read(step)
                out[i] = bytes(buf)
            finally:
                conn.close()
                done.done()

        for i, (a, _) in enumerate(pairs):
            done.add(1)
            go(wait_one, i, a)
        await gosim.sleep(0.05)
        assert threading.active_count() == threads  # parked goroutines, no threads
        for i, (_, b) in enumerate(pairs):
            b.sendall(f"{i}.".encode())
        await done.wait()
        return out

    try:
        assert gosim.run(main, procs=1) == [f"{i}.".encode() for i in range(len(pairs))]
    finally:
        for a, b in pairs:
            a.close()
            b.close()


def test_closing_a_file_conn_wakes_its_reader_and_keeps_the_callers_descriptor() -> None:
    a, b = socket.socketpair()
    try:

        async def main() -> str:
            conn = net.file_conn(a.fileno())

            async def close_soon() -> None:
                await gosim.sleep(0.05)
                conn.close()

            go(close_soon)
            try:
                await conn.read()
            except net.ClosedError:
                return "closed"
            return "read"

        assert gosim.run(main) == "closed"
        os.fstat(a.fileno())  # still open
    finally:
        a.close()
        b.close()


def test_a_descriptor_that_is_no_stream_socket_is_refused_without_a_leak() -> None:
    before = _fds()
    with open(os.devnull, "rb") as f:

        async def not_a_socket() -> str:
            try:
                net.file_conn(f)
            except OSError as exc:
                return str(exc)
            return "accepted"

        assert "non-socket" in gosim.run(not_a_socket)
    d = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:

        async def datagram() -> str:
            try:
                net.file_conn(d)
            except OSError as exc:
                return str(exc)
            return "accepted"

        assert "not a stream socket" in gosim.run(datagram)
    finally:
        d.close()
    assert _fds() == before


def test_file_conn_outside_a_runtime_fails_early() -> None:
    a, b = socket.socketpair()
    try:
        with pytest.raises(Exception, match="gosim"):
            net.file_conn(a)
        os.fstat(a.fileno())
    finally:
        a.close()
        b.close()
