"""Outcomes: what a key's execution answered, encoded once and replayed byte for byte.

Pure (no trio, no gosim). A completed record holds ``ok`` and ``payload``: the msgpack
encoding of the handler's return value when ``ok``, or of ``[code, message, data]`` for
a final :class:`ApplicationError`. The first call and every replay hand out the same
bytes, and ``Outcome.value`` decodes them the same way each time, so a caller cannot tell
a replay from the first call by the value (``replayed`` tells it). Encoding once also
lets the RPC layer put ``payload`` on the wire without encoding again.
"""

from __future__ import annotations

from typing import Any, Final

import msgpack

from ._errors import ApplicationError, InvalidResult

__all__ = [
    "DEFAULT_MAX_RESULT_BYTES",
    "UNRECORDED_RESULT",
    "Outcome",
    "decode_error",
    "encode_error",
    "encode_result",
    "encode_unrecorded",
]

DEFAULT_MAX_RESULT_BYTES: Final = 1 << 20
# The code of the final error recorded for an effect that was applied (and cannot be
# undone) but whose result cannot be recorded: 13 is INTERNAL, the status the RPC layer
# answers InvalidResult with, so a caller sees the same status either way.
UNRECORDED_RESULT: Final = 13

_packb = msgpack.Packer(use_bin_type=True, autoreset=True).pack
_NOT_DECODED: Final[Any] = object()


def _unpackb(payload: bytes) -> Any:
    return msgpack.unpackb(payload, raw=False, strict_map_key=False)


def encode_result(value: Any, max_bytes: int = DEFAULT_MAX_RESULT_BYTES) -> bytes:
    """The payload of a return value; :class:`InvalidResult` when it cannot be recorded."""
    try:
        payload: bytes = _packb(value)
    except (TypeError, ValueError, OverflowError) as exc:
        raise InvalidResult(f"result is not msgpack-serialisable: {exc}") from exc
    if len(payload) > max_bytes:
        raise InvalidResult(f"result encodes to {len(payload)} bytes; the limit is {max_bytes}")
    return payload


def encode_error(err: ApplicationError, max_bytes: int = DEFAULT_MAX_RESULT_BYTES) -> bytes:
    """The payload of a final application error, ``[code, message, data]``."""
    return encode_result([err.code, err.message, err.data], max_bytes)


def encode_unrecorded(why: str) -> bytes:
    """The payload of the final error recorded in place of an applied effect's result
    that cannot be recorded (``why`` says why; the payload is small, whatever the limit):
    the key is completed with it, so a retry replays it instead of applying the effect
    again."""
    message = f"the effect was applied but its result cannot be recorded: {why}"
    payload: bytes = _packb([UNRECORDED_RESULT, message[:512], None])
    return payload


def decode_error(payload: bytes) -> ApplicationError:
    """The :class:`ApplicationError` a stored error payload describes, marked replayable."""
    # Two items when the data is nil: a Lua array (a LuaEffect's refusal) ends there.
    code, message, data = [*_unpackb(payload), None][:3]
    return ApplicationError(code, message, data)


class Outcome:
    """The outcome of ``Idempotency.run``: a recorded value or final error.

    ``replayed`` is True when the stored outcome was returned without running the handler.
    ``payload`` is the recorded msgpack bytes, identical for the first call and every
    replay. ``value`` decodes the value (or raises the recorded :class:`ApplicationError`);
    ``fence`` is the fencing token of the execution that recorded it.
    """

    __slots__ = ("_value", "fence", "ok", "payload", "replayed")

    def __init__(self, ok: bool, payload: bytes, replayed: bool, fence: int) -> None:
        self.ok = ok
        self.payload = payload
        self.replayed = replayed
        self.fence = fence
        self._value: Any = _NOT_DECODED

    @property
    def value(self) -> Any:
        """The recorded return value; raises the recorded error when ``ok`` is False."""
        if not self.ok:
            raise self.error  # type: ignore[misc]
        if self._value is _NOT_DECODED:
            self._value = _unpackb(self.payload)
        return self._value

    @property
    def error(self) -> ApplicationError | None:
        """The recorded final error (a new instance each time), or None for a value."""
        if self.ok:
            return None
        err = decode_error(self.payload)
        err.replayed = self.replayed
        return err

    def __repr__(self) -> str:
        kind = "value" if self.ok else "error"
        size = len(self.payload)
        return f"<Outcome {kind} {size} bytes replayed={self.replayed} fence={self.fence}>"
