"""Framing errors: who broke the protocol, and what to do about it.

The taxonomy follows h11's: a :class:`LocalFrameError` means *this* side asked for
something the frame format cannot express (fix the caller); a :class:`RemoteFrameError`
means the bytes received are not a valid stream in the format (the peer is broken or
hostile: close the connection, framing cannot be recovered). Both are
:class:`FrameError`, which is a :class:`ValueError`, so code that already treats bad
input as ``ValueError`` keeps working.

Connection errors (closed, broken, busy) are not framing errors and do not live here.
"""

from __future__ import annotations

__all__ = [
    "FrameError",
    "FrameTooLarge",
    "LocalFrameError",
    "PayloadTooLarge",
    "RemoteFrameError",
]


class FrameError(ValueError):
    """Base class of every framing error raised by :mod:`netframe`'s codec.

    Never raised itself: catch it to handle both directions at once.
    """


class LocalFrameError(FrameError):
    """Raised by the encoder when *we* asked for a frame the format cannot carry.

    Examples: a payload shorter than the format's negative ``length_adjustment`` allows,
    or a ``preamble`` of the wrong size. Nothing was produced, the encoder keeps no
    state, and the bytes already sent are still a valid stream: fix the call (or the
    :class:`~netframe.FrameFormat`) and go on.
    """


class RemoteFrameError(FrameError):
    """Raised by the decoder when the received bytes are not a valid frame stream.

    Examples: a uvarint prefix longer than 10 bytes, a length that leaves the frame
    shorter than its own header, an announced length above the maximum
    (:class:`FrameTooLarge`). Every frame before the bad header has been delivered; the
    decoder's state is left as it was before the call, so asking again raises the same
    error. Framing is lost from here on: close the connection (a protocol that has
    error replies may send one first).
    """


class FrameTooLarge(RemoteFrameError):
    """Raised by the decoder when a header announces a frame above ``max_frame_length``.

    Raised from the header alone, before any of the announced payload is waited for or
    reserved, so a peer cannot make the decoder buffer or allocate the frame it
    announces. ``announced`` is the frame length the header claims (bytes after the
    length field, which can exceed ``2**63`` for an 8-byte prefix); ``allowed`` is the
    format's ``max_frame_length``. Close the connection, or raise the limit if the peer
    is trusted and the frame legitimate.
    """

    def __init__(self, announced: int, allowed: int) -> None:
        super().__init__(f"frame of {announced} bytes announced, at most {allowed} allowed")
        self.announced = announced
        self.allowed = allowed

    def __reduce__(self) -> tuple[type[FrameTooLarge], tuple[int, int]]:
        return (type(self), (self.announced, self.allowed))


class PayloadTooLarge(LocalFrameError):
    """Raised by the encoder when a payload is longer than the format can send.

    ``length`` is the payload's size; ``allowed`` is the largest payload the format
    accepts: ``max_frame_length``, or less when the length field is too narrow to
    express more (255 bytes with a 1-byte prefix and no adjustment). Nothing was
    encoded: split the payload, or send it with a wider format both sides agree on.
    """

    def __init__(self, length: int, allowed: int) -> None:
        super().__init__(f"payload of {length} bytes, at most {allowed} allowed")
        self.length = length
        self.allowed = allowed

    def __reduce__(self) -> tuple[type[PayloadTooLarge], tuple[int, int]]:
        return (type(self), (self.length, self.allowed))
