"""The long-connection session protocol, sans-IO: frame kinds, heartbeats, idle, goaway.

Wire format (``PROTOCOL.md`` is the reference): every frame payload starts with one
kind byte. ``DATA`` carries application bytes; ``PING`` carries 8 opaque bytes that the
peer echoes in a ``PONG``; ``GOAWAY`` carries a 4-byte big-endian code and a UTF-8
reason and announces that the sender starts no new work and will close.

Theory of operation. A :class:`Session` is one side of one connection. It does no I/O
and reads no clock: the caller passes ``now`` (any monotonic seconds, the runtime
clock in gosim) and moves bytes. The calls are

* :meth:`Session.receive` for each frame payload the decoder produced; it returns the
  event (:class:`Data`, :class:`Ping`, :class:`Pong`, :class:`GoAway`) and, for a ping,
  queues the pong to send;
* :meth:`Session.receive_many` for the payloads of one receive at once (DATA out
  without event objects), then :meth:`Session.take_pongs` for the pongs to send now;
* :meth:`Session.data` / :meth:`Session.goaway` to make payloads to send;
* :meth:`Session.poll` when :meth:`Session.next_deadline` passes (and after each
  receive): it returns the payloads due now (pongs, a ping when the peer has been
  quiet for ``heartbeat_interval``) and updates :attr:`Session.dead` (nothing at all
  received for ``heartbeat_timeout``, and this side's ping given its time to be
  answered: the peer or the path is gone, including a half-open connection whose
  other end vanished) and :attr:`Session.idle` (no DATA either way for
  ``idle_timeout``).

Any frame received proves the peer alive, so a busy connection sends no pings. Both
sides ping independently, so each detects a dead peer on its own clock, within
``heartbeat_timeout`` (two intervals by default) of the last frame it received. A side
made with ``defer_pings`` (a server) waits a little longer before it pings, so that
when both sides use one interval the other side's pings come first and keep both
alive: one ping and one pong an interval. A
driver whose reader is behind may call :meth:`Session.heard` for bytes that have arrived
and are not read yet (netframe's heartbeat does, from the kernel's count of them).

States, in one table (uppercase sentinels, h11's style). An illegal call raises
:class:`LocalSessionError` and leaves the session unchanged.
"""

from __future__ import annotations

import enum
import math
import struct
from dataclasses import dataclass

from ._exceptions import LocalFrameError, RemoteFrameError

__all__ = [
    "CLOSED",
    "GOAWAY_BOTH",
    "GOAWAY_RECEIVED",
    "GOAWAY_SENT",
    "OPEN",
    "Data",
    "GoAway",
    "GoAwayCode",
    "Kind",
    "LocalSessionError",
    "Ping",
    "Pong",
    "RemoteSessionError",
    "Session",
    "SessionState",
]

MAX_REASON_BYTES = 1024
_PING_BODY = struct.Struct(">Q")
_DATA_KIND = bytes([0])  # Kind.DATA, before the enum exists
_PONG_KIND = bytes([2])  # Kind.PONG
_GOAWAY_HEAD = struct.Struct(">I")


class Kind(enum.IntEnum):
    """The first byte of every frame payload."""

    DATA = 0
    PING = 1
    PONG = 2
    GOAWAY = 3


class GoAwayCode(enum.IntEnum):
    """Why a side sends GOAWAY; unknown codes from a peer are kept as plain ints."""

    NO_ERROR = 0  # graceful shutdown: finish in-flight work, then close
    PROTOCOL_ERROR = 1  # the peer sent something this protocol forbids
    IDLE_TIMEOUT = 2  # no DATA either way for the idle timeout
    CONNECTION_LIMIT = 3  # the server is at its connection limit: try later or elsewhere
    HEARTBEAT_TIMEOUT = 4  # the peer was silent for the heartbeat timeout
    INTERNAL_ERROR = 5  # this side failed; the connection cannot go on


class SessionState(enum.Enum):
    OPEN = "OPEN"
    GOAWAY_SENT = "GOAWAY_SENT"  # we announced shutdown; we may still send replies
    GOAWAY_RECEIVED = "GOAWAY_RECEIVED"  # the peer did; start no new work
    # Both announced: neither side starts new work, and replies still owed may still
    # go out (the peer's own GOAWAY cannot take back requests it already sent).
    GOAWAY_BOTH = "GOAWAY_BOTH"
    CLOSED = "CLOSED"  # the caller closed: nothing more to send

    # Members are singletons compared by identity, so the identity hash is consistent
    # with equality; Enum's own __hash__ is a Python function (hash of the name), paid
    # on every `state in MAY_SEND_DATA` of a reply.
    __hash__ = object.__hash__

    def __repr__(self) -> str:
        return self.value


OPEN = SessionState.OPEN
GOAWAY_SENT = SessionState.GOAWAY_SENT
GOAWAY_RECEIVED = SessionState.GOAWAY_RECEIVED
GOAWAY_BOTH = SessionState.GOAWAY_BOTH
CLOSED = SessionState.CLOSED

# (state, what happened) -> next state. Everything that changes state is here.
TRANSITIONS: dict[tuple[SessionState, str], SessionState] = {
    (OPEN, "send_goaway"): GOAWAY_SENT,
    (OPEN, "recv_goaway"): GOAWAY_RECEIVED,
    (GOAWAY_SENT, "recv_goaway"): GOAWAY_BOTH,
    (GOAWAY_RECEIVED, "send_goaway"): GOAWAY_BOTH,
    (GOAWAY_SENT, "send_goaway"): GOAWAY_SENT,  # a second goaway may lower the code's hope
    (GOAWAY_RECEIVED, "recv_goaway"): GOAWAY_RECEIVED,
    (GOAWAY_BOTH, "send_goaway"): GOAWAY_BOTH,
    (GOAWAY_BOTH, "recv_goaway"): GOAWAY_BOTH,
    (OPEN, "close"): CLOSED,
    (GOAWAY_SENT, "close"): CLOSED,
    (GOAWAY_RECEIVED, "close"): CLOSED,
    (GOAWAY_BOTH, "close"): CLOSED,
    (CLOSED, "close"): CLOSED,
}
# States in which each outgoing frame kind may be made.
MAY_SEND_DATA = frozenset({OPEN, GOAWAY_SENT, GOAWAY_RECEIVED, GOAWAY_BOTH})


class LocalSessionError(LocalFrameError):
    """This side asked for something the session protocol forbids in its state.

    Example: sending DATA after :meth:`Session.close`. Nothing was produced and the
    session is unchanged.
    """


class RemoteSessionError(RemoteFrameError):
    """The peer sent a payload this protocol forbids (unknown kind, bad PING length...).

    The session is unchanged. Send ``goaway(GoAwayCode.PROTOCOL_ERROR)`` if you like
    and close the connection.
    """


@dataclass(frozen=True, slots=True)
class Data:
    """Application bytes from the peer."""

    payload: bytes


@dataclass(frozen=True, slots=True)
class Ping:
    """The peer pinged; the pong is queued for :meth:`Session.take_pongs` (or the next
    :meth:`Session.poll`)."""

    opaque: int


@dataclass(frozen=True, slots=True)
class Pong:
    """The peer answered our ping; ``rtt`` in seconds, or None for an unsolicited pong."""

    opaque: int
    rtt: float | None


@dataclass(frozen=True, slots=True)
class GoAway:
    """The peer will start no new work and will close; ``code`` is a GoAwayCode or int."""

    code: int
    reason: str


Event = Data | Ping | Pong | GoAway


class Session:
    """One side of a long connection's session protocol; see the module docstring.

    ``heartbeat_interval``: ping after this long without receiving anything (None: never
    ping). ``heartbeat_timeout``: the peer is dead after this long without receiving
    anything (default: two intervals; None: never dead), and once this side's first
    ping since has had the rest of that time to be answered (the timeout less the quiet
    time before a ping): a ping sent late, by an overloaded process, still gets its
    full answer window. ``idle_timeout``: the
    session is idle after this long without DATA in either direction (None: never).
    ``defer_pings``: this side waits half the grace (``heartbeat_timeout -
    heartbeat_interval``) longer before it pings, so that a peer pinging at the same
    interval pings first and this side only answers: one ping and one pong cross an
    interval, not two of each whenever both sides' quiet times run out together
    (netframe's server defers, its client does not). The peer's pings keep coming
    first while its round trip and lateness stay under half the grace; a peer that
    does not ping is still pinged, half the grace before the timeout.
    """

    def __init__(
        self,
        now: float,
        *,
        heartbeat_interval: float | None = 10.0,
        heartbeat_timeout: float | None = None,
        idle_timeout: float | None = None,
        defer_pings: bool = False,
    ) -> None:
        if heartbeat_interval is not None and heartbeat_interval <= 0:
            raise ValueError(f"heartbeat_interval must be positive, got {heartbeat_interval}")
        if heartbeat_timeout is None and heartbeat_interval is not None:
            heartbeat_timeout = 2 * heartbeat_interval
        if (
            heartbeat_timeout is not None
            and heartbeat_interval is not None
            and heartbeat_timeout < heartbeat_interval
        ):
            raise ValueError("heartbeat_timeout must be at least heartbeat_interval")
        if idle_timeout is not None and idle_timeout <= 0:
            raise ValueError(f"idle_timeout must be positive, got {idle_timeout}")
        self.heartbeat_interval = heartbeat_interval
        self.heartbeat_timeout = heartbeat_timeout
        # How long without receiving anything before this side pings.
        self._quiet_before_ping = math.inf if heartbeat_interval is None else heartbeat_interval
        if defer_pings and heartbeat_interval is not None and heartbeat_timeout is not None:
            self._quiet_before_ping += (heartbeat_timeout - heartbeat_interval) / 2
        # How long a ping has to be answered before the peer may be declared dead: what
        # is left of the timeout after a ping sent on time.
        self._answer_window = (
            0.0 if heartbeat_timeout is None else heartbeat_timeout - self._quiet_before_ping
        )
        # The first ping sent since the last frame received (None: none since).
        self._first_unanswered_ping: float | None = None
        self.idle_timeout = idle_timeout
        self.state = OPEN
        self.last_received = now  # any frame
        self.last_data = now  # DATA either way
        self.last_ping_sent: float | None = None
        self._outstanding: dict[int, float] = {}  # ping opaque -> time sent
        self._next_opaque = 0
        self._pongs: list[bytes] = []
        self.dead = False
        self.idle = False
        self.goaway_received: GoAway | None = None
        self.pings_sent = 0
        self.pongs_received = 0
        self.heartbeats_missed = 0

    def __repr__(self) -> str:
        return f"<Session {self.state!r} dead={self.dead} idle={self.idle}>"

    # ---------------------------------------------------------------- receive

    def receive(self, payload: bytes | bytearray | memoryview, now: float) -> Event:
        """Interpret one frame payload from the peer; raise RemoteSessionError if malformed."""
        if not payload:
            raise RemoteSessionError("empty frame: every payload starts with a kind byte")
        kind = payload[0]
        body = bytes(payload[1:])
        event: Event
        if kind == Kind.DATA:
            event = Data(body)
            self.last_data = now
        elif kind == Kind.PING:
            if len(body) != _PING_BODY.size:
                raise RemoteSessionError(f"PING carries {len(body)} bytes, not 8")
            (opaque,) = _PING_BODY.unpack(body)
            event = Ping(opaque)
            self._pongs.append(bytes([Kind.PONG]) + body)
        elif kind == Kind.PONG:
            if len(body) != _PING_BODY.size:
                raise RemoteSessionError(f"PONG carries {len(body)} bytes, not 8")
            (opaque,) = _PING_BODY.unpack(body)
            sent = self._outstanding.pop(opaque, None)
            self.pongs_received += 1
            event = Pong(opaque, None if sent is None else now - sent)
        elif kind == Kind.GOAWAY:
            if len(body) < _GOAWAY_HEAD.size or len(body) > _GOAWAY_HEAD.size + MAX_REASON_BYTES:
                raise RemoteSessionError(f"GOAWAY carries {len(body)} bytes")
            (code,) = _GOAWAY_HEAD.unpack_from(body)
            try:
                reason = body[_GOAWAY_HEAD.size :].decode("utf-8")
            except UnicodeDecodeError:
                raise RemoteSessionError("GOAWAY reason is not UTF-8") from None
            known = code in GoAwayCode._value2member_map_
            event = GoAway(GoAwayCode(code) if known else code, reason)
            self.goaway_received = event
            self.state = TRANSITIONS.get((self.state, "recv_goaway"), self.state)
        else:
            raise RemoteSessionError(f"unknown frame kind {kind}")
        self.heard(now)
        return event

    def receive_many(self, payloads: list[bytes], now: float, data: list[bytes]) -> bool:
        """Interpret the frame payloads of one receive, as :meth:`receive` would one by
        one, appending each DATA payload to ``data``; True when a control frame was
        among them (a ping's pong is then queued: :meth:`take_pongs` or :meth:`poll`
        returns it).

        The hot path of a connection's reader: DATA frames, nearly all of them, make no
        event object. A malformed payload raises RemoteSessionError with the frames
        before it taken (their DATA in ``data``) and the session unchanged by it.
        """
        control = False
        heard = False  # a PING or DATA came (other frames hear the peer in receive())
        data_taken = len(data)
        try:
            for payload in payloads:
                if payload and payload[0] == 0:  # Kind.DATA
                    data.append(payload[1:])
                elif len(payload) == 9 and payload[0] == 1:  # a well-formed Kind.PING
                    # The heartbeat's hot path (a server answers one per connection an
                    # interval): the pong queued as receive() queues it, no event made.
                    self._pongs.append(_PONG_KIND + payload[1:])
                    heard = control = True
                else:
                    self.receive(payload, now)  # hears the peer itself
                    control = True
        finally:
            if len(data) > data_taken:
                self.last_data = now
                heard = True
            if heard:
                self.heard(now)
        return control

    def heard(self, now: float) -> None:
        """The peer was heard from at ``now``: a frame arrived (the receive methods call
        this), or bytes of it wait to be read (the reader is behind): it is alive, and
        no ping of this side waits for an answer any more."""
        self.last_received = now
        self._first_unanswered_ping = None
        self.dead = False

    # ------------------------------------------------------------------- send

    def data(self, payload: bytes | bytearray | memoryview, now: float) -> bytes:
        """The frame payload that carries ``payload`` as DATA."""
        if self.state not in MAY_SEND_DATA:
            raise LocalSessionError(f"cannot send DATA in state {self.state.value}")
        self.last_data = now
        return bytes([Kind.DATA]) + bytes(payload)

    def data_many(self, payloads: list[bytes], now: float) -> list[bytes]:
        """The frame payloads that carry ``payloads`` as DATA (:meth:`data` for many)."""
        if self.state not in MAY_SEND_DATA:
            raise LocalSessionError(f"cannot send DATA in state {self.state.value}")
        self.last_data = now
        return [_DATA_KIND + p for p in payloads]

    def goaway(self, code: int = GoAwayCode.NO_ERROR, reason: str = "") -> bytes:
        """The GOAWAY frame payload; the session starts no new work from here on."""
        encoded = reason.encode("utf-8")
        if len(encoded) > MAX_REASON_BYTES:
            raise LocalSessionError(
                f"GOAWAY reason is {len(encoded)} bytes, at most {MAX_REASON_BYTES}"
            )
        if not 0 <= code < 2**32:
            raise LocalSessionError(f"GOAWAY code {code} does not fit 32 bits")
        nxt = TRANSITIONS.get((self.state, "send_goaway"))
        if nxt is None:
            raise LocalSessionError(f"cannot send GOAWAY in state {self.state.value}")
        self.state = nxt
        return bytes([Kind.GOAWAY]) + _GOAWAY_HEAD.pack(code) + encoded

    def close(self) -> None:
        """Nothing more will be sent or received (the caller closes the connection)."""
        self.state = TRANSITIONS[(self.state, "close")]

    # ------------------------------------------------------------------- time

    def poll(self, now: float) -> list[bytes]:
        """Frame payloads due now (pongs, then a ping if the peer is quiet); update dead/idle."""
        out = self._pongs
        self._pongs = []
        if self.state is CLOSED:
            return []
        # Compare as next_deadline computes (deadline <= now), never as a difference:
        # with floats the two can disagree by one rounding, and a poll at exactly the
        # deadline must act, or a driver sleeping until next_deadline() would spin.
        if self.heartbeat_timeout is not None and self._dead_at() <= now:
            self.dead = True
        interval = self.heartbeat_interval
        if (
            interval is not None
            and not self.dead
            and self.last_received + self._quiet_before_ping <= now
            and (self.last_ping_sent is None or self.last_ping_sent + interval <= now)
        ):
            if self.last_ping_sent is not None and self.last_ping_sent >= self.last_received:
                self.heartbeats_missed += 1  # the previous ping got no answer in time
            if self._first_unanswered_ping is None:
                self._first_unanswered_ping = now
            opaque = self._next_opaque
            self._next_opaque = (opaque + 1) % 2**64
            self._outstanding[opaque] = now
            if len(self._outstanding) > 64:  # a pong that never comes is forgotten
                self._outstanding.pop(next(iter(self._outstanding)))
            self.last_ping_sent = now
            self.pings_sent += 1
            out.append(bytes([Kind.PING]) + _PING_BODY.pack(opaque))
        self.idle = self.idle_timeout is not None and self.last_data + self.idle_timeout <= now
        return out

    def _dead_at(self) -> float:
        """When the peer is dead if nothing arrives first: ``heartbeat_timeout`` after
        the last frame received, and (when this side pings) no sooner than the answer
        window after the first ping sent since then; never before that ping is sent.
        A side that pinged late (its process overloaded) so gives the peer the time to
        answer that a punctual side gives, rather than judging it by a ping it has
        barely had."""
        timeout = self.heartbeat_timeout
        assert timeout is not None
        at = self.last_received + timeout
        if self.heartbeat_interval is None:
            return at  # no pings: silence alone decides
        first = self._first_unanswered_ping
        if first is None:
            return math.inf  # not pinged since the last frame: the ping comes first
        return max(at, first + self._answer_window)

    def take_pongs(self) -> list[bytes]:
        """The pongs the frames received so far queued, each returned once: what a
        reader sends at once after a receive, without :meth:`poll`'s other duties
        (pings, dead, idle: the heartbeat's, at its deadlines)."""
        out = self._pongs
        if out:
            self._pongs = []
        return out

    def next_deadline(self) -> float:
        """When :meth:`poll` next has something to do (infinity: never, pongs aside)."""
        if self.state is CLOSED:
            return math.inf
        times = [math.inf]
        if self._pongs:
            return -math.inf
        if self.heartbeat_timeout is not None and not self.dead:
            times.append(self._dead_at())
        if self.heartbeat_interval is not None and not self.dead:
            base = self.last_received + self._quiet_before_ping
            if self.last_ping_sent is not None:
                base = max(base, self.last_ping_sent + self.heartbeat_interval)
            times.append(base)
        if self.idle_timeout is not None and not self.idle:
            times.append(self.last_data + self.idle_timeout)  # idle is re-evaluated per poll
        return min(times)
