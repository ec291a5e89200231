"""FramedConn over an in-memory gosim connection pair: frames survive any chunking,
clean and unclean ends of stream, garbage, two readers, batching and backpressure."""

from __future__ import annotations

import random
import socket

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

import gosim
import netframe
from gosim import Chan, go, net
from netframe import (
    BusyError,
    ClosedError,
    FramedConn,
    FrameFormat,
    FrameTooLarge,
    IncompleteFrame,
    LocalFrameError,
    PayloadTooLarge,
)


class MemoryConn:
    """One end of an in-memory byte stream: writes become chunks in the peer's inbox."""

    def __init__(
        self, inbox: Chan[bytes | None], outbox: Chan[bytes | None], chunk: int | None
    ) -> None:
        self.inbox, self.outbox, self.chunk = inbox, outbox, chunk
        self.pending = b""
        self.eof = False
        self.write_calls = 0

    async def read(self, n: int) -> bytes:
        if not self.pending and not self.eof:
            data = await self.inbox.recv()
            if data is None:
                self.eof = True
            else:
                self.pending = data
        out, self.pending = self.pending[:n], self.pending[n:]
        return out

    async def write(self, data: bytes) -> int:
        self.write_calls += 1
        step = self.chunk or len(data) or 1
        for i in range(0, len(data), step):
            await self.outbox.send(bytes(data[i : i + step]))
        return len(data)

    def close(self) -> None:
        self.outbox.try_send(None)


def conn_pair(chunk: int | None = None, capacity: int = 1024) -> tuple[MemoryConn, MemoryConn]:
    ab: Chan[bytes | None] = Chan(capacity)
    ba: Chan[bytes | None] = Chan(capacity)
    return MemoryConn(ba, ab, chunk), MemoryConn(ab, ba, chunk)


def run(main, *args):  # type: ignore[no-untyped-def]
    return gosim.run(main, *args, procs=2, seed=1, virtual_time=True)


@settings(max_examples=60, deadline=None)
@given(
    payloads=st.lists(st.binary(max_size=300), max_size=30),
    chunk=st.one_of(st.none(), st.integers(1, 17)),
    use_send=st.booleans(),
)
def test_frames_arrive_whole_and_in_order_whatever_the_chunking(
    payloads: list[bytes], chunk: int | None, use_send: bool
) -> None:
    async def main() -> list[bytes]:
        a, b = conn_pair(chunk)
        fa, fb = FramedConn(a), FramedConn(b, read_size=7)

        async def writer() -> None:
            for p in payloads:
                if use_send:
                    await fa.send(p)
                else:
                    await fa.write_frame(p)
            await fa.aclose()

        go(writer)
        got = []
        while (frame := await fb.read_frame()) is not None:
            got.append(frame)
        return got

    assert run(main) == payloads


def test_write_frames_is_one_write_and_send_batches() -> None:
    async def main() -> tuple[int, int, int]:
        a, b = conn_pair()
        fa, fb = FramedConn(a), FramedConn(b)
        await fa.write_frames([b"x"] * 100)
        for i in range(500):
            await fa.send(str(i).encode())
        await fa.flush()
        got = 0
        while got < 600:
            assert await fb.read_frame() is not None
            got += 1
        return a.write_calls, fa.statistics().frames_written, fa.statistics().writes

    write_calls, frames, writes = run(main)
    assert frames == 600
    assert writes == write_calls
    assert writes < 50  # 500 queued frames left in a few batched writes


def test_end_of_stream_inside_a_frame_is_an_incomplete_frame() -> None:
    async def main() -> None:
        a, b = conn_pair()
        wire = FrameFormat().encode(b"hello world")
        await a.write(wire[:7])
        a.close()
        with pytest.raises(IncompleteFrame) as info:
            await FramedConn(b).read_frame()
        assert info.value.buffered == 7

    run(main)


def test_garbage_header_raises_the_codec_error() -> None:
    async def main() -> None:
        a, b = conn_pair()
        await a.write(b"\xff\xff\xff\xff" + b"junk")
        with pytest.raises(FrameTooLarge):
            await FramedConn(b, FrameFormat(max_frame_length=1024)).read_frame()

    run(main)


def test_two_readers_at_once_is_busy() -> None:
    async def main() -> None:
        _, b = conn_pair()
        fb = FramedConn(b)
        errors: Chan[BaseException] = Chan(1)

        async def second() -> None:
            try:
                await fb.read_frame()
            except BusyError as exc:
                await errors.send(exc)

        async def first() -> None:
            await fb.read_frame()

        go(first)
        await gosim.sleep(0.01)
        go(second)
        assert isinstance(await errors.recv(), BusyError)

    run(main)


def test_send_blocks_when_the_peer_stops_reading() -> None:
    async def main() -> tuple[int, int, bool]:
        a, _ = conn_pair(capacity=4)  # the peer never reads: 4 chunks fit in the link
        fa = FramedConn(a, send_queue=8)
        sent = 0

        async def flood() -> None:
            nonlocal sent
            for _ in range(100):
                await fa.send(b"x" * 10)
                sent += 1

        go(flood)
        await gosim.sleep(1)
        blocked = sent < 100
        return sent, fa.statistics().send_queue, blocked

    _sent, queued, blocked = run(main)
    assert blocked and queued == 8
    # Without backpressure all 100 would be "sent" into memory at once.


def test_closed_conn_refuses_sends() -> None:
    async def main() -> None:
        a, _ = conn_pair()
        fa = FramedConn(a)
        await fa.aclose()
        with pytest.raises(ClosedError):
            await fa.send(b"late")

    run(main)


def test_send_refuses_a_payload_the_format_cannot_carry_and_the_conn_goes_on() -> None:
    async def main() -> list[bytes]:
        a, b = conn_pair()
        fmt = FrameFormat(length_size=1, length_adjustment=2)  # payloads of 2..257 bytes
        fa, fb = FramedConn(a, fmt), FramedConn(b, fmt)
        with pytest.raises(PayloadTooLarge):
            await fa.send(b"x" * 258)
        with pytest.raises(LocalFrameError):
            await fa.send(b"x")
        await fa.send(b"ok")  # the connection is unharmed: nothing was queued
        await fa.flush()
        got = await fb.read_frame()
        assert got is not None
        return [got]

    assert run(main) == [b"ok"]


def test_closed_errors_are_one_taxonomy_with_gosim_net() -> None:
    # "This side closed it" is one exception family from the socket up: a FramedConn
    # used after aclose raises what `except gosim.net.ClosedError` (an OSError) catches.
    assert issubclass(ClosedError, net.ClosedError)
    assert issubclass(ClosedError, OSError)
    assert issubclass(netframe.BusyError, net.BusyError)

    async def main() -> str:
        a, _ = conn_pair()
        fa = FramedConn(a)
        await fa.aclose()
        try:
            await fa.send_many([b"late"])
        except net.ClosedError as exc:
            return str(exc)
        return "not raised"

    assert "closed FramedConn" in run(main)


def test_send_many_keeps_the_order_of_everything_sent_over_tcp() -> None:
    # Over TCP with small socket buffers, send_many's direct sends (and the rest of a
    # send the socket did not take, finished by the writer goroutine) and send's queued
    # frames leave in the order they were sent. (send_nowait's control frames may jump
    # a full queue, by design.)
    async def main() -> tuple[list[bytes], list[bytes]]:
        ln = net.listen("tcp", "127.0.0.1:0")
        client = await net.dial("tcp", ln.addr())
        server = await ln.accept()
        client._sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)  # type: ignore[attr-defined]
        sender, receiver = FramedConn(client, send_queue=4), FramedConn(server)
        sent: list[bytes] = []
        got: list[bytes] = []
        done: gosim.Chan[None] = gosim.Chan()

        async def read_all() -> None:
            while True:
                frame = await receiver.read_frame()
                if frame is None:
                    break
                got.append(frame)
                if len(got) % 7 == 0:
                    await gosim.sleep(0.001)  # a slow reader: the sender meets full buffers
            await done.send(None)

        go(read_all)
        rng = random.Random(5)
        for i in range(300):
            size = rng.choice([10, 3000, 40000])
            frames = [b"%d.%d:" % (i, k) + b"x" * size for k in range(rng.randint(1, 3))]
            if rng.randrange(2):
                await sender.send_many(frames)
            else:
                for f in frames:
                    await sender.send(f)
            sent += frames
        await sender.aclose(flush=True)
        await done.recv()
        await receiver.aclose()
        ln.close()
        return sent, got

    sent, got = gosim.run(main, procs=1)
    assert [f[:12] for f in got] == [f[:12] for f in sent]
    assert got == sent


def test_send_nowait_goes_out_at_once_and_a_failed_send_fails_the_connection() -> None:
    # A control frame with nothing queued for the writer goroutine is sent by the
    # caller itself (with the C writer): the peer's socket holds it before any
    # goroutine switch. Once the peer has reset the connection, send_nowait says False
    # (it never raises: heartbeats call it) and the next send raises the error.
    async def main() -> tuple[bytes, bool, type[BaseException] | None]:
        ln = net.listen("tcp", "127.0.0.1:0")
        client = await net.dial("tcp", ln.addr())
        server = await ln.accept()
        fc = FramedConn(client)
        peer: socket.socket = server._sock  # type: ignore[attr-defined]
        assert fc.send_nowait(b"ping")
        if fc._frame_writer is None:  # a connection without SyscallConn queues it
            await gosim.sleep(0.05)
        at_once = peer.recv(100, socket.MSG_DONTWAIT)
        peer.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        server.close()
        accepted = True
        for _ in range(200):  # bounded: the reset arrives within a few sends
            accepted = fc.send_nowait(b"x" * 1000)
            if not accepted:
                break
            await gosim.sleep(0.005)
        raised: type[BaseException] | None = None
        try:
            await fc.send(b"after")
        except OSError as exc:
            raised = type(exc)
        await fc.aclose(flush=False)
        ln.close()
        return at_once, accepted, raised

    at_once, accepted, raised = gosim.run(main, procs=1)
    assert at_once == b"\x00\x00\x00\x04ping"
    assert not accepted
    # The socket's own error with the C writer (a reset or a broken pipe), gosim.net's
    # BrokenError through Conn.write on the pure-Python path: a ConnectionError both ways.
    assert raised is not None and issubclass(raised, ConnectionError)


def test_an_alarm_with_a_recheck_sleeps_on_to_a_deadline_that_moved() -> None:
    # A heartbeat's sleep: the timer fires at 1.0, the recheck says the deadline moved
    # to 2.5 (the peer was heard meanwhile), and the sleeper wakes once, at 2.5, not at
    # 1.0; a recheck saying "due" wakes it; a ring wakes it whatever the timer.
    from netframe._conn import _Alarm  # noqa: PLC0415  # the heartbeat's own primitive

    async def main() -> list[tuple[str, float]]:
        log: list[tuple[str, float]] = []
        alarm = _Alarm()
        deadlines = [2.5, 2.5]

        def recheck() -> float:
            log.append(("recheck", gosim.now()))
            return deadlines.pop(0) if deadlines else 0.0

        await alarm.sleep_until(1.0, recheck)
        log.append(("woke", gosim.now()))
        await alarm.sleep_until(3.0, recheck)  # the recheck says due: wakes at 3.0
        log.append(("woke", gosim.now()))

        async def ring_later() -> None:
            await gosim.sleep(1.0)
            alarm.ring()

        go(ring_later)
        await alarm.sleep_until(100.0, recheck)
        log.append(("woke", gosim.now()))
        return log

    log = gosim.run(main, procs=1, seed=1, virtual_time=True)
    assert log == [
        ("recheck", 1.0),
        ("recheck", 2.5),
        ("woke", 2.5),
        ("recheck", 3.0),
        ("woke", 3.0),
        ("woke", 4.0),
    ]
