"""netframe's Server and Client over real loopback TCP (gosim.net), session and raw."""

from __future__ import annotations

import socket
import struct
import tracemalloc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gosim
import netframe
from gosim import Chan, go, net


async def echo(payload: bytes) -> bytes:
    return payload


def test_session_server_and_clients_over_tcp() -> None:
    async def main() -> tuple[int, int]:
        ln = net.listen("tcp", "127.0.0.1:0")
        # Server and clients share one process: a stall of the process (a loaded CI
        # machine, the pure-Python path) silences both sides at once, so the timeout
        # (two intervals) must outlast such a stall; it was 0.4 s and failed under load,
        # and a loaded 2-core machine stalls a process for over a second at times.
        server = netframe.Server(echo, heartbeat_interval=1.0)
        go(server.serve, ln)
        done: Chan[int] = Chan(50)

        async def client(k: int) -> None:
            c = netframe.Client(
                lambda: net.dial("tcp", ln.addr()), heartbeat_interval=1.0, heartbeat_timeout=4.0
            )
            await c.connect()
            ok = 0
            for i in range(10):
                await c.send(b"%d/%d" % (k, i))
                ok += await c.recv() == b"%d/%d" % (k, i)
            await gosim.sleep(2.4)  # quiet for over two intervals: heartbeats keep it alive
            await c.send(b"still here")
            ok += await c.recv() == b"still here"
            await c.close()
            await done.send(ok)

        for k in range(50):
            go(client, k)
        total = sum([await done.recv() or 0 for _ in range(50)])
        await server.shutdown()
        return total, server.statistics().dead_peers

    assert gosim.run(main, procs=2) == (550, 0)


def test_raw_server_answers_a_pipelined_burst_in_order() -> None:
    async def main() -> bool:
        ln = net.listen("tcp", "127.0.0.1:0")
        server = netframe.Server(echo, raw=True, max_in_flight=1)
        go(server.serve, ln)
        fc = netframe.FramedConn(await net.dial("tcp", ln.addr()))
        msgs = [b"%d" % i * (i % 50) for i in range(5000)]
        await fc.write_frames(msgs)
        got = []
        while len(got) < len(msgs):
            frames = await fc.read_frames()
            assert frames
            got += frames
        fc.conn.close()
        await server.shutdown()
        return got == msgs

    assert gosim.run(main, procs=2)


def test_a_thousand_concurrent_tcp_connections_with_heartbeats() -> None:
    n = 1_000

    async def main() -> tuple[int, int, int]:
        ln = net.listen("tcp", "127.0.0.1:0")
        # Two thousand sessions share one driver thread here (both ends in this process):
        # a one-second interval keeps the heartbeat load (about 4,000 frames/s) well
        # within what it can serve, so a timeout would mean a real bug. A peer is dead
        # after 4 s without a frame (not the default two intervals), so that a loaded
        # machine's pause of a second or two is not taken for one.
        server = netframe.Server(echo, heartbeat_interval=1.0, heartbeat_timeout=4.0)
        go(server.serve, ln)
        done: Chan[int] = Chan(n)
        gate: Chan[None] = Chan()

        async def client(k: int) -> None:
            c = netframe.Client(
                lambda: net.dial("tcp", ln.addr()), heartbeat_interval=1.0, heartbeat_timeout=4.0
            )
            await c.connect()
            await gate.recv()  # all connected at once before anyone talks
            ok = 0
            for i in range(2):
                await c.send(b"%d/%d" % (k, i))
                ok += await c.recv() == b"%d/%d" % (k, i)
                if i == 0:
                    # Quiet for longer than the timeout: only heartbeats keep it alive.
                    await gosim.sleep(5.0)
            await c.close()
            await done.send(ok)

        for k in range(n):
            go(client, k)
        deadline = gosim.now() + 60.0  # bounded: a lost connection must fail, not hang
        while server.statistics().connections < n:
            if gosim.now() > deadline:
                raise TimeoutError(f"{server.statistics().connections} of {n} connected in 60 s")
            await gosim.sleep(0.01)
        peak = server.statistics().connections
        gate.close()
        total = sum([await done.recv() or 0 for _ in range(n)])
        await server.shutdown()
        return peak, total, server.statistics().dead_peers

    assert gosim.run(main, procs=2) == (n, 2 * n, 0)


def test_client_on_data_gets_every_payload_in_order_and_awaits_what_it_returns() -> None:
    # on_data runs on the reader: a burst of echoes (sends past the send queue's room
    # fall back from the write-through to the queue) comes back whole and in order, an
    # awaitable it returns holds the next payload back until it is done, and recv()
    # reports only the end.
    n = 3000

    async def main() -> tuple[bool, bool, str, int]:
        ln = net.listen("tcp", "127.0.0.1:0")
        # One handler at a time answers in order (with more in flight, replies that
        # meet a full send queue wait in a goroutine and later ones may pass them).
        server = netframe.Server(lambda payload: payload, heartbeat_interval=None, max_in_flight=1)
        go(server.serve, ln)
        got: list[bytes] = []
        slow_done: list[int] = []
        overlapped = [False]
        all_in: Chan[None] = Chan(1)

        async def slow(i: int) -> None:
            await gosim.sleep(0.01)
            slow_done.append(i)

        def on_data(payload: bytes) -> object:
            if slow_done != [i for i in range(0, len(got), 500)]:
                overlapped[0] = True  # a payload came before the last slow one ended
            got.append(payload)
            if len(got) == n:
                all_in.try_send(None)
            i = len(got) - 1
            return slow(i) if i % 500 == 0 else None

        c = netframe.Client(
            lambda: net.dial("tcp", ln.addr()), heartbeat_interval=None, on_data=on_data
        )
        await c.connect()
        sent = [b"%d:" % i + b"x" * (i % 700) for i in range(n)]
        for payload in sent:
            await c.send(payload)
        await all_in.recv()
        await server.shutdown(grace=1.0)
        try:
            await c.recv()
            ended = "no end"
        except netframe.ConnectionLost as exc:
            ended = type(exc).__name__
        ln.close()
        return got == sent, overlapped[0], ended, len(slow_done)

    assert gosim.run(main, procs=2) == (True, False, "ConnectionLost", n // 500)


def test_client_send_after_the_server_resets_raises_connection_lost() -> None:
    # The peer resets the connection (SO_LINGER 0): whether the client's writer meets
    # the reset or its reader does first, send() raises ConnectionLost, never a raw
    # OSError, so a caller has one exception to catch for "connection gone".
    async def main() -> str:
        ln = net.listen("tcp", "127.0.0.1:0")
        c = netframe.Client(lambda: net.dial("tcp", ln.addr()), heartbeat_interval=None)
        await c.connect()
        peer = await ln.accept()
        peer._sock.setsockopt(  # type: ignore[attr-defined]
            socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
        )
        peer.close()
        try:
            # No pause: the send queue fills, the writer goroutine runs and meets the
            # reset before the reader has been woken to notice it.
            for _ in range(5000):
                await c.send(b"x" * 1000)
        except netframe.ConnectionLost as exc:
            return type(exc).__name__
        finally:
            ln.close()
        return "never raised"

    assert gosim.run(main, procs=1) == "ConnectionLost"


async def _write_twice(
    ln: net.Listener, fmt: netframe.FrameFormat, payloads: list[bytes | bytearray | memoryview]
) -> None:
    fc = netframe.FramedConn(await ln.accept(), fmt)
    await fc.write_frames(payloads)  # at once
    for p in payloads:  # and through the batching writer goroutine
        await fc.send(p)
    await fc.aclose()


def test_large_frames_are_gathered_and_arrive_whole_in_any_format() -> None:
    # Large payloads take the gathering path (header and payload in one sendmsg, no
    # copy); small ones the encoded buffer. Both, mixed, in formats with a preamble,
    # a uvarint or an adjusted length, come back as they were sent.
    formats = [
        netframe.FrameFormat(),
        netframe.FrameFormat(length_size="uvarint", max_frame_length=1 << 22),
        netframe.FrameFormat(
            length_size=2,
            byteorder="little",
            length_offset=3,
            length_adjustment=-2,
            max_frame_length=65_000,
        ),
        netframe.FrameFormat(length_size=8, length_includes_header=True),
    ]

    async def main() -> list[bool]:
        results = []
        for fmt in formats:
            ln = net.listen("tcp", "127.0.0.1:0")
            big = min(fmt.max_frame_length, 3_000_000)
            payloads = [bytes([i]) * (big - i) if i % 2 == 0 else b"small%d" % i for i in range(6)]
            payloads += [bytearray(b"q" * min(70_000, big)), memoryview(b"m" * 65_000)]
            go(_write_twice, ln, fmt, payloads)
            fc = netframe.FramedConn(await net.dial("tcp", ln.addr()), fmt)
            got = []
            while frames := await fc.read_frames():
                got += frames
            fc.conn.close()
            ln.close()
            results.append(got == [bytes(p) for p in payloads] * 2)
        return results

    assert gosim.run(main, procs=2) == [True] * len(formats)


def test_large_frame_read_in_place_survives_a_timeout_and_reports_an_early_end() -> None:
    # A read deadline passes while a large frame is half received in place: the
    # bytes go back to the decoder and the next read returns the frame whole. Then
    # the peer closes inside a second large frame: IncompleteFrame with its count.
    big = bytes(range(256)) * 4096  # 1 MiB

    async def main() -> tuple[bool, int]:
        ln = net.listen("tcp", "127.0.0.1:0")
        step: Chan[None] = Chan()

        async def peer() -> None:
            c = await ln.accept()
            wire = netframe.FrameFormat().encode(big)
            await c.write(wire[:400_000])
            await step.recv()  # the reader has timed out meanwhile
            await c.write(wire[400_000:])
            await c.write(wire[:700_000])  # the start of a second frame, then close
            c.close()

        go(peer)
        fc = netframe.FramedConn(await net.dial("tcp", ln.addr()))
        fc.conn.set_read_deadline(gosim.now() + 0.2)  # type: ignore[attr-defined]
        try:
            await fc.read_frames()
            raise AssertionError("no timeout")
        except net.DeadlineExceeded:
            pass
        fc.conn.set_read_deadline(None)  # type: ignore[attr-defined]
        await step.send(None)
        frames = await fc.read_frames()
        try:
            await fc.read_frame()
            raise AssertionError("no IncompleteFrame")
        except netframe.IncompleteFrame as exc:
            buffered = exc.buffered
        # The frame received in place is counted like any other (by the decoder too,
        # on the general path; the C reader, where built, receives it in place itself).
        assert fc.frames_read == 1
        if fc._reader is None:
            assert fc._decoder.statistics().frames_decoded == 1
        fc.conn.close()
        ln.close()
        return frames == [big], buffered

    assert gosim.run(main, procs=2) == (True, 700_000)


def test_raw_batch_handler_gets_each_receive_and_replies_in_order() -> None:
    sizes: list[int] = []

    async def batch(payloads: list[bytes]) -> list[bytes | None]:
        sizes.append(len(payloads))
        return [None if p == b"skip" else p[::-1] for p in payloads]

    async def main() -> bool:
        ln = net.listen("tcp", "127.0.0.1:0")
        server = netframe.Server(handle_batch=batch, raw=True)
        go(server.serve, ln)
        fc = netframe.FramedConn(await net.dial("tcp", ln.addr()))
        msgs = [b"skip" if i % 10 == 0 else b"%d" % i * (i % 50) for i in range(5000)]
        await fc.write_frames(msgs)
        want = [m[::-1] for m in msgs if m != b"skip"]
        got: list[bytes] = []
        while len(got) < len(want):
            frames = await fc.read_frames()
            assert frames
            got += frames
        fc.conn.close()
        await server.shutdown()
        return got == want

    assert gosim.run(main, procs=2)
    assert sum(sizes) == 5000 and max(sizes) > 1  # batches, not one call per frame


@given(
    sizes=st.lists(
        st.integers(0, 200) | st.sampled_from([70_000, 300_000]), min_size=1, max_size=25
    ),
    chunk=st.integers(1, 5000),
    readers=st.lists(st.sampled_from(["frames", "frame"]), min_size=1, max_size=8),
    garbage=st.booleans(),
)
@settings(max_examples=30, deadline=None)
def test_framed_conn_reads_any_split_mixing_read_frame_and_read_frames(
    sizes: list[int], chunk: int, readers: list[str], garbage: bool
) -> None:
    # Whatever the receive path (the C reader with its carried partial frame, large
    # frames received in place, the decoder after a hand-back) and however the calls
    # alternate, the frames come back in order, the counters match the wire, and a
    # bad header after them is the codec's error.
    fmt = netframe.FrameFormat()
    payloads = [bytes([i % 251]) * n for i, n in enumerate(sizes)]
    wire = fmt.encode_many(payloads) + (b"\xff\xff\xff\xff" if garbage else b"")

    async def main() -> tuple[list[bytes], str, int, int]:
        ln = net.listen("tcp", "127.0.0.1:0")

        async def peer() -> None:
            c = await ln.accept()
            step = max(chunk, len(wire) // 300)  # at most ~300 writes, a pause in three
            for k, i in enumerate(range(0, len(wire), step)):
                await c.write(wire[i : i + step])
                if k % 3 == 0:
                    await gosim.sleep(0.0005)
            c.close()

        go(peer)
        fc = netframe.FramedConn(await net.dial("tcp", ln.addr()), fmt)
        fc.conn.set_read_deadline(gosim.now() + 20)  # type: ignore[attr-defined]
        got: list[bytes] = []
        end = "eof"
        k = 0
        try:
            while True:
                how = readers[k % len(readers)]
                k += 1
                if how == "frame":
                    frame = await fc.read_frame()
                    if frame is None:
                        break
                    got.append(frame)
                else:
                    frames = await fc.read_frames()
                    if not frames:
                        break
                    got.extend(frames)
        except netframe.FrameTooLarge:
            end = "too large"
        fc.conn.close()
        ln.close()
        return got, end, fc.frames_read, fc.bytes_read

    got, end, frames_read, bytes_read = gosim.run(main, procs=2)
    assert got == payloads
    assert frames_read == len(payloads)
    assert end == ("too large" if garbage else "eof")
    assert bytes_read == len(wire)


def test_framed_conn_over_a_closed_conn_reports_closed_on_use() -> None:
    async def main() -> list[str]:
        ln = net.listen("tcp", "127.0.0.1:0")
        c = await net.dial("tcp", ln.addr())
        c.close()
        fc = netframe.FramedConn(c)  # no fast path to set up; no error yet
        seen = []
        for op in (fc.read_frames, fc.read_frame, lambda: fc.write_frames([b"x"])):
            try:
                await op()
            except net.ClosedError:
                seen.append("closed")
        ln.close()
        return seen

    assert gosim.run(main) == ["closed", "closed", "closed"]


def test_a_large_frames_header_alone_does_not_allocate_the_frame() -> None:
    # A peer announces a 12 MiB frame and sends 100 bytes of it, then stalls: the
    # reading side holds about what arrived (both the C reader and, with
    # GOSIM_PURE_PYTHON=1, the general path), not the announced 12 MiB.
    fmt = netframe.FrameFormat()
    wire = fmt.encode(b"x" * (12 << 20))

    async def main() -> int:
        ln = net.listen("tcp", "127.0.0.1:0")
        stalled: Chan[None] = Chan()

        async def peer() -> None:
            c = await ln.accept()
            await c.write(wire[:100])
            await stalled.recv()
            c.close()

        go(peer)
        fc = netframe.FramedConn(await net.dial("tcp", ln.addr()), fmt)
        fc.conn.set_read_deadline(gosim.now() + 0.2)  # type: ignore[attr-defined]
        tracemalloc.start()
        try:
            await fc.read_frames()
            raise AssertionError("a frame from 100 bytes")
        except net.DeadlineExceeded:
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        await stalled.send(None)
        fc.conn.close()
        ln.close()
        return peak

    assert gosim.run(main) < 2 << 20


def test_framed_conn_counts_what_it_writes_on_either_path() -> None:
    # Small frames go through the C writer, large ones through the gathering sendmsg,
    # the writer goroutine batches sends: frames, bytes and writes are counted alike,
    # and statistics() reports them.
    fmt = netframe.FrameFormat()
    small = [b"a" * 10, b"b" * 20]
    large = [b"L" * 70_000]
    queued = [b"q%d" % i for i in range(5)]
    wire = fmt.encode_many(small) + fmt.encode_many(large) + fmt.encode_many(queued)

    async def main() -> tuple[bytes, netframe.FramedConnStatistics]:
        ln = net.listen("tcp", "127.0.0.1:0")
        got: Chan[bytes] = Chan(1)

        async def peer() -> None:
            c = await ln.accept()
            data = b""
            while len(data) < len(wire):
                data += await c.read(1 << 20)
            await got.send(data)
            c.close()

        go(peer)
        fc = netframe.FramedConn(await net.dial("tcp", ln.addr()), fmt)
        await fc.write_frames(small)
        await fc.write_frame(large[0])
        for q in queued:
            await fc.send(q)
        await fc.flush()
        data = await got.recv()
        stats = fc.statistics()
        await fc.aclose()
        ln.close()
        return data, stats

    data, stats = gosim.run(main)
    assert data == wire
    assert stats.frames_written == len(small) + len(large) + len(queued)
    assert stats.bytes_written == len(wire)
    assert 3 <= stats.writes <= 2 + len(queued)


@pytest.mark.parametrize("size", [4000, 1 << 20])
def test_framed_conn_write_past_its_deadline_says_how_many_bytes_went_out(size: int) -> None:
    # Small frames take the encoded write (in C where built), large ones the gathering
    # sendmsg: either way a write deadline's DeadlineExceeded says how many bytes of the
    # encoded frames went out, and the peer receives exactly those.
    fmt = netframe.FrameFormat()
    payloads = [bytes([i % 251]) * size for i in range(8 * (1 << 20) // size)]
    wire = fmt.encode_many(payloads)

    async def main() -> tuple[int, int]:
        ln = net.listen("tcp", "127.0.0.1:0")
        peer: Chan[net.Conn] = Chan(1)

        async def acceptor() -> None:
            await peer.send(await ln.accept())

        go(acceptor)
        fc = netframe.FramedConn(await net.dial("tcp", ln.addr()), fmt)
        server_side = await peer.recv()
        assert server_side is not None
        fc.conn.set_write_deadline(gosim.now() + 0.2)  # type: ignore[attr-defined]
        try:
            await fc.write_frames(payloads)
            raise AssertionError("no timeout")
        except net.DeadlineExceeded as exc:
            written = exc.written
        fc.conn.close()
        received = 0
        while data := await server_side.read(1 << 20):
            assert data == wire[received : received + len(data)]
            received += len(data)
        server_side.close()
        ln.close()
        return written, received

    written, received = gosim.run(main, procs=2)
    assert 0 < written < len(wire)
    assert received == written
