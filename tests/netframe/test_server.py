"""netframe.Server and Client over an in-memory network: request/response, heartbeats
and dead peers, idle timeout, connection limit, graceful shutdown, reconnect backoff."""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gosim
from gosim import Chan, go
from netframe import Data, FrameFormat, GoAway, GoAwayCode, Kind, Session, _handlers
from netframe import _server as _server_module
from netframe._client import Client, ConnectionLost
from netframe._conn import FramedConn
from netframe._server import Server


class MemoryConn:
    """One end of an in-memory stream; closing a channel is the end of stream."""

    def __init__(self, inbox: Chan[bytes], outbox: Chan[bytes]) -> None:
        self.inbox, self.outbox = inbox, outbox
        self.pending = b""

    async def read(self, n: int) -> bytes:
        if not self.pending:
            data = await self.inbox.recv()
            if data is None:
                return b""
            self.pending = data
        out, self.pending = self.pending[:n], self.pending[n:]
        return out

    async def write(self, data: bytes) -> int:
        try:
            await self.outbox.send(bytes(data))
        except gosim.SendOnClosedChannel:
            raise BrokenPipeError("peer closed") from None
        return len(data)

    def close(self) -> None:
        for ch in (self.outbox, self.inbox):
            if not ch.closed:
                ch.close()


def conn_pair(capacity: int = 256) -> tuple[MemoryConn, MemoryConn]:
    ab: Chan[bytes] = Chan(capacity)
    ba: Chan[bytes] = Chan(capacity)
    return MemoryConn(ba, ab), MemoryConn(ab, ba)


class MemoryListener:
    def __init__(self) -> None:
        self.pending: Chan[MemoryConn] = Chan(1024)
        self.refuse = 0  # dials to refuse before accepting (to exercise backoff)

    async def accept(self) -> MemoryConn:
        c = await self.pending.recv()
        if c is None:
            raise OSError("use of closed network connection")
        return c

    def close(self) -> None:
        if not self.pending.closed:
            self.pending.close()

    async def dial(self) -> MemoryConn:
        if self.refuse:
            self.refuse -= 1
            raise ConnectionRefusedError("refused")
        if self.pending.closed:
            raise ConnectionRefusedError("listener closed")
        a, b = conn_pair()
        await self.pending.send(b)
        return a


def vrun(main):  # type: ignore[no-untyped-def]
    return gosim.run(main, procs=2, seed=3, virtual_time=True)


async def echo(payload: bytes) -> bytes:
    return payload


def test_many_clients_request_response_then_graceful_shutdown() -> None:
    async def main() -> tuple[int, int, int]:
        ln = MemoryListener()
        server = Server(echo, heartbeat_interval=1.0)
        served: Chan[None] = Chan(1)

        async def run_server() -> None:
            await server.serve(ln)
            await served.send(None)

        go(run_server)
        done: Chan[int] = Chan(100)

        async def client(k: int) -> None:
            c = Client(ln.dial, heartbeat_interval=1.0)
            await c.connect()
            n = 0
            for i in range(20):
                msg = f"{k}:{i}".encode()
                await c.send(msg)
                assert await c.recv() == msg
                n += 1
                await gosim.sleep(0.1)
            await c.close()
            await done.send(n)

        for k in range(100):
            go(client, k)
        total = 0
        for _ in range(100):
            total += await done.recv() or 0
        peak = server.statistics().accepted
        await server.shutdown()
        await served.recv()
        return total, peak, server.statistics().connections

    assert vrun(main) == (2000, 100, 0)


def test_dead_peer_is_detected_within_two_heartbeat_intervals() -> None:
    async def main() -> tuple[int, float]:
        ln = MemoryListener()
        server = Server(echo, heartbeat_interval=1.0)
        go(server.serve, ln)
        conn = await ln.dial()  # a raw peer that never answers pings
        start = gosim.now()
        while server.statistics().dead_peers == 0:
            await gosim.sleep(0.05)
        elapsed = gosim.now() - start
        conn.close()
        await server.shutdown()
        return server.statistics().dead_peers, elapsed

    dead, elapsed = vrun(main)
    assert dead == 1
    assert elapsed <= 2.0 + 0.1  # two intervals, plus the polling step of this test


def test_idle_connection_gets_goaway_idle_timeout() -> None:
    async def main() -> tuple[int, object]:
        ln = MemoryListener()
        server = Server(echo, heartbeat_interval=1.0, idle_timeout=3.0)
        go(server.serve, ln)
        fc = FramedConn(await ln.dial())
        session = Session(gosim.now(), heartbeat_interval=1.0)
        last = None
        writable = True
        while True:  # answer pings like a live but silent client
            frame = await fc.read_frame()
            if frame is None:
                break
            event = session.receive(frame, gosim.now())
            if isinstance(event, GoAway):
                last = event
            try:
                for out in session.poll(gosim.now()):
                    if writable:
                        await fc.write_frame(out)
            except BrokenPipeError:
                # The server wrote its GOAWAY and closed: a pong to a ping read before
                # the GOAWAY may meet the closed connection. What it sent is still
                # there to read.
                writable = False
        await server.shutdown()
        return server.statistics().idle_closed, last

    idle_closed, last = vrun(main)
    assert idle_closed == 1
    assert last == GoAway(GoAwayCode.IDLE_TIMEOUT, "idle")


def test_connection_limit_answers_goaway_and_closes() -> None:
    async def main() -> tuple[object, int]:
        ln = MemoryListener()
        server = Server(echo, max_connections=2, heartbeat_interval=None)
        go(server.serve, ln)
        keep = [FramedConn(await ln.dial()) for _ in range(2)]
        await gosim.sleep(0.1)
        extra = FramedConn(await ln.dial())
        frame = await extra.read_frame()
        assert frame is not None and frame[0] == Kind.GOAWAY
        event = Session(0.0).receive(frame, 0.0)
        end = await extra.read_frame()
        for fc in keep:
            fc.conn.close()
        await server.shutdown()
        return event, (end is None) + server.statistics().rejected

    event, n = vrun(main)
    assert event == GoAway(GoAwayCode.CONNECTION_LIMIT, "connection limit")
    assert n == 2


def test_shutdown_loses_no_in_flight_reply() -> None:
    async def slow(payload: bytes) -> bytes:
        await gosim.sleep(1.0)
        return b"done:" + payload

    async def main() -> tuple[list[bytes], str]:
        ln = MemoryListener()
        server = Server(slow, heartbeat_interval=None, grace_period=5.0)
        go(server.serve, ln)
        c = Client(ln.dial, heartbeat_interval=None)
        await c.connect()
        for i in range(10):
            await c.send(str(i).encode())
        await gosim.sleep(0.1)  # all ten are in flight
        go(server.shutdown)
        got = []
        reason = ""
        try:
            while True:
                got.append(await c.recv())
        except ConnectionLost as exc:
            reason = exc.reason
        return sorted(got), reason

    got, reason = vrun(main)
    assert got == sorted(b"done:" + str(i).encode() for i in range(10))
    assert "GOAWAY(0)" in reason


def test_client_reconnects_with_exponential_backoff_and_jitter() -> None:
    async def main() -> tuple[int, float]:
        ln = MemoryListener()
        go(Server(echo, heartbeat_interval=None).serve, ln)
        ln.refuse = 5
        c = Client(
            ln.dial,
            heartbeat_interval=None,
            backoff_initial=0.1,
            backoff_max=1.0,
            rng=random.Random(4),
        )
        start = gosim.now()
        await c.connect()
        waited = gosim.now() - start
        await c.send(b"x")
        assert await c.recv() == b"x"
        return c.attempts, waited

    attempts, waited = vrun(main)
    assert attempts == 6
    assert 0 < waited <= 0.1 + 0.2 + 0.4 + 0.8 + 1.0  # each wait at most its backoff


def test_client_gives_up_after_max_attempts() -> None:
    async def main() -> str:
        ln = MemoryListener()
        ln.refuse = 100
        c = Client(ln.dial, max_attempts=3, backoff_initial=0.01)
        try:
            await c.connect()
        except ConnectionRefusedError as exc:
            return f"{c.attempts} {exc}"
        return "connected?"

    assert vrun(main) == "3 refused"


def test_garbage_from_a_client_is_a_protocol_error() -> None:
    async def main() -> int:
        ln = MemoryListener()
        server = Server(echo, heartbeat_interval=None, format=FrameFormat(max_frame_length=1024))
        go(server.serve, ln)
        conn = await ln.dial()
        await conn.write(b"\x00\x00\x00\x02\x09\x09")  # a frame of unknown kind 9
        while await conn.read(100):
            pass
        await server.shutdown()
        return server.statistics().protocol_errors

    assert vrun(main) == 1


def _many_connections(n: int) -> tuple[int, int, int]:
    async def main() -> tuple[int, int, int]:
        ln = MemoryListener()
        server = Server(echo, heartbeat_interval=1.0)
        go(server.serve, ln)
        done: Chan[int] = Chan(n)
        start: Chan[None] = Chan()

        async def client(k: int) -> None:
            c = Client(ln.dial, heartbeat_interval=1.0)
            await c.connect()
            await start.recv()  # everyone connected before anyone talks
            ok = 0
            for i in range(3):
                await gosim.sleep(1.5)  # quiet long enough for heartbeats to run
                await c.send(b"%d:%d" % (k, i))
                ok += await c.recv() == b"%d:%d" % (k, i)
            await c.close()
            await done.send(ok)

        for k in range(n):
            go(client, k)
        while server.statistics().connections < n:
            await gosim.sleep(0.01)
        peak = server.statistics().connections
        start.close()
        total = 0
        for _ in range(n):
            total += await done.recv() or 0
        await server.shutdown()
        return peak, total, server.statistics().dead_peers

    result: tuple[int, int, int] = vrun(main)
    return result


def test_a_thousand_concurrent_long_connections_with_heartbeats() -> None:
    assert _many_connections(1_000) == (1_000, 3_000, 0)


@pytest.mark.slow
def test_ten_thousand_concurrent_long_connections_with_heartbeats() -> None:
    assert _many_connections(10_000) == (10_000, 30_000, 0)


def test_a_slow_reader_does_not_stall_other_connections() -> None:
    async def main() -> tuple[int, int]:
        ln = MemoryListener()
        server = Server(echo, heartbeat_interval=None, send_queue=16)
        go(server.serve, ln)
        sluggish = Client(ln.dial, heartbeat_interval=None)
        await sluggish.connect()
        for _ in range(5_000):  # replies pile up: this client never reads them
            await sluggish.send(b"x" * 100)
        fast = Client(ln.dial, heartbeat_interval=None)
        await fast.connect()
        answered = 0
        for i in range(100):
            await fast.send(b"%d" % i)
            answered += await fast.recv() == b"%d" % i
        return answered, server.statistics().connections

    assert vrun(main) == (100, 2)


def test_reset_in_the_middle_of_a_frame_is_counted_and_closed() -> None:
    async def main() -> tuple[int, int]:
        ln = MemoryListener()
        server = Server(echo, heartbeat_interval=None)
        go(server.serve, ln)
        conn = await ln.dial()
        await conn.write(b"\x00\x00\x00\x10\x00half")  # announces 16 bytes, sends 5
        conn.close()
        await gosim.sleep(0.1)
        return server.statistics().protocol_errors, server.statistics().connections

    assert vrun(main) == (1, 0)


def test_server_needs_exactly_one_kind_of_handler() -> None:
    async def batch(payloads: list[bytes]) -> list[bytes | None]:
        return list(payloads)

    with pytest.raises(TypeError, match="handler or a handle_batch"):
        Server()
    with pytest.raises(TypeError, match="handler or a handle_batch"):
        Server(echo, handle_batch=batch)
    assert Server(handle_batch=batch).max_in_flight == 1


def test_session_batch_handler_answers_in_order_and_survives_its_own_errors() -> None:
    calls: list[int] = []

    async def batch(payloads: list[bytes]) -> list[bytes | None]:
        calls.append(len(payloads))
        if b"boom" in payloads:
            raise ValueError("a bad batch")
        if b"short" in payloads:
            return []  # wrong length: no replies for this batch
        return [None if p.startswith(b"quiet") else p.upper() for p in payloads]

    async def main() -> tuple[list[bytes], int, int]:
        ln = MemoryListener()
        server = Server(handle_batch=batch, heartbeat_interval=0.5)
        go(server.serve, ln)
        c = Client(ln.dial, heartbeat_interval=0.5)
        await c.connect()
        for p in [b"a", b"quiet1", b"b", b"c"]:
            await c.send(p)
        got = [await c.recv() for _ in range(3)]
        await c.send(b"boom")
        await gosim.sleep(1.6)  # idle past the heartbeat timeout: pongs keep it alive
        await c.send(b"short")
        await gosim.sleep(0.1)  # a write of its own: "after" is in the next batch
        await c.send(b"after")
        got.append(await c.recv())
        await c.close()
        await server.shutdown()
        stats = server.statistics()
        return got, stats.handler_errors, stats.dead_peers

    got, errors, dead = vrun(main)
    assert got == [b"A", b"B", b"C", b"AFTER"]
    assert errors == 2
    assert dead == 0
    assert sum(calls) == 7  # every payload reached the handler once


@pytest.mark.parametrize("heartbeat", [None, 0.5])
def test_heartbeat_goroutines_end_with_their_connections(heartbeat: float | None) -> None:
    # The heartbeat loops sleep until their next deadline (never, without heartbeats
    # and idle timeout) and are woken when the connection ends: no goroutine is left
    # behind, on either side, whether the client or the server ends the connection.
    async def main() -> list[int]:
        ln = MemoryListener()
        server = Server(echo, heartbeat_interval=heartbeat)
        go(server.serve, ln)
        await gosim.sleep(0.01)
        counts = [gosim.statistics().goroutines]
        for who_ends in ("client", "server"):
            c = Client(ln.dial, heartbeat_interval=heartbeat)
            await c.connect()
            await c.send(b"x")
            assert await c.recv() == b"x"
            if who_ends == "client":
                await c.close()
            else:
                await server.shutdown(grace=0.1)
                try:
                    await c.recv()
                except ConnectionLost:
                    pass
                await c.close()
            await gosim.sleep(0.05)  # far less than a heartbeat interval
            counts.append(gosim.statistics().goroutines)
        return counts

    baseline, after_client_end, after_server_end = gosim.run(main, procs=1)
    assert after_client_end == baseline
    # serve() returned after the shutdown; nothing of the connection is left (the
    # client's FramedConn writer goroutine used to stay behind after a lost connection).
    assert after_server_end == baseline - 1


def test_dead_peers_leave_no_goroutines_behind() -> None:
    # Peers that go silent are closed by the server's heartbeat check; each one's
    # reader, heartbeat and FramedConn writer goroutines all end.
    async def main() -> tuple[int, int, int]:
        ln = MemoryListener()
        server = Server(echo, heartbeat_interval=0.05, heartbeat_timeout=0.1)
        go(server.serve, ln)
        await gosim.sleep(0.01)
        baseline = gosim.statistics().goroutines
        silent = [await ln.dial() for _ in range(20)]  # connect, then never answer
        await gosim.sleep(0.5)
        dead = server.statistics().dead_peers
        for conn in silent:
            conn.close()
        await gosim.sleep(0.05)
        return baseline, gosim.statistics().goroutines, dead

    baseline, after, dead = gosim.run(main, procs=1)
    assert dead == 20
    assert after == baseline


def test_plain_function_handlers_reply_without_a_coroutine() -> None:
    # A plain function's return value is the reply; an awaitable it returns is
    # awaited; a bytearray reply is a reply (not something to await); its exceptions
    # count as handler errors. Raw and session modes, a handler per frame and batches.
    calls: list[str] = []

    def plain(payload: bytes) -> bytes | bytearray | None:
        calls.append("plain")
        if payload == b"boom":
            raise ValueError("bad request")
        if payload == b"quiet":
            return None
        if payload == b"array":
            return bytearray(b"from a bytearray")
        return payload.upper()

    async def later(payload: bytes) -> bytes:
        await gosim.sleep(0.001)
        return b"awaited " + payload

    def returns_awaitable(payload: bytes) -> Any:
        calls.append("indirect")
        return later(payload)

    def plain_batch(payloads: list[bytes]) -> list[bytes | None]:
        calls.append("batch")
        return [p[::-1] for p in payloads]

    async def main() -> list[object]:
        results: list[object] = []
        for kwargs in (
            {"handler": plain, "raw": True, "max_in_flight": 1},
            {"handler": plain},
            {"handler": plain, "max_in_flight": 1},
            {"handler": returns_awaitable},
            {"handle_batch": plain_batch, "raw": True},
            {"handle_batch": plain_batch},
        ):
            ln = MemoryListener()
            raw = bool(kwargs.get("raw"))
            server = Server(heartbeat_interval=None, **kwargs)  # type: ignore[arg-type]
            go(server.serve, ln)
            conn = await ln.dial()
            fc = FramedConn(conn)
            session = Session(gosim.now(), heartbeat_interval=None)
            out = []
            for payload in (b"hi", b"boom", b"quiet", b"array", b"end"):
                await fc.write_frame(payload if raw else session.data(payload, gosim.now()))
            while len(out) < (3 if kwargs.get("handler") is plain else 5):
                frame = await fc.read_frame()
                assert frame is not None
                if raw:
                    out.append(frame)
                else:
                    event = session.receive(frame, gosim.now())
                    if isinstance(event, Data):
                        out.append(event.payload)
            results.append((out, server.statistics().handler_errors))
            await server.shutdown(grace=0.1)
            await fc.aclose()
        return results

    got = gosim.run(main, procs=1)
    plain_out = ([b"HI", b"from a bytearray", b"END"], 1)
    assert got[0] == plain_out  # raw, inline
    assert got[1][1] == 1 and sorted(got[1][0]) == sorted(plain_out[0])  # goroutine each
    assert got[2] == plain_out  # session, inline
    awaited = [b"awaited " + p for p in (b"hi", b"boom", b"quiet", b"array", b"end")]
    assert sorted(got[3][0]) == sorted(awaited) and got[3][1] == 0
    reversed_all = [p[::-1] for p in (b"hi", b"boom", b"quiet", b"array", b"end")]
    assert got[4] == (reversed_all, 0)
    assert got[5] == (reversed_all, 0)
    assert "indirect" in calls and "batch" in calls


def _op_handler(log: list[str]) -> Any:
    """A handler whose behaviour each frame picks with its first byte."""

    async def suspend_then(payload: bytes) -> bytes:
        await gosim.gosched()  # yields to the driver: the C loop hands the coroutine back
        return b"late " + payload

    async def async_reply(payload: bytes) -> bytes | None:
        return None if payload[1:] == b"none" else b"async " + payload

    async def async_raise(payload: bytes) -> bytes:
        raise KeyError("async failure")

    def handler(payload: bytes) -> Any:
        op = payload[:1]
        log.append(op.decode())
        if op == b"p":
            return b"plain " + payload
        if op == b"b":
            return bytearray(b"array " + payload)
        if op == b"n":
            return None
        if op == b"r":
            raise ValueError("plain failure")
        if op == b"a":
            return async_reply(payload)
        if op == b"x":
            return async_raise(payload)
        if op == b"s":
            return suspend_then(payload)
        raise AssertionError(op)

    return handler


@given(ops=st.lists(st.sampled_from("pbnraxs"), min_size=1, max_size=30))
@settings(max_examples=60, deadline=None)
def test_c_handler_loop_matches_the_python_loop(ops: list[str]) -> None:
    # The raw server's per-frame loop, in C where built (handle_each) and in Python:
    # the same replies in the same order and the same handler_errors, whatever mix of
    # plain replies, None, exceptions, async replies and handlers that wait.
    payloads = [op.encode() + b"%d" % i for i, op in enumerate(ops)]

    def serve(use_c: bool) -> tuple[list[bytes], int, list[str]]:
        log: list[str] = []
        saved = _server_module._handle_each
        if not use_c:
            _server_module._handle_each = _handlers._handle_each_py
        try:

            async def main() -> tuple[list[bytes], int]:
                ln = MemoryListener()
                server = Server(
                    _op_handler(log), raw=True, max_in_flight=1, heartbeat_interval=None
                )
                go(server.serve, ln)
                fc = FramedConn(await ln.dial())
                await fc.write_frames(payloads)  # one burst: one loop call
                await fc.write_frame(b"pend")  # a last reply marks the end
                got: list[bytes] = []
                while not got or got[-1] != b"plain pend":
                    frame = await fc.read_frame()
                    assert frame is not None
                    got.append(frame)
                await server.shutdown(grace=0.1)
                await fc.aclose()
                return got[:-1], server.statistics().handler_errors

            got, errors = gosim.run(main, procs=1)
        finally:
            _server_module._handle_each = saved
        return got, errors, log

    python = serve(False)
    expected = [
        {"p": b"plain ", "b": b"array ", "a": b"async ", "s": b"late "}[op] + p
        for op, p in zip(ops, payloads, strict=True)
        if op in "pbas"
    ]
    assert python[0] == expected
    assert python[1] == sum(op in "rx" for op in ops)
    if _server_module._handle_each is not _handlers._handle_each_py:
        assert serve(True) == python


@pytest.mark.parametrize(
    "handle_each",
    [
        pytest.param(_handlers._handle_each_py, id="python"),
        pytest.param(
            _server_module._handle_each,
            id="c",
            marks=pytest.mark.skipif(
                _server_module._handle_each is _handlers._handle_each_py,
                reason="netframe._speedups not in use (pure Python)",
            ),
        ),
    ],
)
def test_handler_loop_leaves_coroutines_unstarted_without_run(handle_each: Any) -> None:
    # The concurrent strategy's call: an async handler's coroutine comes back unstarted
    # (suspended False), to be run by the goroutine that awaits it; plain replies before
    # it are taken, and the loop goes on from the next index.
    started: list[bytes] = []

    def handler(payload: bytes) -> Any:
        if payload.startswith(b"a"):

            async def later() -> bytes:
                started.append(payload)
                return payload

            return later()
        return payload

    replies: list[bytes] = []
    i, pending, suspended, errors = handle_each(handler, [b"p", b"a1", b"q"], 0, replies, False)
    assert (i, suspended, errors, replies, started) == (1, False, 0, [b"p"], [])
    with pytest.raises(StopIteration) as stop:
        pending.send(None)
    assert stop.value.value == b"a1"
    assert handle_each(handler, [b"p", b"a1", b"q"], 2, replies, False) == (3, None, False, 0)
    assert replies == [b"p", b"q"]
    # With run (the default), the same coroutine is run with one send and returns.
    assert handle_each(handler, [b"a2"], 0, replies) == (1, None, False, 0)
    assert replies == [b"p", b"q", b"a2"]


@pytest.mark.skipif(
    _server_module._handle_each is _handlers._handle_each_py,
    reason="netframe._speedups not in use (pure Python)",
)
def test_c_handler_loop_propagates_what_is_not_an_exception_and_checks_arguments() -> None:
    class Stop(BaseException):
        pass

    def handler(payload: bytes) -> bytes:
        if payload == b"stop":
            raise Stop()
        return payload

    replies: list[bytes] = []
    with pytest.raises(Stop):
        _server_module._handle_each(handler, [b"a", b"stop", b"b"], 0, replies)
    assert replies == [b"a"]
    assert _server_module._handle_each(handler, [b"a", b"b"], 1, replies) == (2, None, False, 0)
    assert replies == [b"a", b"b"]
    with pytest.raises(TypeError):
        _server_module._handle_each(handler, (b"a",), 0, [])
    with pytest.raises(ValueError):
        _server_module._handle_each(handler, [b"a"], -1, [])


def test_a_handler_waiting_when_the_program_ends_runs_its_finally() -> None:
    # A coroutine started by the C loop and suspended is resumed through _resume;
    # closing the goroutine (main returns) reaches the handler's own finally block.
    cleaned: list[str] = []
    started: Chan[None] = Chan(1)

    async def forever(payload: bytes) -> bytes:
        try:
            started.try_send(None)
            await Chan[None]().recv()  # nobody ever sends
            return payload
        finally:
            cleaned.append("finally")

    async def main() -> None:
        ln = MemoryListener()
        go(Server(forever, raw=True, max_in_flight=1, heartbeat_interval=None).serve, ln)
        fc = FramedConn(await ln.dial())
        await fc.write_frame(b"hang")
        await started.recv()

    gosim.run(main, procs=1)
    assert cleaned == ["finally"]


@given(
    delays=st.lists(st.integers(0, 5), min_size=1, max_size=60),
    outcomes=st.lists(st.sampled_from(["reply", "none", "raise"]), min_size=1, max_size=60),
    max_in_flight=st.integers(1, 8),
    send_queue=st.integers(1, 4),
)
@settings(max_examples=40, deadline=None)
def test_raw_replies_follow_request_order_whatever_the_handlers_timing(
    delays: list[int], outcomes: list[str], max_in_flight: int, send_queue: int
) -> None:
    # Raw frames carry no request id: however long each handler takes, and whether it
    # replies, returns None or fails, the replies that exist leave in request order.
    # The last request always replies: its reply comes after every handler has run.
    n = len(delays) + 1

    def outcome(i: int) -> str:
        return "reply" if i == n - 1 else outcomes[i % len(outcomes)]

    async def handler(payload: bytes) -> bytes | None:
        i = int(payload)
        await gosim.sleep(delays[i % len(delays)] / 1000)
        if outcome(i) == "raise":
            raise ValueError(i)
        return None if outcome(i) == "none" else b"re:" + payload

    async def main() -> tuple[list[bytes], int]:
        ln = MemoryListener()
        server = Server(handler, raw=True, max_in_flight=max_in_flight, send_queue=send_queue)
        go(server.serve, ln)
        fc = FramedConn(await ln.dial())
        await fc.write_frames([b"%d" % i for i in range(n)])
        want = sum(outcome(i) == "reply" for i in range(n))
        got: list[bytes] = []
        while len(got) < want:
            frames = await fc.read_frames()
            assert frames, "the server closed before every reply"
            got += frames
        errors = server.statistics().handler_errors
        fc.conn.close()
        await server.shutdown(grace=0.1)
        return got, errors

    got, errors = vrun(main)
    assert got == [b"re:%d" % i for i in range(n) if outcome(i) == "reply"]
    assert errors == sum(outcome(i) == "raise" for i in range(n))


@pytest.mark.parametrize("strategy", ["inline", "concurrent", "batch"])
def test_a_protocol_error_after_requests_in_one_receive_answers_them_then_goaway(
    strategy: str,
) -> None:
    # Whatever the handler strategy, the one reader hands the DATA before a bad frame
    # to the handlers, then takes the one protocol-error path: their replies, then
    # GOAWAY(PROTOCOL_ERROR), one count.
    fmt = FrameFormat()

    def plain(payload: bytes) -> bytes:
        return b"re:" + payload

    def batch(payloads: list[bytes]) -> list[bytes]:
        return [b"re:" + p for p in payloads]

    async def main() -> tuple[list[Any], int]:
        ln = MemoryListener()
        if strategy == "batch":
            server = Server(handle_batch=batch, heartbeat_interval=None)
        else:
            server = Server(
                plain, heartbeat_interval=None, max_in_flight=1 if strategy == "inline" else 8
            )
        go(server.serve, ln)
        conn = await ln.dial()
        wire = fmt.encode_many([b"\x00a", b"\x00b", b"\x09bad", b"\x00c"])
        await conn.write(wire)  # one write: the reader gets all four in one receive
        fc = FramedConn(conn, fmt)
        session = Session(0.0, heartbeat_interval=None)
        events: list[Any] = []
        while (frame := await fc.read_frame()) is not None:
            events.append(session.receive(frame, 0.0))
        await server.shutdown()
        return events, server.statistics().protocol_errors

    events, errors = vrun(main)
    assert events[:2] == [Data(b"re:a"), Data(b"re:b")]
    assert len(events) == 3 and isinstance(events[2], GoAway)
    assert events[2].code == GoAwayCode.PROTOCOL_ERROR
    assert "unknown frame kind 9" in events[2].reason
    assert errors == 1


def test_client_recv_with_a_timeout_loses_nothing() -> None:
    """recv(timeout) raises TimeoutError at its timeout; the late payload is the next
    recv's. A payload in time is returned; an ended connection is still ConnectionLost."""

    async def slow(payload: bytes) -> bytes:
        await gosim.sleep(1.0)
        return b"late:" + payload

    async def main() -> tuple[float, bytes, bytes, str]:
        ln = MemoryListener()
        server = Server(slow, heartbeat_interval=None)
        go(server.serve, ln)
        c = Client(ln.dial, heartbeat_interval=None)
        await c.connect()
        await c.send(b"a")
        t0 = gosim.now()
        try:
            await c.recv(timeout=0.5)
        except TimeoutError:
            waited = gosim.now() - t0
        late = await c.recv()
        await c.send(b"b")
        in_time = await c.recv(timeout=2.0)
        await server.shutdown(grace=0.1)
        try:
            await c.recv(timeout=5.0)
        except ConnectionLost as exc:
            reason = exc.reason
        return waited, late, in_time, reason

    waited, late, in_time, reason = vrun(main)
    assert waited == pytest.approx(0.5)
    assert (late, in_time) == (b"late:a", b"late:b")
    assert "GOAWAY" in reason or "closed" in reason


def test_heartbeat_goroutines_park_with_the_heartbeat_reason() -> None:
    # A connection's heartbeat sleeps on its alarm (a gosim Waiter): a goroutine dump
    # names the wait "heartbeat wait", not the "select" that a hand-made park showed.
    async def main() -> str:
        ln = MemoryListener()
        server = Server(echo, heartbeat_interval=1.0)
        go(server.serve, ln)
        c = Client(ln.dial, heartbeat_interval=1.0)
        await c.connect()
        await c.send(b"x")
        assert await c.recv() == b"x"
        await gosim.sleep(0.5)  # both sides' heartbeats are asleep now
        dump = gosim.lowlevel.current_runtime().goroutine_dump()
        await c.close()
        await server.shutdown()
        return dump

    dump = vrun(main)
    # The client's and the server's heartbeat goroutines, at least.
    assert dump.count("[heartbeat wait]:") >= 2, dump
    assert "[select]:" not in dump, dump
