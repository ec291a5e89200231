"""The reconnecting ``Client``: one long session connection to a server, with
heartbeats and reconnects on demand, and ``ConnectionLost``, what its calls raise when
that connection has ended.

The connection's reader and heartbeat are the server's own
(``_drivers.py``: :func:`_read_connection`, :func:`_read_exchange`, :func:`_keep_alive`).
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from typing import Any

import gosim
from gosim import Chan, go, recv, select

from ._codec import FrameFormat
from ._conn import FramedConn, StreamConn, _send_data
from ._drivers import _Conn, _HeartbeatEnd, _keep_alive, _read_connection, _read_exchange
from ._session import GoAway, RemoteSessionError, Session

__all__ = ["DEFAULT_CLOSE_TIMEOUT", "Client", "ConnectionLost"]

#: Client.close's default bound on writing what is queued.
DEFAULT_CLOSE_TIMEOUT = 5.0


class ConnectionLost(ConnectionError):
    """The client's connection ended (peer closed, dead peer, goaway); ``reason`` says which.

    Frames sent and not answered may or may not have been processed: retry them
    through a new connection only if they are idempotent (see ``idempotency``).
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


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
