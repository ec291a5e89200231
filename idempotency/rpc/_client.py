"""The msgpack-rpc client: many calls in flight on one long connection, safe retries.

A :class:`Client` holds one connection at a time (framed, through netframe's
:class:`~netframe.Client` with its heartbeats; or the plain msgpack stream) and matches
responses to calls by msgid, so any number of goroutines may call at once.

When a call is sent again
-------------------------
A retry is safe only when running the method twice cannot happen, so the client asks
two questions. Did the method provably never start? (The request could not be queued
on a live connection, or the server refused it before dispatch as it went away and
marked the refusal so, ``{"refused": true}``: a mark only the server sets, never a
method, whatever status the method raises.) Then any call may be sent again. Does the
call carry an idempotency key? Then it may be sent again whatever happened to it: the
server runs it at most once per key and answers a repeat with the stored outcome
(flagged ``replayed``).

A keyed call is resent until it is answered (a result, or a status outside the retry
policy's set: final, recorded), or its deadline passes: through lost connections, a
server's death, GOAWAY and reconnection, on both transports. Those connection events
are not the server's judgement of the call, so neither ``max_attempts`` nor the
throttle stops these resends: the throttle protects a struggling server, not a dead
one, and a lost connection or a dial that gave up is charged to it once, however many
calls it failed. A backoff drawn past the deadline is shortened to half the time left.
Without a deadline, the resends stop ``RetryPolicy.resend_budget`` seconds (30) after
the call began. A keyed call answered with a retryable status by a live server
(``UNAVAILABLE``, ``RESOURCE_EXHAUSTED``, ``ABORTED``) is retried under gRPC A6's rules
below. Every error of a keyed call carries its key
(:attr:`RPCError.key <idempotency.rpc.RPCError.key>`); resending under it,
``call(method, *params, idempotency_key=err.key, timeout=t)``, is one new call whose
attempts share the new deadline ``t``, and answers with the outcome of the one run.

A call without a key whose connection was lost in flight, or that was answered with an
error that is not a marked refusal (even ``UNAVAILABLE`` raised by the method), is not
sent again (at most once): lost in flight, or past its deadline once sent, it fails
(:class:`~idempotency.rpc.Unavailable`, :class:`~idempotency.rpc.CallTimeout`)
saying it may or may not have run.

Plain msgpack-rpc peers
-----------------------
On the plain stream the client opens each connection with a handshake (``[0, msgid,
"idempotency.rpc.hello", [1]]``, PROTOCOL.md) and sends a request's fifth element
(key, caller, timeout, attempt) only once the server has answered that it speaks the
extension; a call with any of those waits for that answer, so that the first call on a
connection carries its deadline too. A plain peer (Neovim, aio-msgpack-rpc) never sees
one: its calls are the specification's four elements, their deadlines are kept by the
client alone, and a call with an idempotency key is refused locally
(``FAILED_PRECONDITION``, nothing sent), since such a peer cannot run it once per key.
Errors of a shape that is not ours are ``UNKNOWN`` and keep the peer's type and
message (:attr:`~idempotency.rpc.RPCError.peer_type`).

How often, and when (gRPC's A6 retry design)
--------------------------------------------
:class:`RetryPolicy`: at most ``max_attempts`` transmissions (for a keyed call, at most
``max_attempts`` answered with a retryable status; its resends after connection events
are bounded by its deadline instead, above); before retry *n* the
client waits ``uniform(0, min(initial_backoff * multiplier**(n-1), max_backoff))``
(full jitter, so clients that failed together do not return together); never past
the call's deadline. :class:`RetryThrottle`: a token bucket per client (start full at
``max_tokens``, each failed attempt takes one, each success gives back
``token_ratio``; a lost connection or a failed dial takes one, not one per call);
retries stop while it holds half or less, so a sick server sees about one retry per
ten calls instead of ``max_attempts`` times its load.

A call's ``timeout`` bounds the whole call, retries and reconnects included; each
transmission tells the server how much of it is left, and the server cancels the
method's context when that passes.
"""

from __future__ import annotations

import functools
import math
import random
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import gosim
from gosim import Chan, go, recv, select
from gosim.lowlevel import Waiter, WaitReason
from gosim.net import dial as net_dial
from netframe import Client as FramedClient
from netframe import ConnectionLost, FrameFormat, LocalFrameError

from ._errors import CallTimeout, RPCError, Unavailable
from ._protocol import (
    DEFAULT_LIMITS,
    EXTENSION_VERSION,
    HELLO_METHOD,
    MAX_MSGID,
    CallMeta,
    ErrorInfo,
    Limits,
    Message,
    Notification,
    RemoteProtocolError,
    Request,
    Response,
    Status,
    decode,
    encode_error,
    encode_notification,
    encode_plain_error,
    encode_request,
    parse_error,
    speaks_extension,
)
from ._stream import StreamLink

__all__ = ["CallResult", "Client", "ClientStatistics", "RetryPolicy", "RetryThrottle"]


@dataclass(frozen=True)
class RetryPolicy:
    """gRPC A6's retry policy: how many transmissions, how long between them, on what.

    ``retryable_codes`` apply to calls with an idempotency key; calls without one are
    retried only when the method provably never started (never sent, or a refusal the
    server marked as made before dispatch; see the module docstring), never on a
    status alone. ``max_attempts`` bounds an unkeyed call's transmissions, and a keyed
    call's transmissions answered with one of ``retryable_codes``; a keyed call is
    resent after connection events (a lost connection, a failed dial, a GOAWAY's
    refusal) until its deadline, or, without one, for ``resend_budget`` seconds from
    the call's start. The backoff applies to every resend.
    """

    max_attempts: int = 5
    initial_backoff: float = 0.05
    max_backoff: float = 2.0
    backoff_multiplier: float = 2.0
    retryable_codes: frozenset[int] = frozenset(
        {Status.UNAVAILABLE, Status.RESOURCE_EXHAUSTED, Status.ABORTED}
    )
    resend_budget: float = 30.0

    def __post_init__(self) -> None:
        if not isinstance(self.max_attempts, int) or self.max_attempts < 1:
            raise ValueError(f"max_attempts must be an int >= 1, not {self.max_attempts!r}")
        if not self.initial_backoff > 0 or not self.max_backoff > 0:
            raise ValueError("initial_backoff and max_backoff must be > 0")
        if not self.backoff_multiplier >= 1:
            raise ValueError("backoff_multiplier must be >= 1")
        if not 0 < self.resend_budget < math.inf:
            raise ValueError(
                f"resend_budget must be a finite number of seconds > 0, not {self.resend_budget!r}"
            )

    def backoff(self, retry: int, rng: random.Random) -> float:
        """The wait before retry number ``retry`` (1 for the first retry)."""
        cap = min(self.initial_backoff * self.backoff_multiplier ** (retry - 1), self.max_backoff)
        return rng.uniform(0, cap)


class RetryThrottle:
    """gRPC A6's retry throttling: a token bucket shared by a client's calls."""

    def __init__(self, max_tokens: float = 10.0, token_ratio: float = 0.1) -> None:
        if not max_tokens > 0 or not token_ratio > 0:
            raise ValueError("max_tokens and token_ratio must be > 0")
        self.max_tokens = float(max_tokens)
        self.token_ratio = float(token_ratio)
        self.tokens = self.max_tokens

    def record_failure(self) -> None:
        """A call failed in a way that counts against retries: one token less."""
        self.tokens = max(0.0, self.tokens - 1.0)

    def record_success(self) -> None:
        """A call succeeded: ``token_ratio`` tokens back, up to ``max_tokens``."""
        self.tokens = min(self.max_tokens, self.tokens + self.token_ratio)

    def allows_retry(self) -> bool:
        """Whether a retry may be sent: more than half the tokens are left."""
        return self.tokens > self.max_tokens / 2


@dataclass(frozen=True, slots=True)
class CallResult:
    """What :meth:`Client.call_result` returns: the result and how it was obtained."""

    result: Any
    replayed: bool
    attempts: int
    key: str | None


@dataclass
class ClientStatistics:
    """Counters of a client; a snapshot, see :meth:`Client.statistics`."""

    calls: int = 0
    attempts: int = 0
    retries: int = 0
    replays: int = 0
    connects: int = 0
    connections_lost: int = 0
    goaways: int = 0
    throttled: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    # Connections lost because the server sent nothing for the heartbeat timeout (this
    # side declared it dead); the rest of connections_lost the server or the network
    # ended.
    servers_found_dead: int = 0
    # Calls waiting on a connection when it was lost (keyed ones are resent), against
    # connections_lost, which counts the connections.
    lost_in_flight: int = 0
    # Dials that gave up (after connect_attempts tries), each once however many calls
    # waited for it.
    connect_failures: int = 0
    # Failures charged to the RetryThrottle: one per retryable status answer, one per
    # lost connection that carried calls and one per dial that gave up (not one per call
    # such an event failed).
    throttle_failures: int = 0


#: A wait's outcome when the call's deadline came first.
_EXPIRED: Final = object()
#: Seconds left to a keyed call's deadline under which it is not resent (no server
#: could answer in time).
_LAST_RESEND: Final = 0.002
_RPC_REPLY: Final = WaitReason.RPC_REPLY


class _Lost:
    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason


class _Link:
    """One live connection of the client, either transport.

    ``extension``: whether the server speaks the extension (request metadata, our
    error shape, the refusal mark). True on the framed transport; on the plain stream
    None until the handshake's answer (``hello_msgid``) comes, then True or False;
    ``handshake`` is closed then, waking calls that wait for it. ``going_away``: the
    server refused a call because it is going away (a marked ``UNAVAILABLE``, the plain
    stream's GOAWAY): the link finishes its calls and takes no new ones.
    """

    __slots__ = (
        "closed",
        "extension",
        "framed",
        "going_away",
        "handshake",
        "hello_msgid",
        "reason",
        "stream",
    )

    def __init__(self, framed: FramedClient | None, stream: StreamLink | None) -> None:
        self.framed = framed
        self.stream = stream
        self.closed = False
        self.reason = ""
        self.extension: bool | None = True if framed is not None else None
        self.hello_msgid: int | None = None
        self.handshake: Chan[None] | None = None
        self.going_away = False

    async def send(self, payload: bytes) -> None:
        if self.framed is not None:
            await self.framed.send(payload)
        else:
            assert self.stream is not None
            await self.stream.send(payload)


def _addresses_dialer(
    addresses: Sequence[str], timeout: float | None
) -> Callable[[], Awaitable[Any]]:
    if not addresses:
        raise ValueError("Client needs at least one address")
    index = [0]

    async def dial() -> Any:
        # Round-robin: a failed or lost connection's next attempt tries the next server.
        address = addresses[index[0] % len(addresses)]
        index[0] += 1
        return await net_dial("tcp", address, timeout=timeout)

    return dial


class Client:
    """Calls methods of a msgpack-rpc server; see the module docstring for retries.

    ``dial`` is an async function returning a new connection (gosim.net's ``Conn``
    shape), one ``"host:port"`` address, or a list of them tried in turn. ``transport`` is
    ``"framed"`` (netframe sessions, our servers) or ``"stream"`` (plain msgpack-rpc
    peers such as Neovim). ``caller`` scopes this client's idempotency keys on the
    server. Calls to the methods in ``idempotent_methods`` get a generated key when
    none is given, and every retry of the call reuses it. With addresses, each dial
    gives up after ``connect_timeout`` seconds (a black-holed address would otherwise
    hold the connecting calls for the kernel's SYN retries, minutes).

    On the plain stream, ``handshake`` (default True) asks each new connection's server
    whether it speaks the extension (see the module docstring); the answer is awaited
    for at most ``connect_timeout`` seconds, and only by calls that need it (those with
    a key). ``handshake=False`` sends no handshake and treats every stream peer as
    plain.
    """

    def __init__(
        self,
        dial: Callable[[], Awaitable[Any]] | str | Sequence[str],
        *,
        transport: str = "framed",
        handshake: bool = True,
        caller: str | None = None,
        idempotent_methods: Iterable[str] = (),
        timeout: float | None = None,
        retry: RetryPolicy | None = None,
        throttle: RetryThrottle | None = None,
        limits: Limits = DEFAULT_LIMITS,
        heartbeat_interval: float | None = 10.0,
        heartbeat_timeout: float | None = None,
        connect_attempts: int = 3,
        connect_timeout: float | None = 5.0,
        backoff_initial: float = 0.05,
        backoff_max: float = 2.0,
        rng: random.Random | None = None,
    ) -> None:
        if transport not in ("framed", "stream"):
            raise ValueError(f"transport must be 'framed' or 'stream', not {transport!r}")
        if connect_attempts < 1:
            raise ValueError("connect_attempts must be at least 1")
        if isinstance(dial, str):  # one address, as net.dial takes it (a str is a Sequence)
            dial = [dial]
        self.dial = dial if callable(dial) else _addresses_dialer(list(dial), connect_timeout)
        self.transport = transport
        self.handshake = handshake
        self.connect_timeout = connect_timeout
        self.caller = caller
        self.idempotent_methods = frozenset(idempotent_methods)
        self.timeout = timeout
        self.retry = RetryPolicy() if retry is None else retry
        self.throttle = RetryThrottle() if throttle is None else throttle
        self.limits = limits
        self.heartbeat_interval = heartbeat_interval
        self.heartbeat_timeout = heartbeat_timeout
        self.connect_attempts = connect_attempts
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self.rng = random.Random() if rng is None else rng
        self._link: _Link | None = None  # where new calls go
        self._links: set[_Link] = set()  # every live link
        self._connecting: Chan[None] | None = None
        self._pending: dict[int, tuple[Waiter, _Link]] = {}
        self._next_id = 0
        self._closed = False
        self._stats = ClientStatistics()

    # ------------------------------------------------------------------ public

    async def call(
        self,
        method: str,
        *params: Any,
        idempotency_key: str | None = None,
        idempotent: bool | None = None,
        timeout: float | None = None,
    ) -> Any:
        """Call ``method(*params)`` on the server and return its result.

        ``timeout`` (default: the client's) is one deadline over all the call's
        attempts, reconnects and backoffs included. A keyed call (``idempotency_key``,
        or a method of ``idempotent_methods``, or ``idempotent=True``: a key is
        generated) is resent under its key through lost connections, a dead server,
        GOAWAY and reconnection, until it is answered or its deadline passes (without a
        timeout: for the retry policy's ``resend_budget``); the server runs it at most
        once per key. A call without a key is sent again only when it provably never
        started: lost in flight it fails, saying it may or may not have run.

        Raises :class:`~idempotency.rpc.RPCError` for an error response (typed:
        :class:`~idempotency.rpc.CallTimeout` when the deadline passes,
        :class:`~idempotency.rpc.Unavailable` when no server could take the call). Every
        error of a keyed call carries its key (``err.key``):
        ``call(method, *params, idempotency_key=err.key, timeout=t)`` resends it, as one
        new call with its own deadline ``t``, and returns the outcome of its one run
        (running it now if no earlier attempt reached the method).
        """
        res = await self.call_result(
            method, *params, idempotency_key=idempotency_key, idempotent=idempotent, timeout=timeout
        )
        return res.result

    async def call_result(
        self,
        method: str,
        *params: Any,
        idempotency_key: str | None = None,
        idempotent: bool | None = None,
        timeout: float | None = None,
    ) -> CallResult:
        """As :meth:`call`, returning a :class:`CallResult` (replayed, attempts, key)."""
        keyed = idempotency_key is not None or (
            idempotent if idempotent is not None else method in self.idempotent_methods
        )
        key = idempotency_key
        if keyed and key is None:
            key = f"{self.rng.getrandbits(128):032x}"
        timeout = self.timeout if timeout is None else timeout
        try:
            if self._closed:
                raise Unavailable("client is closed")
            return await self._call(method, params, key, timeout)
        except RPCError as exc:
            # Every error of a keyed call names its key (generated ones included): the
            # caller resends under it to learn the outcome without running it twice.
            exc.key = key
            raise

    async def _call(
        self, method: str, params: tuple[Any, ...], key: str | None, timeout: float | None
    ) -> CallResult:
        """The attempts of one call, by the rules of the module docstring."""
        keyed = key is not None
        policy = self.retry
        now = gosim.now()
        deadline = math.inf if timeout is None else now + timeout
        # A keyed call is resent after connection events until its deadline; without
        # one, for the policy's resend budget (a caller never waits forever).
        resend_until = deadline if deadline != math.inf else now + policy.resend_budget
        stats = self._stats
        stats.calls += 1
        attempt = 0
        answered = 0  # attempts answered with a retryable status (A6's max_attempts)
        while True:
            attempt += 1
            stats.attempts += 1
            outcome = await self._attempt(method, params, key, attempt, deadline, timeout, now)
            if type(outcome) is Response:
                self.throttle.record_success()
                if outcome.replayed:
                    stats.replays += 1
                return CallResult(outcome.result, outcome.replayed, attempt, key)
            error, event, retryable = self._judge(outcome, keyed)
            if retryable and not event:  # a live server's retryable status (gRPC A6)
                answered += 1
                self._charge_throttle()
            if not retryable or self._closed:  # closed: no connection will take it
                self._count_error(error.code)
                raise error
            wait = policy.backoff(attempt, self.rng)
            if event and keyed:
                wait = self._resend_wait(wait, resend_until, deadline, attempt, error)
            else:
                self._may_retry(answered if keyed else attempt, wait, deadline, attempt, error)
            stats.retries += 1
            await gosim.sleep(wait)
            now = gosim.now()

    def _judge(self, outcome: Any, keyed: bool) -> tuple[RPCError, bool, bool]:
        """A failed attempt's error; whether it was a connection event (the call not
        sent, lost in flight, or refused by a server going away before dispatch: not
        the server's judgement of the call); whether the call may be tried again."""
        if type(outcome) is _ErrorReply:
            info = outcome.info
            error: RPCError = RPCError.from_info(info)
            if outcome.refused:
                # Only the server sets the mark, and only before dispatch, as it goes
                # away (a GOAWAY's refusal): the method never started.
                return error, True, True
            # A live server's answer that the call may be tried again: gRPC A6's rules
            # (max_attempts, the throttle) protect a struggling server. A status alone
            # never proves an unkeyed method did not start.
            return error, False, keyed and info.code in self.retry.retryable_codes
        assert isinstance(outcome, _Failed)
        if outcome.sent is False:
            return Unavailable(f"could not send the call: {outcome.reason}"), True, True
        if keyed:
            lost = f"connection lost with the call in flight ({outcome.reason})"
            return Unavailable(lost), True, True
        return (
            Unavailable(
                f"connection lost with the call in flight ({outcome.reason}); it has "
                "no idempotency key, so it was not sent again: it may or may not "
                "have run"
            ),
            False,
            False,
        )

    def _resend_wait(
        self, wait: float, resend_until: float, deadline: float, attempt: int, error: RPCError
    ) -> float:
        """How long to back off before resending a keyed call after a connection event,
        or the error that ends it. A lost connection, a dead or departing server: the
        call is resent (the server runs it at most once per key) until its deadline or
        budget, whatever max_attempts and the throttle say; the throttle was charged
        once for the connection, not once per call it carried."""
        left = resend_until - gosim.now()
        if deadline != math.inf and wait >= left > _LAST_RESEND:
            # A backoff drawn past the deadline is cut short, not the call: the last
            # resend goes with half the time left.
            wait = left / 2
        if wait < left:
            return wait
        if deadline != math.inf:
            self._count_error(Status.DEADLINE_EXCEEDED)
            raise CallTimeout(f"deadline exceeded before resend {attempt}: last error {error}")
        self._count_error(Status.UNAVAILABLE)
        raise Unavailable(
            f"no answer within the resend budget of {self.retry.resend_budget:g} s "
            f"({attempt} attempts): last error {error}"
        )

    def _may_retry(
        self, tries: int, wait: float, deadline: float, attempt: int, error: RPCError
    ) -> None:
        """Raise what ends the call unless gRPC A6's rules let it be retried after
        ``wait``: fewer than max_attempts ``tries``, the throttle's leave, and the
        deadline not passed by then."""
        if tries >= self.retry.max_attempts:
            self._count_error(error.code)
            raise error
        if not self.throttle.allows_retry():
            self._stats.throttled += 1
            self._count_error(error.code)
            raise error
        if gosim.now() + wait >= deadline:
            self._count_error(Status.DEADLINE_EXCEEDED)
            raise CallTimeout(f"deadline exceeded before retry {attempt}: last error {error}")

    def _charge_throttle(self) -> None:
        """One failure for the retry throttle: a retryable status answer, a lost
        connection that carried calls, or a dial that gave up (each once, however many
        calls it failed)."""
        self.throttle.record_failure()
        self._stats.throttle_failures += 1

    async def notify(self, method: str, *params: Any) -> None:
        """Send a notification (no response; delivered at most once)."""
        link = await self._get_link(math.inf)
        try:
            await link.send(encode_notification(method, params))
        except ConnectionError as exc:
            raise Unavailable(f"could not send the notification: {exc}") from exc

    async def close(self) -> None:
        """Close the connection; calls in flight fail with Unavailable."""
        self._closed = True
        self._link = None
        # Every live link, the current one and any still finishing calls after a GOAWAY.
        for link in list(self._links):
            await self._close_link(link, "client closed")

    def statistics(self) -> ClientStatistics:
        """A snapshot of the client's counters."""
        s = self._stats
        return ClientStatistics(
            s.calls,
            s.attempts,
            s.retries,
            s.replays,
            s.connects,
            s.connections_lost,
            s.goaways,
            s.throttled,
            dict(s.errors),
            s.servers_found_dead,
            s.lost_in_flight,
            s.connect_failures,
            s.throttle_failures,
        )

    # ------------------------------------------------------------------ one attempt

    def _count_error(self, code: int) -> None:
        try:
            name = Status(code).name
        except ValueError:
            name = str(code)
        self._stats.errors[name] = self._stats.errors.get(name, 0) + 1

    async def _attempt(
        self,
        method: str,
        params: tuple[Any, ...],
        key: str | None,
        attempt: int,
        deadline: float,
        timeout: float | None,
        now: float,
    ) -> Response | _ErrorReply | _Failed:
        """One transmission of the call and the wait for its outcome: the response when
        it succeeded, else the error it carried, or how the attempt failed. ``now`` is
        the clock as the call began (its first attempt need not read it again)."""
        link = self._usable_link()
        if link is None:
            try:
                link = await self._get_link(deadline)
            except Unavailable as exc:
                return _Failed(str(exc), sent=False)
            now = gosim.now()
        if link.extension is None and (
            key is not None or deadline != math.inf or self.caller is not None or attempt > 1
        ):
            # What the call carries beside its request (a key, a deadline, the caller, the
            # attempt) goes only to a server that speaks the extension: wait for the
            # handshake's answer. Sent before it, the first call on a new connection would
            # lose its deadline, and the server run it after the caller gave up.
            if not await self._await_handshake(link, deadline):
                self._count_error(Status.DEADLINE_EXCEEDED)
                raise CallTimeout("deadline exceeded waiting for the server's handshake")
            if link.closed:
                return _Failed(link.reason, sent=False)
            now = gosim.now()
        remaining = deadline - now
        if remaining <= 0:
            raise CallTimeout(f"no reply within {timeout} s")
        meta = self._meta(link, key, None if deadline == math.inf else remaining, attempt)
        msgid = self._new_msgid()
        payload = encode_request(msgid, method, params, meta)
        # The response (the reader), the link's loss (_drop_link) or the deadline,
        # whichever settles it first; a settle during the send below is kept.
        waiter = Waiter()
        self._pending[msgid] = (waiter, link)
        try:
            try:
                await link.send(payload)
            except ConnectionError as exc:  # never queued on a live connection
                self._drop_link(link, f"{exc}")
                return _Failed(str(exc), sent=False)
            if deadline != math.inf:
                waiter.set_deadline(deadline, _EXPIRED)
            outcome = await waiter.wait(_RPC_REPLY)
            if outcome is _EXPIRED:
                self._count_error(Status.DEADLINE_EXCEEDED)
                raise CallTimeout(
                    f"no reply within {timeout} s"
                    if key is not None  # the error's text says what a key means
                    else f"no reply within {timeout} s; the call has no idempotency key: "
                    "it may or may not have run"
                )
        finally:
            self._pending.pop(msgid, None)
        if type(outcome) is Response:
            return outcome if outcome.error is None else self._error_reply(outcome, link)
        assert isinstance(outcome, _Lost)
        return _Failed(outcome.reason, sent=True)

    def _meta(
        self, link: _Link, key: str | None, remaining: float | None, attempt: int
    ) -> CallMeta | None:
        """What the call carries beside its request, for a server that speaks the
        extension (None when there is nothing to carry: the plain request); ``remaining``
        is the time left to the deadline (None: none). Raises FAILED_PRECONDITION for a
        keyed call to a plain peer, which cannot run it once per key: nothing is sent."""
        if link.extension:
            timeout_ms = None if remaining is None else max(0, int(remaining * 1000))
            if key is not None or self.caller is not None or timeout_ms is not None or attempt > 1:
                return CallMeta(key, self.caller, timeout_ms, attempt)
            return None
        if key is not None:
            self._count_error(Status.FAILED_PRECONDITION)
            raise RPCError(
                Status.FAILED_PRECONDITION,
                "the server did not answer the handshake saying it speaks the idempotency "
                "extension (a plain msgpack-rpc peer): a call with an idempotency key is "
                "not sent to it",
            )
        return None

    @staticmethod
    def _error_reply(response: Response, link: _Link) -> _ErrorReply:
        """An error response, read: our error shape and the refusal mark mean something
        only from a server that speaks the extension (any other peer's error is its own,
        UNKNOWN); a refusal with UNAVAILABLE marks the link as going away, so that new
        calls (this one's retry too) go on a new connection, the next address with
        several, as after a GOAWAY."""
        ours = link.extension is True
        info = parse_error(response.error, ours)
        refused = ours and response.refused
        if refused and info.code == Status.UNAVAILABLE:
            link.going_away = True
        return _ErrorReply(info, refused)

    async def _await_handshake(self, link: _Link, deadline: float) -> bool:
        """Wait until ``link``'s handshake has its answer (or the link ended); False
        when ``deadline`` came first."""
        done = link.handshake
        if done is None:
            return True
        if deadline == math.inf:
            await done.recv()
            return True
        timer = gosim.Timer(max(deadline - gosim.now(), 0.0))
        i, _, _ = await select(recv(done), recv(timer.c))
        timer.stop()
        return i == 0

    def _end_handshake(self, link: _Link, extension: bool) -> None:
        """The handshake's outcome is known (or the link ended): record it, wake the
        calls waiting for it."""
        if link.extension is None:
            link.extension = extension
        link.hello_msgid = None
        done = link.handshake
        if done is not None and not done.closed:
            done.close()

    async def _handshake_deadline(self, link: _Link, done: Chan[None], seconds: float) -> None:
        """A peer that has not answered the handshake within ``seconds`` is plain."""
        timer = gosim.Timer(seconds)
        i, _, _ = await select(recv(done), recv(timer.c))
        timer.stop()
        if i == 1:
            self._end_handshake(link, False)

    def _new_msgid(self) -> int:
        msgid = self._next_id
        self._next_id = 0 if msgid >= MAX_MSGID else msgid + 1
        return msgid

    # ------------------------------------------------------------------ connections

    def _usable_link(self) -> _Link | None:
        """The link new calls go on, when it can take one (live, no GOAWAY)."""
        link = self._link
        if (
            link is not None
            and not link.closed
            and not link.going_away
            and (link.framed is None or link.framed.goaway_received is None)
        ):
            return link
        return None

    async def _get_link(self, deadline: float) -> _Link:
        while True:
            link = self._usable_link()
            if link is not None:
                return link
            link = self._link
            if link is not None and not link.closed:
                # The server said GOAWAY (or, on the plain stream, refused a call as
                # going away): the link finishes the calls it carries, and new calls go
                # on a new connection (the next address, with several).
                self._link = None
                self._stats.goaways += 1
                continue
            if self._closed:
                raise Unavailable("client is closed")
            connecting = self._connecting
            if connecting is not None:  # another goroutine dials: wait for its outcome
                if deadline == math.inf:
                    await connecting.recv()
                else:  # ...but no longer than this call may take
                    timer = gosim.Timer(max(deadline - gosim.now(), 0.0))
                    i, _, _ = await select(recv(connecting), recv(timer.c))
                    timer.stop()
                    if i == 1:
                        raise CallTimeout("deadline exceeded while connecting")
                if self._link is None or self._link.closed:
                    raise Unavailable(f"could not connect: {self._last_connect_error}")
                continue
            self._connecting = Chan()
            try:
                self._link = await self._connect()
            except Unavailable:
                # One event for the throttle, however many calls wait for this dial.
                self._stats.connect_failures += 1
                self._charge_throttle()
                raise
            finally:
                done, self._connecting = self._connecting, None
                done.close()

    _last_connect_error = ""

    async def _connect(self) -> _Link:
        self._stats.connects += 1
        if self.transport == "framed":
            fmt = FrameFormat(max_frame_length=self.limits.max_message_size + 1)
            nc = FramedClient(
                self.dial,
                format=fmt,
                heartbeat_interval=self.heartbeat_interval,
                heartbeat_timeout=self.heartbeat_timeout,
                backoff_initial=self.backoff_initial,
                backoff_max=self.backoff_max,
                max_attempts=self.connect_attempts,
                rng=self.rng,
            )
            link = _Link(nc, None)
            # Responses are matched on netframe's reader goroutine (a partial: no frame
            # of its own), not handed through a channel to a reader of ours.
            nc.on_data = functools.partial(self._on_payload, link, nc)
            try:
                await nc.connect()
            except OSError as exc:
                self._last_connect_error = str(exc)
                raise Unavailable(f"could not connect: {exc}") from exc
            self._links.add(link)
            go(self._framed_reader, link, nc)
            return link
        conn = await self._dial_stream()
        link = _Link(None, None)
        link.stream = StreamLink(
            conn,
            self.limits,
            lambda payload: self._on_stream_payload(link, payload),
            lambda reason: self._drop_link(link, reason),
        )
        self._links.add(link)
        if not self.handshake:
            link.extension = False
            return link
        # The handshake goes first on the connection, so its answer (from our server)
        # comes before any call's: every error on the link is read knowing who sent it.
        done: Chan[None] = Chan()
        link.handshake = done
        link.hello_msgid = msgid = self._new_msgid()
        try:
            await link.stream.send(encode_request(msgid, HELLO_METHOD, [EXTENSION_VERSION]))
        except ConnectionError:
            self._end_handshake(link, False)  # the link has ended: calls fail as unsent
            return link
        if self.connect_timeout is not None:
            go(self._handshake_deadline, link, done, self.connect_timeout)
        return link

    async def _dial_stream(self) -> Any:
        backoff = self.backoff_initial
        for tries in range(1, self.connect_attempts + 1):
            try:
                return await self.dial()
            except OSError as exc:
                self._last_connect_error = str(exc)
                if tries >= self.connect_attempts:
                    raise Unavailable(f"could not connect: {exc}") from exc
                await gosim.sleep(self.rng.uniform(0, backoff))
                backoff = min(backoff * 2, self.backoff_max)
        raise AssertionError("unreachable")  # pragma: no cover

    async def _framed_reader(self, link: _Link, nc: FramedClient) -> None:
        """Waits for a framed link's end (its payloads go to :meth:`_on_payload`)."""
        reason = "connection closed"
        try:
            await nc.recv()  # with on_data, recv only reports the end
        except ConnectionLost as exc:
            reason = str(exc)
        finally:
            self._stats.servers_found_dead += nc.servers_found_dead  # one link, one nc
            self._drop_link(link, reason)
            await nc.close()

    def _on_payload(self, link: _Link, nc: FramedClient, payload: bytes) -> Any:
        """A framed link's DATA payload, on netframe's reader goroutine (``on_data``)."""
        try:
            msg = decode(payload, self.limits)
        except RemoteProtocolError as exc:
            # The server sent something that is not msgpack-rpc: it cannot be matched
            # to a call, so no call on this link can be trusted to end.
            self._drop_link(link, f"undecodable message from the server: {exc}")
            return nc.close()
        return self._on_message(link, msg)

    def _on_stream_payload(self, link: _Link, payload: bytes) -> Any:
        """A plain-stream link's message, on its reader goroutine: one that does not
        decode is dropped (a stream that cannot be cut ends the link instead)."""
        try:
            msg = decode(payload, self.limits)
        except RemoteProtocolError:
            return None
        return self._on_message(link, msg)

    def _on_message(self, link: _Link, msg: Message) -> Any:
        if type(msg) is Response:
            if msg.msgid == link.hello_msgid:
                # Our server answers {"extension": 1}; a plain peer, an error.
                self._end_handshake(link, msg.error is None and speaks_extension(msg.result))
                return None
            entry = self._pending.get(msg.msgid)
            if entry is not None and entry[1] is link:
                entry[0].settle(msg)
            return None
        if type(msg) is Request:
            return self._refuse(link, msg.msgid, msg.method)
        assert isinstance(msg, Notification)
        return None

    async def _refuse(self, link: _Link, msgid: int, method: str) -> None:
        """A request from the server: this client serves no methods and says so, as a
        server would, when that needs no waiting. The answer runs on the link's reader,
        so a server that sends requests and reads nothing must not stall it (responses
        and pongs come through it), and a link that ended meanwhile loses the answer,
        not the runtime (an exception here would end the reader's goroutine)."""
        message = f"no method {method!r}"
        if link.extension:
            payload = encode_error(msgid, Status.UNIMPLEMENTED, message)
        else:  # a plain peer (Neovim) reads [type, message]
            payload = encode_plain_error(msgid, Status.UNIMPLEMENTED, message)
        try:
            if link.framed is not None:
                await link.framed.send(payload, timeout=0.0)  # TimeoutError when full
            elif link.stream is not None:
                link.stream.send_nowait(payload)
        except (OSError, LocalFrameError):
            # ConnectionLost, a full send queue, a reset, or an answer too long for a
            # frame (a method name near the size limit): the answer is lost.
            pass

    def _drop_link(self, link: _Link, reason: str) -> None:
        """The link has ended: fail every call waiting on it (they may retry)."""
        if link.closed:
            return
        link.closed = True
        link.reason = reason
        self._links.discard(link)
        self._stats.connections_lost += 1
        if self._link is link:
            self._link = None
        carried = 0
        for waiter, on in list(self._pending.values()):
            if on is link:
                carried += 1
                waiter.settle(_Lost(reason))
        if carried and not self._closed:
            # One event for the throttle, however many calls the connection carried:
            # counted per call, one dead server's connection would empty the bucket and
            # stop the resends that exist for exactly this case.
            self._stats.lost_in_flight += carried
            self._charge_throttle()
        self._end_handshake(link, False)
        if link.stream is not None:
            link.stream.close(reason)

    async def _close_link(self, link: _Link, reason: str) -> None:
        self._drop_link(link, reason)
        if link.framed is not None:
            await link.framed.close()


class _ErrorReply:
    """An attempt answered with an error: what it said, and whether the server marked
    it as a refusal made before dispatch (only a server that speaks the extension)."""

    __slots__ = ("info", "refused")

    def __init__(self, info: ErrorInfo, refused: bool) -> None:
        self.info = info
        self.refused = refused


class _Failed:
    """An attempt that got no response: ``sent`` False when the request never left."""

    __slots__ = ("reason", "sent")

    def __init__(self, reason: str, sent: bool) -> None:
        self.reason = reason
        self.sent = sent
