"""``FramedConn``: frames over a gosim byte-stream connection.

A :class:`FramedConn` joins the sans-IO codec to any connection with gosim's ``Conn``
shape (:class:`StreamConn`: ``read(n)``, ``write(data)``, ``close()``), so the same
code runs over TCP, Unix sockets and the simulated network.

Reading: one goroutine at a time calls :meth:`FramedConn.read_frame`; it returns the
next frame, ``None`` at a clean end of stream (the peer closed between frames), and
raises :class:`IncompleteFrame` when the stream ends inside a frame, or the codec's
:class:`RemoteFrameError` on a header that breaks the format (framing is then lost:
close). A second concurrent reader gets :class:`BusyError` at once.

Writing, two ways:

1. :meth:`FramedConn.write_frame` / :meth:`FramedConn.write_frames`: encode and write
   now; ``write_frames`` makes one buffer, so one syscall, for many frames (or, for
   large payloads on a connection that gathers, one ``sendmsg`` of headers and
   payloads without copying the payloads).
2. :meth:`FramedConn.send`: queue the frame for a writer goroutine that batches every
   queued frame into one write. The queue is bounded (``send_queue`` frames), so a
   peer that stops reading makes ``send`` block: backpressure instead of unbounded
   memory. This is what a server answering pipelined requests wants: replies made
   one at a time leave in batches. A write error stops the writer; the next ``send``
   (or :meth:`flush`) raises it, and so does a ``send`` that was waiting for room.
   :meth:`FramedConn.send_nowait` never waits: control frames (pings, pongs, goaway)
   go into the queue when it has room, else ahead of the queued frames, so a peer
   that stops reading cannot hold up a heartbeat or a close.

With ``max_owed_bytes``, reading stops while more than that many bytes sent (queued, or
held by the frame writer) have not been written: a peer that sends requests and reads no
replies holds that much of our memory, not its whole send queue's worth.
:meth:`FramedConn.owed_bytes` says how many there are.

Closing: :meth:`FramedConn.aclose` writes what is queued (``flush=True``) for at most
``timeout`` seconds, then closes the connection whatever the peer does; a ``send``
waiting for room then raises :class:`ClosedError`.

Reading: once the header of a frame of LARGE_FRAME_BYTES or more is in, the rest is
received in place (the C reader into the ``bytes`` object the caller gets; without it,
``read_into`` a buffer copied once at the end); on a timeout or an early end the bytes
go back to the decoder. Either way the buffer grows with the bytes received, doubling,
never to the announced length at once: a header alone costs its sender a few bytes and
the process a few hundred KiB, not the frame. Otherwise each receive asks for
``read_size`` bytes, or the rest of a frame whose size is known
(``FrameDecoder.bytes_needed``) when that is more.

On a connection with Go's ``SyscallConn`` (gosim.net's ``Conn``) and with the C
extension, the hot path is one C call per receive and per send: ``FrameReader``
receives and cuts every complete frame (keeping the start of the next one, receiving
a large frame straight into its ``bytes``), ``FrameWriter`` encodes and sends, and the
netpoller waits in between (``RawConn.read``/``write``). What the reader cannot finish
(an invalid header, the end of the stream inside a frame) goes to the decoder, whose
path serves until it is empty again, so errors and counts are the same either way.

Buffers from ``gosim.mem`` are not used: received frames are ``bytes`` handed to the
caller, and the codec's offset buffer already reuses its storage; a measured benefit
would be needed to add a second allocator here.
"""

from __future__ import annotations

import fcntl
import math
import os
import struct
import termios
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

import gosim
from gosim import Chan, SendOnClosedChannel, Timer, lowlevel, recv, select, send
from gosim.lowlevel import Waiter, WaitReason
from gosim.net import BusyError as _NetBusyError
from gosim.net import ClosedError as _NetClosedError

from ._accel import speedups as _c_speedups
from ._codec import FrameDecoder, FrameFormat
from ._exceptions import RemoteFrameError
from ._session import CLOSED, Session

__all__ = [
    "BusyError",
    "ClosedError",
    "FramedConn",
    "FramedConnStatistics",
    "IncompleteFrame",
    "StreamConn",
]

#: Why the C Exchange stopped (netframe/_speedups_server.c.h defines them; unused where
#: it is not built, since FramedConn.exchange then returns None and StreamLink makes none).
EXCHANGE_READER: int = getattr(_c_speedups, "EXCHANGE_READER", -1)  # end of stream, hand-back
EXCHANGE_PENDING: int = getattr(_c_speedups, "EXCHANGE_PENDING", -1)  # a handler to await
EXCHANGE_WRITE_WAIT: int = getattr(_c_speedups, "EXCHANGE_WRITE_WAIT", -1)  # a send to finish
EXCHANGE_WRITE_GENERAL: int = getattr(_c_speedups, "EXCHANGE_WRITE_GENERAL", -1)
EXCHANGE_CLOSED: int = getattr(_c_speedups, "EXCHANGE_CLOSED", -1)  # a handler closed it
# Session mode's own (netframe._drivers._read_exchange handles them):
EXCHANGE_SEND_QUEUED: int = getattr(_c_speedups, "EXCHANGE_SEND_QUEUED", -1)  # via the queue
EXCHANGE_WRITE_HANDOFF: int = getattr(_c_speedups, "EXCHANGE_WRITE_HANDOFF", -1)
EXCHANGE_GENERAL: int = getattr(_c_speedups, "EXCHANGE_GENERAL", -1)  # frames it leaves
EXCHANGE_OWED: int = getattr(_c_speedups, "EXCHANGE_OWED", -1)  # too much owed to receive

DEFAULT_READ_SIZE = 256 * 1024  # one receive carries a pipelined burst (the batch handler's)
DEFAULT_SEND_QUEUE = 1024
MAX_BATCH_BYTES = 1 << 20  # one write carries at most about this much
#: A frame at least this large is received in place once its header is read.
LARGE_FRAME_BYTES = 256 * 1024
#: Payloads this large together are written by gathering (no copy into one buffer).
GATHER_MIN_BYTES = 64 * 1024
#: ...unless there are more frames than this (many small iovecs cost more than a copy).
GATHER_MAX_FRAMES = 64
#: Control frames held ahead of a full send queue (see ``send_nowait``): a few pongs and
#: a goaway; more than that means the peer reads nothing, and its heartbeat times out.
MAX_URGENT = 8


class StreamConn(Protocol):
    """What FramedConn needs from a connection (gosim.net's ``Conn`` has it)."""

    async def read(self, n: int) -> bytes:
        """Up to ``n`` bytes as soon as some are available; ``b""`` at end of stream."""

    async def write(self, data: bytes) -> int:
        """Write all of ``data``; return its length."""

    def close(self) -> None:
        """Close the connection."""


class IncompleteFrame(RemoteFrameError):
    """The stream ended inside a frame: the peer closed (or crashed) mid-message.

    ``buffered`` bytes of the unfinished frame were received. Nothing more will come;
    close the connection.
    """

    def __init__(self, buffered: int) -> None:
        super().__init__(f"connection closed inside a frame ({buffered} bytes of it received)")
        self.buffered = buffered


class ClosedError(_NetClosedError):
    """This side closed the FramedConn (``aclose``) and then tried to use it.

    A :class:`gosim.net.ClosedError` (so an ``OSError``, EBADF): one ``except`` clause
    catches "this side closed it" whether the socket or the FramedConn above it said so.
    """


class BusyError(_NetBusyError):
    """Two goroutines used one side of a FramedConn at once (two readers).

    Frames would interleave unpredictably; give each connection one reader goroutine.
    A :class:`gosim.net.BusyError`, the same mistake one layer up.
    """


@dataclass(frozen=True, slots=True)
class FramedConnStatistics:
    frames_read: int
    frames_written: int
    bytes_read: int
    bytes_written: int
    writes: int  # write calls made on the connection (batching shows here)
    send_queue: int  # frames queued for the writer goroutine now


class _Alarm:
    """A goroutine's sleep until a runtime-clock deadline, cut short by :meth:`ring`.

    One :class:`gosim.lowlevel.Waiter` per alarm, reset and re-armed in place (its one
    runtime timer), where a ``Timer``, its channel and a ``select`` per wait cost several
    times more (10,000 connections wait once per heartbeat interval each): nothing is
    allocated per wait. One goroutine sleeps on an alarm at a time, parked with the
    alarm's wait reason (a heartbeat's dump says ``heartbeat wait``, not ``select``).
    Nothing can come between a sleeper's last look at what it waits for and its park
    (no await), so a ring while nobody sleeps has nothing to wake and is dropped (the
    next sleep resets the waiter).
    """

    __slots__ = ("_reason", "_w")

    def __init__(self, reason: WaitReason = WaitReason.HEARTBEAT) -> None:
        self._w = Waiter()
        self._reason = reason

    def sleep_until(
        self, when: float, recheck: Callable[[], float] | None = None
    ) -> Awaitable[Any]:
        """Park until ``when`` (``math.inf``: until rung) or until :meth:`ring`.

        With ``recheck``, a timer that fires asks it for the deadline again first, and
        re-arms itself for a later one instead of waking the sleeper: a heartbeat whose
        peer was heard meanwhile (its deadline moved on) costs no goroutine switch.
        ``recheck`` runs on the driver: it must not wait, nor fail. Returns the wait
        itself to await (no coroutine frame of its own).
        """
        w = self._w
        w.reset()  # drops a ring that came while nobody slept
        if when != math.inf:
            w.set_deadline(when, None, recheck)
        return w.wait(self._reason)

    def ring(self) -> None:
        self._w.settle()


class PyFrameWriter:
    """Encode frames and send them on a non-blocking socket: ``writer(fd) -> bool``.

    What lets a reply be sent at once by the goroutine that made it, with no switch to
    the connection's writer goroutine: :meth:`load` encodes a list of payloads into
    one buffer, and each call sends what the socket takes of it (one non-blocking
    ``send``), True once all of it is out, False when the socket is full (the caller
    waits for output, with gosim.net's ``RawConn.write``, and calls again). It is
    built for a fixed-width format: ``width`` (1, 2, 4 or 8 bytes), its byte order,
    the ``adjust`` subtracted from a payload's size, the smallest and largest payload
    and the zero ``preamble`` before each length field (``FrameFormat``'s encoding
    parameters). :meth:`load` declines (False, nothing loaded) a batch it does not
    encode, for the connection's general path to take: a payload that is not bytes
    or bytearray, a size out of range (the general path raises the precise error),
    and at most ``gather_max`` payloads of ``gather_min`` bytes or more together
    (``gather_min`` -1: never), which a gathering write sends without copying them.
    The C accelerator's ``FrameWriter`` is its twin (tests/netframe/test_codec.py runs
    the writer's tests over both)."""

    __slots__ = (
        "_adjust",
        "_buf",
        "_gather_max",
        "_gather_min",
        "_high",
        "_low",
        "_mask",
        "_pack",
        "_pos",
        "bytes_sent",
    )

    def __init__(
        self,
        width: int,
        big_endian: bool,
        adjust: int,
        low: int,
        high: int,
        preamble: int,
        gather_min: int,
        gather_max: int,
        /,
    ) -> None:
        if width not in (1, 2, 4, 8) or not 0 <= preamble <= _MAX_PREAMBLE:
            raise ValueError("FrameWriter: bad width or preamble")
        if not -_MAX_ADJUST <= adjust <= _MAX_ADJUST or low < 0 or high > _MAX_BODY:
            raise ValueError("FrameWriter: adjustment or payload bounds out of range")
        order = ">" if big_endian else "<"
        length = struct.Struct(order + {1: "B", 2: "H", 4: "I", 8: "Q"}[width])
        zeros = bytes(preamble)
        self._pack: Callable[[int], bytes] = (
            (lambda n: zeros + length.pack(n)) if preamble else length.pack
        )
        self._mask = (1 << (8 * width)) - 1  # the field's bits of size - adjust, as C's cast
        self._adjust = adjust
        self._low = low
        self._high = high
        self._gather_min = gather_min
        self._gather_max = gather_max
        self._buf = memoryview(b"")  # loaded frames not yet sent: _buf[_pos:]
        self._pos = 0
        #: Bytes sent in all.
        self.bytes_sent = 0

    @property
    def pending(self) -> int:
        """Loaded bytes not yet sent."""
        return len(self._buf) - self._pos

    def load(self, payloads: list[bytes | bytearray]) -> bool:
        """Encode ``payloads`` for sending; False (nothing loaded) when it declines
        them (see the class docstring). RuntimeError while loaded bytes are unsent."""
        if type(payloads) is not list:
            raise TypeError("FrameWriter.load: payloads must be a list")
        if self._pos < len(self._buf):
            raise RuntimeError("FrameWriter.load: the last frames are unsent")
        low, high = self._low, self._high
        body = 0
        for payload in payloads:
            if type(payload) is not bytes and type(payload) is not bytearray:
                return False
            n = len(payload)
            if n < low or n > high:
                return False
            body += n
        gather_min = self._gather_min
        if gather_min >= 0 and len(payloads) <= self._gather_max and body >= gather_min:
            return False  # few large payloads: a gathering write sends them uncopied
        pack, adjust, mask = self._pack, self._adjust, self._mask
        parts: list[bytes | bytearray] = []
        for payload in payloads:
            parts.append(pack((len(payload) - adjust) & mask))
            parts.append(payload)
        self._buf = memoryview(b"".join(parts))
        self._pos = 0
        return True

    def __call__(self, fd: int) -> bool:
        """Send what is loaded on ``fd``: True once all of it is sent, False when the
        socket is full. An error of the send is raised (``OSError``)."""
        buf = self._buf
        while self._pos < len(buf):
            try:
                # os.write is send() without flags on a socket: no SIGPIPE reaches a
                # Python process (it ignores the signal), a closed peer is EPIPE.
                sent = os.write(fd, buf[self._pos :])
            except BlockingIOError:
                return False
            self._pos += sent
            self.bytes_sent += sent
        return True

    def discard(self) -> None:
        """Drop what is loaded and unsent (after a failed send)."""
        self._buf = memoryview(b"")
        self._pos = 0


# The bounds FrameWriter checks its parameters against (its C twin's, in
# _speedups_codec.c.h): FrameFormat never makes parameters outside them.
_MAX_PREAMBLE = 0xFFFF
_MAX_ADJUST = (1 << 40) + 0xFFFF + 8  # FrameFormat's adjustment, less its header
_MAX_BODY = 1 << 60

# The one place this module chooses C or Python. FrameWriter: the frame writer
# FramedConn uses, the C twin where built. The C parts without a Python twin, None
# where the accelerator is not in use (FramedConn then takes its general paths):
# _FrameReader, a receive and its cut in one call; _Exchange, the receive-handle-send
# loop (FramedConn.exchange makes its framed modes, idempotency.rpc's StreamLink its
# frameless one, a plain msgpack stream); _send_data(fc, session, payload, clock) ->
# bool, one session DATA frame sent at once where FramedConn would send it at once
# (netframe/_speedups_server.c.h), else False.
FrameWriter: Any
_FrameReader: Any
_Exchange: Any
_send_data: Any
if _c_speedups is None:
    FrameWriter = PyFrameWriter
    _FrameReader = _Exchange = _send_data = None
else:
    FrameWriter = _c_speedups.FrameWriter
    _FrameReader = _c_speedups.FrameReader
    _Exchange = _c_speedups.Exchange
    _send_data = _c_speedups.send_data
    _c_speedups.set_closed_state(CLOSED)


class _Flush:
    __slots__ = ("done",)

    def __init__(self) -> None:
        self.done: Chan[None] = Chan(1)


class FramedConn:
    """Frames over one connection; see the module docstring for the guarantees."""

    def __init__(
        self,
        conn: StreamConn,
        format: FrameFormat | None = None,
        *,
        read_size: int = DEFAULT_READ_SIZE,
        send_queue: int = DEFAULT_SEND_QUEUE,
        max_owed_bytes: int | None = None,
    ) -> None:
        if read_size <= 0:
            raise ValueError(f"read_size must be positive, got {read_size}")
        if send_queue <= 0:
            raise ValueError(f"send_queue must be positive, got {send_queue}")
        self.conn = conn
        self.format = FrameFormat() if format is None else format
        self._decoder = FrameDecoder(self.format)
        self._read_size = read_size
        self._reading = False
        self._eof = False
        # Frames and _Flush markers for the writer goroutine; closed by aclose (the
        # writer writes what is buffered, then stops) or when the writer fails (which
        # wakes every send waiting for room).
        self._queue: Chan[Any] = Chan(send_queue)
        self._urgent: list[bytes] = []  # control frames to go ahead of a full queue
        self._writer_started = False
        self._writer_error: BaseException | None = None
        # Frames queued (or urgent) and not yet written; while there are any, and while
        # the frame writer holds the unsent rest of a send_many (_unfinished, the writer
        # goroutine's to finish), send_many queues too, so frames keep their order.
        self._backlog = 0
        self._unfinished = False
        # Bytes of the frames counted in _backlog (the frame writer's unsent rest is counted
        # apart: owed_bytes). Over max_owed_bytes, reading waits for the writer goroutine
        # to write some (it rings _drained after each write, and closes it at its exit).
        self._queued_bytes = 0
        self.max_owed_bytes = max_owed_bytes
        self._drained: Chan[None] = Chan(1)
        self._in_place = 0  # 1 while a large frame is received in place (partial_bytes)
        # Closed when the writer goroutine has exited (a broadcast to flush and aclose).
        self._writer_exit: Chan[None] = Chan()
        self._closed = False
        # The connection's gathering write and in-place read, where it has them
        # (gosim.net.Conn does).
        self._gather = getattr(conn, "write_buffers", None)
        self._read_into = getattr(conn, "read_into", None)
        self._attach_fast_path(conn, read_size)
        self._pending: deque[bytes] = deque()  # frames received ahead of read_frame
        self._frames_read = 0
        self._frames_written = 0
        self._writes = 0
        self._exchange: Any = None  # the C loop's own counters, while it has run
        self._bytes_read = 0
        self._bytes_written = 0

    def _attach_fast_path(self, conn: StreamConn, read_size: int) -> None:
        """Set the connection's RawConn (``_syscall_conn``, None when it has none or is
        closed), the frame writer over it (``_frame_writer``) and, where the
        accelerator is built, the C reader (``_raw``, ``_reader``); None where they do
        not run."""
        # On a connection with Go's SyscallConn (gosim.net.Conn): an encode and its
        # send in one call (FrameWriter, C or Python), so a reply goes out from the
        # goroutine that made it; and where the accelerator is built, a receive and
        # its cut in one C call (FrameReader), the netpoller waiting in between
        # (RawConn.read/write). The reader holds the start of the next frame itself
        # while it is active; what it hands back (an invalid header, the end of the
        # stream inside a frame) goes to the decoder, and the general path serves
        # until the decoder is empty.
        self._raw: Any = None
        self._reader: Any = None
        self._frame_writer: Any = None
        self._syscall_conn: Any = None
        syscall_conn = getattr(conn, "syscall_conn", None)
        if syscall_conn is not None:
            try:
                self._syscall_conn = syscall_conn()
            except OSError:
                pass  # closed already: the general path reports it on first use
        fmt = self.format
        if self._syscall_conn is not None and fmt._fixed_header >= 0:
            self._frame_writer = FrameWriter(
                *fmt._encode_params,
                GATHER_MIN_BYTES if self._gather is not None else -1,
                GATHER_MAX_FRAMES,
            )
        if _FrameReader is not None:
            self._raw = self._syscall_conn
        if self._raw is not None:
            self._reader = _FrameReader(read_size, LARGE_FRAME_BYTES, *fmt._scan_params)
        self._reader_active = self._reader is not None

    @property
    def frames_read(self) -> int:
        """Frames received and returned."""
        ex = self._exchange
        return self._frames_read + (ex.frames_in if ex is not None else 0)

    @property
    def frames_written(self) -> int:
        """Frames written (or queued to be)."""
        ex = self._exchange
        return self._frames_written + (ex.frames_out if ex is not None else 0)

    @property
    def writes(self) -> int:
        """Sends on the connection."""
        ex = self._exchange
        return self._writes + (ex.writes if ex is not None else 0)

    @property
    def bytes_read(self) -> int:
        """Bytes received from the connection."""
        reader = self._reader
        return self._bytes_read + (reader.bytes_received if reader is not None else 0)

    @property
    def bytes_written(self) -> int:
        """Bytes written to the connection."""
        writer = self._frame_writer
        return self._bytes_written + (writer.bytes_sent if writer is not None else 0)

    def statistics(self) -> FramedConnStatistics:
        """A snapshot of the connection's counters."""
        return FramedConnStatistics(
            self.frames_read,
            self.frames_written,
            self.bytes_read,
            self.bytes_written,
            self.writes,
            self._queue.len(),
        )

    # ----------------------------------------------------------------- read

    async def read_frame(self) -> bytes | None:
        """The next frame; None at a clean end of stream. See the module docstring.

        A receive that brings several frames returns the first: the others wait in the
        connection, and the next ``read_frame`` (or ``read_frames``) returns them before
        reading again."""
        ahead = self._pending
        if not ahead:
            frames = await self.read_frames()
            if len(frames) <= 1:
                return frames[0] if frames else None
            ahead.extend(frames[1:])
            self._frames_read -= len(frames) - 1  # counted as they are returned
            return frames[0]
        if self._reading:
            raise BusyError("another goroutine is already reading this FramedConn")
        if self.max_owed_bytes is not None and self._owes_too_much():
            self._reading = True
            try:
                await self.wait_owed()
            finally:
                self._reading = False
        self._frames_read += 1
        return ahead.popleft()

    async def read_frames(self) -> list[bytes]:
        """Every complete frame buffered now (at least one); ``[]`` at a clean end of stream.

        Reads from the connection only when no frame is buffered, so a pipelining peer's
        burst comes back as one list: one call per receive, not per frame.
        """
        if self._reading:
            raise BusyError("another goroutine is already reading this FramedConn")
        self._reading = True
        try:
            if self.max_owed_bytes is not None and self._owes_too_much():
                await self.wait_owed()
            ahead = self._pending
            if ahead:  # received with an earlier read_frame's, not yet returned
                frames: list[bytes] = list(ahead)
                ahead.clear()
                self._frames_read += len(frames)
                return frames
            if self._reader_active:
                reader = self._reader
                if not reader.handback and not reader.eof:
                    await self._raw.read(reader)
                    frames = reader.take()
                    if frames:
                        self._frames_read += len(frames)
                        return frames
                self._hand_back()
            decoder = self._decoder
            frames = decoder.decode()  # what is buffered already, no read
            while not frames:
                if self._read_into is not None and decoder.bytes_needed >= LARGE_FRAME_BYTES:
                    frame = await self._read_rest_in_place()
                    if frame is not None:
                        frames = [frame]
                        break
                if self._eof:
                    pending = decoder.statistics().bytes_buffered
                    if pending:
                        raise IncompleteFrame(pending)
                    return frames
                # The rest of a large frame in one receive where the kernel has it:
                # fewer, larger reads and fewer buffer appends.
                data = await self.conn.read(max(self._read_size, decoder.bytes_needed))
                if not data:
                    self._eof = True
                    continue
                self._bytes_read += len(data)
                frames = decoder.decode(data)
            self._frames_read += len(frames)
            if self._reader is not None and not self._eof and decoder.is_empty():
                self._reader_active = True  # back to the fast path
            return frames
        finally:
            self._reading = False

    def _hand_back(self) -> None:
        """The reader stops; what it carries (and its end of stream) goes to the decoder
        (after the frames already cut, which ``_pending`` still holds)."""
        reader = self._reader
        self._reader_active = False
        if reader.eof:
            self._eof = True
        carried = reader.take_carry()  # also resets its hand-back state and drained hint
        if carried:
            self._decoder.feed(carried)

    async def _read_rest_in_place(self) -> bytes | None:
        """Receive the rest of a large frame straight into a buffer (the general path's
        in-place receive; the C reader has its own).

        One copy of the frame in user space (the buffer into ``bytes``) instead of the
        receive buffer's appends and the cut. None (nothing changed) when the decoder
        declines; at end of stream or on any error the bytes go back to the decoder,
        so the usual path reports or retries exactly as before.
        """
        decoder = self._decoder
        taken = decoder.take_partial_frame(LARGE_FRAME_BYTES)
        if taken is None:
            return None
        prefix, skip, size = taken
        read_into = self._read_into
        assert read_into is not None
        filled = len(prefix) - skip
        # Sized by what has arrived, doubling as more does (see the module docstring).
        frame = bytearray(min(size, max(2 * filled, LARGE_FRAME_BYTES)))
        frame[:filled] = memoryview(prefix)[skip:]
        self._in_place = 1
        try:
            while filled < size:
                if filled == len(frame):
                    frame.extend(bytes(min(size, 2 * filled) - filled))
                with memoryview(frame) as view:
                    n = await read_into(view[filled:])
                if not n:
                    self._eof = True
                    break
                filled += n
                self._bytes_read += n
        finally:
            self._in_place = 0
            if filled < size:  # give everything back; the caller goes on as usual
                decoder.feed(prefix)
                decoder.feed(frame[len(prefix) - skip : filled])
        if filled < size:
            return None
        decoder.count_frame()
        return bytes(frame)

    def partial_bytes(self) -> int:
        """Bytes received of a frame not yet whole (0: none is begun). A server's read
        deadline looks at it: a frame must arrive whole within a bound of its start."""
        n = self._decoder.statistics().bytes_buffered + self._in_place
        if self._reader is not None and self._reader_active:
            n += self._reader.carried
        return int(n)

    @property
    def owed_bytes(self) -> int:
        """Bytes of frames sent (queued for the writer goroutine, or the frame writer's
        unsent rest) that the connection has not taken yet."""
        if self._unfinished:
            return self._queued_bytes + int(self._frame_writer.pending)
        return self._queued_bytes

    def _owes_too_much(self) -> bool:
        limit = self.max_owed_bytes
        return limit is not None and self.owed_bytes > limit

    async def wait_owed(self) -> None:
        """Wait while :attr:`owed_bytes` is over ``max_owed_bytes``, until the writer
        has written enough, failed or stopped."""
        limit = self.max_owed_bytes
        if limit is None:
            return
        while (
            self.owed_bytes > limit
            and self._writer_error is None
            and not self._writer_exit.closed
            and not self._closed
        ):
            await self._drained.recv()

    def unread_bytes(self) -> int | None:
        """Bytes that have arrived in the kernel's receive buffer and are not read yet
        (FIONREAD), or None where the connection does not show its socket (the
        simulated network). A heartbeat asks it before declaring the peer dead: bytes
        waiting there mean the peer is alive and this side's reader is behind."""
        return self._ask_socket(termios.FIONREAD)

    def unsent_bytes(self) -> int | None:
        """Bytes written to the kernel that the peer has not acknowledged yet (TIOCOUTQ),
        or None where the connection does not show its socket. A server's write
        deadline asks it before closing: a count that moved means the peer is taking
        bytes, from a write that has not returned yet."""
        return self._ask_socket(termios.TIOCOUTQ)

    def _ask_socket(self, request: int) -> int | None:
        raw = self._syscall_conn
        if raw is None:
            return None
        got: list[int] = []

        def ask(fd: int) -> None:
            raw_count = fcntl.ioctl(fd, request, b"\0\0\0\0")
            got.append(struct.unpack("i", raw_count)[0])

        try:
            raw.control(ask)
        except OSError:
            return None
        return got[0]

    # ------------------------------------------------------------- exchange

    def exchange(
        self,
        handler: Any,
        limit: int,
        owner: Any,
        session: Session | None = None,
        max_in_flight: int = 1,
        start_pending: Callable[[Any, Any], None] | None = None,
    ) -> Any:
        """A C loop that receives, calls ``handler`` per frame and sends the replies,
        for :meth:`run_exchange`: netframe's raw server with one handler at a time, or
        with ``session`` its session server with up to ``max_in_flight`` handlers at
        once, ``start_pending(owner, result)`` taking each result that is not a reply
        yet; with a session and no ``start_pending``, a client's reader, whose
        handler's results (not None) are awaited by the caller
        (netframe/_speedups_server.c.h says what each loop takes on). None where the
        fast path is not there (no C accelerator, a connection without SyscallConn, a
        format the frame writer does not encode, or frames already taken ahead). Its frames
        and writes count in this connection's counters."""
        if (
            _Exchange is None
            or self._frame_writer is None
            or not self._reader_active
            or self._pending
            or self._exchange is not None
        ):
            return None
        args: tuple[Any, ...] = (self._reader, self._frame_writer, handler, limit, owner)
        if session is not None:
            clock = lowlevel.current_runtime().now  # gosim.now() without its frame
            owed = -1 if self.max_owed_bytes is None else self.max_owed_bytes
            args += (session, clock, self, max_in_flight, start_pending, owed)
        self._exchange = _Exchange(*args)
        return self._exchange

    async def run_exchange(self, ex: Any) -> int:
        """Run :meth:`exchange`'s loop until it needs its caller: wait for input in the
        netpoller between receives, finish sends the socket could not take at once,
        and send replies the frame writer declines on the general path. Returns
        EXCHANGE_PENDING (a handler to await), EXCHANGE_READER (the end of the stream or
        a hand-back: read on with :meth:`read_frames`) or EXCHANGE_CLOSED; a session
        loop also EXCHANGE_SEND_QUEUED and EXCHANGE_GENERAL (its replies the socket
        does not take at once finish in the writer goroutine, as
        :meth:`send_many_nowait`'s do; it receives nothing while more than
        ``max_owed_bytes`` are owed, as :meth:`read_frames`). OSError as :meth:`read_frames` and
        :meth:`write_frames` raise it; a session loop's send that failed fails later
        sends, as :meth:`send_many_nowait`'s does."""
        if self._reading:
            raise BusyError("another goroutine is already reading this FramedConn")
        self._reading = True
        raw = self._raw
        writer = self._frame_writer
        try:
            while True:
                try:
                    await raw.read(ex)
                except OSError as exc:
                    if writer.pending:  # a session loop's send failed: as _send_through's
                        writer.discard()
                        self._fail_writes(exc)
                    raise
                state: int = ex.state
                if state == EXCHANGE_WRITE_HANDOFF:  # the writer goroutine sends the rest
                    self._unsent_to_writer()
                elif state == EXCHANGE_WRITE_WAIT:  # the socket took part of the replies
                    try:
                        await raw.write(writer)
                    except BaseException:
                        writer.discard()  # nothing half-sent stays loaded
                        raise
                elif state == EXCHANGE_WRITE_GENERAL:  # replies the frame writer declines
                    await self._write_general(ex.take_replies())
                elif state == EXCHANGE_OWED:  # as read_frames: no receive while over
                    await self.wait_owed()
                else:
                    return state
        finally:
            self._reading = False

    # ---------------------------------------------------------------- write

    async def write_frame(self, payload: bytes | bytearray | memoryview) -> None:
        """Encode one frame and write it now."""
        await self.write_frames([payload])

    async def write_frames(self, payloads: Iterable[bytes | bytearray | memoryview]) -> None:
        """Encode many frames and write them with one call on the connection.

        Small frames are encoded into one buffer; when the payloads are large (at
        least GATHER_MIN_BYTES together) and the connection can gather buffers
        (gosim.net's ``write_buffers``), headers and payloads go out in one
        ``sendmsg`` without copying the payloads.

        A write deadline that passes (gosim.net's ``DeadlineExceeded``) says in
        ``written`` how many bytes of the encoded frames went out first, as gosim.net's
        ``Conn.write`` does; anything but 0 leaves a partial frame on the stream, so
        the connection can only be closed then.
        """
        items = payloads if type(payloads) is list else list(payloads)
        if not items:
            return
        writer = self._frame_writer
        if writer is not None and writer.load(items):  # encoded in C, sent by RawConn
            try:
                await self._syscall_conn.write(writer)
            except TimeoutError as exc:
                # A write deadline: RawConn cannot know how much went out, the writer
                # does (what it was loaded with, less what it still holds).
                header = self.format._fixed_header
                loaded = sum(
                    header + (p.nbytes if type(p) is memoryview else len(p)) for p in items
                )
                exc.written = loaded - writer.pending  # type: ignore[attr-defined]
                raise
            finally:
                writer.discard()  # after an error nothing half-sent stays loaded
            self._frames_written += len(items)
            self._writes += 1
        else:
            await self._write_general(items)

    async def _write_general(self, items: list[bytes | bytearray | memoryview]) -> None:
        """What the frame writer declines or cannot do: large payloads gathered into one
        ``sendmsg``, connections without SyscallConn, payload errors (raised here)."""
        fmt = self.format
        gather = self._gather
        if gather is not None and len(items) <= GATHER_MAX_FRAMES:
            size = sum(p.nbytes if type(p) is memoryview else len(p) for p in items)
            if size >= GATHER_MIN_BYTES:
                parts: list[bytes | bytearray | memoryview] = []
                for p in items:  # every header first: a bad payload writes nothing
                    parts.append(fmt.header_for(p))
                    parts.append(p)
                written = await gather(parts)
                self._count_write(len(items), written)
                return
        data = fmt.encode_many(items)
        await self.conn.write(data)
        self._count_write(len(items), len(data))

    def _count_write(self, frames: int, nbytes: int) -> None:
        self._frames_written += frames
        self._bytes_written += nbytes
        self._writes += 1

    async def send(
        self, payload: bytes | bytearray | memoryview, timeout: float | None = None
    ) -> None:
        """Queue a frame for the writer goroutine; block while the queue is full.

        Raises the writer's error once a write has failed, and :class:`ClosedError`
        after :meth:`aclose`, including in a send that was waiting for room then.
        With ``timeout``, a queue still full after that many seconds raises
        :class:`TimeoutError` and the frame is not queued.
        """
        if self._writer_error is not None:
            raise self._writer_error
        if self._closed:
            raise ClosedError("send on a closed FramedConn")
        # A payload the format cannot carry fails here, in the sender, not later in the
        # writer goroutine (which would then fail the whole connection).
        self.format.check_payload(payload)
        if not self._writer_started:
            self._start_writer()
        self._backlog += 1  # counted before it waits: send_many must not pass it
        size = len(payload)
        self._queued_bytes += size
        queued = False
        try:
            if timeout is None:
                await self._queue.send(bytes(payload))
            elif not self._queue.try_send(bytes(payload)):
                timer = Timer(timeout)
                try:
                    i, _, _ = await select(send(self._queue, bytes(payload)), recv(timer.c))
                finally:
                    timer.stop()
                if i == 1:
                    raise TimeoutError(f"send queue still full after {timeout} s")
            queued = True
        except SendOnClosedChannel:
            # Closed while this send waited for room: by aclose, or by a failed writer.
            raise self._writer_error or ClosedError("FramedConn closed during send") from None
        finally:
            if not queued:
                self._backlog -= 1
                self._queued_bytes -= size

    async def send_many(self, payloads: list[bytes]) -> None:
        """Send frames in order: as :meth:`send_many_nowait` when it can, else queued as
        :meth:`send` queues them, waiting for room."""
        if not self.send_many_nowait(payloads):
            for payload in payloads:
                await self.send(payload)

    def send_many_nowait(self, payloads: list[bytes]) -> bool:
        """Send frames in order without waiting; False (nothing sent) when the send queue
        has no room for them all.

        With the frame writer, on a connection with Go's ``SyscallConn``, and nothing queued
        for the writer goroutine: encoded and sent at once with one non-blocking send
        (the common case of a server's replies: no goroutine switch), what the socket
        does not take going to the writer goroutine ahead of anything sent later.
        Otherwise queued for the writer goroutine. Frames leave in the order they were
        sent either way. A send that fails fails the connection as the writer
        goroutine's would: raised here and to every later send; a payload the format
        cannot carry raises the codec's LocalFrameError, and nothing is sent.
        """
        if self._writer_error is not None:
            raise self._writer_error
        if self._closed:
            raise ClosedError("send on a closed FramedConn")
        if self._send_through(payloads):
            return True
        q = self._queue
        if q.cap() - q.len() < len(payloads):
            return False
        check = self.format.check_payload
        for payload in payloads:
            check(payload)  # in the sender: the writer would fail the whole connection
        if not self._writer_started:
            self._start_writer()
        for payload in payloads:
            q.try_send(bytes(payload))
            self._queued_bytes += len(payload)
        self._backlog += len(payloads)
        return True

    def _send_through(self, payloads: list[bytes]) -> bool:
        """With the frame writer and nothing queued for the writer goroutine: encode
        ``payloads`` and send them at once with one non-blocking send, what the socket
        does not take going to the writer goroutine ahead of anything sent later; True
        when so sent. False (nothing done) when the frames must be queued. A send that
        fails fails the connection (``_fail_writes``) and raises its OSError."""
        writer = self._frame_writer
        if writer is None or self._backlog or self._unfinished or not writer.load(payloads):
            return False
        try:
            self._syscall_conn.control(writer)  # one send, no waiting
        except OSError as exc:
            writer.discard()
            self._fail_writes(exc)
            raise
        self._frames_written += len(payloads)
        self._writes += 1
        if writer.pending:  # the socket is full: the writer goroutine goes on
            self._unsent_to_writer()
        else:
            writer.discard()
        return True

    def _unsent_to_writer(self) -> None:
        """The frame writer holds frames the socket did not take at once (nothing was
        queued ahead of them): the writer goroutine sends them before anything queued
        after them."""
        self._unfinished = True
        if not self._writer_started:
            self._start_writer()
        self._queue.try_send(_Flush())  # wakes it (the queue is empty)

    def _fail_writes(self, exc: BaseException) -> None:
        """A write failed: the connection's stream is lost (a partial frame may have gone
        out). Every later send raises ``exc``; the writer goroutine stops."""
        if self._writer_error is None:
            self._writer_error = exc
        self._drop_queued()
        if not self._queue.closed:
            self._queue.close()  # a send waiting for room raises the error instead of hanging

    def send_nowait(self, payload: bytes | bytearray | memoryview) -> bool:
        """Queue a control frame without waiting; False when it cannot be queued.

        Sent at once when nothing waits for the writer goroutine (as
        :meth:`send_many_nowait` sends: a pong costs no goroutine switch); else into
        the queue when it has room; otherwise ahead of the queued frames (at most
        MAX_URGENT frames are held so). False after :meth:`aclose`, after a write
        error (this send's included), or with MAX_URGENT frames already waiting ahead:
        a peer that reads nothing at all. Heartbeats and goaways use this, so a full
        queue never delays the check that the peer is dead, nor a close.
        """
        if self._closed or self._writer_error is not None or self._queue.closed:
            return False
        frame = bytes(payload)
        self.format.check_payload(frame)
        try:
            if self._send_through([frame]):
                return True
        except OSError:
            return False  # the connection failed: later sends raise, the reader sees it
        if not self._writer_started:
            self._start_writer()
        if self._queue.try_send(frame):
            self._backlog += 1
            self._queued_bytes += len(frame)
            return True
        # The queue is full, so the writer is not parked on it: it takes the urgent
        # frames when it next builds a batch.
        if len(self._urgent) >= MAX_URGENT:
            return False
        self._urgent.append(frame)
        self._backlog += 1
        self._queued_bytes += len(frame)
        return True

    def _start_writer(self) -> None:
        self._writer_started = True
        gosim.go(self._writer)

    async def flush(self, timeout: float | None = None) -> bool:
        """Wait until every frame queued so far has been written; False if ``timeout``
        seconds passed first (the frames stay queued). Raises the writer's error."""
        if self._writer_started and not self._writer_exit.closed:
            timer = None if timeout is None else Timer(timeout)
            expired = None if timer is None else timer.c  # a nil channel never fires
            try:
                if self._queue.closed:  # aclose is flushing: the writer's exit is the end
                    i, _, _ = await select(recv(self._writer_exit), recv(expired))
                    if i == 1:
                        return False
                else:
                    marker = _Flush()
                    i, _, _ = await select(
                        send(self._queue, marker), recv(self._writer_exit), recv(expired)
                    )
                    if i == 0:
                        # The writer may fail (and exit) before it reaches the marker.
                        i, _, _ = await select(
                            recv(marker.done), recv(self._writer_exit), recv(expired)
                        )
                    if i == 2:
                        return False
            except SendOnClosedChannel:  # closed meanwhile: the writer is finishing
                return await self.flush(timeout)
            finally:
                if timer is not None:
                    timer.stop()
        if self._writer_error is not None:
            raise self._writer_error
        return True

    async def _writer(self) -> None:
        q = self._queue
        try:
            while True:
                item = await q.recv()
                if item is None:  # closed and drained: everything queued was written
                    return
                batch: list[bytes] = []
                size = 0
                if self._urgent:  # control frames that met a full queue go first
                    batch, self._urgent = self._urgent, batch
                    size = sum(map(len, batch))
                flushes: list[_Flush] = []
                stop = False
                while True:
                    if type(item) is bytes:
                        batch.append(item)
                        size += len(item)
                    elif item is None:
                        stop = True
                        break
                    else:
                        flushes.append(item)
                    if size >= MAX_BATCH_BYTES:
                        break
                    item, _, got = q.try_recv()
                    if not got:
                        break
                if self._unfinished:  # the rest of send_many's send goes first
                    try:
                        await self._syscall_conn.write(self._frame_writer)
                    finally:
                        self._frame_writer.discard()
                        self._unfinished = False
                if batch:
                    await self.write_frames(batch)
                    self._backlog -= len(batch)
                    self._queued_bytes -= size
                self._drained.try_send(None)  # a reader waiting for room looks again
                for f in flushes:
                    f.done.try_send(None)
                if stop:
                    return
        except Exception as exc:  # reported to the next send/flush, not a runtime panic
            self._fail_writes(exc)
        finally:
            if not q.closed:
                q.close()  # when the writer stops for good, not only on errors
            self._writer_exit.close()
            self._drained.close()  # a reader waiting for room stops waiting

    def _drop_queued(self) -> None:
        """Discard what waits for the writer, releasing anyone waiting on a flush."""
        self._queued_bytes -= sum(map(len, self._urgent))
        self._urgent.clear()
        q = self._queue
        while True:
            item, _, got = q.try_recv()
            if not got or item is None:
                break
            if isinstance(item, _Flush):
                item.done.try_send(None)
            else:
                self._queued_bytes -= len(item)

    # ---------------------------------------------------------------- close

    async def aclose(self, flush: bool = True, timeout: float | None = None) -> None:
        """Stop the writer and close the connection.

        With ``flush`` the frames already queued are written first, for at most
        ``timeout`` seconds (None: as long as it takes); then the connection is closed
        whatever the peer does, and what is still unwritten is lost. A ``send``
        waiting for room raises :class:`ClosedError`.
        """
        if self._closed:
            return
        self._closed = True
        q = self._queue
        if not q.closed:
            q.close()  # the writer writes what is buffered, then stops
        if self._writer_started and not self._writer_exit.closed:
            if flush:
                try:
                    await self.flush(timeout)
                except Exception:  # the writer failed: nothing more will be written
                    pass
            else:
                self._drop_queued()
        self.conn.close()  # also ends a write the peer never let finish
