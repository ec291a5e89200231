"""The plain msgpack stream transport: msgpack-rpc with no length prefix (Neovim's).

One :class:`StreamLink` per connection, for either role: a reader goroutine cuts the
stream into messages with a :data:`~idempotency.rpc._protocol.MsgpackCutter` (in C
where built: no decoding) and hands each message's bytes to a callback, as netframe
hands a frame's payload to the framed transport's handler; the
replies the callbacks return for one receive leave together, sent by the reader itself
with one non-blocking send when nothing waits for the writer; other writes (and what
the socket did not take) go through a bounded queue to one writer goroutine that sends
whatever has queued in one gathered write (replies made one at a time leave in
batches, and a peer that stops reading makes :meth:`StreamLink.send` block instead of
growing memory).

Where netframe's C accelerator is built and no ``idle_timeout`` is set, the reader
runs netframe's C ``Exchange`` loop in its frameless mode (the framed transport's loop,
netframe/_speedups_exchange.c.h): it receives, cuts, calls the callback and sends the
replies as this reader does, with no Python frame per receive, and hands back to the
Python loop here (the general path, and the whole reader under
``GOSIM_PURE_PYTHON=1``) for what it does not do: an awaitable result, a message not
yet whole (its read deadline), the owed-bytes bound, a send the socket did not take
whole or while the writer has items, a cutter's error, the end of the stream, a closed
link. :attr:`StreamLink.exchanged` counts the messages it handled.

This transport has no heartbeats or goaway (the stream has no room for them): a dead
peer is noticed by the kernel (reset, keepalive) or by the caller's timeouts, and a
server closes a connection that sent nothing for its ``idle_timeout`` while no call of
it was running (a silent or slow peer would otherwise hold its connection forever), and
one whose write made no progress for ``idle_timeout`` (a peer that sends calls but never
reads their replies: its calls stay blocked on the full queue, so the idle rule alone
would never apply).

A server's link answers a peer that shuts its write side (``shutdown(SHUT_WR)``,
``nc -N``): the calls it sent before are run to their end and their replies written
before the connection closes, as on the framed transport.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from typing import Any, Protocol

import gosim
from gosim import Chan, SendOnClosedChannel, go
from netframe.lowlevel import (
    EXCHANGE_CLOSED,
    EXCHANGE_OWED,
    EXCHANGE_PENDING,
    EXCHANGE_WRITE_GENERAL,
    EXCHANGE_WRITE_HANDOFF,
    message_exchange,
)

from ._protocol import Limits, new_cutter

__all__ = ["StreamLink"]

READ_SIZE = 256 * 1024


class _Conn(Protocol):
    async def read(self, n: int) -> bytes: ...

    def set_read_deadline(self, t: float | None) -> None: ...

    def set_write_deadline(self, t: float | None) -> None: ...

    async def write(self, data: bytes | memoryview) -> int: ...

    def close(self) -> None: ...


class StreamLink:
    """A msgpack-rpc peer over one byte stream.

    ``on_message(payload)`` is called by the reader goroutine with every message's
    bytes (one whole msgpack object, not yet decoded: it decodes it, and answers what
    does not decode), in order; ``on_end(reason)`` once, when the connection has ended
    for any reason (bytes that cannot be cut into messages end it: see
    :class:`~idempotency.rpc.StreamDecoder`). ``on_message`` returns None, an
    awaitable the reader awaits, or bytes: a reply to send. The replies of one
    receive's messages are queued together once its messages are handled (earlier,
    before the reader waits for anything), so the calls one receive brings cost one
    hand-off to the writer and one write.
    """

    def __init__(
        self,
        conn: _Conn,
        limits: Limits,
        on_message: Callable[[bytes], Any],
        on_end: Callable[[str], None],
        *,
        send_queue: int = 1024,
        idle_timeout: float | None = None,
        busy: Callable[[], bool] = lambda: False,
        answer_after_eof: bool = False,
        read_timeout: float | None = None,
        write_timeout: float | None = None,
        max_owed: int | None = None,
    ) -> None:
        self.conn = conn
        self.cutter = new_cutter(limits)
        self.on_message = on_message
        self.on_end = on_end
        self.closed = False
        self.reason = ""
        # Items: one message's bytes, or a receive's replies (a list), or None (stop).
        self._queue: Chan[bytes | list[bytes] | None] = Chan(send_queue)
        # Items handed to the queue and not yet written by the writer: with none, the
        # reader sends its replies itself at once (one non-blocking send, no switch to
        # the writer), where the connection gives raw access to its socket.
        self._handed = 0
        syscall_conn = getattr(conn, "syscall_conn", None)
        self._raw: Any = None if syscall_conn is None else syscall_conn()
        self._out = b""  # the bytes _send_now is sending, and how many the socket took
        self._sent = 0
        self._write_out_bound = self._write_out
        self._messages_read = 0
        self._messages_written = 0
        # Read deadlines, renewed before every read: past one with nothing received
        # and ``busy()`` False (no call of this connection running), the link ends.
        self.idle_timeout = idle_timeout
        self.busy = busy
        # A message must arrive whole within read_timeout of its first byte; a write
        # that the peer takes nothing of for write_timeout (default: idle_timeout)
        # ends the link.
        self.read_timeout = read_timeout
        self.write_timeout = idle_timeout if write_timeout is None else write_timeout
        # Bytes of messages queued or being written: over max_owed, the reader stops
        # taking messages from the peer until the writer has written some.
        self.max_owed = math.inf if max_owed is None else max_owed
        self._owed = 0
        self._room: Chan[None] = Chan(1)
        # A server's link: at the peer's end of stream, the calls it sent still get
        # their replies (busy() turns False, and idle() says so, once they have all
        # been queued); then what is queued is written and the link ends.
        self.answer_after_eof = answer_after_eof
        self._quiet: Chan[None] = Chan(1)
        self._writer_done: Chan[None] = Chan()
        # The reader's C loop (netframe's Exchange in its frameless mode): where the
        # cutter is C's, the connection has a RawConn and no idle deadline is to be
        # renewed before each receive, it receives, cuts, calls on_message and sends
        # the replies, handing back to _reader for the rest.
        self._exchange: Any = None
        fast = self._raw is not None and hasattr(self.cutter, "take")
        if fast and idle_timeout is None:
            self._exchange = message_exchange(self.cutter, on_message, self, max_owed)
        go(self._reader)
        go(self._writer)

    async def send(self, payload: bytes) -> None:
        """Queue one message's bytes; ConnectionError once the link has ended."""
        if self.closed:
            raise ConnectionResetError(self.reason or "connection closed")
        self._owed += len(payload)  # before it waits: the reader must see it owed
        self._handed += 1
        try:
            await self._queue.send(payload)
        except SendOnClosedChannel:  # the link ended while this send waited for room
            self._owed -= len(payload)
            self._handed -= 1
            raise ConnectionResetError(self.reason or "connection closed") from None

    def send_nowait(self, payload: bytes) -> bool:
        """Queue one message's bytes if there is room now; False (nothing queued) when
        the queue is full or the link has ended."""
        if self.closed or self._queue.closed:
            return False
        if not self._queue.try_send(payload):
            return False
        self._handed += 1
        self._owed += len(payload)
        return True

    def hold(self, nbytes: int) -> None:
        """Count ``nbytes`` as owed until :meth:`release`: a call running for the peer
        holds its request's bytes, and its reply will be owed (the reader stops taking
        calls while the owed bytes are over ``max_owed``, running calls' included)."""
        self._owed += nbytes

    def release(self, nbytes: int) -> None:
        """End a :meth:`hold` (its reply has been queued, or it has none)."""
        self._owed -= nbytes
        if not self._room.closed:  # closed once the writer has stopped: nobody waits
            self._room.try_send(None)

    def idle(self) -> None:
        """Say that ``busy()`` has turned False (a half-closed peer's link waits for it)."""
        self._quiet.try_send(None)

    @property
    def messages_read(self) -> int:
        """Messages handed to ``on_message``."""
        ex = self._exchange
        return self._messages_read + (ex.frames_in if ex is not None else 0)

    @property
    def messages_written(self) -> int:
        """Messages written (the replies of one send that the socket took only part of
        count as one, when the writer has written the rest)."""
        ex = self._exchange
        return self._messages_written + (ex.frames_out if ex is not None else 0)

    @property
    def exchanged(self) -> int:
        """Messages of :attr:`messages_read` that the reader's C loop handled (0 where
        it is not used: the pure-Python build, an ``idle_timeout``)."""
        ex = self._exchange
        return 0 if ex is None else int(ex.frames_in)

    @property
    def queued(self) -> int:
        """Messages queued and not yet handed to the connection."""
        return len(self._queue)

    @property
    def owed(self) -> int:
        """Bytes of messages queued or being written, not yet all taken by the peer."""
        return self._owed

    def close(self, reason: str = "closed by this side") -> None:
        """End the link now: queued messages not yet written are dropped."""
        self._end(reason)

    def _end(self, reason: str) -> None:
        if self.closed:
            return
        self.closed = True
        self.reason = reason
        self.conn.close()
        # Closing the queue wakes the writer (it receives None) and every sender that
        # waits for room (they raise): nobody stays parked on a dead link.
        if not self._queue.closed:
            self._queue.close()
        self._quiet.try_send(None)  # a reader waiting for calls after the peer's end
        self.on_end(reason)

    async def _reader(self) -> None:
        reason = "peer closed the connection"
        try:
            idle = self.idle_timeout
            whole = self.read_timeout
            cutter = self.cutter
            # Where the cutter is C's and the connection has a RawConn, the reader
            # receives through it: each wake is one C call that receives and cuts.
            receiver = self._raw if hasattr(cutter, "take") else None
            payloads: list[bytes]
            data: bytes | bool
            # When the first byte of the message not yet whole arrived (None: no byte of
            # one is buffered): past it by read_timeout, the link ends (slowloris).
            started: float | None = None
            armed = False  # a read deadline is set on the connection
            ex = self._exchange
            while not self.closed:
                if self._owed > self.max_owed:
                    await self._wait_for_room()
                    continue
                if started is not None or idle is not None or armed:
                    if started is not None and whole is not None and gosim.now() >= started + whole:
                        reason = f"message not received whole within {whole:g} s"
                        return
                    armed = self._arm_read_deadline(started, armed)
                if ex is not None and started is None:  # at a message boundary: C's
                    stop = await self._exchange_once(ex, receiver)
                    if stop is None:
                        continue
                    if stop == "closed":
                        return
                    if cutter.eof:
                        if self.answer_after_eof:
                            await self._answer_after_eof()
                        return
                    if cutter.error is not None:
                        reason = f"protocol error from the peer: {cutter.error}"
                        return
                    started = gosim.now()  # a message begun: its deadline, in Python
                    continue
                try:
                    if receiver is not None:  # the receive and its cut, one C call
                        await receiver.read(cutter)
                        payloads = cutter.take()
                        data = not cutter.eof
                    else:
                        data = await self.conn.read(READ_SIZE)
                        payloads = cutter.feed(data)
                except TimeoutError:
                    if started is not None and whole is not None and gosim.now() >= started + whole:
                        continue  # the message's deadline: the link ends above
                    if idle is None or self.busy():
                        continue  # a call is running: the peer waits for it
                    reason = f"idle for {idle:g} s"
                    return
                if not data:
                    if self.answer_after_eof:
                        await self._answer_after_eof()
                    return
                if not await self._answer(payloads):
                    return
                if cutter.error is not None:  # after the messages cut before it
                    reason = f"protocol error from the peer: {cutter.error}"
                    return
                # The bytes left over started a message in this receive, or earlier
                # when this receive completed none (time spent waiting on calls above
                # is this side's, not the peer's: a message counts from here then).
                if not cutter.buffered:
                    started = None
                elif payloads or started is None:
                    started = gosim.now()
        except OSError as exc:
            reason = f"connection broken: {exc}"
        finally:
            self._end(reason)
            if self._exchange is not None:
                self._exchange.release()  # it held this link: no cycle left

    def _arm_read_deadline(self, started: float | None, armed: bool) -> bool:
        """Set the connection's read deadline to the earlier of the idle timeout (from
        now) and the end of the message begun at ``started`` (``read_timeout`` after
        it), or clear it when there is neither and one was ``armed``; whether one is
        armed now."""
        idle, whole = self.idle_timeout, self.read_timeout
        deadline = math.inf if idle is None else gosim.now() + idle
        if started is not None and whole is not None:
            deadline = min(deadline, started + whole)
        if deadline != math.inf or armed:
            self.conn.set_read_deadline(None if deadline == math.inf else deadline)
        return deadline != math.inf

    async def _answer(self, payloads: list[bytes]) -> bool:
        """Hand each message of one receive to ``on_message``, in order, and send the
        replies it returns at once together (an awaitable's are sent by it, after the
        replies ahead of it). Past ``max_owed`` bytes of replies not yet written, no
        further message is taken until the writer catches up; False when the link
        ended meanwhile."""
        on_message = self.on_message
        replies: list[bytes] = []  # this receive's replies, owed, not yet queued
        for payload in payloads:
            if self._owed > self.max_owed:
                if replies:
                    replies = await self._queue_replies(replies)
                if not await self._wait_for_room():
                    return False
            self._messages_read += 1
            result = on_message(payload)
            if result is None:
                continue
            if type(result) is bytes:
                self._owed += len(result)  # owed from now: the bound sees it
                replies.append(result)
                continue
            if replies:  # ahead of whatever the awaitable sends
                replies = await self._queue_replies(replies)
            await result
        if replies:
            rest = self._reply_now(replies)
            if rest is not None:
                await self._hand_to_writer(rest)
        return True

    async def _exchange_once(self, ex: Any, raw: Any) -> str | None:
        """Run the C loop until it hands back, and do what it handed back as the Python
        loop below does it: None to run it again; "closed" when the link has ended;
        "reader" when the cutter is not at a message boundary (the end of the stream,
        its error, or a message begun: the Python loop's)."""
        await raw.read(ex)
        state: int = ex.state
        if state == EXCHANGE_PENDING:  # an awaitable: the replies before it go first
            replies = ex.take_replies()
            if replies:
                self._owed += sum(map(len, replies))
                await self._queue_replies(replies)
            pending, _ = ex.take_pending()
            await pending
            ex.resume(None)
        elif state == EXCHANGE_OWED:  # over max_owed: no more calls until room
            replies = ex.take_replies()
            if replies:
                self._owed += sum(map(len, replies))
                await self._queue_replies(replies)
            if not await self._wait_for_room():
                return "closed"
        elif state == EXCHANGE_WRITE_GENERAL:  # the writer has items, or the send failed
            replies = ex.take_replies()
            self._owed += sum(map(len, replies))
            await self._queue_replies(replies)
        elif state == EXCHANGE_WRITE_HANDOFF:  # the socket took part: the writer sends the rest
            rest = ex.take_unsent()
            self._owed += len(rest)
            await self._hand_to_writer(rest)
        elif state == EXCHANGE_CLOSED:
            return "closed"
        else:
            return "reader"
        return None

    async def _queue_replies(self, replies: list[bytes]) -> list[bytes]:
        """Send the reader's replies (already counted owed): at once with one
        non-blocking send when nothing waits for the writer, what the socket does not
        take (or all of them, otherwise) as one item of the writer's queue; a link that
        has ended drops them. Returns a new, empty list."""
        item = self._reply_now(replies)
        if item is not None:
            await self._hand_to_writer(item)
        return []

    def _reply_now(self, replies: list[bytes]) -> bytes | list[bytes] | None:
        """:meth:`_queue_replies`'s send at once (no coroutine for the common case):
        None when the socket took them all, else what must go to the writer."""
        if self._raw is None or self._handed or self.closed:
            return replies
        data = b"".join(replies)
        try:
            sent = self._send_now(data)
        except OSError as exc:
            self._end(f"connection broken: {exc}")
            sent = 0
        self._owed -= sent
        if sent == len(data):
            self._messages_written += len(replies)
            return None
        return data[sent:]  # the writer sends the rest, under the write deadline

    async def _hand_to_writer(self, item: bytes | list[bytes]) -> None:
        self._handed += 1
        try:
            await self._queue.send(item)
        except SendOnClosedChannel:  # the link ended: nobody to reach
            self._handed -= 1
            self._owed -= sum(map(len, item)) if isinstance(item, list) else len(item)

    def _send_now(self, data: bytes) -> int:
        """One non-blocking send of ``data`` on the socket: the bytes it took."""
        self._out = data
        try:
            self._raw.control(self._write_out_bound)  # made once: no closure per send
            return self._sent
        finally:
            self._out = b""

    def _write_out(self, fd: int) -> None:
        try:
            self._sent = os.write(fd, self._out)
        except BlockingIOError:
            self._sent = 0

    async def _wait_for_room(self) -> bool:
        """Wait until the replies owed to the peer are back under ``max_owed`` bytes (the
        writer says so after each write): True; False once the link has ended."""
        while self._owed > self.max_owed and not self.closed and not self._room.closed:
            await self._room.recv()
        return not self.closed

    async def _answer_after_eof(self) -> None:
        """The peer shut its write side, and may still read: wait for the calls it
        sent to finish, then for the writer to write every reply queued (its write
        deadline still ends a peer that does not read)."""
        while self.busy() and not self.closed:
            await self._quiet.recv()
        if self.closed:
            return
        self._queue.close()  # the writer writes what is queued, then stops
        await self._writer_done.recv()

    async def _writer(self) -> None:
        queue = self._queue
        deadline = self.write_timeout
        try:
            while True:
                item = await queue.recv()
                if item is None or self.closed:
                    return
                batch: list[bytes] = item if isinstance(item, list) else [item]
                items = 1
                while len(batch) < 256:
                    more, _, received = queue.try_recv()
                    if not received or more is None:
                        break
                    items += 1
                    if isinstance(more, list):
                        batch.extend(more)
                    else:
                        batch.append(more)
                data = b"".join(batch)
                await self._write(data, deadline)
                self._handed -= items
                self._messages_written += len(batch)
                self._owed -= len(data)
                self._room.try_send(None)
        except TimeoutError:
            self._end(f"peer read nothing for {deadline:g} s")
        except OSError as exc:
            self._end(f"connection broken: {exc}")
        finally:
            self._writer_done.close()
            self._room.close()  # a reader waiting for room sees the link end

    async def _write(self, data: bytes, idle: float | None) -> None:
        """Write all of ``data``; with ``idle``, raise TimeoutError (gosim's
        DeadlineExceeded) once ``idle`` seconds pass with no byte taken by the peer (the
        write deadline). A slow reader keeps its link: the deadline is renewed whenever
        some bytes went out."""
        if idle is None:
            await self.conn.write(data)
            return
        rest = memoryview(data)
        while True:
            self.conn.set_write_deadline(gosim.now() + idle)
            try:
                await self.conn.write(rest)
                return
            except TimeoutError as exc:
                written = getattr(exc, "written", 0)
                if not written:
                    raise
                rest = rest[written:]
