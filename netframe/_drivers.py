"""A framed session connection's state and the loops that drive it, for ``Server``
(``_server.py``) and ``Client`` (``_client.py``) alike.

- :class:`_Conn`: one connection's state, shared by its reader, heartbeat and
  handler goroutines (:class:`_Ticket`: a raw request's place in line);
- the reader: :func:`_read_connection` (Python) and :func:`_read_exchange` (the C
  loop, ``FramedConn.exchange``), with :func:`_session_payloads` between the frames
  and the session;
- the heartbeat: :func:`_keep_alive`, and a server's read and write deadlines it
  looks at (:class:`_Deadlines`, ending with a :class:`_HeartbeatEnd`);
- sending replies: :func:`_reply_nowait`, :func:`_send`.

What each does for a server is told in ``_server.py``'s module docstring.
"""

from __future__ import annotations

import enum
import math
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

import gosim
from gosim import lowlevel
from gosim.lowlevel import WaitReason

from ._conn import (
    EXCHANGE_GENERAL,
    EXCHANGE_PENDING,
    EXCHANGE_READER,
    EXCHANGE_SEND_QUEUED,
    FramedConn,
    _Alarm,
    _send_data,
)
from ._exceptions import RemoteFrameError
from ._session import Session


class _Ticket:
    """A raw request's place in line: its reply leaves after the replies before it."""

    __slots__ = ("done", "reply")

    def __init__(self) -> None:
        self.reply: Any = None
        self.done = False


class _Conn:
    """One connection's state, shared by its reader, heartbeat and handler goroutines."""

    __slots__ = (
        "alarm",
        "clock",
        "closed",
        "draining",
        "exchange",
        "fc",
        "in_flight",
        "order",
        "owed",
        "releasing",
        "retired",
        "room",
        "session",
    )

    def __init__(self, fc: FramedConn, session: Session) -> None:
        self.fc = fc
        self.session = session
        self.clock = lowlevel.current_runtime().now  # gosim.now() without its frame
        self.in_flight = 0  # handlers running now
        # Later replies settled in this pass, sent together at its end (Server._send_gathered).
        self.owed: list[bytes] = []
        self.closed = False
        self.retired = False  # counted out of the server (see Server._retire)
        self.draining = False
        # Raw mode with concurrent handlers: requests in arrival order, and whether a
        # goroutine is releasing their replies now (one at a time keeps them in order).
        self.order: deque[_Ticket] | None = None
        self.releasing = False
        self.exchange: Any = None  # the C loop serving it (Server._serve_exchange), if any
        self.alarm = _Alarm()  # the heartbeat goroutine's sleep
        self.room = _Alarm(WaitReason.HANDLER_ROOM)  # the reader's wait for a handler to end

    def end(self) -> None:
        """Mark the connection finished: wake its heartbeat and its reader."""
        self.closed = True
        self.alarm.ring()
        self.room.ring()

    def is_closed(self) -> bool:
        # Read through a call: other goroutines close the connection while we await.
        return self.closed

    def handler_done(self) -> None:
        """A handler goroutine ended: its slot is free (the reader may wait for one)."""
        self.in_flight -= 1
        self.room.ring()


async def _read_connection(
    st: _Conn, deliver: Callable[[_Conn, list[bytes]], Awaitable[bool]], raw: bool
) -> Exception | None:
    """A connection's one reader, for server and client alike: take every frame the
    connection has buffered (one receive), hand the DATA payloads to ``deliver``, read
    again; pongs go out at once (ahead of queued replies). Returns why it stopped: None
    at the peer's clean end, when ``deliver`` says stop (False), or when this side
    closed; the OSError of a broken connection; the RemoteFrameError of a peer that
    broke the framing or the session protocol (the payloads before the bad frame are
    delivered first)."""
    fc = st.fc
    while not st.closed:
        try:
            frames = await fc.read_frames()
        except (RemoteFrameError, OSError) as exc:
            return exc
        if not frames:
            return None
        error: RemoteFrameError | None = None
        if raw:
            payloads = frames
        else:
            payloads, error = _session_payloads(st, frames)
        if payloads and not await deliver(st, payloads):
            return None
        if error is not None:
            return error
    return None


async def _read_exchange(
    st: _Conn,
    ex: Any,
    raw: bool,
    deliver: Callable[[_Conn, list[bytes]], Awaitable[bool]],
    finish: Callable[[_Conn, Any, bool], Awaitable[bytes | None]],
    queue_replies: Callable[[_Conn, list[bytes]], bool] | None,
    count_errors: Callable[[int], None] | None,
) -> Exception | None:
    """A connection's reader on the C loop (``FramedConn.exchange``), for server and
    client alike: it returns here for a handler result to await (``finish`` gives the
    reply, or None), replies for the send queue (``queue_replies``: False when the
    connection is gone), frames for the general path (session mode: control frames,
    DATA with every handler slot taken, handed to ``deliver`` as
    :func:`_read_connection` hands them), a close, or the end of the stream or a
    hand-back (an invalid header), after which :func:`_read_connection` reads on (and
    reports what the general path finds). Handler failures the loop counted go to
    ``count_errors``. Returns as :func:`_read_connection` does."""
    fc = st.fc
    while not st.closed:
        try:
            state = await fc.run_exchange(ex)
        except OSError as exc:  # broken, or closed by this side meanwhile
            return exc
        finally:
            if count_errors is not None and (errors := ex.take_errors()):
                count_errors(errors)
        if state == EXCHANGE_SEND_QUEUED:
            assert queue_replies is not None
            if not queue_replies(st, ex.take_replies()):
                return None
        elif state == EXCHANGE_GENERAL:
            payloads, error = _session_payloads(st, ex.take_rest())
            if payloads and not await deliver(st, payloads):
                return None
            if error is not None:
                return error
        elif state == EXCHANGE_PENDING:
            ex.resume(await finish(st, *ex.take_pending()))
        elif state == EXCHANGE_READER:
            return await _read_connection(st, deliver, raw)
        else:  # EXCHANGE_CLOSED
            return None
    return None


def _session_payloads(
    st: _Conn, frames: list[bytes]
) -> tuple[list[bytes], RemoteFrameError | None]:
    """A session connection's received frames: their DATA payloads, and the protocol
    error that stopped them (the payloads before the bad frame are kept); the pongs
    they ask for are sent at once (ahead of queued replies)."""
    payloads: list[bytes] = []
    session = st.session
    try:
        if session.receive_many(frames, gosim.now(), payloads):  # one clock read
            for out in session.take_pongs():
                st.fc.send_nowait(out)
    except RemoteFrameError as exc:
        return payloads, exc
    return payloads, None


class _HeartbeatEnd(enum.Enum):
    CLOSED = "closed"  # the connection closed otherwise
    DEAD = "dead"  # nothing received for the heartbeat timeout
    IDLE = "idle"  # no DATA either way for the idle timeout (not while draining)
    READ = "read"  # a frame not whole within the read timeout (_Deadlines)
    WRITE = "write"  # replies owed and none of their bytes taken for the write timeout


class _Deadlines:
    """A server connection's read and write deadlines, from counters the connection
    keeps anyway: :meth:`look` is called every quarter of the shorter timeout (by the
    connection's heartbeat or raw watch, on the runtime's driver when their timer
    fires), so frames pay nothing for them.

    Read: a frame begun (``FramedConn.partial_bytes``) and no frame completed since
    it was first seen, for ``read_timeout``, while the reader was reading (``paused()``
    False: not waiting for a handler slot, nor for owed replies to be written). Write:
    replies owed (``FramedConn.owed_bytes``) and no write finished since that was first
    seen, for ``write_timeout``, twice over, and the kernel's unacknowledged bytes
    (``FramedConn.unsent_bytes``) the same at both ends: a large write that has not
    returned yet may be taken by a slow peer all along. So a peer that reads nothing
    is closed between two and two and a half times ``write_timeout``."""

    __slots__ = (
        "begun",
        "clock",
        "fc",
        "frames",
        "next_look",
        "owing",
        "paused",
        "read_timeout",
        "step",
        "unacked",
        "write_timeout",
        "written",
    )

    def __init__(
        self,
        fc: FramedConn,
        clock: Callable[[], float],
        paused: Callable[[], bool],
        read_timeout: float | None,
        write_timeout: float | None,
    ) -> None:
        self.fc = fc
        self.clock = clock
        self.paused = paused
        self.read_timeout = read_timeout
        self.write_timeout = write_timeout
        self.step = min(t for t in (read_timeout, write_timeout) if t is not None) / 4
        self.begun: float | None = None  # when the frame being received was first seen
        self.frames = 0
        self.owing: float | None = None  # when owed bytes were first seen unmoving
        self.written = 0
        self.unacked: int | None = None  # the kernel's unsent bytes at the last timeout
        self.next_look = clock() + self.step

    def look(self, now: float) -> _HeartbeatEnd | None:
        """Look at the connection now: the deadline that has passed, or None (the next
        look is due at ``next_look``). Must not wait nor fail (it runs on the driver)."""
        fc = self.fc
        self.next_look = now + self.step
        if self.read_timeout is not None:
            if self.paused() or not fc.partial_bytes():
                self.begun = None
            else:
                frames = fc.frames_read
                if self.begun is None or frames != self.frames:
                    self.begun, self.frames = now, frames
                elif now - self.begun >= self.read_timeout:
                    return _HeartbeatEnd.READ
        if self.write_timeout is not None:
            if not fc.owed_bytes:
                self.owing = self.unacked = None
            else:
                written = fc.bytes_written
                if self.owing is None or written != self.written:
                    self.owing, self.written, self.unacked = now, written, None
                elif now - self.owing >= self.write_timeout:
                    return _HeartbeatEnd.WRITE
        return None

    def recheck(self) -> float:
        """The alarm's recheck: the time of the next look, or -inf (wake the watcher
        now) when a deadline has passed."""
        return -math.inf if self.look(self.clock()) is not None else self.next_look

    def overdue(self, now: float) -> _HeartbeatEnd | None:
        """In the watching goroutine: the deadline that has passed, unless this side's
        reader is behind (bytes of the frame wait unread in the kernel: the peer sent
        them), when the frame's time starts again."""
        end = self.look(now)
        if end is _HeartbeatEnd.READ and self.fc.unread_bytes():
            self.begun = now
            return None
        if end is _HeartbeatEnd.WRITE:
            asked = self.fc.unsent_bytes()
            unacked = -1 if asked is None else asked  # -1: the socket does not say
            if self.unacked is None or unacked != self.unacked:
                # First timeout, or the peer took bytes meanwhile: another period.
                self.unacked, self.owing = unacked, now
                return None
        return end


async def _keep_alive(st: _Conn, deadlines: _Deadlines | None = None) -> _HeartbeatEnd:
    """A session connection's heartbeat, for server and client alike: sleep until the
    session's next deadline, send its pings, and return when the peer is dead or the
    connection idle (the caller closes it) or closed. Pings never wait behind a full
    send queue (a peer that neither sends nor reads must still be found dead). With
    ``deadlines`` (a server's), it also returns when one of those has passed."""
    session = st.session
    heard = 0  # bytes arrived (read and unread) when the peer was last heard unread
    recheck: Callable[[], float] = session.next_deadline
    if deadlines is not None:

        def recheck() -> float:
            return min(session.next_deadline(), deadlines.recheck())

    while not st.closed:
        deadline = session.next_deadline()
        if deadlines is not None:
            end = deadlines.overdue(gosim.now())
            if end is not None:
                return end
            deadline = min(deadline, deadlines.next_look)
        if deadline > gosim.now():
            # Rechecked when the timer fires: a peer heard meanwhile moved the deadline
            # on, and the timer re-arms without waking this goroutine.
            await st.alarm.sleep_until(deadline, recheck)
            if st.is_closed():
                break
        now = gosim.now()
        timeout = session.heartbeat_timeout
        if timeout is not None and session.last_received + timeout <= now:
            # Nothing read for the timeout. Bytes that arrived and wait for this side's
            # reader (an overloaded runtime reads late) are the peer alive, not dead:
            # declaring it dead would drop a live peer and start a reconnect storm.
            # Only bytes that came since the last such look count, so input a stalled
            # reader never takes cannot keep a dead peer alive.
            unread = st.fc.unread_bytes()
            if unread:
                arrived = st.fc.bytes_read + unread
                if arrived > heard:
                    heard = arrived
                    session.heard(now)
        for out in session.poll(now):
            st.fc.send_nowait(out)
        if session.dead:
            return _HeartbeatEnd.DEAD
        if session.idle and not st.draining:
            return _HeartbeatEnd.IDLE
    return _HeartbeatEnd.CLOSED


def _reply_nowait(st: _Conn, reply: bytes | list[bytes] | None) -> list[bytes] | None:
    """Send a handler's reply, or several replies together (one send), at once if the
    send queue has room (send_many's first case); the frames still to send, with a
    wait for room, if not. A connection closed meanwhile (a dead peer, shutdown past
    its grace) loses the replies: the handler's goroutine must not turn that into a
    panic."""
    if reply is None or st.closed:
        return None
    try:
        if _send_data is not None and _send_data(st.fc, st.session, reply, st.clock):
            return None  # sent at once, in C (one reply, or several in one send)
        # type(), not isinstance: cheaper on the pure path, which mypy cannot narrow.
        if type(reply) is list:
            frames = st.session.data_many(reply, gosim.now())
        else:
            frames = [st.session.data(reply, gosim.now())]  # type: ignore[arg-type]
        if st.fc.send_many_nowait(frames):
            return None
    except OSError:  # ClosedError included: the replies are lost with it
        return None
    return frames


async def _send(st: _Conn, frames: list[bytes]) -> bool:
    """Send frames (``FramedConn.send_many``: at once, or queued, waiting for room);
    False (not an exception) when the connection is gone: broken, or closed by this
    side (a dead peer, shutdown past its grace), which loses them."""
    try:
        await st.fc.send_many(frames)
    except OSError:  # ClosedError included
        return False
    return True
