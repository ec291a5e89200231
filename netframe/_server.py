"""Long-connection ``Server`` and reconnecting ``Client`` over the session protocol.

Server, per connection (all goroutines, no trio task per connection):

1. the accept loop hands each connection to its own *reader* goroutine, unless the
   server is at ``max_connections``: then the connection gets ``GOAWAY(CONNECTION_LIMIT)``
   and is closed (a refusal, not a hang). A connection counts from the moment the
   accept loop takes it, so no burst gets past the limit. Temporary accept errors
   (out of descriptors, EMFILE/ENFILE; out of buffers; a connection aborted before it
   was accepted) do not stop the server: as Go's ``http.Server`` does, the loop waits
   5 ms, doubling up to 1 s while they repeat, and tries again; each one counts in
   ``statistics().accept_errors`` and goes to ``on_accept_error`` (or the log);
2. the reader (one per connection, the client's too: :func:`_read_connection`) takes
   every frame a receive brought, feeds them to the :class:`~netframe.Session` (DATA
   payloads out, pongs sent at once), hands the payloads to the *handler strategy*,
   sends the replies it returns, and reads again. The strategy is chosen once, at
   construction: *inline* (``max_in_flight=1``: the handlers of a receive called in
   the reader, in one C loop where built; replies in order), *concurrent* (session
   mode: each handler called in the reader, and one that returns an awaitable goes on
   in a goroutine of its own, one that returns a :class:`Later` on no goroutine until
   it is settled, at most ``max_in_flight`` of them together; reading pauses at
   the limit, so backpressure reaches the peer through TCP), *ordered* (raw mode with
   ``max_in_flight > 1``: a goroutine per request, replies released in request
   order), *batch* (``handle_batch``: one call per receive). In raw mode with the
   inline strategy, and in session mode with the concurrent one, a connection that
   has the C fast path is served by one C call per wake instead
   (:meth:`FramedConn.exchange`: receive, cut, let the session hear the peer, call the
   handlers, encode and send the replies, the same steps in the same order;
   :func:`_read_exchange` drives it), which returns to Python only for a handler that
   must be awaited (raw mode), a send the socket could not take, replies that must
   queue or that the C writer declines, control frames and DATA with every slot
   taken (session mode), or the end of the stream. A client with ``on_data`` reads on
   the same loop (its results awaited in the reader). A peer that breaks the
   framing or the session protocol ends the reader, and the one protocol-error path
   (:meth:`Server._protocol_error`) counts it, says why in a GOAWAY and closes;
3. replies are sent at once when nothing is queued (:meth:`FramedConn.send_many`:
   one non-blocking send, no goroutine switch; one C call for a single session DATA
   frame), else through the connection's batching writer goroutine, in order either
   way. :class:`Later` replies settled in one pass (a group commit answering its
   batch) are gathered and leave at the pass's end, one send per connection;
4. a *heartbeat* goroutine (the same code for the client: :func:`_keep_alive`) sleeps
   until the session's next deadline (its timer, finding the deadline moved on because
   the peer was heard meanwhile, re-arms itself without waking it), sends its pings
   (the server's later than the client's, so that clients ping and the server answers:
   ``Session(defer_pings=True)``), and closes the connection when the peer is dead or
   the connection idle. Control frames never wait behind a full
   send queue (:meth:`FramedConn.send_nowait`), so a peer that neither sends nor
   reads is still found dead at its heartbeat timeout.

A close that tells the peer why (a refusal at the limit, a protocol error) writes the
GOAWAY, shuts the write side and reads what the peer still sends, for at most
CLOSE_LINGER seconds, before closing: a close with unread input would reset the
connection, and a reset can destroy the GOAWAY before the peer reads it.

Graceful shutdown (:meth:`Server.shutdown`): stop accepting, send ``GOAWAY(NO_ERROR)``
on every connection, let in-flight handlers finish and their replies flush within the
grace period, then close every connection, whatever the peers do: ``shutdown`` returns
once the grace period is over (and ``statistics().connections`` is 0 then). A reply
produced within the grace period is lost only if the peer does not read it before the
grace period ends.

Peers that hold a connection's resources (both modes): a frame must arrive whole
within ``read_timeout`` of its first byte, or the connection is closed (a peer that
sends a byte now and then renews no deadline: slowloris); while the replies a
connection owes its peer come to more than ``max_owed_bytes``, its reader reads
nothing more (``FramedConn``'s ``max_owed_bytes``), and a connection that owes replies
and whose peer takes none of their bytes for ``write_timeout`` is closed (within 2.5
times that: see ``_Deadlines``). Both
deadlines are looked at a few times per timeout by the connection's heartbeat (raw
mode: its watch goroutine), from counters the connection keeps anyway, so frames pay
nothing for them; a frame is closed on between ``read_timeout`` and 1.25 times that
after its first byte, time the reader spends not reading (every handler slot taken,
replies owed over the bound) not counted.

Raw mode (``raw=True``) has no session byte, so no heartbeat and no goaway: replies go
out in request order whatever ``max_in_flight`` (raw frames carry no request id; a peer
matches replies by order), and ``idle_timeout`` closes a connection that carried no
frame either way for that long (a slow or silent raw peer is otherwise held forever).

The transport is anything with the :class:`Listener` / ``StreamConn`` shape:
``gosim.net`` listeners and connections, or the simulated network.
"""

from __future__ import annotations

import enum
import errno
import inspect
import logging
import math
import random
import sys
import types
from collections import deque
from collections.abc import Awaitable, Callable, Generator
from dataclasses import dataclass
from typing import Any, Final, Protocol

import gosim
from gosim import Chan, go, lowlevel, recv, select
from gosim.lowlevel import WaitCancelled, Waiter, WaitReason

from ._accel import speedups as _c_speedups
from ._codec import FrameFormat
from ._conn import (
    EXCHANGE_GENERAL,
    EXCHANGE_PENDING,
    EXCHANGE_READER,
    EXCHANGE_SEND_QUEUED,
    FramedConn,
    StreamConn,
    _Alarm,
    _send_data,
)
from ._exceptions import RemoteFrameError
from ._session import (
    MAX_REASON_BYTES,
    GoAway,
    GoAwayCode,
    LocalSessionError,
    RemoteSessionError,
    Session,
)

__all__ = [
    "DEFAULT_MAX_OWED_BYTES",
    "DEFAULT_READ_TIMEOUT",
    "DEFAULT_WRITE_TIMEOUT",
    "Client",
    "ConnectionLost",
    "Listener",
    "Server",
    "ServerStatistics",
    "default_max_connections",
]

_log = logging.getLogger("netframe")

#: How long a close that says why (GOAWAY) waits for the peer to take it: the GOAWAY's
#: flush, then reading what the peer still sends after our write side is shut. Go's
#: net/http waits 500 ms after CloseWrite for the same reason (``rstAvoidanceDelay``).
CLOSE_LINGER = 0.5
#: ...and reads at most this much of it (a peer that floods is simply closed).
LINGER_MAX_BYTES = 256 * 1024
#: Refusals lingering at once; past this, refused connections are closed at once so a
#: flood of connections cannot hold descriptors for CLOSE_LINGER each.
MAX_LINGERING = 128
#: Go's http.Server: a temporary accept error waits 5 ms, doubling to at most 1 s.
ACCEPT_RETRY_MIN = 0.005
ACCEPT_RETRY_MAX = 1.0
#: Client.close's default bound on writing what is queued.
DEFAULT_CLOSE_TIMEOUT = 5.0
#: Server's defaults: a frame arrives whole within this many seconds of its first byte.
DEFAULT_READ_TIMEOUT = 30.0
#: ...a connection that owes replies has some of their bytes taken within this long.
DEFAULT_WRITE_TIMEOUT = 30.0
#: ...and while it owes more than this many bytes of replies, it reads no more requests.
DEFAULT_MAX_OWED_BYTES = 4 * 1024 * 1024
_DEFAULT_MAX_CONNECTIONS = 10_000

# accept(2) errors that say nothing about the listener: out of descriptors, buffers or
# memory (EMFILE, ENFILE, ENOBUFS, ENOMEM), a connection gone before it was accepted
# (ECONNABORTED), an interrupted call, a firewall's refusal of one connection (EPERM);
# and the pending network errors Linux passes on from the new socket, which accept(2)
# says to treat like EAGAIN by retrying.
_TEMPORARY_ACCEPT_ERRORS = frozenset(
    getattr(errno, name)
    for name in (
        "EMFILE",
        "ENFILE",
        "ENOBUFS",
        "ENOMEM",
        "ECONNABORTED",
        "EINTR",
        "EAGAIN",
        "ENETDOWN",
        "EPROTO",
        "ENOPROTOOPT",
        "EHOSTDOWN",
        "ENONET",
        "EHOSTUNREACH",
        "EOPNOTSUPP",
        "ENETUNREACH",
        "EPERM",
    )
    if hasattr(errno, name)
)


def default_max_connections() -> int:
    """``Server``'s default connection limit: 10,000, or less under a lower descriptor limit.

    Each connection holds a descriptor, and running out of them makes ``accept`` fail
    (EMFILE), which the server survives but cannot answer. So the default leaves room
    under the soft ``RLIMIT_NOFILE`` for the rest of the process (a tenth of the limit,
    at least 64) and for refusals lingering to deliver their GOAWAY (MAX_LINGERING):
    922 - 128 = 794 connections under the common limit of 1024. Raise the descriptor
    limit (``ulimit -n``) before asking for more connections.
    """
    if sys.platform == "win32":  # no RLIMIT_NOFILE there
        return _DEFAULT_MAX_CONNECTIONS
    import resource  # noqa: PLC0415  (Unix only)

    try:
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (OSError, ValueError):
        return _DEFAULT_MAX_CONNECTIONS
    if soft == resource.RLIM_INFINITY or soft <= 0:
        return _DEFAULT_MAX_CONNECTIONS
    room = soft - MAX_LINGERING - max(64, soft // 10)
    return max(1, min(_DEFAULT_MAX_CONNECTIONS, room))


def _is_temporary(exc: BaseException) -> bool:
    """An accept error to wait out and retry (Go's ``net.Error.Temporary``)."""
    return isinstance(exc, OSError) and exc.errno in _TEMPORARY_ACCEPT_ERRORS


def _reason_for(exc: BaseException) -> str:
    """What the peer did wrong, for a GOAWAY's reason (cut to the protocol's limit)."""
    text = str(exc) or type(exc).__name__
    encoded = text.encode("utf-8")
    if len(encoded) <= MAX_REASON_BYTES:
        return text
    return encoded[:MAX_REASON_BYTES].decode("utf-8", "ignore")


async def _close_write_and_drain(conn: Any, linger: float) -> None:
    """Shut our write side, then read and drop what the peer sends until it closes, for
    at most ``linger`` seconds and LINGER_MAX_BYTES: closing with its input unread
    would reset the connection, and the reset can destroy what we wrote last (a
    GOAWAY) before the peer reads it. The caller closes the connection after."""
    close_write = getattr(conn, "close_write", None)
    set_read_deadline = getattr(conn, "set_read_deadline", None)
    if close_write is None or set_read_deadline is None:
        return
    try:
        close_write()
        set_read_deadline(gosim.now() + linger)
        left = LINGER_MAX_BYTES
        while left > 0:
            data = await conn.read(min(left, 65536))
            if not data:
                return
            left -= len(data)
    except OSError:  # reset, closed, or the deadline (DeadlineExceeded): done either way
        pass


_drop_none: Any = None if _c_speedups is None else _c_speedups.drop_none

#: An async function, or a plain function (its return value is the reply: no coroutine
#: per request, for handlers that never wait).
Handler = Callable[[bytes], Awaitable[bytes | None] | bytes | None]
BatchHandler = Callable[[list[bytes]], Awaitable[list[bytes | None]] | list[bytes | None]]

_Coroutine = types.CoroutineType


class Later(Waiter):
    """A reply that comes later, with no goroutine waiting for it.

    A handler whose work finishes elsewhere (in a batch that another goroutine
    commits, say) returns a ``Later`` and has that work call :meth:`reply` when it is
    done; the server sends the reply from there. A request that waits then costs no
    goroutine and no coroutines of its own, which cost several times the request's own
    work in a small service (BENCHMARKS.md). Whatever else gets a Later (the inline
    strategy, a transport that does not know it) awaits it: it is awaitable, and the
    awaiting goroutine parks as ``netframe reply``.

    A Later is a :class:`gosim.lowlevel.Waiter` settled with the reply's bytes (its one
    consumer is the server's callback or the goroutine that awaits it). :meth:`reply`
    must be called exactly once, by a goroutine of the server's runtime (a callback
    that one runs included), with the reply's bytes, or None for no reply. Until then
    the request holds its ``max_in_flight`` slot, and a graceful shutdown waits for it
    as for a handler's goroutine: a Later never replied to holds its slot for the
    connection's life.
    """

    __slots__ = ()

    def reply(self, value: bytes | None) -> None:
        """Settle the reply (bytes, or None: none); RuntimeError if already settled.

        A reply to a Later whose awaiting goroutine has left (it was cancelled while
        waiting) is dropped: nobody is left to send it."""
        if not self.settle(value):
            try:
                self.result()
            except WaitCancelled:
                return
            raise RuntimeError("this Later has its reply already")

    def __await__(self) -> Generator[Any, Any, bytes | None]:
        # A plain generator around the wait: __await__ may not return the pure path's
        # wait, which is a (generator-based) coroutine.
        return (yield from self.wait(_HANDLER_REPLY))  # type: ignore[no-any-return]


_HANDLER_REPLY: Final = WaitReason.HANDLER_REPLY


def _handle_each_py(
    handler: Handler, frames: list[bytes], start: int, replies: list[Any], run: bool = True
) -> tuple[int, Any, bool, int]:
    """``handle_each``'s twin (``netframe/_speedups_server.c.h`` says what it returns):
    ``handler(frame)`` for ``frames[start:]``, the replies appended, up to the first
    result that must wait; with ``run``, a coroutine is run with one send first."""
    errors = 0
    count = len(frames)
    i = start
    while i < count:
        try:
            result: Any = handler(frames[i])
            if run and type(result) is _Coroutine:
                try:
                    yielded = result.send(None)
                except StopIteration as stop:
                    result = stop.value
                else:
                    return i, (result, yielded), True, errors
        except Exception:
            errors += 1
            i += 1
            continue
        if result is not None:
            if type(result) is not bytes and type(result) is not bytearray:
                return i, result, False, errors  # an awaitable, or an unusual reply
            replies.append(result)
        i += 1
    return i, None, False, errors


_handle_each: Any = _handle_each_py if _c_speedups is None else _c_speedups.handle_each


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


async def _settle(pending: Any, suspended: bool) -> Any:
    """The reply of a handler ``handle_each`` stopped at: resume its suspended coroutine,
    or await what it returned, or take that as the reply (``write_frames`` judges it)."""
    if suspended:
        return await _resume(*pending)
    if _awaitable(pending):
        return await pending
    return pending


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
class ServerStatistics:
    """What :meth:`Server.statistics` returns: counts since the server started."""

    connections: int  # open now
    accepted: int
    rejected: int  # refused at the connection limit
    accept_errors: int  # temporary accept failures (EMFILE...), each retried after a wait
    frames_received: int
    frames_sent: int
    bytes_received: int
    bytes_sent: int
    heartbeats_missed: int
    dead_peers: int
    idle_closed: int  # idle timeouts, session and raw
    protocol_errors: int
    handler_errors: int
    read_timeouts: int = 0  # closed: a frame not whole within read_timeout
    write_timeouts: int = 0  # closed: replies owed and none taken for write_timeout


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


def _reply_nowait(st: _Conn, reply: bytes | None) -> list[bytes] | None:
    """Send a handler's reply at once if the send queue has room (send_many's first
    case); the frames still to send, with a wait for room, if not. A connection closed
    meanwhile (a dead peer, shutdown past its grace) loses the reply: the handler's
    goroutine must not turn that into a panic."""
    if reply is None or st.closed:
        return None
    try:
        if _send_data is not None and _send_data(st.fc, st.session, reply, st.clock):
            return None  # sent at once, in C
        frames = [st.session.data(reply, gosim.now())]
        if st.fc.send_many_nowait(frames):
            return None
    except OSError:  # ClosedError included: the reply is lost with it
        return None
    return frames


def _replies_nowait(st: _Conn, replies: list[bytes]) -> list[bytes] | None:
    """:func:`_reply_nowait` for several replies, sent together (one send)."""
    if len(replies) == 1:
        return _reply_nowait(st, replies[0])
    if st.closed:
        return None
    try:
        if _send_data is not None and _send_data(st.fc, st.session, replies, st.clock):
            return None  # sent at once, in C
        frames = st.session.data_many(replies, gosim.now())
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


class Server:
    """Serves ``handler(payload) -> reply | None`` on long connections; see the module docstring.

    ``handler`` is an async function, or a plain function for work that never waits: a
    plain function's return value is the reply, with no coroutine made and run per
    request (several times cheaper for small requests: see BENCHMARKS.md). Whatever
    awaitable a handler returns is awaited; in session mode a :class:`Later` it returns
    is not: its reply is sent when other code settles it, with no goroutine waiting.
    The same holds for ``handle_batch``.

    ``handle_batch`` instead of ``handler``: ``handle_batch(payloads) -> replies`` gets
    the DATA payloads of one receive, in order, and returns one entry per payload
    (``None``: no reply), for protocols whose peers pipeline many small requests: one
    call per receive instead of one per frame. A connection's batches are handled one
    at a time, in order (``max_in_flight`` does not apply). A batch whose handler
    raises, or returns a list of the wrong length, gets no replies and counts once in
    ``handler_errors``; the connection goes on.

    In session mode, up to ``max_in_flight`` handlers of one connection run at once
    and their replies leave as they finish: a protocol that pipelines requests says in
    its payloads which reply answers which (as msgpack-rpc's ids do), or uses
    ``max_in_flight=1``. Raw mode keeps request order itself (see the module docstring).

    ``max_connections`` defaults to :func:`default_max_connections` (10,000, or less
    under a lower descriptor limit). ``on_accept_error(exc, delay)`` sees each
    temporary accept error and the wait before the next try (default: a warning on
    the ``netframe`` logger). ``idle_timeout`` applies in both modes; in raw mode it
    counts frames (one must arrive whole, or a reply leave, within the timeout) and
    closes within 1.25 times the timeout, checked a few times per timeout so that
    frames pay nothing for it.

    Against peers that hold a connection's resources (see the module docstring), in
    both modes: a frame must arrive whole within ``read_timeout`` seconds of its first
    byte (default DEFAULT_READ_TIMEOUT, 30 s; None: no bound); while a connection owes
    its peer more than ``max_owed_bytes`` of replies not yet written (default
    DEFAULT_MAX_OWED_BYTES, 4 MiB; None: only ``send_queue`` bounds them) it reads none
    of the peer's frames, so what a peer that never reads costs is that bound plus
    the replies of one receive and of the handlers already running; and a connection
    that owes replies and whose peer takes none of their bytes for ``write_timeout``
    seconds (default DEFAULT_WRITE_TIMEOUT, 30 s; looked at twice, so closed within
    2.5 times that) is closed. ``statistics()`` counts
    both closes (``read_timeouts``, ``write_timeouts``).
    """

    def __init__(
        self,
        handler: Handler | None = None,
        *,
        handle_batch: BatchHandler | None = None,
        format: FrameFormat | None = None,
        max_connections: int | None = None,
        max_in_flight: int = 64,
        heartbeat_interval: float | None = 10.0,
        heartbeat_timeout: float | None = None,
        idle_timeout: float | None = None,
        grace_period: float = 5.0,
        send_queue: int = 1024,
        raw: bool = False,
        on_accept_error: Callable[[OSError, float], None] | None = None,
        read_timeout: float | None = DEFAULT_READ_TIMEOUT,
        write_timeout: float | None = DEFAULT_WRITE_TIMEOUT,
        max_owed_bytes: int | None = DEFAULT_MAX_OWED_BYTES,
    ) -> None:
        if max_connections is None:
            max_connections = default_max_connections()
        if max_connections < 1 or max_in_flight < 1:
            raise ValueError("max_connections and max_in_flight must be at least 1")
        if (handler is None) == (handle_batch is None):
            raise TypeError("Server needs a handler or a handle_batch, not both")
        if handle_batch is not None:
            max_in_flight = 1  # batches of one connection run one at a time, in order
        if idle_timeout is not None and idle_timeout <= 0:
            raise ValueError(f"idle_timeout must be positive, got {idle_timeout}")
        if send_queue < 1:
            raise ValueError(f"send_queue must be at least 1, got {send_queue}")
        for name, value in (("read_timeout", read_timeout), ("write_timeout", write_timeout)):
            if value is not None and value <= 0:
                raise ValueError(f"{name} must be positive, got {value}")
        if max_owed_bytes is not None and max_owed_bytes < 1:
            raise ValueError(f"max_owed_bytes must be at least 1, got {max_owed_bytes}")
        self.read_timeout = read_timeout
        self.write_timeout = write_timeout
        self.max_owed_bytes = max_owed_bytes
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
        # heartbeats or goaway, so refusals and shutdown just close.
        self.raw = raw
        self.on_accept_error = on_accept_error
        # The handler strategy, chosen once: what the reader hands each receive to.
        self._handle: Callable[[_Conn, list[bytes]], Awaitable[list[bytes]]]
        if handle_batch is not None:
            self._handle = self._handle_batch
        elif max_in_flight == 1:
            self._handle = self._handle_inline
        elif raw:
            self._handle = self._handle_ordered
        else:
            self._handle = self._handle_concurrent
        self._replies_in_order = max_in_flight == 1
        # Raw mode with one handler at a time, and session mode with concurrent
        # handlers: a connection with the C fast path is served by one C call per wake
        # (FramedConn.exchange), the same loop as _read_connection, _deliver and
        # _handle_inline or _handle_concurrent in Python.
        self._exchange = handle_batch is None and (raw if max_in_flight == 1 else not raw)
        self._conns: set[_Conn] = set()
        # Connections with Later replies gathered in this pass, in the order their first
        # reply came; a goroutine sends them at the pass's end (Server._send_gathered).
        self._gathered: list[_Conn] = []
        self._listener: Listener | None = None
        self._shutting_down = False
        self._stopped: Chan[None] = Chan()
        self._lingering = 0  # refusals waiting for their peer to take the GOAWAY
        # The refusal every excess connection gets, made once.
        self._refusal = self.format.encode(
            Session(0.0, heartbeat_interval=None).goaway(
                GoAwayCode.CONNECTION_LIMIT, "connection limit"
            )
        )
        self._counters = dict.fromkeys(
            (
                "accepted",
                "rejected",
                "accept_errors",
                "heartbeats_missed",
                "dead_peers",
                "idle_closed",
                "protocol_errors",
                "handler_errors",
                "read_timeouts",
                "write_timeouts",
                "frames_received",
                "frames_sent",
                "bytes_received",
                "bytes_sent",
            ),
            0,
        )

    def statistics(self) -> ServerStatistics:
        """The server's counters now, open connections' included (trio's naming)."""
        c = dict(self._counters)
        for st in self._conns:
            s = st.fc.statistics()
            c["frames_received"] += s.frames_read
            c["frames_sent"] += s.frames_written
            c["bytes_received"] += s.bytes_read
            c["bytes_sent"] += s.bytes_written
            c["heartbeats_missed"] += st.session.heartbeats_missed
            if st.exchange is not None:  # its handlers' failures not yet taken
                c["handler_errors"] += st.exchange.errors
        return ServerStatistics(connections=len(self._conns), **c)

    # ------------------------------------------------------------ accepting

    async def serve(self, listener: Listener) -> None:
        """Accept and serve until :meth:`shutdown` has finished."""
        self._listener = listener
        retry = 0.0
        while not self._shutting_down:
            try:
                conn = await listener.accept()
            except Exception as exc:
                if self._stopping():
                    break
                if not _is_temporary(exc):
                    raise
                assert isinstance(exc, OSError)
                retry = min(2 * retry, ACCEPT_RETRY_MAX) if retry else ACCEPT_RETRY_MIN
                self._counters["accept_errors"] += 1
                if self.on_accept_error is not None:
                    self.on_accept_error(exc, retry)
                else:
                    _log.warning("netframe: accept error: %s; retrying in %.3f s", exc, retry)
                await gosim.sleep(retry)
                continue
            retry = 0.0
            if self._stopping():
                conn.close()
                break
            if len(self._conns) >= self.max_connections:
                self._counters["rejected"] += 1
                go(self._reject, conn)
                continue
            self._counters["accepted"] += 1
            # Counted here, where the limit is checked, not in the connection's own
            # goroutine: a burst accepted before any of those has run would pass it.
            go(self._serve_conn, self._open(conn))
        await self._stopped.recv()

    def _stopping(self) -> bool:
        # A method, not the attribute inline: shutdown() flips it while serve() awaits.
        return self._shutting_down

    async def _reject(self, conn: StreamConn) -> None:
        """Refuse a connection over the limit: GOAWAY(CONNECTION_LIMIT), then a close
        that lets the peer read it (session mode); raw mode just closes."""
        try:
            if not self.raw:
                set_write_deadline = getattr(conn, "set_write_deadline", None)
                if set_write_deadline is not None:
                    set_write_deadline(gosim.now() + CLOSE_LINGER)
                await conn.write(self._refusal)
                if self._lingering < MAX_LINGERING:
                    self._lingering += 1
                    try:
                        await _close_write_and_drain(conn, CLOSE_LINGER)
                    finally:
                        self._lingering -= 1
        except OSError:  # the peer is gone already: nothing to tell it
            pass
        finally:
            conn.close()

    # -------------------------------------------------------- a connection

    def _open(self, conn: StreamConn) -> _Conn:
        fc = FramedConn(
            conn, self.format, send_queue=self.send_queue, max_owed_bytes=self.max_owed_bytes
        )
        session = Session(
            gosim.now(),
            heartbeat_interval=None if self.raw else self.heartbeat_interval,
            heartbeat_timeout=None if self.raw else self.heartbeat_timeout,
            idle_timeout=None if self.raw else self.idle_timeout,
            defer_pings=True,  # clients ping first; the server answers (PROTOCOL.md)
        )
        st = _Conn(fc, session)
        self._conns.add(st)
        return st

    def _deadlines(self, st: _Conn) -> _Deadlines | None:
        """The connection's read and write deadlines, if the server has either."""
        if self.read_timeout is None and self.write_timeout is None:
            return None
        limit, owed_limit, fc = self.max_in_flight, self.max_owed_bytes, st.fc

        def paused() -> bool:
            # The reader is not reading: every handler slot taken, or replies owed over
            # the bound. A frame's time runs only while it reads.
            return st.in_flight >= limit or (owed_limit is not None and fc.owed_bytes > owed_limit)

        return _Deadlines(fc, st.clock, paused, self.read_timeout, self.write_timeout)

    async def _serve_conn(self, st: _Conn) -> None:
        deadlines = self._deadlines(st)
        if not self.raw:
            go(self._heartbeat, st, deadlines)
        elif self.idle_timeout is not None or deadlines is not None:
            go(self._raw_watch, st, self.idle_timeout, deadlines)
        try:
            ex = None
            if self._exchange:
                ex = st.fc.exchange(
                    self.handler,
                    self.send_queue,
                    st,
                    None if self.raw else st.session,
                    self.max_in_flight,
                    self._start_pending,
                )
            if ex is not None:
                st.exchange = ex
                stopped = await self._serve_exchange(st, ex)
            else:
                stopped = await _read_connection(st, self._deliver, self.raw)
            if isinstance(stopped, RemoteFrameError):
                await self._protocol_error(st, stopped)
        finally:
            await self._finish(st)
            if st.exchange is not None:
                st.exchange.release()  # it held st: no cycle left for the collector

    async def _serve_exchange(self, st: _Conn, ex: Any) -> Exception | None:
        """A connection's reader on the C loop (:func:`_read_exchange`), with the
        server's handler failures counted and its replies queued."""
        counters = self._counters

        def count_errors(errors: int) -> None:
            counters["handler_errors"] += errors

        return await _read_exchange(
            st,
            ex,
            self.raw,
            self._deliver,
            self._finish_pending,
            self._send_frames_or_defer,
            count_errors,
        )

    async def _finish_pending(self, st: _Conn, pending: Any, suspended: bool) -> bytes | None:
        """A raw connection's handler that must be awaited, in its reader (the one
        handler at a time): its reply, or None when it failed (counted)."""
        st.in_flight = 1  # the idle watch does not close under a running handler
        try:
            reply: bytes | None = await _settle(pending, suspended)
        except Exception:
            self._counters["handler_errors"] += 1
            reply = None
        finally:
            st.in_flight = 0
        return reply

    async def _deliver(self, st: _Conn, payloads: list[bytes]) -> bool:
        """The reader's hand-off: the payloads of one receive to the handler strategy
        chosen at construction, and the replies it returns out (one send for them
        all). A burst of more than ``send_queue`` payloads is taken that many at a
        time, each part's replies sent before the next part is handled: a peer that
        pipelines and never reads makes the server hold at most that many replies.
        False: the connection is gone, stop reading.

        Raw mode writes the replies now (nothing else writes on a raw connection but
        ordered handlers' goroutines, whose replies never come here). Session mode
        sends them without waiting for the peer (``send_many``): one handler at a
        time waits for room in the send queue, in order; concurrent handlers' replies
        go as :meth:`_send_or_defer` says."""
        limit = self.send_queue
        for start in range(0, len(payloads), limit):
            part = payloads if len(payloads) <= limit else payloads[start : start + limit]
            replies = await self._handle(st, part)
            if st.closed:
                return False
            if not replies:
                continue
            if self.raw:
                try:
                    await st.fc.write_frames(replies)
                except OSError:  # broken, or closed by this side meanwhile
                    return False
            elif self._replies_in_order:
                if not await _send(st, st.session.data_many(replies, gosim.now())):
                    return False
            elif not self._send_or_defer(st, replies):
                return False
        return True

    def _send_or_defer(self, st: _Conn, replies: list[bytes]) -> bool:
        """Concurrent handlers' replies (session mode), sent without waiting: replies
        that find the send queue full wait in a goroutine of their own that holds a
        handler's slot, so the reader goes on reading (pings, a protocol error) from a
        peer that reads nothing until ``max_in_flight`` such waits, as it would with
        that many handlers waiting to send. False when the connection is gone."""
        if st.closed:
            return False
        return self._send_frames_or_defer(st, st.session.data_many(replies, gosim.now()))

    def _send_frames_or_defer(self, st: _Conn, frames: list[bytes]) -> bool:
        """:meth:`_send_or_defer` for replies already made session DATA frames."""
        if st.closed:
            return False
        try:
            if not st.fc.send_many_nowait(frames):
                st.in_flight += 1
                go(self._send_later, st, frames)
        except OSError:  # broken, or closed by this side meanwhile
            return False
        return True

    async def _send_later(self, st: _Conn, frames: list[bytes]) -> None:
        """Replies that met a full send queue, sent as room comes (a handler's slot)."""
        try:
            await _send(st, frames)
        finally:
            st.handler_done()

    # The handler strategies (Server._handle is one of them): each takes the payloads
    # of one receive and returns the replies to send now.

    async def _handle_inline(self, st: _Conn, payloads: list[bytes]) -> list[bytes]:
        """One handler at a time, in the reader (``max_in_flight=1``): replies in order,
        no goroutine per request. The handlers that return at once are called in one
        C loop (``handle_each``); one that must wait is awaited here."""
        handler = self.handler
        replies: list[bytes] = []
        st.in_flight = 1
        i, count = 0, len(payloads)
        while i < count:
            i, pending, suspended, errors = _handle_each(handler, payloads, i, replies)
            if errors:
                self._counters["handler_errors"] += errors
            if pending is None:
                break
            try:
                reply = await _settle(pending, suspended)
            except Exception:
                self._counters["handler_errors"] += 1
            else:
                if reply is not None:
                    replies.append(reply)
            i += 1
        st.in_flight = 0
        return replies

    async def _handle_concurrent(self, st: _Conn, payloads: list[bytes]) -> list[bytes]:
        """Up to ``max_in_flight`` handlers at once (session mode): each is called in the
        reader; a plain function's reply goes out with the burst's, and an awaitable
        (an async handler's coroutine, unstarted) runs in a goroutine of its own,
        which sends its reply when it is done. At ``max_in_flight`` the reader sends
        what it has and waits for room (backpressure reaches the peer through TCP).

        An async handler is not started in the reader, as ``_handle_inline`` does: what
        it parks on would know the reader's goroutine, not the one that goes on."""
        handler = self.handler
        limit = self.max_in_flight
        replies: list[bytes] = []
        i, count = 0, len(payloads)
        while i < count:
            if st.in_flight >= limit:
                if replies and not self._send_or_defer(st, replies):
                    return []
                replies = []
                while st.in_flight >= limit and not st.closed:
                    await st.room.sleep_until(math.inf)
                if st.is_closed():
                    return []
            i, pending, _, errors = _handle_each(handler, payloads, i, replies, False)
            if errors:
                self._counters["handler_errors"] += errors
            if pending is None:
                break
            self._start_pending(st, pending)
            i += 1
        return replies

    def _start_pending(self, st: _Conn, pending: Any) -> None:
        """A concurrent handler's result that is not its reply yet takes a handler
        slot: a :class:`Later` replies when settled, anything else is finished in a
        goroutine of its own (:meth:`_handle_rest`)."""
        st.in_flight += 1
        if type(pending) is Later:
            pending.on_settle(self._later_replied, st)
        else:
            go(self._handle_rest, st, pending)

    def _later_replied(self, st: _Conn, later: Waiter) -> None:
        """A :class:`Later`'s reply, gathered: the replies that the code settling Laters
        (a group commit answering its batch) settles before it next waits go out
        together, one send per connection, at the end of that pass (:meth:`_send_gathered`).
        The Later's slot is held until its reply is sent."""
        reply = later.result()
        if reply is None or st.closed:
            st.handler_done()
            return
        if not st.owed:
            gathered = self._gathered
            gathered.append(st)
            if len(gathered) == 1:
                # Runs once this goroutine waits or yields: after the pass.
                go(self._send_gathered)
        st.owed.append(reply)

    async def _send_gathered(self) -> None:
        """The end of a pass of Later replies: each connection's replies, in the order
        they were settled, with one send (one C call where built); what the socket does
        not take goes to the connection's writer, as a single reply's does; replies
        that meet a full send queue wait for room in a goroutine that holds a slot."""
        gathered, self._gathered = self._gathered, []
        for st in gathered:
            owed, st.owed = st.owed, []
            frames = _replies_nowait(st, owed)
            if frames is None:
                st.in_flight -= len(owed)
                st.room.ring()
            else:
                st.in_flight -= len(owed) - 1
                go(self._send_later, st, frames)  # one slot held until they are sent

    async def _handle_rest(self, st: _Conn, pending: Any) -> None:
        """A handler's awaitable (or an unusual reply), in its own goroutine: await it,
        send its reply."""
        try:
            try:
                # An async handler's coroutine, awaited here: _settle's first case
                # without its two frames (this runs once a request).
                if type(pending) is _Coroutine:
                    reply = await pending
                else:
                    reply = await _settle(pending, False)
            except Exception:
                self._counters["handler_errors"] += 1
                return
            frames = _reply_nowait(st, reply)
            if frames is not None:
                await _send(st, frames)
        finally:
            st.handler_done()

    async def _handle_ordered(self, st: _Conn, payloads: list[bytes]) -> list[bytes]:
        """Raw frames with up to ``max_in_flight`` handlers at once, replies in request order.

        Raw frames carry no request id, so a peer can only match replies to requests by
        order: each request takes a place in line (a :class:`_Ticket`) and a finished
        reply waits for those before it. A request holds its ``max_in_flight`` slot
        until its reply is queued, so a slow request holds back at most that many
        finished replies, and queued replies are bounded by ``send_queue``.
        """
        if st.order is None:
            st.order = deque()
        order, limit = st.order, self.max_in_flight
        for payload in payloads:
            while st.in_flight >= limit and not st.closed:
                await st.room.sleep_until(math.inf)  # backpressure
            if st.is_closed():
                break
            ticket = _Ticket()
            order.append(ticket)
            st.in_flight += 1
            go(self._handle_in_line, st, payload, ticket)
        return []

    async def _handle_in_line(self, st: _Conn, payload: bytes, ticket: _Ticket) -> None:
        """One raw request of :meth:`_handle_ordered`: its reply waits its turn."""
        assert self.handler is not None
        try:
            reply: Any = self.handler(payload)
            if _awaitable(reply):
                reply = await reply
        except Exception:
            self._counters["handler_errors"] += 1
            reply = None
        await self._release_in_order(st, ticket, reply)

    async def _release_in_order(self, st: _Conn, ticket: _Ticket, reply: Any) -> None:
        """Raw mode's ordered replies: record this one, then (unless another goroutine
        is at it) queue every finished reply at the head of the line, in order."""
        ticket.reply = reply
        ticket.done = True
        if st.releasing:
            return  # the goroutine releasing replies now takes this one in its turn
        st.releasing = True
        order = st.order
        assert order is not None
        try:
            while order and order[0].done:
                head = order.popleft()
                if head.reply is not None and not st.closed:
                    await _send(st, [head.reply])  # waits while send_queue is full
                st.handler_done()
        finally:
            st.releasing = False

    async def _handle_batch(self, st: _Conn, payloads: list[bytes]) -> list[bytes]:
        """``handle_batch``: the payloads of one receive in one call, the batches of a
        connection one at a time. Its replies, ``None`` entries dropped; [] when it
        failed (raised, or returned a list of the wrong length)."""
        batch = self.handle_batch
        assert batch is not None
        st.in_flight = 1
        try:
            replies: Any = batch(payloads)
            if type(replies) is not list and _awaitable(replies):
                replies = await replies
        except Exception:
            replies = None
        finally:
            st.in_flight = 0
        if type(replies) is not list or len(replies) != len(payloads):
            self._counters["handler_errors"] += 1
            return []
        if _drop_none is not None:
            kept: list[bytes] = _drop_none(replies)
            return kept
        return [r for r in replies if r is not None]

    async def _protocol_error(self, st: _Conn, exc: RemoteFrameError) -> None:
        """The peer broke the framing or the session protocol: count it, tell the peer
        what was wrong (GOAWAY(PROTOCOL_ERROR) with the error's text, e.g. the length
        announced and the length allowed), and close. Called by the reader, which can
        then read what the peer still sends while the goaway gets through."""
        self._counters["protocol_errors"] += 1
        await self._goaway_and_close(st, GoAwayCode.PROTOCOL_ERROR, _reason_for(exc), drain=True)

    async def _heartbeat(self, st: _Conn, deadlines: _Deadlines | None = None) -> None:
        end = await _keep_alive(st, deadlines)
        if end is _HeartbeatEnd.DEAD:
            self._counters["dead_peers"] += 1
            self._close_now(st)
        elif end is _HeartbeatEnd.IDLE:
            self._counters["idle_closed"] += 1
            await self._goaway_and_close(st, GoAwayCode.IDLE_TIMEOUT, "idle", drain=False)
        elif end is not _HeartbeatEnd.CLOSED:
            await self._deadline_passed(st, end)

    async def _deadline_passed(self, st: _Conn, end: _HeartbeatEnd) -> None:
        """Close a connection whose read or write deadline passed (counted); a session
        peer that is slow to send is told why first (GOAWAY(IDLE_TIMEOUT)), one that
        reads nothing is not: it would not read that either."""
        if end is _HeartbeatEnd.READ:
            self._counters["read_timeouts"] += 1
            if not self.raw:
                reason = f"frame not received whole within {self.read_timeout:g} s"
                await self._goaway_and_close(st, GoAwayCode.IDLE_TIMEOUT, reason, drain=False)
        else:
            self._counters["write_timeouts"] += 1
        self._close_now(st)

    async def _raw_watch(
        self, st: _Conn, idle_timeout: float | None, deadlines: _Deadlines | None
    ) -> None:
        """Raw mode's idle timeout and deadlines, from counters the connection keeps
        anyway. The idle timeout is looked at every quarter timeout, so the close comes
        between ``idle_timeout`` and 1.25 times that after the last frame read or
        written (with no handler running)."""
        fc = st.fc
        step = math.inf if idle_timeout is None else idle_timeout / 4
        seen = fc.frames_read + fc.frames_written
        quiet_since = gosim.now()
        next_idle = quiet_since + step
        recheck = None
        if deadlines is not None:

            def recheck() -> float:
                return min(next_idle, deadlines.recheck())

        while not st.closed:
            wake = next_idle if deadlines is None else min(next_idle, deadlines.next_look)
            await st.alarm.sleep_until(wake, recheck)
            if st.is_closed():
                return
            now = gosim.now()
            if deadlines is not None:
                end = deadlines.overdue(now)
                if end is not None:
                    await self._deadline_passed(st, end)
                    return
            if idle_timeout is None or now < next_idle:
                continue
            next_idle = now + step
            count = fc.frames_read + fc.frames_written
            if count != seen or st.in_flight:
                seen, quiet_since = count, now
            elif now - quiet_since >= idle_timeout:
                self._counters["idle_closed"] += 1
                self._close_now(st)
                return

    async def _goaway_and_close(self, st: _Conn, code: int, reason: str, *, drain: bool) -> None:
        """Tell the peer why (session mode) and close, within about 2 * CLOSE_LINGER
        whatever the peer does. ``drain``: the caller is the connection's reader, so
        the peer's input can be read (and dropped) until it closes, which keeps the
        close from becoming a reset that could destroy the goaway."""
        if st.closed:
            return
        if not self.raw:
            try:
                goaway: bytes | None = st.session.goaway(code, reason)
            except LocalSessionError:  # the session was closed: nothing more to send
                goaway = None
            if goaway is not None and st.fc.send_nowait(goaway):
                try:
                    await st.fc.flush(CLOSE_LINGER)
                except Exception:  # the writer failed: the peer is gone
                    pass
            if drain and not st.closed:
                await _close_write_and_drain(st.fc.conn, CLOSE_LINGER)
        self._close_now(st)

    def _close_now(self, st: _Conn) -> None:
        if st.closed:
            return
        st.fc.conn.close()  # unblocks the reader (EOF or error) and the writer
        st.end()

    async def _finish(self, st: _Conn) -> None:
        """After the reader ends: wait for handlers (bounded by shutdown's grace), close."""
        while st.in_flight and not st.closed:
            st.draining = True
            await st.room.sleep_until(math.inf)  # rung as each handler ends, and by end()
        if not st.closed:
            # The peer ended its side; what is queued for it is written. The heartbeat
            # (or raw mode's idle watch) still runs meanwhile: a peer that stops
            # reading too is closed by it, which ends this flush.
            await st.fc.aclose(flush=True)
        else:
            # Closed already (dead peer, protocol error, shutdown): stop the
            # FramedConn's writer goroutine too, or every such connection leaves one.
            await st.fc.aclose(flush=False)
        self._retire(st)

    def _retire(self, st: _Conn) -> None:
        """Count a finished connection out of the server (once, whoever gets here first:
        its reader, or shutdown past the grace period)."""
        if st.retired:
            return
        st.retired = True
        st.closed = True
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

        Returns once the grace period (``grace`` seconds, default ``grace_period``) is
        over, or sooner when every connection has finished, whatever the peers do:
        handlers still running then lose their connection, and replies a peer has not
        read by then are lost. When it returns, ``statistics().connections`` is 0.
        """
        if self._shutting_down:
            return
        self._shutting_down = True
        if self._listener is not None:
            self._listener.close()
        grace = self.grace_period if grace is None else grace
        deadline = gosim.now() + grace
        for st in list(self._conns):
            st.draining = True
            if self.raw or st.closed:
                continue
            try:
                goaway = st.session.goaway(GoAwayCode.NO_ERROR, "shutting down")
            except LocalSessionError:
                continue
            st.fc.send_nowait(goaway)  # never waits behind a peer that does not read
        while any(st.in_flight for st in self._conns) and gosim.now() < deadline:
            await gosim.sleep(min(0.01, max(deadline - gosim.now(), 0)))
        # Write what is queued, on every connection at once, until the grace ends.
        for st in list(self._conns):
            if not st.closed:
                st.closed = True
                go(self._flush_and_close, st, deadline)
        if self._conns:
            timer = gosim.Timer(max(deadline - gosim.now(), 0))
            await select(recv(self._stopped), recv(timer.c))
            timer.stop()
        # Past the grace period: whatever is left (a peer that does not read, a
        # handler that does not return) is closed and counted out now.
        for st in list(self._conns):
            st.closed = True
            st.fc.conn.close()  # also ends a flush that is still waiting for the peer
            await st.fc.aclose(flush=False)
            self._retire(st)
        self._signal_stopped()

    async def _flush_and_close(self, st: _Conn, deadline: float) -> None:
        await st.fc.aclose(flush=True, timeout=max(deadline - gosim.now(), 0))

    def _signal_stopped(self) -> None:
        if not self._stopped.closed:
            self._stopped.close()  # a closed channel wakes serve() whenever it gets there


class Client:
    """One long connection to a server, with heartbeats and reconnects on demand.

    ``dial()`` makes a new connection. :meth:`connect` retries failed dials with
    exponential backoff (``backoff_initial`` doubling up to ``backoff_max``) and full
    jitter (each wait uniform in [0, backoff]), so many clients reconnecting after an
    outage do not arrive together. :meth:`recv` raises :class:`ConnectionLost` when the
    connection ends; call :meth:`connect` again to get a new one. When the server said
    why (GOAWAY) before the connection ended, ``ConnectionLost.reason`` is what it
    said, even if a reset followed.

    Nothing waits without bound on the server: pings never wait behind a full send
    queue, so a server that stops reading and answering is found dead at the
    heartbeat timeout; :meth:`send` takes a ``timeout``; :meth:`close` writes what is
    queued for at most ``timeout`` seconds (default DEFAULT_CLOSE_TIMEOUT).

    With ``on_data``, each DATA payload is passed to ``on_data(payload)`` on the
    connection's reader goroutine, in the order received, instead of being queued for
    :meth:`recv`: no goroutine switch between the socket and the code that consumes
    the payload (a protocol client matching responses to callers, say). When it returns
    an awaitable, the reader awaits it before it hands on the next payload. Neither may
    raise: an exception ends the reader's goroutine, which is a panic of the runtime as
    for any goroutine. :meth:`recv` then only reports the connection's end: it raises
    :class:`ConnectionLost` once the connection has ended.

    ``servers_found_dead`` counts the connections this client closed because the
    server sent nothing for the heartbeat timeout (the rest ended otherwise).
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
        on_data: Callable[[bytes], Awaitable[Any] | None] | None = None,
    ) -> None:
        self.dial = dial
        self.on_data = on_data
        self.format = FrameFormat() if format is None else format
        self.heartbeat_interval = heartbeat_interval
        self.heartbeat_timeout = heartbeat_timeout
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self.max_attempts = max_attempts
        self.rng = rng or random.Random()
        self.attempts = 0
        self.connects = 0
        # Connections this client closed because the server sent nothing (no pong, no
        # frame) for the heartbeat timeout: a dead server or path, or a starved one.
        self.servers_found_dead = 0
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
        st = _Conn(fc, session)
        self._st = st
        self._inbox = Chan(1024)
        go(self._reader, st, self._inbox)
        go(self._heartbeat, st)

    async def send(self, payload: bytes, timeout: float | None = None) -> None:
        """Queue one DATA frame; ConnectionLost when the connection has ended or breaks.

        With ``timeout``, a send queue still full after that many seconds (a server that
        does not read) raises :class:`TimeoutError`; the payload was not queued. A
        payload the format cannot carry raises the codec's LocalFrameError instead
        (the connection is fine; the payload is not).
        """
        st = self._st
        if st is None:
            raise ConnectionLost("not connected")
        if st.closed:
            raise ConnectionLost(_lost_reason(st, "not connected"))
        try:
            fc = st.fc
            # Written at once when nothing is queued ahead (no switch to the writer
            # goroutine: a call's request is usually alone; in C where it can be);
            # queued otherwise.
            if _send_data is None or not _send_data(fc, st.session, payload, st.clock):
                frame = st.session.data(payload, gosim.now())
                if not fc.send_many_nowait([frame]):
                    await fc.send(frame, timeout)
        except OSError as exc:  # ClosedError included
            if type(exc) is TimeoutError:  # FramedConn.send's timeout: nothing was queued
                raise
            # The writer hit a reset or a broken pipe, or the reader closed the
            # connection meanwhile: one exception type for "connection gone".
            raise ConnectionLost(_lost_reason(st, f"connection broken: {exc}")) from exc

    @property
    def goaway_received(self) -> GoAway | None:
        """The GOAWAY the server sent on the current connection, or None.

        After a GOAWAY the server starts no new work on this connection: replies it owes
        still arrive, but new requests belong on another connection (:meth:`connect`
        again, or another server)."""
        st = self._st
        return None if st is None else st.session.goaway_received

    async def recv(self, timeout: float | None = None) -> bytes:
        """The next DATA payload from the server; ConnectionLost when the connection ended.

        With ``timeout``, :class:`TimeoutError` when no payload came within that many
        seconds; nothing is lost (a later ``recv`` gets what comes after)."""
        if timeout is None:
            item = await self._inbox.recv()
        else:
            timer = gosim.Timer(max(timeout, 0.0))
            try:
                which, item, _ = await select(recv(self._inbox), recv(timer.c))
            finally:
                timer.stop()
            if which == 1:
                raise TimeoutError(f"no payload from the server within {timeout} s")
        if isinstance(item, ConnectionLost):
            self._inbox.try_send(item)  # every later recv sees it too
            raise item
        if item is None:
            raise ConnectionLost("not connected")
        data: bytes = item
        return data

    async def close(self, timeout: float | None = DEFAULT_CLOSE_TIMEOUT) -> None:
        """Write what is queued (for at most ``timeout`` seconds; None: no bound), then
        close the connection."""
        st = self._st
        self._st = None
        if st is not None and not st.closed:
            st.closed = True
            await st.fc.aclose(flush=True, timeout=timeout)
            st.end()

    async def _reader(self, st: _Conn, inbox: Chan[Any]) -> None:
        on_data = self.on_data

        async def deliver(st: _Conn, payloads: list[bytes]) -> bool:
            if on_data is None:
                for payload in payloads:
                    await inbox.send(payload)
            else:
                for payload in payloads:
                    pending = on_data(payload)
                    if pending is not None:
                        await pending
            return True

        async def finish(st: _Conn, pending: Any, suspended: bool) -> None:
            await pending  # on_data's awaitable, in the reader as deliver awaits it

        reason = "server closed the connection"
        try:
            # on_data is called by the C loop where there is one (no reply, no slots).
            ex = None if on_data is None else st.fc.exchange(on_data, 1 << 30, st, st.session)
            if ex is None:
                stopped = await _read_connection(st, deliver, raw=False)
            else:
                st.exchange = ex
                stopped = await _read_exchange(st, ex, False, deliver, finish, None, None)
            if isinstance(stopped, RemoteSessionError):
                reason = f"protocol error from the server: {stopped}"
            elif stopped is not None:
                reason = f"connection broken: {stopped}"
        finally:
            # The FramedConn's writer goroutine stops with the connection (a client that
            # reconnects after every loss would otherwise leave one behind each time).
            await st.fc.aclose(flush=False)
            st.end()
            if st.exchange is not None:
                st.exchange.release()  # it held st: no cycle left for the collector
            inbox.try_send(ConnectionLost(_lost_reason(st, reason)))

    async def _heartbeat(self, st: _Conn) -> None:
        if await _keep_alive(st) is _HeartbeatEnd.DEAD:
            self.servers_found_dead += 1
            st.fc.conn.close()  # the reader sees the end and reports ConnectionLost


def _lost_reason(st: _Conn, broken: str) -> str:
    """Why a client connection ended: a dead server, else what the server said in its
    GOAWAY (a reset or an end of stream after it is the close it announced), else
    ``broken``, what the connection did."""
    if st.session.dead:
        return "server missed its heartbeats"
    goaway = st.session.goaway_received
    if goaway is not None:
        return f"server sent GOAWAY({int(goaway.code)}): {goaway.reason}"
    return broken
