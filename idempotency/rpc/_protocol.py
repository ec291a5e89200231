"""msgpack-rpc messages with the idempotency extension, sans-IO.

This module does no I/O and imports neither trio nor gosim (h11's rule): a transport
hands it the bytes of one netframe frame (:func:`decode`) or the chunks of a plain
msgpack stream (:class:`StreamDecoder`), and gets message objects back; ``encode_*``
turn messages into bytes to write. The wire format is specified byte by byte in
``PROTOCOL.md`` ("Idempotent msgpack-rpc"); its examples are tests.

The messages (the msgpack-rpc specification's three shapes)
-----------------------------------------------------------
* request ``[0, msgid, method, params]``, optionally with a fifth element, the call's
  metadata map (:class:`CallMeta`: idempotency key, caller, timeout, attempt);
* response ``[1, msgid, error, result]``, optionally with a fifth element, the reply's
  metadata map (``{"replayed": true}`` when a stored outcome was returned);
* notification ``[2, method, params]``.

A plain msgpack-rpc peer (Neovim, say) never sees a fifth element: a request without
key, caller or timeout, and a response that is not a replay or a refusal, are the
spec's four-element arrays exactly, and on the plain stream a client sends metadata
only to a server that answered the handshake (:data:`HELLO_METHOD`) saying it speaks
the extension. The decoder accepts both lengths, and ignores metadata keys it does not
know (so later versions may add some).

Errors
------
Ours travel as ``[code, message, data]``: ``code`` is one of gRPC's status codes
(:class:`Status`; the client's retry policy is written in them, as gRPC's A6 is),
``message`` a string, ``data`` anything (the server puts ``{"type": name}`` there, the
remote exception's type). To a plain peer our server sends Neovim's own shape,
``[type, "STATUS: message"]`` (:func:`plain_error`), which Neovim and pynvim read.
Peers send other shapes too; :func:`parse_error` reads every shape into an
:class:`ErrorInfo` and never fails: one that is not ours is ``UNKNOWN`` and keeps the
peer's type and message.

Bad input
---------
Every decode failure is a :class:`RemoteProtocolError` that says what was wrong, with
``msgid`` set when the bad message was a request whose id could be read, so a server
can answer that request with an ``INVALID_ARGUMENT`` error and keep the connection. A
message that is not msgpack at all, or larger than the limit, loses the stream (plain
transport: where the next message starts is unknown) or only that frame (framed
transport: the next frame starts clean); on the plain transport a message cut whole
(its msgpack headers say where it ends) that does not decode loses only itself.
Limits are constructor arguments with safe defaults (see :class:`Limits`), and maps
accept only string or bytes keys (msgpack's ``strict_map_key``, against hash flooding).
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Final

import msgpack

from netframe import MAX_MSGPACK_DEPTH as MAX_DEPTH
from netframe import NEED_DATA, MsgpackCutter, NeedData

from .._accel import speedups as _speedups

__all__ = [
    "EXTENSION_VERSION",
    "HELLO_METHOD",
    "MAX_MSGID",
    "NOTIFICATION",
    "PEER_EXCEPTION",
    "PEER_VALIDATION",
    "REQUEST",
    "RESPONSE",
    "CallMeta",
    "ErrorInfo",
    "Limits",
    "LocalProtocolError",
    "Message",
    "MessageTooLarge",
    "Notification",
    "ProtocolError",
    "RemoteProtocolError",
    "Request",
    "Response",
    "Status",
    "StreamDecoder",
    "decode",
    "encode",
    "encode_error",
    "encode_notification",
    "encode_plain_error",
    "encode_request",
    "encode_response",
    "encode_response_payloads",
    "hello_result",
    "parse",
    "parse_error",
    "plain_error",
    "speaks_extension",
]

REQUEST: Final = 0
RESPONSE: Final = 1
NOTIFICATION: Final = 2
#: msgpack-rpc message ids are 32-bit unsigned integers.
MAX_MSGID: Final = 2**32 - 1
#: Largest idempotency key, in characters (printable ASCII), as the idempotency core.
MAX_KEY_LENGTH: Final = 255
#: Largest caller name carried in a request's metadata, in bytes.
MAX_CALLER_LENGTH: Final = 255
#: The plain stream's handshake: a client sends ``[0, msgid, HELLO_METHOD, [version]]``
#: first on a new connection; our server answers ``{"extension": version}`` (and from
#: then on speaks the extension on that connection), a plain peer an error (no such
#: method). No method may be registered under this name.
HELLO_METHOD: Final = "idempotency.rpc.hello"
#: The version of the extension (PROTOCOL.md) this module speaks.
EXTENSION_VERSION: Final = 1
#: Neovim's error types, the first element of its ``[type, message]`` errors: an
#: exception, and a validation error (bad arguments). Neovim reads no other type.
PEER_EXCEPTION: Final = 0
PEER_VALIDATION: Final = 1


class Status(enum.IntEnum):
    """gRPC's status codes, used as msgpack-rpc error codes.

    The retry policy names retryable codes in these terms (gRPC's A6 design); a peer
    that sends some other integer is read as it is, and treated as ``UNKNOWN`` by
    code that needs a status.
    """

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16


class ProtocolError(ValueError):
    """Base of the RPC protocol errors; never raised itself."""


class LocalProtocolError(ProtocolError):
    """*We* asked to send something the protocol cannot carry (a msgid out of range, a
    value msgpack cannot pack). Nothing was encoded; fix the call."""


class RemoteProtocolError(ProtocolError):
    """The bytes received are not a valid message.

    ``msgid`` is the request id when the bad message was a request whose id could be
    read (answer it with an ``INVALID_ARGUMENT`` error), else None. ``stream_lost`` is
    True when the transport cannot find the next message (undecodable msgpack on the
    plain stream transport): close the connection.
    """

    def __init__(self, reason: str, msgid: int | None = None, stream_lost: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.msgid = msgid
        self.stream_lost = stream_lost


class MessageTooLarge(RemoteProtocolError):
    """A message is larger than :attr:`Limits.max_message_size`; it was never buffered
    past the limit. On the plain stream transport the stream is lost."""


@dataclass(frozen=True, slots=True)
class Limits:
    """What a decoder accepts from a peer; every bound is checked before the value is
    built.

    ``max_message_size`` bounds one message's bytes (and, on the plain stream, the
    bytes buffered waiting for one); the others bound a single string, binary, array or
    map inside it, so a small message cannot announce a huge container.
    """

    max_message_size: int = 16 * 1024 * 1024
    max_str_len: int = 1024 * 1024
    max_bin_len: int = 16 * 1024 * 1024
    max_array_len: int = 128 * 1024
    max_map_len: int = 32 * 1024
    max_ext_len: int = 1024 * 1024
    #: A message at most this long decodes with msgpack's default limits, which are
    #: derived from its length and so within every limit here (a keyword-free unpackb
    #: costs a third of one with options).
    bare_max: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for name in (
            "max_message_size",
            "max_str_len",
            "max_bin_len",
            "max_array_len",
            "max_map_len",
            "max_ext_len",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"Limits.{name} must be a positive int, not {value!r}")
        bare = min(
            self.max_message_size,
            self.max_str_len,
            self.max_bin_len,
            self.max_array_len,
            2 * self.max_map_len,
            self.max_ext_len,
        )
        object.__setattr__(self, "bare_max", bare)

    def unpack_options(self) -> dict[str, Any]:
        """The keyword arguments of ``msgpack.Unpacker`` that enforce these limits."""
        return {
            "raw": False,
            "strict_map_key": True,
            "use_list": True,
            "max_str_len": self.max_str_len,
            "max_bin_len": self.max_bin_len,
            "max_array_len": self.max_array_len,
            "max_map_len": self.max_map_len,
            "max_ext_len": self.max_ext_len,
        }


DEFAULT_LIMITS: Final = Limits()


@dataclass(slots=True)
class CallMeta:
    """A request's fifth element: what makes a call idempotent and bounded in time.

    ``key``: the idempotency key (1-255 printable ASCII; checked by the idempotency
    core, which says why a key is refused). ``caller``: who is calling, the key's scope.
    ``timeout_ms``: how long the caller will wait for this attempt, counted from when
    the server reads the request (relative, as gRPC's ``grpc-timeout``, so the two
    clocks need not agree). ``attempt``: 1 for the first transmission, 2 and up for
    retries (gRPC's ``grpc-previous-rpc-attempts`` plus one).
    """

    key: str | None = None
    caller: str | None = None
    timeout_ms: int | None = None
    attempt: int = 1

    def to_wire(self) -> dict[str, Any]:
        """The metadata map sent with a call: only the fields set (``attempt`` past the first)."""
        out: dict[str, Any] = {}
        if self.key is not None:
            out["key"] = self.key
        if self.caller is not None:
            out["caller"] = self.caller
        if self.timeout_ms is not None:
            out["timeout"] = self.timeout_ms
        if self.attempt != 1:
            out["attempt"] = self.attempt
        return out


@dataclass(slots=True)
class Request:
    """``[0, msgid, method, params(, meta)]``."""

    msgid: int
    method: str
    params: list[Any]
    meta: CallMeta | None = None


@dataclass(slots=True)
class Response:
    """``[1, msgid, error, result(, meta)]``; ``error`` is None on success.

    ``replayed``: a stored outcome was returned. ``refused``: the server refused the
    request before dispatching it (draining, say): the method did not start, so any
    call may be sent again. Only the server sets it, never a method's error.
    """

    msgid: int
    error: Any
    result: Any
    replayed: bool = False
    refused: bool = False


@dataclass(slots=True)
class Notification:
    """``[2, method, params]``: no reply is sent."""

    method: str
    params: list[Any]


Message = Request | Response | Notification


@dataclass(frozen=True, slots=True)
class ErrorInfo:
    """An error response's content, whatever shape the peer sent.

    ``peer_type`` is set for an error in a shape that is not ours (``code`` is then
    ``UNKNOWN``): the first element of a peer's ``[type, message]`` (Neovim's
    :data:`PEER_EXCEPTION` or :data:`PEER_VALIDATION`); None for ours.
    """

    code: int
    message: str
    data: Any = None
    peer_type: int | None = None

    @property
    def type_name(self) -> str | None:
        """The remote exception's type name, when the peer sent one (ours do)."""
        return type_name_of(self.data)


def type_name_of(data: Any) -> str | None:
    """The remote exception's type name in an error's ``data`` (our servers send
    ``{"type": name, ...}``), else None."""
    if isinstance(data, dict):
        name = data.get("type")
        if isinstance(name, str):
            return name
    return None


# ------------------------------------------------------------------------ encoding

# One Packer for the module: a packb call builds a Packer each time (twice the cost).
# Goroutines run on one thread; nothing here is called from a syscall thread.
_packer_pack = msgpack.Packer(use_bin_type=True, autoreset=True).pack


def _pack(obj: Any) -> bytes:
    try:
        packed: bytes = _packer_pack(obj)
    except (TypeError, ValueError, OverflowError) as exc:
        raise LocalProtocolError(f"cannot encode as msgpack: {exc}") from exc
    return packed


def _check_msgid(msgid: int) -> None:
    if type(msgid) is not int or not 0 <= msgid <= MAX_MSGID:
        raise LocalProtocolError(f"msgid must be an int in [0, 2**32), not {msgid!r}")


def encode_request(
    msgid: int, method: str, params: list[Any] | tuple[Any, ...], meta: CallMeta | None = None
) -> bytes:
    """``[0, msgid, method, params]``, with ``meta`` as a fifth element when it says
    anything (a meta with every field at its default is left out)."""
    _check_msgid(msgid)
    if not isinstance(method, str):
        raise LocalProtocolError(f"method must be a str, not {type(method).__name__}")
    if meta is not None:
        wire = meta.to_wire()
        if wire:
            return _pack([REQUEST, msgid, method, list(params), wire])
    return _pack([REQUEST, msgid, method, list(params)])


def encode_response(
    msgid: int, error: Any, result: Any, replayed: bool = False, refused: bool = False
) -> bytes:
    """``[1, msgid, error, result]``, plus ``{"replayed": true}`` for a replay and
    ``{"refused": true}`` for a refusal made before dispatch."""
    _check_msgid(msgid)
    if replayed or refused:
        meta: dict[str, bool] = {}
        if replayed:
            meta["replayed"] = True
        if refused:
            meta["refused"] = True
        return _pack([RESPONSE, msgid, error, result, meta])
    return _pack([RESPONSE, msgid, error, result])


_REPLAYED_META: Final = b"\x81\xa8replayed\xc3"  # {"replayed": true}


def encode_response_payloads(
    msgid: int, error: bytes | None, result: bytes | None, replayed: bool = False
) -> bytes:
    """A response whose error or result is already msgpack (a recorded outcome's bytes):
    spliced in as they are, so a replay is byte-identical to the first reply's result.
    A missing part is nil."""
    if type(msgid) is not int or not 0 <= msgid <= MAX_MSGID:
        _check_msgid(msgid)  # raises, saying why
    head = b"\x95\x01" if replayed else b"\x94\x01"
    # A uint32 always packs: no _pack frame to turn an error into LocalProtocolError.
    body: bytes = head + _packer_pack(msgid) + (error or b"\xc0") + (result or b"\xc0")
    return body + _REPLAYED_META if replayed else body


def encode_error(
    msgid: int, code: int, message: str, data: Any = None, *, refused: bool = False
) -> bytes:
    """An error response in our shape: ``[1, msgid, [code, message, data], nil]``;
    ``refused`` adds ``{"refused": true}`` (only for the server's own refusals made
    before dispatch, never for a method's error)."""
    return encode_response(msgid, [int(code), message, data], None, refused=refused)


def _status_name(code: int) -> str:
    try:
        return Status(code).name
    except ValueError:
        return str(code)


def plain_error(code: int, message: str, data: Any = None) -> list[Any]:
    """Our error in Neovim's shape, for a plain peer: ``[type, "STATUS: message"]``.

    ``type`` is :data:`PEER_VALIDATION` for ``INVALID_ARGUMENT``, else
    :data:`PEER_EXCEPTION` (the only two Neovim reads); a type name in ``data`` leads
    the message (``[0, "UNKNOWN: ValueError: bad value"]``). Neovim shows the message,
    pynvim raises it (``err[1]``). Our client does not read a status back from this
    text (a peer's message could say anything): it gets ``[code, message, data]``
    instead, by the handshake.
    """
    name = data.get("type") if isinstance(data, dict) else None
    text = f"{name}: {message}" if isinstance(name, str) else message
    kind = PEER_VALIDATION if code == Status.INVALID_ARGUMENT else PEER_EXCEPTION
    return [kind, f"{_status_name(code)}: {text}"]


def encode_plain_error(msgid: int, code: int, message: str, data: Any = None) -> bytes:
    """An error response for a plain peer: ``[1, msgid, plain_error(...), nil]``."""
    return encode_response(msgid, plain_error(code, message, data), None)


def hello_result() -> dict[str, int]:
    """Our server's answer to the handshake (:data:`HELLO_METHOD`)."""
    return {"extension": EXTENSION_VERSION}


def speaks_extension(result: Any) -> bool:
    """Whether a handshake's result says the server speaks the extension."""
    if not isinstance(result, dict):
        return False
    version = result.get("extension")
    return type(version) is int and version >= 1


def encode_notification(method: str, params: list[Any] | tuple[Any, ...]) -> bytes:
    """``[2, method, params]``."""
    if not isinstance(method, str):
        raise LocalProtocolError(f"method must be a str, not {type(method).__name__}")
    return _pack([NOTIFICATION, method, list(params)])


def encode(msg: Message) -> bytes:
    """Any message object to bytes (the ``encode_*`` functions skip the object)."""
    if isinstance(msg, Request):
        return encode_request(msg.msgid, msg.method, msg.params, msg.meta)
    if isinstance(msg, Response):
        return encode_response(msg.msgid, msg.error, msg.result, msg.replayed, msg.refused)
    if isinstance(msg, Notification):
        return encode_notification(msg.method, msg.params)
    raise LocalProtocolError(f"not a message: {type(msg).__name__}")


# ------------------------------------------------------------------------ decoding


def _method(value: Any, what: str, msgid: int | None) -> str:
    if type(value) is str:
        return value
    if type(value) is bytes:
        # msgpack's old raw type: early msgpack-rpc peers send method names as raw.
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            raise RemoteProtocolError(f"{what} method is not UTF-8", msgid) from None
    raise RemoteProtocolError(f"{what} method must be a string, not {type(value).__name__}", msgid)


def _call_meta(value: Any, msgid: int) -> CallMeta | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise RemoteProtocolError(
            f"request metadata must be a map, not {type(value).__name__}", msgid
        )
    key = value.get("key")
    if key is not None:
        if type(key) is not str:
            raise RemoteProtocolError("request metadata 'key' must be a string", msgid)
        if len(key) > MAX_KEY_LENGTH:
            raise RemoteProtocolError(
                f"request metadata 'key' is {len(key)} characters, at most "
                f"{MAX_KEY_LENGTH} allowed",
                msgid,
            )
    caller = value.get("caller")
    if caller is not None:
        if type(caller) is not str:
            raise RemoteProtocolError("request metadata 'caller' must be a string", msgid)
        # An ASCII caller's length is its UTF-8 length: no encoding to count it.
        if (len(caller) if caller.isascii() else len(caller.encode("utf-8"))) > MAX_CALLER_LENGTH:
            raise RemoteProtocolError(
                f"request metadata 'caller' is longer than {MAX_CALLER_LENGTH} bytes", msgid
            )
    timeout = value.get("timeout")
    if timeout is not None and (type(timeout) is not int or timeout < 0):
        raise RemoteProtocolError(
            "request metadata 'timeout' must be a non-negative integer (milliseconds)", msgid
        )
    attempt = value.get("attempt", 1)
    if type(attempt) is not int or not 1 <= attempt <= MAX_MSGID:
        raise RemoteProtocolError("request metadata 'attempt' must be a positive integer", msgid)
    return CallMeta(key, caller, timeout, attempt)


def parse(obj: Any) -> Message:
    """Check a decoded msgpack object's shape and make the message it is.

    Raises :class:`RemoteProtocolError` saying what is wrong (with ``msgid`` when a
    request's id could be read).
    """
    if type(obj) is not list:
        raise RemoteProtocolError(f"message must be an array, not {type(obj).__name__}")
    n = len(obj)
    if n == 0:
        raise RemoteProtocolError("message is an empty array")
    kind = obj[0]
    if kind == REQUEST and type(kind) is int:
        if n not in (4, 5):
            raise RemoteProtocolError(f"request has {n} elements, expected 4 or 5")
        msgid = obj[1]
        if type(msgid) is not int or not 0 <= msgid <= MAX_MSGID:
            raise RemoteProtocolError(f"request msgid must be a uint32, not {msgid!r}"[:200])
        method = obj[2]
        if type(method) is not str:
            method = _method(method, "request", msgid)
        params = obj[3]
        if type(params) is not list:
            raise RemoteProtocolError(
                f"request params must be an array, not {type(params).__name__}", msgid
            )
        meta = _call_meta(obj[4], msgid) if n == 5 else None
        return Request(msgid, method, params, meta)
    if kind == RESPONSE and type(kind) is int:
        if n not in (4, 5):
            raise RemoteProtocolError(f"response has {n} elements, expected 4 or 5")
        msgid = obj[1]
        if type(msgid) is not int or not 0 <= msgid <= MAX_MSGID:
            raise RemoteProtocolError(f"response msgid must be a uint32, not {msgid!r}"[:200])
        replayed = refused = False
        if n == 5:
            rmeta = obj[4]
            if rmeta is not None:
                if not isinstance(rmeta, dict):
                    raise RemoteProtocolError(
                        f"response metadata must be a map, not {type(rmeta).__name__}"
                    )
                replayed = rmeta.get("replayed", False)
                if type(replayed) is not bool:
                    raise RemoteProtocolError("response metadata 'replayed' must be a boolean")
                refused = rmeta.get("refused", False)
                if type(refused) is not bool:
                    raise RemoteProtocolError("response metadata 'refused' must be a boolean")
        return Response(msgid, obj[2], obj[3], replayed, refused)
    if kind == NOTIFICATION and type(kind) is int:
        if n != 3:
            raise RemoteProtocolError(f"notification has {n} elements, expected 3")
        method = _method(obj[1], "notification", None)
        params = obj[2]
        if type(params) is not list:
            raise RemoteProtocolError(
                f"notification params must be an array, not {type(params).__name__}"
            )
        return Notification(method, params)
    raise RemoteProtocolError(f"unknown message type {kind!r}"[:200])


# parse()'s common answer in one C call, where idempotency's accelerator is built: a
# well-formed request's Request (with its CallMeta), or None for everything else, which
# parse() then reads and, when it is wrong, says why (parse stays the reference).
parse_request: Callable[[Any], Request | None] | None = None
if _speedups is not None:
    _speedups.configure_rpc(
        request=Request,
        call_meta=CallMeta,
        max_key_length=MAX_KEY_LENGTH,
        max_caller_length=MAX_CALLER_LENGTH,
        max_msgid=MAX_MSGID,
    )
    parse_request = _speedups.parse_request


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bytes):  # msgpack's old raw type
        return value.decode("utf-8", "replace")
    return repr(value)


def parse_error(error: Any, ours: bool = True) -> ErrorInfo:
    """Read an error response's ``error`` element, whatever its shape; never fails.

    ``ours`` says the peer speaks the extension (the framed transport, or a plain-stream
    server that answered the handshake). Then ``[code, message, data]`` with an integer
    code is ours and keeps its parts, and so is ``[code, message]``: an error recorded by
    Redis's Lua encoder, which drops a trailing nil, is replayed in that shape. Every
    other shape, and every shape from a peer that is not ours, is ``UNKNOWN``:
    ``[type, message(, ...)]`` (Neovim's, whose ``type`` is 0 or 1 and no status) keeps
    ``type`` as ``peer_type`` and ``message`` (further elements, if any, as ``data``);
    a string is the message; anything else is kept whole in ``data``.
    """
    if isinstance(error, list) and len(error) >= 2 and type(error[0]) is int:
        if ours and len(error) <= 3:
            return ErrorInfo(error[0], _text(error[1]), error[2] if len(error) == 3 else None)
        rest = error[2:]
        data = None if not rest else rest[0] if len(rest) == 1 else rest
        return ErrorInfo(Status.UNKNOWN, _text(error[1]), data, error[0])
    if isinstance(error, str | bytes):
        return ErrorInfo(Status.UNKNOWN, _text(error), None)
    return ErrorInfo(Status.UNKNOWN, "error response of an unknown shape", error)


_unpackb = msgpack.unpackb


def decode(data: bytes | bytearray | memoryview, limits: Limits = DEFAULT_LIMITS) -> Message:
    """One message from one frame's payload (the framed transport).

    The payload must hold exactly one msgpack object. A failure loses only this frame:
    the frame boundaries are the transport's, so the next frame decodes on its own.
    """
    if len(data) > limits.max_message_size:
        raise MessageTooLarge(
            f"message of {len(data)} bytes, at most {limits.max_message_size} allowed"
        )
    try:
        if len(data) <= limits.bare_max:
            obj = _unpackb(data)  # the defaults: raw=False, strict_map_key=True, lists
        else:
            obj = msgpack.unpackb(data, **limits.unpack_options())
    except msgpack.ExtraData:
        raise RemoteProtocolError("frame holds more than one msgpack object") from None
    except (ValueError, msgpack.UnpackException) as exc:
        raise RemoteProtocolError(f"undecodable msgpack: {exc}") from None
    return parse(obj)


def new_cutter(limits: Limits) -> Any:
    """A :data:`MsgpackCutter` bounded as ``limits`` and msgpack's unpacker bound a
    message (its stack depth too)."""
    return MsgpackCutter(
        limits.max_message_size,
        limits.max_str_len,
        limits.max_bin_len,
        limits.max_array_len,
        limits.max_map_len,
        limits.max_ext_len,
        MAX_DEPTH,
    )


class StreamDecoder:
    """Messages from a plain msgpack stream (no framing), for msgpack-rpc peers.

    ``feed(bytes)`` buffers, ``next_message()`` returns a message or
    :data:`~netframe.NEED_DATA`; iterating yields messages until more data is needed.
    The stream is cut into messages by a :data:`MsgpackCutter` before anything is
    decoded. At most ``limits.max_message_size`` bytes are buffered waiting for one
    message: a longer message raises :class:`MessageTooLarge` once that much has
    arrived, not after it has all been read. A str, bin, ext, array or map whose header
    announces more than its limit, containers nested deeper than msgpack's unpacker
    takes, or a byte that is not msgpack raise as soon as that byte has arrived. These
    lose the stream: they raise with ``stream_lost`` set, and asking again raises the
    same error. A message cut whole that does not decode, or is not a valid message,
    raises a :class:`RemoteProtocolError` and is consumed (the stream goes on: its
    boundaries are known).
    """

    def __init__(self, limits: Limits = DEFAULT_LIMITS) -> None:
        self.limits = limits
        self._cutter = new_cutter(limits)
        self._ready: deque[bytes] = deque()  # messages cut, not yet returned
        self._failed: RemoteProtocolError | None = None
        #: The bytes of the message last returned (or refused).
        self.last_size = 0

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        """Buffer bytes received; never raises a protocol error."""
        if data:
            self._ready.extend(self._cutter.feed(data))

    @property
    def buffered(self) -> int:
        """Bytes received and not yet returned as messages."""
        return int(self._cutter.buffered) + sum(map(len, self._ready))

    def next_message(self) -> Message | NeedData:
        """The next message, or NEED_DATA; see the class docstring for errors."""
        if self._ready:
            payload = self._ready.popleft()
            self.last_size = len(payload)
            return decode(payload, self.limits)
        if self._failed is not None:
            raise self._failed
        error = self._cutter.error
        if error is None:
            return NEED_DATA
        cls = MessageTooLarge if self._cutter.too_large else RemoteProtocolError
        self._failed = cls(error, stream_lost=True)
        raise self._failed

    def __iter__(self) -> Iterator[Message]:
        while True:
            msg = self.next_message()
            if msg is NEED_DATA:
                return
            yield msg
