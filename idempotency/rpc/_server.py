"""The msgpack-rpc server: methods registered once, served on either transport.

``serve(listener)`` speaks the framed transport: every message is a netframe session
frame, so heartbeats, idle timeouts, the connection and in-flight limits, goaway and
graceful shutdown are netframe's :class:`~netframe.Server`'s, and this layer adds only
the dispatch (see ``_dispatch``). ``serve_stream(listener)`` speaks the plain msgpack
stream for existing msgpack-rpc peers (Neovim), with the same methods, the same
connection and in-flight limits and the same shutdown.

Calls on one connection run concurrently up to ``max_in_flight``; past it the server
stops reading that connection until a call finishes (backpressure: the peer's calls
wait in its socket rather than in our memory). Responses leave in completion order;
msgpack-rpc matches them by msgid.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import gosim
from gosim import Chan, go
from netframe import (
    DEFAULT_MAX_OWED_BYTES,
    DEFAULT_READ_TIMEOUT,
    DEFAULT_WRITE_TIMEOUT,
    FrameFormat,
    Listener,
    default_max_connections,
)
from netframe import Server as FramedServer

from .._idempotency import Idempotency
from ._dispatch import Dispatcher, ServerStatistics
from ._protocol import (
    DEFAULT_LIMITS,
    HELLO_METHOD,
    Limits,
    RemoteProtocolError,
    Request,
    decode,
    encode_response,
    hello_result,
)
from ._stream import StreamLink

__all__ = ["Server"]

F = TypeVar("F", bound=Callable[..., Any])


class Server:
    """Serves registered methods to msgpack-rpc callers.

    Register with the decorator ``@server.method()`` (the function's name) or
    ``@server.method("name")``, or with :meth:`add_method`. A method is a plain or an
    async function taking the call's params by position; its return value is the
    result (anything msgpack can carry). ``pass_context=True`` gives it a
    :class:`gosim.context.Context` first, cancelled when the caller's timeout passes.
    Raise :class:`~idempotency.rpc.RPCError` to answer with a chosen status code; any
    other exception is answered as ``UNKNOWN`` with its type name and message.

    Keyword options are netframe's :class:`~netframe.Server`'s; ``limits`` bounds what
    a peer's message may contain (:class:`~idempotency.rpc.Limits`). On the plain
    stream, which has no heartbeats, ``idle_timeout`` closes a connection that sent
    nothing for that long while none of its calls was running.

    Against peers that hold a connection's resources, on both transports:
    ``read_timeout`` (default 30 s) closes a connection whose message has not arrived
    whole that long after its first byte (one byte at a time renews no deadline);
    ``max_owed_bytes`` (default 4 MiB) bounds the replies a connection owes its peer:
    past it the server reads no more of that peer's calls until some have been
    written (calls already running may each add their reply), and ``write_timeout``
    (default 30 s) closes a connection that owes replies and whose peer takes none of
    their bytes for that long (within 2.5 times that on the framed transport, see
    :class:`netframe.Server`).
    """

    def __init__(
        self,
        *,
        idempotency: Idempotency | None = None,
        limits: Limits = DEFAULT_LIMITS,
        max_connections: int | None = None,
        max_in_flight: int = 64,
        heartbeat_interval: float | None = 10.0,
        heartbeat_timeout: float | None = None,
        idle_timeout: float | None = None,
        grace_period: float = 5.0,
        send_queue: int = 1024,
        read_timeout: float | None = DEFAULT_READ_TIMEOUT,
        write_timeout: float | None = DEFAULT_WRITE_TIMEOUT,
        max_owed_bytes: int = DEFAULT_MAX_OWED_BYTES,
    ) -> None:
        self.limits = limits
        self.idempotency = idempotency
        self.dispatcher = Dispatcher(limits, idempotency=idempotency)
        self.stream_dispatcher = self.dispatcher.sibling(plain_errors=True)
        # None: netframe's default, 10,000 or less under a low descriptor limit.
        self.max_connections = (
            default_max_connections() if max_connections is None else max_connections
        )
        self.max_in_flight = max_in_flight
        self.grace_period = grace_period
        self.idle_timeout = idle_timeout
        self.send_queue = send_queue
        self.read_timeout = read_timeout
        # The plain stream's write deadline: the shorter of write_timeout and the idle
        # timeout (which was its write deadline before it had its own).
        deadlines = [t for t in (write_timeout, idle_timeout) if t is not None]
        self.write_timeout = min(deadlines) if deadlines else None
        self.max_owed_bytes = max_owed_bytes
        # A session frame is one kind byte plus the message.
        fmt = FrameFormat(max_frame_length=limits.max_message_size + 1)
        self.framed = FramedServer(
            self.dispatcher.handle_payload,
            format=fmt,
            max_connections=self.max_connections,
            max_in_flight=max_in_flight,
            heartbeat_interval=heartbeat_interval,
            heartbeat_timeout=heartbeat_timeout,
            idle_timeout=idle_timeout,
            grace_period=grace_period,
            send_queue=send_queue,
            read_timeout=read_timeout,
            write_timeout=write_timeout,
            max_owed_bytes=max_owed_bytes,
        )
        self._stream_links: set[_StreamServerConn] = set()
        self._stream_listeners: list[Listener] = []
        self._shutting_down = False

    # ------------------------------------------------------------------ methods

    def method(
        self,
        name: str | None = None,
        *,
        pass_context: bool = False,
        idempotent: bool = False,
        key_optional: bool = False,
        pass_call: bool = False,
        one_step: bool = False,
    ) -> Callable[[F], F]:
        """Decorator: register the function as method ``name`` (default: its name);
        the options are :meth:`add_method`'s."""

        def register(fn: F) -> F:
            self.add_method(
                fn,
                name,
                pass_context=pass_context,
                idempotent=idempotent,
                key_optional=key_optional,
                pass_call=pass_call,
                one_step=one_step,
            )
            return fn

        return register

    def add_method(
        self,
        fn: Callable[..., Any],
        name: str | None = None,
        *,
        pass_context: bool = False,
        idempotent: bool = False,
        key_optional: bool = False,
        pass_call: bool = False,
        one_step: bool = False,
    ) -> None:
        """Register ``fn`` as method ``name`` (default: its name).

        ``idempotent=True`` runs every call through the server's
        :class:`~idempotency.Idempotency` under the call's key and caller: once per key,
        replayed after (flagged ``replayed``), ``ALREADY_EXISTS`` for a key reused with
        other params, duplicates waiting for the first execution's outcome. A call
        without a key is refused (``FAILED_PRECONDITION``) unless ``key_optional``, when
        it runs as a plain call. ``pass_call=True`` gives the method the
        :class:`~idempotency.Call` first (``call.fence`` for external effects,
        ``call.ctx``); a method that returns the store's ``Effect`` has it committed
        with the record (exactly once). An :class:`~idempotency.rpc.RPCError` the
        method raises is its final answer, recorded and replayed; any other exception
        releases the key, so a retry runs the method again.

        ``one_step=True`` (idempotent, plain functions) says the method does nothing but
        return its outcome, usually an Effect, built from its arguments and ``call``:
        on a store that can (SQLite, PostgreSQL: a ``OneStepStore``) the key's claim,
        the effect and the record then commit in one transaction, one round trip
        instead of two, and a server killed mid-call leaves no claim behind. The method then runs
        before the claim, for a replay too (its outcome is dropped), and ``call.fence``
        is set when the effect runs (read it in the effect). It cannot wait, so it gets
        no context to wait on: ``call.ctx`` is None, and a ``pass_context`` method's
        context only tells it the deadline (a deadline that passes while its effect
        commits is answered ``DEADLINE_EXCEEDED`` by the server all the same, once the
        commit returns: the outcome is recorded, and a retry replays it). Its call
        waits for the commit on no goroutine: the store's batch calls back and the call,
        the :class:`netframe.Later` the server waits on, is settled with its reply. See
        :meth:`idempotency.Idempotency.run`.
        """
        self.dispatcher.register(
            fn,
            name,
            pass_context=pass_context,
            idempotent=idempotent,
            key_optional=key_optional,
            pass_call=pass_call,
            one_step=one_step,
        )

    def statistics(self) -> ServerStatistics:
        """Call counters (errors by status name); the transports keep their own."""
        return self.dispatcher.statistics()

    # ------------------------------------------------------------------ serving

    async def serve(self, listener: Listener) -> None:
        """Serve the framed transport on ``listener`` until :meth:`shutdown` finishes."""
        await self.framed.serve(listener)

    async def serve_stream(self, listener: Listener) -> None:
        """Serve the plain msgpack stream on ``listener`` until :meth:`shutdown`."""
        self._stream_listeners.append(listener)
        while not self._stopping():
            try:
                conn = await listener.accept()
            except Exception:
                if self._stopping():
                    return
                raise
            if self._stopping():
                conn.close()
                return
            if len(self._stream_links) >= self.max_connections:
                conn.close()  # the plain stream has no way to say why
                continue
            _StreamServerConn(self, conn)

    def _stopping(self) -> bool:
        # A method, not the attribute inline: shutdown() flips it while serve awaits.
        return self._shutting_down

    async def shutdown(self, grace: float | None = None) -> None:
        """Stop accepting, let calls already received finish (up to ``grace`` seconds,
        default ``grace_period``), then close every connection, on both transports."""
        if self._shutting_down:
            return
        self._shutting_down = True
        grace = self.grace_period if grace is None else grace
        for listener in self._stream_listeners:
            listener.close()
        deadline = gosim.now() + grace
        for sc in list(self._stream_links):
            sc.draining = True
        # netframe's shutdown sends every framed connection its GOAWAY before it first
        # waits: from then on the sender of a GOAWAY starts no new work (PROTOCOL.md).
        self.dispatcher.refusing = True
        await self.framed.shutdown(grace)
        while any(sc.in_flight for sc in self._stream_links) and gosim.now() < deadline:
            await gosim.sleep(min(0.01, max(deadline - gosim.now(), 0.0)))
        for sc in list(self._stream_links):
            await sc.flush_and_close(deadline)


class _StreamServerConn:
    """One plain-stream connection being served."""

    def __init__(self, server: Server, conn: Any) -> None:
        self.server = server
        self.in_flight = 0
        self.draining = False
        # A plain peer's shapes until the peer's handshake says it speaks the extension
        # (then the server's framed dispatcher's): the connection's own sibling, whose
        # handshake hook switches it.
        self.dispatcher = server.stream_dispatcher.sibling(plain_errors=True)
        self.dispatcher.on_hello = self._on_hello
        self._slots: Chan[None] = Chan(server.max_in_flight)
        server._stream_links.add(self)
        self.link = StreamLink(
            conn,
            server.limits,
            self._on_message,
            self._on_end,
            send_queue=server.send_queue,
            idle_timeout=server.idle_timeout,
            busy=lambda: self.in_flight > 0,
            answer_after_eof=True,
            read_timeout=server.read_timeout,
            write_timeout=server.write_timeout,
            max_owed=server.max_owed_bytes,
        )

    def _on_end(self, reason: str) -> None:
        self.server._stream_links.discard(self)

    def _on_hello(self, msg: Request) -> bytes:
        # The peer speaks the extension: from now on it gets our error shape and the
        # refusal mark (PROTOCOL.md, "The plain stream's handshake").
        self.dispatcher.plain_errors = False
        return encode_response(msg.msgid, None, hello_result())

    async def _reply(self, payload: bytes | None) -> None:
        if payload is None:
            return
        try:
            await self.link.send(payload)
        except ConnectionError:
            pass  # the peer is gone: the reply has nobody to reach

    def _on_message(self, payload: bytes) -> Any:
        """One message's bytes, through the framed transport's dispatch."""
        draining = self.draining
        out = self._draining(payload) if draining else self.dispatcher.handle_payload(payload)
        if out is None or type(out) is bytes:
            return out  # the link queues a reply's bytes with the receive's others
        if isinstance(out, bytes | bytearray):
            return bytes(out)
        return self._start(out, len(payload))

    def _draining(self, payload: bytes) -> Any:
        """After shutdown began: a request is refused (the handshake still answered),
        anything else handled as usual."""
        dispatcher = self.dispatcher
        try:
            msg = decode(payload, dispatcher.limits)
        except RemoteProtocolError as exc:
            return dispatcher.bad_message(exc)
        if type(msg) is Request and msg.method != HELLO_METHOD:
            return dispatcher.refuse(msg.msgid)
        return dispatcher.handle(msg)

    async def _start(self, awaitable: Any, size: int) -> None:
        # The call holds its request's bytes against max_owed_bytes while it runs.
        self.link.hold(size)
        await self._slots.send(None)  # blocks the reader at max_in_flight: backpressure
        self.in_flight += 1
        go(self._finish, awaitable, size)

    async def _finish(self, awaitable: Any, size: int) -> None:
        try:
            reply = await awaitable
            if reply is not None:
                await self._reply(reply)
        finally:
            self.link.release(size)
            self.in_flight -= 1
            self._slots.try_recv()
            if self.in_flight == 0:
                self.link.idle()

    async def flush_and_close(self, deadline: float) -> None:
        """Give queued replies until ``deadline`` to leave, then close."""
        link = self.link
        while not link.closed and link.queued and gosim.now() < deadline:
            await gosim.sleep(0.005)
        link.close("server shut down")
