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

This module holds the ``Server`` (its accept loop, its handler strategies, its
heartbeat, deadline and shutdown handling) and its statistics; the connection state,
reader and heartbeat loops it shares with the client are in ``_drivers.py``, the
calling of handlers in ``_handlers.py`` and the ``Client`` in ``_client.py``.
"""

from __future__ import annotations

import errno
import logging
import math
import sys
from collections import deque
from collections.abc import Awaitable, Callable, Generator
from dataclasses import dataclass
from typing import Any, Final, Protocol, Self

import gosim
from gosim import Chan, go, recv, select
from gosim.lowlevel import WaitCancelled, Waiter, WaitReason

from ._codec import FrameFormat
from ._conn import FramedConn, StreamConn
from ._drivers import (
    _Conn,
    _Deadlines,
    _HeartbeatEnd,
    _keep_alive,
    _read_connection,
    _read_exchange,
    _reply_nowait,
    _send,
    _Ticket,
)
from ._exceptions import RemoteFrameError
from ._handlers import (
    BatchHandler,
    Handler,
    _awaitable,
    _drop_none,
    _handle_each,
    _settle,
)
from ._session import MAX_REASON_BYTES, GoAwayCode, LocalSessionError, Session

__all__ = [
    "DEFAULT_MAX_OWED_BYTES",
    "DEFAULT_READ_TIMEOUT",
    "DEFAULT_WRITE_TIMEOUT",
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


class Later(Waiter):
    """A reply that comes later, with no goroutine waiting for it.

    A handler whose work finishes elsewhere (in a batch that another goroutine
    commits, say) returns a ``Later`` and has that work call :meth:`reply` when it is
    done; the server sends the reply from there. A request that waits then costs no
    goroutine and no coroutines of its own, which in a small service cost more than the
    request's own work. Whatever else gets a Later (the inline
    strategy, a transport that does not know it) awaits it: it is awaitable, and the
    awaiting goroutine parks as ``netframe reply``.

    A Later is a :class:`gosim.lowlevel.Waiter` settled with the reply's bytes; its one
    consumer is the goroutine that awaits it, or the taker that :meth:`reply` calls
    (the server's, given by :meth:`reply_to`). :meth:`reply`
    must be called exactly once, by a goroutine of the server's runtime (a callback
    that one runs included), with the reply's bytes, or None for no reply. Until then
    the request holds its ``max_in_flight`` slot, and a graceful shutdown waits for it
    as for a handler's goroutine: a Later never replied to holds its slot for the
    connection's life.
    """

    __slots__ = ()

    # No data of its own: a Later's ``data`` is its taker's (reply_to). Refused in
    # __new__, not __init__: a KeyedCall that is a Later (the RPC server's call) is made
    # by KeyedCall.__new__ and its __init__'s super() would otherwise pass through here.
    def __new__(cls) -> Self:
        return super().__new__(cls)

    def reply(self, value: bytes | None) -> None:
        """Settle the reply (bytes, or None: none) and hand it to its taker, if it has
        one (:meth:`reply_to`); RuntimeError if already settled.

        A reply to a Later whose awaiting goroutine has left (it was cancelled while
        waiting) is dropped: nobody is left to send it."""
        if not self.settle(value):
            try:
                self.result()
            except WaitCancelled:
                return
            raise RuntimeError("this Later has its reply already")
        taker = self.data
        if taker is not None:
            self.data = None
            taker[0](taker[1], self)

    def reply_to(self, fn: Callable[[Any, Later], None], arg: Any = None) -> None:
        """Have :meth:`reply` call ``fn(arg, later)`` once the reply is settled (at once
        if it is already): how the server takes a reply with no goroutine waiting for
        it. ``fn`` runs where ``reply`` runs (a group commit's pass, say); it must not
        block. One taker, and then no goroutine may await the Later as well
        (RuntimeError for a second taker, or for an await after it). The taker is kept
        in the Waiter's ``data``, which is the waker's to read: :meth:`reply` is the
        waker."""
        if self.done():
            fn(arg, self)
            return
        if self.data is not None:
            raise RuntimeError("this Later has a taker already")
        self.data = (fn, arg)

    def __await__(self) -> Generator[Any, Any, bytes | None]:
        if self.data is not None:
            raise RuntimeError("a Later has one consumer: it has a taker already")
        # A plain generator around the wait: __await__ may not return the pure path's
        # wait, which is a (generator-based) coroutine.
        return (yield from self.wait(_HANDLER_REPLY))  # type: ignore[no-any-return]


class Listener(Protocol):
    async def accept(self) -> StreamConn:
        """Wait for the next connection and return it."""

    def close(self) -> None:
        """Stop listening."""


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


_HANDLER_REPLY: Final = WaitReason.HANDLER_REPLY

#: The server's own counters, ServerStatistics' fields but ``connections``.
_COUNTERS: Final = (
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
)


def _check_options(
    handler: Handler | None,
    handle_batch: BatchHandler | None,
    max_connections: int,
    max_in_flight: int,
    idle_timeout: float | None,
    send_queue: int,
    read_timeout: float | None,
    write_timeout: float | None,
    max_owed_bytes: int | None,
) -> None:
    """Raise ValueError for a Server option out of its range, TypeError unless
    exactly one of handler and handle_batch is given."""
    if max_connections < 1 or max_in_flight < 1:
        raise ValueError("max_connections and max_in_flight must be at least 1")
    if (handler is None) == (handle_batch is None):
        raise TypeError("Server needs a handler or a handle_batch, not both")
    if idle_timeout is not None and idle_timeout <= 0:
        raise ValueError(f"idle_timeout must be positive, got {idle_timeout}")
    if send_queue < 1:
        raise ValueError(f"send_queue must be at least 1, got {send_queue}")
    for name, value in (("read_timeout", read_timeout), ("write_timeout", write_timeout)):
        if value is not None and value <= 0:
            raise ValueError(f"{name} must be positive, got {value}")
    if max_owed_bytes is not None and max_owed_bytes < 1:
        raise ValueError(f"max_owed_bytes must be at least 1, got {max_owed_bytes}")


class Server:
    """Serves ``handler(payload) -> reply | None`` on long connections; see the module docstring.

    ``handler`` is an async function, or a plain function for work that never waits: a
    plain function's return value is the reply, with no coroutine made and run per
    request (cheaper for small requests: BENCHMARKS.md's network section has both, as
    ``netframe`` and ``netframe-plain``). Whatever
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
        _check_options(
            handler,
            handle_batch,
            max_connections,
            max_in_flight,
            idle_timeout,
            send_queue,
            read_timeout,
            write_timeout,
            max_owed_bytes,
        )
        if handle_batch is not None:
            max_in_flight = 1  # batches of one connection run one at a time, in order
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
        self._handle = self._handler_strategy()
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
        self._counters = dict.fromkeys(_COUNTERS, 0)

    def _handler_strategy(self) -> Callable[[_Conn, list[bytes]], Awaitable[list[bytes]]]:
        """What the reader hands each receive to, for the options set: the batch
        handler, one handler at a time, or concurrent handlers with replies in order (raw
        mode) or as they finish."""
        if self.handle_batch is not None:
            return self._handle_batch
        if self.max_in_flight == 1:
            return self._handle_inline
        if self.raw:
            return self._handle_ordered
        return self._handle_concurrent

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
        if isinstance(pending, Later):
            pending.reply_to(self._later_replied, st)  # called by its reply()
        else:
            go(self._handle_rest, st, pending)

    def _later_replied(self, st: _Conn, later: Later) -> None:
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
            frames = _reply_nowait(st, owed)
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
        kept: list[bytes] = _drop_none(replies)
        return kept

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
