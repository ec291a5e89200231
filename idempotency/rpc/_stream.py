"""The plain msgpack stream transport: msgpack-rpc with no length prefix (Neovim's).

One :class:`StreamLink` per connection, for either role: a reader goroutine feeds the
:class:`~idempotency.rpc.StreamDecoder` and hands each message to a callback; writes
go through a bounded queue to one writer goroutine that sends whatever has queued in
one gathered write (replies made one at a time leave in batches, and a peer that stops
reading makes :meth:`StreamLink.send` block instead of growing memory).

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

from collections.abc import Callable
from typing import Any, Protocol

import gosim
from gosim import Chan, SendOnClosedChannel, go
from netframe import NEED_DATA

from ._protocol import Limits, Message, RemoteProtocolError, StreamDecoder

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

    ``on_message(msg)`` is called by the reader goroutine for every message, in order;
    ``on_bad(exc)`` for a message that decoded but is not valid msgpack-rpc (the stream
    goes on); ``on_end(reason)`` once, when the connection has ended for any reason.
    """

    def __init__(
        self,
        conn: _Conn,
        limits: Limits,
        on_message: Callable[[Message], Any],
        on_bad: Callable[[RemoteProtocolError], Any],
        on_end: Callable[[str], None],
        send_queue: int = 1024,
        idle_timeout: float | None = None,
        busy: Callable[[], bool] = lambda: False,
        answer_after_eof: bool = False,
    ) -> None:
        self.conn = conn
        self.decoder = StreamDecoder(limits)
        self.on_message = on_message
        self.on_bad = on_bad
        self.on_end = on_end
        self.closed = False
        self.reason = ""
        self._queue: Chan[bytes | None] = Chan(send_queue)
        self.messages_read = 0
        self.messages_written = 0
        # Read deadlines, renewed before every read: past one with nothing received
        # and ``busy()`` False (no call of this connection running), the link ends.
        self.idle_timeout = idle_timeout
        self.busy = busy
        # A server's link: at the peer's end of stream, the calls it sent still get
        # their replies (busy() turns False, and idle() says so, once they have all
        # been queued); then what is queued is written and the link ends.
        self.answer_after_eof = answer_after_eof
        self._quiet: Chan[None] = Chan(1)
        self._writer_done: Chan[None] = Chan()
        go(self._reader)
        go(self._writer)

    async def send(self, payload: bytes) -> None:
        """Queue one message's bytes; ConnectionError once the link has ended."""
        if self.closed:
            raise ConnectionResetError(self.reason or "connection closed")
        try:
            await self._queue.send(payload)
        except SendOnClosedChannel:  # the link ended while this send waited for room
            raise ConnectionResetError(self.reason or "connection closed") from None

    def send_nowait(self, payload: bytes) -> bool:
        """Queue one message's bytes if there is room now; False (nothing queued) when
        the queue is full or the link has ended."""
        if self.closed or self._queue.closed:
            return False
        return self._queue.try_send(payload)

    def idle(self) -> None:
        """Say that ``busy()`` has turned False (a half-closed peer's link waits for it)."""
        self._quiet.try_send(None)

    @property
    def queued(self) -> int:
        """Messages queued and not yet handed to the connection."""
        return len(self._queue)

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
        self.on_end(reason)

    async def _reader(self) -> None:
        reason = "peer closed the connection"
        try:
            idle = self.idle_timeout
            while not self.closed:
                if idle is not None:
                    self.conn.set_read_deadline(gosim.now() + idle)
                    try:
                        data = await self.conn.read(READ_SIZE)
                    except TimeoutError:
                        if self.busy():
                            continue  # a call is running: the peer waits for it
                        reason = f"idle for {idle:g} s"
                        return
                else:
                    data = await self.conn.read(READ_SIZE)
                if not data:
                    if self.answer_after_eof:
                        await self._answer_after_eof()
                    return
                self.decoder.feed(data)
                while True:
                    try:
                        msg = self.decoder.next_message()
                    except RemoteProtocolError as exc:
                        if exc.stream_lost:
                            reason = f"protocol error from the peer: {exc}"
                            return
                        bad = self.on_bad(exc)
                        if bad is not None:
                            await bad
                        continue
                    if msg is NEED_DATA:
                        break
                    self.messages_read += 1
                    result = self.on_message(msg)
                    if result is not None:
                        await result
        except OSError as exc:
            reason = f"connection broken: {exc}"
        finally:
            self._end(reason)

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
        idle = self.idle_timeout
        try:
            while True:
                item = await queue.recv()
                if item is None or self.closed:
                    return
                batch = [item]
                while len(batch) < 256:
                    more, _, received = queue.try_recv()
                    if not received or more is None:
                        break
                    batch.append(more)
                await self._write(b"".join(batch), idle)
                self.messages_written += len(batch)
        except TimeoutError:
            self._end(f"peer read nothing for {idle:g} s")
        except OSError as exc:
            self._end(f"connection broken: {exc}")
        finally:
            self._writer_done.close()

    async def _write(self, data: bytes, idle: float | None) -> None:
        """Write all of ``data``; with ``idle``, raise TimeoutError (gosim's
        DeadlineExceeded) once ``idle`` seconds pass with no byte taken by the peer. A slow
        reader keeps its link: the deadline is renewed whenever some bytes went out."""
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
