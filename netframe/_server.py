"""Long-connection ``Server`` and reconnecting ``Client`` over the session protocol.

Server, per connection (all goroutines, no trio task per connection):

1. the accept loop hands each connection to its own *reader* goroutine, unless the
   server is at ``max_connections``: then the connection gets ``GOAWAY(CONNECTION_LIMIT)``
   and is closed (a refusal, not a hang);
2. the reader decodes frames and feeds the :class:`~netframe.Session`; each DATA frame
   starts a *handler* goroutine, at most ``max_in_flight`` per connection (reading
   pauses at the limit: backpressure reaches the peer through TCP);
3. replies leave through the connection's batching writer (:meth:`FramedConn.send`);
4. a *heartbeat* goroutine sleeps until the session's next deadline, sends its pings,
   and closes the connection when the peer is dead or the connection idle.

Graceful shutdown (:meth:`Server.shutdown`): stop accepting, send ``GOAWAY(NO_ERROR)``
on every connection, let in-flight handlers finish and their replies flush within the
grace period, then close every connection. A reply produced within the grace period is
never lost.

The transport is anything with the :class:`Listener` / ``StreamConn`` shape:
``gosim.net`` listeners and connections, or the simulated network.
"""

from __future__ import annotations

import inspect
import math
import random
import types
from collections.abc import Awaitable, Callable, Generator
from dataclasses import dataclass
from typing import Any, Protocol

import gosim
from gosim import Chan, go, lowlevel, recv, select

from ._codec import FrameFormat
from ._codec import _speedups as _c_speedups
from ._conn import ClosedError, FramedConn, StreamConn
from ._exceptions import RemoteFrameError
from ._session import Data, GoAway, GoAwayCode, Session

__all__ = ["Client", "ConnectionLost", "Listener", "Server", "ServerStats"]

_drop_none: Any = None if _c_speedups is None else _c_speedups.drop_none
_handle_each: Any = None if _c_speedups is None else _c_speedups.handle_each

#: An async function, or a plain function (its return value is the reply: no coroutine
#: per request, for handlers that never wait).
Handler = Callable[[bytes], Awaitable[bytes | None] | bytes | None]
BatchHandler = Callable[[list[bytes]], Awaitable[list[bytes | None]] | list[bytes | None]]

_Coroutine = types.CoroutineType


@types.coroutine
def _resume(coro: Any, yielded: Any) -> Generator[Any, Any, Any]:
    """Go on with a coroutine that was started elsewhere (handle_each) and suspended,
    yielding ``yielded``: pass that up to the driver, then delegate as ``await`` would."""
    while True:
        try:
            sent = yield yielded
        except GeneratorExit:
            coro.close()
            raise
        except BaseException as exc:  # thrown in by the driver: the coroutine's to handle
            try:
                yielded = coro.throw(exc)
            except StopIteration as stop:
                return stop.value
        else:
            try:
                yielded = coro.send(sent)
            except StopIteration as stop:
                return stop.value


def _awaitable(value: Any) -> bool:
    """A handler's result that is still to be awaited (an async handler's coroutine, or
    any awaitable a plain function returned) rather than the reply itself."""
    if type(value) is _Coroutine:
        return True
    return value is not None and type(value) is not bytes and inspect.isawaitable(value)


class Listener(Protocol):
    async def accept(self) -> StreamConn: ...

    def close(self) -> None: ...


class ConnectionLost(ConnectionError):
    """The client's connection ended (peer closed, dead peer, goaway); ``reason`` says which.

    Frames sent and not answered may or may not have been processed: retry them
    through a new connection only if they are idempotent (see ``idempotency``).
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class ServerStats:
    connections: int  # open now
    accepted: int
    rejected: int  # refused at the connection limit
    frames_received: int
    frames_sent: int
    bytes_received: int
    bytes_sent: int
    heartbeats_missed: int
    dead_peers: int
    idle_closed: int
    protocol_errors: int
    handler_errors: int


class _Alarm:
    """A goroutine's sleep until a runtime-clock deadline, cut short by :meth:`ring`.

    The heartbeat loops' wait: one runtime timer per connection, re-armed in place,
    where a ``Timer``, its channel and a three-case ``select`` per wait cost several
    times more (10,000 connections wait once per heartbeat interval each). Nothing
    can come between a loop's last look at the connection and its park (no await),
    so a ring while nobody sleeps has nothing to wake and is dropped.
    """

    __slots__ = ("_g", "_timer")

    def __init__(self) -> None:
        self._g: lowlevel.G | None = None
        self._timer = lowlevel.RuntimeTimer(_alarm_fired, self)

    async def sleep_until(self, when: float) -> None:
        """Park until ``when`` (``math.inf``: until rung) or until :meth:`ring`."""
        if when != math.inf:
            lowlevel.add_timer(self._timer, when)
        self._g = lowlevel.current_g()
        await lowlevel.park("select")
        lowlevel.del_timer(self._timer)  # rung early: the timer may still be armed

    def ring(self) -> None:
        g = self._g
        if g is not None:
            self._g = None
            lowlevel.ready(g)


def _alarm_fired(alarm: _Alarm, now: float) -> None:
    alarm.ring()


class _Conn:
    __slots__ = (
        "alarm",
        "closed",
        "done",
        "draining",
        "fc",
        "in_flight",
        "session",
        "slots",
        "wake",
    )

    def __init__(self, fc: FramedConn, session: Session, max_in_flight: int) -> None:
        self.fc = fc
        self.session = session
        self.slots: Chan[None] = Chan(max_in_flight)  # a token per running handler
        self.in_flight = 0
        self.closed = False
        self.draining = False
        self.done: Chan[None] = Chan()  # closed when the connection is finished
        self.wake: Chan[None] = Chan(1)  # nudges _finish when the last handler ends
        self.alarm = _Alarm()  # the heartbeat goroutine's sleep

    def end(self) -> None:
        """Mark the connection finished: close ``done`` and wake the heartbeat loop."""
        self.closed = True
        if not self.done.closed:
            self.done.close()
        self.alarm.ring()

    def is_closed(self) -> bool:
        # Read through a call: other goroutines close the connection while we await.
        return self.closed


async def _send(st: _Conn, payload: bytes) -> bool:
    """Queue a frame; False (not an exception) when the connection is already closed."""
    try:
        await st.fc.send(payload)
    except (ClosedError, OSError):
        return False
    return True


class Server:
    """Serves ``handler(payload) -> reply | None`` on long connections; see the module docstring.

    ``handler`` is an async function, or a plain function for work that never waits: a
    plain function's return value is the reply, with no coroutine made and run per
    request (several times cheaper for small requests: see BENCHMARKS.md). Whatever
    awaitable a handler returns is awaited. The same holds for ``handle_batch``.

    ``handle_batch`` instead of ``handler``: ``handle_batch(payloads) -> replies`` gets
    the DATA payloads of one receive, in order, and returns one entry per payload
    (``None``: no reply), for protocols whose peers pipeline many small requests: one
    call per receive instead of one per frame. A connection's batches are handled one
    at a time, in order (``max_in_flight`` does not apply). A batch whose handler
    raises, or returns a list of the wrong length, gets no replies and counts once in
    ``handler_errors``; the connection goes on.
    """

    def __init__(
        self,
        handler: Handler | None = None,
        *,
        handle_batch: BatchHandler | None = None,
        format: FrameFormat | None = None,
        max_connections: int = 10_000,
        max_in_flight: int = 64,
        heartbeat_interval: float | None = 10.0,
        heartbeat_timeout: float | None = None,
        idle_timeout: float | None = None,
        grace_period: float = 5.0,
        send_queue: int = 1024,
        raw: bool = False,
    ) -> None:
        if max_connections < 1 or max_in_flight < 1:
            raise ValueError("max_connections and max_in_flight must be at least 1")
        if (handler is None) == (handle_batch is None):
            raise TypeError("Server needs a handler or a handle_batch, not both")
        if handle_batch is not None:
            max_in_flight = 1  # batches of one connection run one at a time, in order
        self.handler = handler
        self.handle_batch = handle_batch
        self.format = FrameFormat() if format is None else format
        self.max_connections = max_connections
        self.max_in_flight = max_in_flight
        self.heartbeat_interval = heartbeat_interval
        self.heartbeat_timeout = heartbeat_timeout
        self.idle_timeout = idle_timeout
        self.grace_period = grace_period
        self.send_queue = send_queue
        # raw: plain length-prefixed frames with no session byte (interop with peers
        # such as Go's or Twisted's Int32StringReceiver): every frame is data; no
        # heartbeats, idle timeout or goaway, so refusals and shutdown just close.
        self.raw = raw
        self._conns: set[_Conn] = set()
        self._listener: Listener | None = None
        self._shutting_down = False
        self._stopped: Chan[None] = Chan()
        self._counters = dict.fromkeys(
            (
                "accepted",
                "rejected",
                "heartbeats_missed",
                "dead_peers",
                "idle_closed",
                "protocol_errors",
                "handler_errors",
                "frames_received",
                "frames_sent",
                "bytes_received",
                "bytes_sent",
            ),
            0,
        )

    def stats(self) -> ServerStats:
        c = dict(self._counters)
        for st in self._conns:
            s = st.fc.statistics()
            c["frames_received"] += s.frames_read
            c["frames_sent"] += s.frames_written
            c["bytes_received"] += s.bytes_read
            c["bytes_sent"] += s.bytes_written
            c["heartbeats_missed"] += st.session.heartbeats_missed
        return ServerStats(connections=len(self._conns), **c)

    # ------------------------------------------------------------ accepting

    async def serve(self, listener: Listener) -> None:
        """Accept and serve until :meth:`shutdown` has finished."""
        self._listener = listener
        while not self._shutting_down:
            try:
                conn = await listener.accept()
            except Exception:
                if self._stopping():
                    break
                raise
            if self._stopping():
                conn.close()
                break
            if len(self._conns) >= self.max_connections:
                self._counters["rejected"] += 1
                go(self._reject, conn)
                continue
            self._counters["accepted"] += 1
            go(self._serve_conn, conn)
        await self._stopped.recv()

    def _stopping(self) -> bool:
        # A method, not the attribute inline: shutdown() flips it while serve() awaits.
        return self._shutting_down

    async def _reject(self, conn: StreamConn) -> None:
        if self.raw:
            conn.close()
            return
        fc = FramedConn(conn, self.format)
        session = Session(gosim.now(), heartbeat_interval=None)
        try:
            await fc.write_frame(session.goaway(GoAwayCode.CONNECTION_LIMIT, "connection limit"))
        except Exception:  # the peer is gone already: nothing to tell it
            pass
        conn.close()

    # -------------------------------------------------------- a connection

    async def _serve_conn(self, conn: StreamConn) -> None:
        fc = FramedConn(conn, self.format, send_queue=self.send_queue)
        session = Session(
            gosim.now(),
            heartbeat_interval=None if self.raw else self.heartbeat_interval,
            heartbeat_timeout=None if self.raw else self.heartbeat_timeout,
            idle_timeout=None if self.raw else self.idle_timeout,
        )
        st = _Conn(fc, session, self.max_in_flight)
        self._conns.add(st)
        if not self.raw:
            go(self._heartbeat, st)
        try:
            await self._read_loop(st)
        finally:
            await self._finish(st)

    async def _read_loop(self, st: _Conn) -> None:
        if self.raw and self.max_in_flight == 1:
            await self._raw_inline_loop(st)
            return
        if self.handle_batch is not None:
            await self._session_batch_loop(st)
            return
        fc, session = st.fc, st.session
        while not st.closed:
            try:
                frame = await fc.read_frame()
            except RemoteFrameError:
                self._counters["protocol_errors"] += 1
                await self._goaway_and_close(st, GoAwayCode.PROTOCOL_ERROR, "bad frame")
                return
            except OSError:
                return  # broken connection (reset, or closed by us)
            if frame is None:
                return
            if self.raw:
                event: Data | object = Data(frame)
            else:
                now = gosim.now()  # one clock read for the frame (~1 us each)
                try:
                    event = session.receive(frame, now)
                except RemoteFrameError:
                    self._counters["protocol_errors"] += 1
                    await self._goaway_and_close(st, GoAwayCode.PROTOCOL_ERROR, "bad session frame")
                    return
                for out in session.poll(now):  # pongs go out at once
                    if not await _send(st, out):
                        return
            if isinstance(event, Data):
                if self.max_in_flight == 1:
                    # One at a time: handle in the reader itself, replies in order,
                    # no goroutine per frame.
                    st.in_flight = 1
                    await self._handle_one(st, event.payload)
                    st.in_flight = 0
                    continue
                await st.slots.send(None)  # blocks at max_in_flight: backpressure
                st.in_flight += 1
                go(self._handle, st, event.payload)
            elif isinstance(event, GoAway):
                pass  # the peer starts no new work; keep serving until it closes

    async def _raw_inline_loop(self, st: _Conn) -> None:
        """Raw frames, one handler at a time: each burst of frames read becomes one write.

        Nothing else writes in raw mode (no pongs, no goaway), so the replies go out
        with a direct ``write_frames`` in order, without the writer goroutine's queue.
        """
        fc, handler, batch = st.fc, self.handler, self.handle_batch
        while not st.closed:
            frames = await self._read_burst(st)
            if not frames:
                return
            st.in_flight = 1
            if batch is not None:
                replies = await self._call_batch(batch, frames)
            elif _handle_each is not None:
                assert handler is not None
                replies = await self._handle_each(handler, frames)
            else:
                assert handler is not None
                replies = []
                for frame in frames:  # handle_each's twin (netframe/_speedups.c)
                    try:
                        reply: Any = handler(frame)
                        if _awaitable(reply):
                            reply = await reply
                    except Exception:
                        self._counters["handler_errors"] += 1
                        continue
                    if reply is not None:
                        replies.append(reply)
            st.in_flight = 0
            if replies and not st.closed:
                try:
                    await fc.write_frames(replies)
                except OSError:
                    return

    async def _handle_each(self, handler: Handler, frames: list[bytes]) -> list[bytes]:
        """The handler's replies to ``frames``, in order: the C loop calls it per frame and
        stops only where a result must be awaited, which is done here."""
        replies: list[bytes] = []
        i, count = 0, len(frames)
        while i < count:
            i, pending, suspended, errors = _handle_each(handler, frames, i, replies)
            if errors:
                self._counters["handler_errors"] += errors
            if pending is None:
                break
            try:
                if suspended:
                    reply: Any = await _resume(*pending)
                elif _awaitable(pending):
                    reply = await pending
                else:
                    reply = pending  # a reply of an unusual type: write_frames judges it
            except Exception:
                self._counters["handler_errors"] += 1
            else:
                if reply is not None:
                    replies.append(reply)
            i += 1
        return replies

    async def _read_burst(self, st: _Conn) -> list[bytes]:
        """The frames of the next receive; [] when the connection has ended. A framing
        error from the peer counts as a protocol error and ends the connection (with a
        goaway in session mode; raw mode just closes)."""
        try:
            return await st.fc.read_frames()
        except RemoteFrameError:
            self._counters["protocol_errors"] += 1
            await self._goaway_and_close(st, GoAwayCode.PROTOCOL_ERROR, "bad frame")
        except OSError:
            pass  # broken connection (reset, or closed by us)
        return []

    async def _call_batch(self, batch: BatchHandler, payloads: list[bytes]) -> list[bytes]:
        """The batch handler's replies, ``None`` entries dropped; [] when it failed."""
        try:
            replies: Any = batch(payloads)
            if type(replies) is not list and _awaitable(replies):
                replies = await replies
        except Exception:
            self._counters["handler_errors"] += 1
            return []
        if type(replies) is not list or len(replies) != len(payloads):
            self._counters["handler_errors"] += 1
            return []
        if _drop_none is not None:
            kept: list[bytes] = _drop_none(replies)
            return kept
        return [r for r in replies if r is not None]

    async def _session_batch_loop(self, st: _Conn) -> None:
        """Session frames with a batch handler: the DATA payloads of each receive go to
        one ``handle_batch`` call; pings are answered at once, as in the other loop."""
        session, batch = st.session, self.handle_batch
        assert batch is not None
        while not st.closed:
            frames = await self._read_burst(st)
            if not frames:
                return
            payloads = []
            now = gosim.now()  # one clock read for the receive's frames
            for frame in frames:
                try:
                    event = session.receive(frame, now)
                except RemoteFrameError:
                    self._counters["protocol_errors"] += 1
                    await self._goaway_and_close(st, GoAwayCode.PROTOCOL_ERROR, "bad session frame")
                    return
                if isinstance(event, Data):
                    payloads.append(event.payload)
            for out in session.poll(now):  # pongs go out at once
                if not await _send(st, out):
                    return
            if not payloads:
                continue
            st.in_flight = 1
            replies = await self._call_batch(batch, payloads)
            st.in_flight = 0
            for reply in replies:
                if st.closed or not await _send(st, session.data(reply, gosim.now())):
                    return

    async def _handle_one(self, st: _Conn, payload: bytes) -> None:
        assert self.handler is not None
        try:
            reply: Any = self.handler(payload)
            if _awaitable(reply):
                reply = await reply
        except Exception:
            self._counters["handler_errors"] += 1
            return
        if reply is not None and not st.closed:
            # A connection closed meanwhile (dead peer, shutdown past its grace) loses
            # the reply; the handler's goroutine must not turn that into a panic.
            await _send(st, reply if self.raw else st.session.data(reply, gosim.now()))

    async def _handle(self, st: _Conn, payload: bytes) -> None:
        try:
            await self._handle_one(st, payload)
        finally:
            st.in_flight -= 1
            st.slots.try_recv()
            if st.draining and st.in_flight == 0:
                st.wake.try_send(None)

    async def _heartbeat(self, st: _Conn) -> None:
        session = st.session
        while not st.closed:
            deadline = session.next_deadline()
            if deadline > gosim.now():
                await st.alarm.sleep_until(deadline)
                if st.is_closed():
                    return
            for out in session.poll(gosim.now()):
                if not await _send(st, out):
                    return
            if session.dead:
                self._counters["dead_peers"] += 1
                self._close_now(st)
                return
            if session.idle and not st.draining:
                self._counters["idle_closed"] += 1
                await self._goaway_and_close(st, GoAwayCode.IDLE_TIMEOUT, "idle")
                return

    async def _goaway_and_close(self, st: _Conn, code: int, reason: str) -> None:
        if st.closed:
            return
        if self.raw:
            self._close_now(st)
            return
        try:
            await st.fc.send(st.session.goaway(code, reason))
            await st.fc.flush()
        except Exception:
            pass
        self._close_now(st)

    def _close_now(self, st: _Conn) -> None:
        if st.closed:
            return
        st.closed = True
        st.fc.conn.close()  # unblocks the reader (EOF or error) and the writer
        st.alarm.ring()

    async def _finish(self, st: _Conn) -> None:
        """After the reader ends: wait for handlers (bounded by shutdown's grace), close."""
        while st.in_flight and not st.closed:
            st.draining = True
            await select(recv(st.wake), recv(st.done))
        try:
            if not st.closed:
                st.closed = True
                await st.fc.aclose(flush=True)
            else:
                # Closed already (dead peer, protocol error, shutdown): stop the
                # FramedConn's writer goroutine too, or every such connection leaves one.
                await st.fc.aclose(flush=False)
        except Exception:
            pass
        st.end()
        self._conns.discard(st)
        self._counters["frames_received"] += st.fc.frames_read
        self._counters["frames_sent"] += st.fc.frames_written
        self._counters["bytes_received"] += st.fc.bytes_read
        self._counters["bytes_sent"] += st.fc.bytes_written
        self._counters["heartbeats_missed"] += st.session.heartbeats_missed
        if self._shutting_down and not self._conns:
            self._signal_stopped()

    # ------------------------------------------------------------ shutdown

    async def shutdown(self, grace: float | None = None) -> None:
        """Stop accepting, tell every peer (GOAWAY), drain in-flight work, then close.

        Handlers still running after ``grace`` seconds (default ``grace_period``) lose
        their connection; replies produced before that are written.
        """
        if self._shutting_down:
            return
        self._shutting_down = True
        if self._listener is not None:
            self._listener.close()
        grace = self.grace_period if grace is None else grace
        for st in list(self._conns):
            st.draining = True
            if self.raw:
                continue
            try:
                await st.fc.send(st.session.goaway(GoAwayCode.NO_ERROR, "shutting down"))
            except Exception:
                pass
        deadline = gosim.now() + grace
        while any(st.in_flight for st in self._conns) and gosim.now() < deadline:
            await gosim.sleep(min(0.01, max(deadline - gosim.now(), 0)))
        for st in list(self._conns):
            if not st.closed:
                st.closed = True
                try:
                    await st.fc.aclose(flush=True)
                except Exception:
                    st.fc.conn.close()
        if not self._conns:
            self._signal_stopped()

    def _signal_stopped(self) -> None:
        if not self._stopped.closed:
            self._stopped.close()  # a closed channel wakes serve() whenever it gets there


class Client:
    """One long connection to a server, with heartbeats and reconnects on demand.

    ``dial()`` makes a new connection. :meth:`connect` retries failed dials with
    exponential backoff (``backoff_initial`` doubling up to ``backoff_max``) and full
    jitter (each wait uniform in [0, backoff]), so many clients reconnecting after an
    outage do not arrive together. :meth:`recv` raises :class:`ConnectionLost` when the
    connection ends; call :meth:`connect` again to get a new one.
    """

    def __init__(
        self,
        dial: Callable[[], Awaitable[StreamConn]],
        *,
        format: FrameFormat | None = None,
        heartbeat_interval: float | None = 10.0,
        heartbeat_timeout: float | None = None,
        backoff_initial: float = 0.05,
        backoff_max: float = 5.0,
        max_attempts: int | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.dial = dial
        self.format = FrameFormat() if format is None else format
        self.heartbeat_interval = heartbeat_interval
        self.heartbeat_timeout = heartbeat_timeout
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self.max_attempts = max_attempts
        self.rng = rng or random.Random()
        self.attempts = 0
        self.connects = 0
        self._st: _Conn | None = None
        self._inbox: Chan[Any] = Chan(1024)

    async def connect(self) -> None:
        """Dial until it works (or ``max_attempts`` fail: the last error is raised)."""
        await self.close()
        backoff = self.backoff_initial
        tries = 0
        while True:
            self.attempts += 1
            tries += 1
            try:
                conn = await self.dial()
                break
            except OSError:
                if self.max_attempts is not None and tries >= self.max_attempts:
                    raise
                await gosim.sleep(self.rng.uniform(0, backoff))
                backoff = min(backoff * 2, self.backoff_max)
        self.connects += 1
        fc = FramedConn(conn, self.format)
        session = Session(
            gosim.now(),
            heartbeat_interval=self.heartbeat_interval,
            heartbeat_timeout=self.heartbeat_timeout,
        )
        st = _Conn(fc, session, 1)
        self._st = st
        self._inbox = Chan(1024)
        go(self._reader, st, self._inbox)
        go(self._heartbeat, st, self._inbox)

    async def send(self, payload: bytes) -> None:
        """Queue one DATA frame; ConnectionLost when the connection has ended or breaks.

        A payload the format cannot carry raises the codec's LocalFrameError instead
        (the connection is fine; the payload is not).
        """
        st = self._st
        if st is None or st.closed:
            raise ConnectionLost("not connected")
        try:
            await st.fc.send(st.session.data(payload, gosim.now()))
        except (ClosedError, OSError) as exc:
            # The writer hit a reset or a broken pipe, or the reader closed the
            # connection meanwhile: one exception type for "connection gone".
            raise ConnectionLost(f"connection broken: {exc}") from exc

    async def recv(self) -> bytes:
        """The next DATA payload from the server; ConnectionLost when the connection ended."""
        item = await self._inbox.recv()
        if isinstance(item, ConnectionLost):
            self._inbox.try_send(item)  # every later recv sees it too
            raise item
        if item is None:
            raise ConnectionLost("not connected")
        data: bytes = item
        return data

    async def close(self) -> None:
        st = self._st
        self._st = None
        if st is not None and not st.closed:
            st.closed = True
            try:
                await st.fc.aclose(flush=True)
            except Exception:
                st.fc.conn.close()
            st.end()

    async def _reader(self, st: _Conn, inbox: Chan[Any]) -> None:
        reason = "server closed the connection"
        try:
            while True:
                try:
                    frame = await st.fc.read_frame()
                except (RemoteFrameError, OSError) as exc:
                    reason = f"connection broken: {exc}"
                    return
                if frame is None:
                    return
                now = gosim.now()
                try:
                    event = st.session.receive(frame, now)
                except RemoteFrameError as exc:
                    reason = f"protocol error from the server: {exc}"
                    return
                for out in st.session.poll(now):
                    if not await _send(st, out):
                        return
                if isinstance(event, Data):
                    await inbox.send(event.payload)
                elif isinstance(event, GoAway):
                    reason = f"server sent GOAWAY({int(event.code)}): {event.reason}"
        finally:
            if st.session.dead:
                reason = "server missed its heartbeats"
            # The FramedConn's writer goroutine stops with the connection (a client that
            # reconnects after every loss would otherwise leave one behind each time).
            await st.fc.aclose(flush=False)
            st.end()
            inbox.try_send(ConnectionLost(reason))

    async def _heartbeat(self, st: _Conn, inbox: Chan[Any]) -> None:
        session = st.session
        while not st.closed:
            deadline = session.next_deadline()
            if deadline > gosim.now():
                await st.alarm.sleep_until(deadline)
                if st.is_closed():
                    return
            for out in session.poll(gosim.now()):
                if not await _send(st, out):
                    return
            if session.dead:
                st.fc.conn.close()  # the reader sees the end and reports ConnectionLost
                return
