"""Length-prefixed framing, sans-IO: bytes in, frames out; payloads in, bytes out.

This module does no I/O and imports neither trio nor gosim (h11's rule): a caller reads
bytes from anywhere, :meth:`FrameDecoder.feed`\\ s them, and pulls frames with
:meth:`FrameDecoder.next_frame` (a frame, or the sentinel :data:`NEED_DATA`) or by
iterating; :meth:`FrameFormat.encode` turns payloads into bytes to write.

Glossary (Netty's ``LengthFieldBasedFrameDecoder`` names in brackets)
--------------------------------------------------------------------
frame
    ``preamble | length field | body``. The *preamble* is ``length_offset`` opaque bytes
    [lengthFieldOffset]; the *length field* is 1, 2, 4 or 8 bytes in either byte order,
    or a uvarint (Go's ``encoding/binary`` base-128, at most 10 bytes)
    [lengthFieldLength]; the *header* is preamble plus length field.
body length
    ``value of the length field + length_adjustment`` [lengthAdjustment], minus the
    header's size when ``length_includes_header`` (the length counts the header too).
    ``max_frame_length`` bounds the body length [maxFrameLength, which Netty applies to
    the whole frame].
returned bytes
    The frame without its first ``strip`` bytes [initialBytesToStrip]. ``strip=None``
    (the default) strips the whole header, so the decoder returns exactly the payload
    that :meth:`FrameFormat.encode` was given.

How a frame is decoded, fast to slow
------------------------------------
1. Frames already cut are handed out from a deque: one ``popleft``.
2. Otherwise, if the bytes buffered are fewer than the next frame is known to need
   (``_need``, set when a header was read but its body had not arrived), answer
   ``NEED_DATA`` at once: waiting for a large body fed a byte at a time costs O(1) per
   call, not a rescan.
3. Otherwise, with the C extension (``netframe._speedups``, the default where it is
   built), one C call walks the prefixes and cuts every complete frame of the batch
   (``cut_frames``, the twin of :meth:`FrameFormat.scan` plus the slicing; faster
   than the loop and the kernel at every frame count measured). :meth:`FrameDecoder.decode`
   hands a fresh receive straight to it when nothing is buffered.
   Without it: scan the buffer in place (no copy) with the Python loop for up to
   :data:`KERNEL_MIN_FRAMES` frames. If it stopped only because it reached that
   count, more frames are likely, and the numba kernel
   (:func:`netframe._kernels.scan_frames`) finds the rest of the boundaries in one call
   (once it is compiled; it is never compiled on the decoding path, see ``_kernels``).
   Each frame is then cut with one slice of an immutable ``bytes`` buffer (see
   ``_buffer``) and the consumed bytes are committed at once.
4. A header that is invalid stops the scan; the frames before it are delivered, and
   when the bad header is next, it is re-read by the Python code, which raises the
   :class:`RemoteFrameError` (the one place messages are written).

Errors leave the decoder unchanged
----------------------------------
A :class:`FrameError` from :meth:`FrameDecoder.next_frame` or iteration consumes
nothing: the decoder's state (buffered bytes, ready frames, counters) is exactly what
it was before the call, and asking again raises the same error again. The decoder is
not "poisoned" by a flag; it is stuck on the bad header because that is where the
stream is. :meth:`FrameDecoder.feed` never raises a FrameError: it only buffers.

Limits before buffering
-----------------------
The body length is checked against ``max_frame_length`` as soon as the header is
complete, from the header alone: the decoder never reserves space for an announced
body and never waits for it, so a 2 GiB announcement costs nothing but its header. The
bytes buffered are only those the caller fed (a caller that feeds what one ``recv``
returned and then drains the frames buffers at most one ``recv`` past a bad header).

Alternatives rejected
---------------------
* ``bytearray`` + ``struct.unpack_from`` + ``del buf[:n]`` per frame, the usual loop:
  one ``bytearray`` slice plus a ``bytes`` copy and a buffer shift per frame; it is the
  baseline in ``benchmarks/bench_codec.py``.
* Returning ``memoryview`` frames (zero copy): a live view of a ``bytearray`` forbids
  growing it (``BufferError``) and pins the whole receive buffer for as long as any
  one frame lives. A frame is an independent ``bytes``.
* Calling the kernel for every refill: a numba call plus two array conversions cost
  more than the Python loop for a few frames (measured crossover: see
  :data:`KERNEL_MIN_FRAMES`), and with ``NUMBA_DISABLE_JIT=1`` it runs interpreted.
"""

from __future__ import annotations

import enum
import importlib
import struct
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Final, Literal

from . import _accel
from ._buffer import OffsetBuffer
from ._exceptions import (
    FrameTooLarge,
    LocalFrameError,
    PayloadTooLarge,
    RemoteFrameError,
)

__all__ = [
    "DEFAULT_MAX_FRAME_LENGTH",
    "KERNEL_MIN_FRAMES",
    "NEED_DATA",
    "DecoderStatistics",
    "FrameDecoder",
    "FrameFormat",
    "NeedData",
]

#: The default ``max_frame_length``: 16 MiB, large enough for any ordinary message and
#: small enough that a hostile peer cannot make one connection hold much memory.
DEFAULT_MAX_FRAME_LENGTH: Final = 16 * 1024 * 1024

#: The crossover between the Python loop and the numba kernel, in frames. Measured on
#: this project's 2-core machine with 64-byte frames (``pytest
#: benchmarks/bench_codec.py -k scan``, reproduced in the module's report): the Python
#: loop costs about 0.15 µs a frame; one kernel call about 1.2 µs fixed (dispatch, array
#: view, two ``tolist``) plus 0.02 µs a frame; they are equal at 8 frames (1.48 vs
#: 1.41 µs) and the kernel is 1.7x faster at 16, 3.4x at 64, 6x at 4096. So the Python
#: loop scans the first 8 frames of a refill, and the kernel takes the rest only when
#: the bytes left, at the average frame size seen so far, hold at least 8 more frames.
#: Buffers holding few frames (large frames, interactive traffic) never pay for it.
KERNEL_MIN_FRAMES: Final = 8

#: Frames cut per refill at most: sizes the kernel's output arrays.
_BATCH_FRAMES: Final = 4096

#: No frame that starts this many bytes past the first one is cut in the same refill.
#: Cutting a whole 16 MiB buffer of 64 KiB frames at once made decoding 1.5x slower
#: than the struct loop (every frame in fresh, cold memory before the first is used);
#: in batches of about this size the frames are used and freed while the allocator's
#: memory is still warm. 64-byte frames still fill the 4096-frame batch.
_BATCH_BYTES: Final = 256 * 1024

_SCAN_PYTHON: Final = 0
_SCAN_NUMBA: Final = 1
_SCAN_KERNEL: Final = 2
_SCAN_C: Final = 3
_SCAN_MODES: Final = {
    "python": _SCAN_PYTHON,
    "numba": _SCAN_NUMBA,
    "kernel": _SCAN_KERNEL,
    "c": _SCAN_C,
    "auto": -1,  # resolved in FrameDecoder.__init__
}

_UVARINT: Final = "uvarint"
_STRUCT_CODES: Final = {1: "B", 2: "H", 4: "I", 8: "Q"}
# Parameter bounds that keep every valid length below the kernel's LENGTH_CUTOFF.
_MAX_OFFSET: Final = 0xFFFF
_MAX_ADJUSTMENT: Final = 1 << 40
_MAX_STRIP: Final = 1 << 40
_MAX_MAX_FRAME_LENGTH: Final = 1 << 60
_UVARINT_MAX_BYTES: Final = 10


class NeedData(enum.Enum):
    """The type of :data:`NEED_DATA` (an enum so type checkers narrow on ``is``)."""

    NEED_DATA = "NEED_DATA"

    def __repr__(self) -> str:
        return "NEED_DATA"

    __str__ = __repr__


#: Returned by :meth:`FrameDecoder.next_frame` when no complete frame is buffered:
#: feed more bytes and ask again.
NEED_DATA: Final = NeedData.NEED_DATA

# The optional C twins of the per-frame loops (the sans-IO part of ``_speedups``, loaded
# by ``_accel``): ``cut_frames`` is FrameFormat.scan plus the slicing, ``encode_fixed``
# is encode_many for fixed-width formats. None when not built, or when
# GOSIM_PURE_PYTHON=1 asks for the reference code.
_speedups: Any = _accel.speedups

#: True when the C loops are in use (``scan="auto"`` then means the C loop).
C_ENABLED: Final = _accel.C_ENABLED

#: Why a scan stopped (the Python loop's and the numba kernel's common answer).
STOP_FULL: Final = 0  #: the output is full, or ``stop_at`` reached; more may follow
STOP_NEED_DATA: Final = 1  #: the frame at ``pos`` is incomplete
STOP_INVALID: Final = 2  #: the header at ``pos`` is invalid; re-read it for the error
_STOP_FULL: Final = STOP_FULL
_STOP_NEED_DATA: Final = STOP_NEED_DATA
_STOP_INVALID: Final = STOP_INVALID

# The numba kernel's module, imported on first need only: it brings numpy and numba
# (70 MB, about a second), which a process on the C loops never uses. Loading it is
# never on a decoding path: a "numba" decoder starts it in a background thread and
# decodes with the Python loop until it is READY (see netframe._kernels).
_kernels: ModuleType | None = None
_kernels_lock = threading.Lock()
_loader: threading.Thread | None = None


def _kernels_module() -> ModuleType:
    global _kernels
    if _kernels is None:
        with _kernels_lock:
            if _kernels is None:
                _kernels = importlib.import_module("netframe._kernels")
    return _kernels


def load_kernel() -> None:
    """Import and compile the numba frame scan now, blocking (once per process).

    Takes 0.3 s to a few seconds the first time (from numba's disk cache when it is
    there). A server on the pure-Python path that wants the kernel from its first
    request calls this before it accepts connections; with the C extension in use no
    decoder needs it unless asked for ``scan="numba"`` or ``"kernel"``. Safe from any
    thread, any number of times. Under ``NUMBA_DISABLE_JIT=1`` it imports the kernel
    module and compiles nothing.
    """
    kernels = _kernels_module()
    if kernels.JIT_ENABLED:
        kernels.load()


def _load_kernel_in_background() -> None:
    """Start :func:`load_kernel` in a thread unless it was started; return at once.

    The thread is not a daemon: an interpreter that exits meanwhile waits for the
    compilation to finish rather than killing it inside LLVM.
    """
    global _loader
    with _kernels_lock:  # once per decoder, not per frame: no need to check outside it
        if _loader is None:
            _loader = threading.Thread(target=load_kernel, name="netframe-kernel-load")
            _loader.start()


def _uvarint(value: int) -> bytes:
    """Go's ``binary.PutUvarint``: 7 bits a byte, least significant first."""
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _uvarint_size(value: int) -> int:
    return max(1, (value.bit_length() + 6) // 7)


def _nbytes(payload: bytes | bytearray | memoryview) -> int:
    return payload.nbytes if type(payload) is memoryview else len(payload)


@dataclass(frozen=True, slots=True)
class FrameFormat:
    """How frames are laid out on the wire; immutable and hashable.

    ``length_size``
        1, 2, 4 or 8 (an unsigned integer field) or ``"uvarint"``.
    ``byteorder``
        ``"big"`` (network order, the default) or ``"little"``; ignored for uvarint.
    ``length_offset``
        Bytes before the length field (0 to 65535), opaque to the codec.
    ``length_adjustment``
        Added to the field's value to get the body length (within +-2**40).
    ``length_includes_header``
        The field's value counts the header (preamble and length field) too.
    ``strip``
        Bytes cut from the frame's start before it is returned; ``None`` strips the
        header, so decoding returns what :meth:`encode` was given.
    ``max_frame_length``
        The largest body length accepted (decode) or produced (encode), at most 2**60.
        Default :data:`DEFAULT_MAX_FRAME_LENGTH` (16 MiB).

    Raises ValueError (or TypeError for a wrong type) when a parameter is out of range.
    """

    length_size: int | Literal["uvarint"] = 4
    byteorder: Literal["big", "little"] = "big"
    length_offset: int = 0
    length_adjustment: int = 0
    length_includes_header: bool = False
    strip: int | None = None
    max_frame_length: int = DEFAULT_MAX_FRAME_LENGTH

    # Derived once in __post_init__ (the hot paths read these, not the fields above).
    _fixed_header: int = field(init=False, repr=False, compare=False)
    _fixed_adjust: int = field(init=False, repr=False, compare=False)
    _min_payload: int = field(init=False, repr=False, compare=False)
    _max_payload: int = field(init=False, repr=False, compare=False)
    # The C encoder's parameters for a fixed-width format (encode_fixed, FrameWriter):
    # width, big-endian, adjustment, smallest and largest payload, zero preamble.
    _encode_params: tuple[int, bool, int, int, int, int] = field(
        init=False, repr=False, compare=False
    )
    _unpack: Callable[[bytes | bytearray, int], tuple[int]] = field(
        init=False, repr=False, compare=False
    )
    _pack: Callable[[int], bytes] = field(init=False, repr=False, compare=False)
    _zero_preamble: bytes = field(init=False, repr=False, compare=False)
    # The format as the C and numba scanners take it: width (0 = uvarint), big endian,
    # offset, adjustment, includes header, strip (-1 = the header), max body.
    _scan_params: tuple[int, bool, int, int, bool, int, int] = field(
        init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        size = self.length_size
        if size != _UVARINT and (type(size) is not int or size not in _STRUCT_CODES):
            raise ValueError(f"length_size must be 1, 2, 4, 8 or 'uvarint', not {size!r}")
        if self.byteorder not in ("big", "little"):
            raise ValueError(f"byteorder must be 'big' or 'little', not {self.byteorder!r}")
        _check_int("length_offset", self.length_offset, 0, _MAX_OFFSET)
        _check_int("length_adjustment", self.length_adjustment, -_MAX_ADJUSTMENT, _MAX_ADJUSTMENT)
        _check_int("max_frame_length", self.max_frame_length, 0, _MAX_MAX_FRAME_LENGTH)
        if self.strip is not None:
            _check_int("strip", self.strip, 0, _MAX_STRIP)
        if type(self.length_includes_header) is not bool:
            raise TypeError("length_includes_header must be a bool")

        setattr_ = object.__setattr__
        setattr_(self, "_zero_preamble", bytes(self.length_offset))
        if type(size) is int:
            header = self.length_offset + size
            adjust = self.length_adjustment - (header if self.length_includes_header else 0)
            code = (">" if self.byteorder == "big" else "<") + _STRUCT_CODES[size]
            packer = struct.Struct(code)
            field_max = (1 << (8 * size)) - 1
            setattr_(self, "_unpack", packer.unpack_from)
            setattr_(self, "_pack", packer.pack)
            # body = value + adjust with 0 <= value <= field_max.
            max_payload = min(self.max_frame_length, field_max + adjust)
            min_payload = max(0, adjust)
        else:
            header = -1  # varies with the uvarint's size
            adjust = 0
            max_payload = self.max_frame_length
            min_payload = 0  # checked per payload: it depends on the uvarint's size
        if self.strip is not None:
            min_payload = max(min_payload, self.strip - (header if header >= 0 else 0))
        setattr_(
            self,
            "_scan_params",
            (
                0 if size == _UVARINT else size,
                self.byteorder == "big",
                self.length_offset,
                self.length_adjustment,
                self.length_includes_header,
                -1 if self.strip is None else self.strip,
                self.max_frame_length,
            ),
        )
        setattr_(self, "_fixed_header", header)
        setattr_(self, "_fixed_adjust", adjust)
        setattr_(self, "_min_payload", min_payload)
        setattr_(self, "_max_payload", max_payload)
        setattr_(
            self,
            "_encode_params",
            (
                size if isinstance(size, int) else 0,
                self.byteorder == "big",
                adjust,
                min_payload,
                max_payload,
                self.length_offset,
            ),
        )

    # ------------------------------------------------------------------ encoding

    def encode(
        self, payload: bytes | bytearray | memoryview, *, preamble: bytes | None = None
    ) -> bytes:
        """Return the frame that carries ``payload``: ``preamble | length | payload``.

        ``preamble`` (``length_offset`` bytes, zeros by default) fills the bytes before
        the length field. Decoding the result with the same format returns
        ``(preamble + length field + payload)[strip:]``, which is ``payload`` when
        ``strip`` is None.

        Raises :class:`PayloadTooLarge` if the payload exceeds ``max_frame_length`` or
        what the length field can express, and :class:`LocalFrameError` if it is too
        short for a negative ``length_adjustment`` or a large ``strip``, or the preamble
        has the wrong size. Nothing is encoded then.
        """
        n = payload.nbytes if type(payload) is memoryview else len(payload)
        if preamble is None:
            preamble = self._zero_preamble
            if not preamble and self._fixed_header >= 0:  # the common case, fast
                if not self._min_payload <= n <= self._max_payload:
                    self._raise_payload_error(n)
                return self._pack(n - self._fixed_adjust) + payload
        elif len(preamble) != self.length_offset:
            raise LocalFrameError(
                f"preamble of {len(preamble)} bytes, the format has length_offset="
                f"{self.length_offset}"
            )
        if self._fixed_header >= 0:
            if not self._min_payload <= n <= self._max_payload:
                self._raise_payload_error(n)
            return b"".join((preamble, self._pack(n - self._fixed_adjust), payload))
        return b"".join((preamble, self._uvarint_field(n), payload))

    def header_for(self, payload: bytes | bytearray | memoryview) -> bytes:
        """The bytes that go before ``payload`` in its frame (zero preamble and length
        field): ``header_for(p) + p == encode(p)``. For writers that gather a header
        and a large payload into one system call without copying the payload.

        Raises what :meth:`encode` raises for ``payload``.
        """
        n = payload.nbytes if type(payload) is memoryview else len(payload)
        if self._fixed_header >= 0:
            if not self._min_payload <= n <= self._max_payload:
                self._raise_payload_error(n)
            field_ = self._pack(n - self._fixed_adjust)
        else:
            field_ = self._uvarint_field(n)
        return self._zero_preamble + field_ if self._zero_preamble else field_

    def check_payload(self, payload: bytes | bytearray | memoryview) -> None:
        """Raise what :meth:`encode` would raise for ``payload``, without encoding it."""
        n = payload.nbytes if type(payload) is memoryview else len(payload)
        if self._fixed_header >= 0:
            if not self._min_payload <= n <= self._max_payload:
                self._raise_payload_error(n)
        else:
            self._uvarint_field(n)

    def encode_many(self, payloads: Iterable[bytes | bytearray | memoryview]) -> bytes:
        """Return the frames for ``payloads``, concatenated in order (zero preambles).

        All or nothing: if one payload cannot be encoded (see :meth:`encode`), the
        error is raised and no bytes are returned.
        """
        items = payloads if type(payloads) is list else list(payloads)
        count = len(items)
        if not count:
            return b""
        if _speedups is not None and self._fixed_header >= 0:
            encoded: bytes | None = _speedups.encode_fixed(items, *self._encode_params)
            if encoded is not None:
                return encoded
            # A payload out of range (the code below raises the precise error) or not
            # bytes/bytearray (the code below handles any buffer).
        lengths = list(map(len, items))
        total = sum(lengths)
        preamble = self._zero_preamble
        if self._fixed_header >= 0:
            low = self._min_payload
            high = self._max_payload
            # The sum bounds every length: one cheap pass instead of max() in the
            # common case; an exact pass only when it cannot decide.
            if total > high or low > 0:
                for n in lengths:
                    if not low <= n <= high:
                        self._raise_payload_error(n)
            adjust = self._fixed_adjust
            fields = list(map(self._pack, lengths if not adjust else [n - adjust for n in lengths]))
            header_bytes = count * self._fixed_header
        else:
            fields = [self._uvarint_field(n) for n in lengths]
            header_bytes = count * self.length_offset + sum(map(len, fields))
        # Interleave with slice assignment: the per-frame work stays in C.
        step = 3 if preamble else 2
        parts: list[bytes | bytearray | memoryview] = [preamble] * (step * count)
        parts[step - 2 :: step] = fields
        parts[step - 1 :: step] = items
        out = b"".join(parts)
        if len(out) != header_bytes + total:
            # A memoryview whose items are wider than a byte: len() counted items, not
            # bytes. Rare; redo it frame by frame with the byte counts.
            return b"".join([self.encode(p) for p in items])
        return out

    def _uvarint_field(self, n: int) -> bytes:
        if n > self._max_payload:
            raise PayloadTooLarge(n, self._max_payload)
        value = n - self.length_adjustment
        size = 1
        if self.length_includes_header:
            # The field counts itself: find the size k with uvarint_size(value(k)) == k.
            # value(k) grows with k, so k only grows; it settles within 10 rounds.
            while True:
                total = value + self.length_offset + size
                need = _uvarint_size(total)
                if need <= size:
                    value = total
                    break
                size = need
        if value < 0:
            raise LocalFrameError(
                f"payload of {n} bytes is too short for length_adjustment={self.length_adjustment}"
            )
        encoded = _uvarint(value)
        if self.strip is not None and self.strip > self.length_offset + len(encoded) + n:
            raise LocalFrameError(
                f"payload of {n} bytes leaves the frame shorter than strip={self.strip}"
            )
        return encoded

    def _raise_payload_error(self, n: int) -> None:
        if n > self._max_payload:
            raise PayloadTooLarge(n, self._max_payload)
        raise LocalFrameError(
            f"payload of {n} bytes is too short for the format: at least "
            f"{self._min_payload} bytes (length_adjustment={self.length_adjustment}, "
            f"strip={self.strip})"
        )

    # ------------------------------------------------------------------ decoding

    def scan(
        self,
        data: bytes | bytearray,
        pos: int,
        end: int,
        capacity: int,
        bounds: list[int],
        *,
        stop_at: int = 1 << 62,
    ) -> tuple[int, int, int]:
        """The Python boundary loop: find up to ``capacity`` complete frames in
        ``data[pos:end]``, none starting at or after ``stop_at``, appending each one's
        returned-bytes start and end to ``bounds``. Return ``(pos, stop, need)``: where
        scanning stopped, why (``STOP_FULL`` when ``capacity`` or ``stop_at`` was
        reached, ``STOP_NEED_DATA``, ``STOP_INVALID``), and for NEED_DATA the number of
        bytes from ``pos`` the next frame needs at least.

        Must agree with :func:`netframe._kernels.scan_frames` frame for frame.
        """
        append = bounds.append
        count = 0
        max_body = self.max_frame_length
        header = self._fixed_header
        if header >= 0:
            unpack = self._unpack
            offset = self.length_offset
            adjust = self._fixed_adjust
            strip = header if self.strip is None else self.strip
            short_ok = strip <= header  # else each frame must hold `strip` bytes
            while count < capacity and pos < stop_at:
                if end - pos < header:
                    return pos, _STOP_NEED_DATA, header
                body = unpack(data, pos + offset)[0] + adjust
                if body > max_body or body < 0 or not (short_ok or strip <= header + body):
                    return pos, _STOP_INVALID, 0
                stop = pos + header + body
                if stop > end:
                    return pos, _STOP_NEED_DATA, header + body
                append(pos + strip)
                append(stop)
                pos = stop
                count += 1
            return pos, _STOP_FULL, 0
        offset = self.length_offset
        includes = self.length_includes_header
        adjustment = self.length_adjustment
        while count < capacity and pos < stop_at:
            parsed = _read_uvarint(data, pos + offset, end)
            if parsed is None:
                return pos, _STOP_NEED_DATA, min(end - pos + 1, offset + _UVARINT_MAX_BYTES)
            value, size = parsed
            if size < 0:
                return pos, _STOP_INVALID, 0
            header = offset + size
            body = value + adjustment - (header if includes else 0)
            strip = header if self.strip is None else self.strip
            if body > max_body or body < 0 or strip > header + body:
                return pos, _STOP_INVALID, 0
            stop = pos + header + body
            if stop > end:
                return pos, _STOP_NEED_DATA, header + body
            append(pos + strip)
            append(stop)
            pos = stop
            count += 1
        return pos, _STOP_FULL, 0

    def raise_header_error(self, data: bytes | bytearray, pos: int, end: int) -> None:
        """Raise the :class:`RemoteFrameError` for the invalid header at ``pos``.

        The single place decode errors are worded; both scanners defer to it.
        """
        offset = self.length_offset
        header = self._fixed_header
        if header >= 0:
            value = self._unpack(data, pos + offset)[0]
        else:
            parsed = _read_uvarint(data, pos + offset, end)
            if parsed is None:  # pragma: no cover - scanners only report complete headers
                raise AssertionError("raise_header_error: incomplete header")
            value, size = parsed
            if size == -1:
                raise RemoteFrameError("uvarint length prefix longer than 10 bytes")
            if size == -2:
                raise RemoteFrameError("uvarint length prefix overflows 64 bits")
            header = offset + size
        body = value + self.length_adjustment - (header if self.length_includes_header else 0)
        if body > self.max_frame_length:
            raise FrameTooLarge(body, self.max_frame_length)
        if body < 0:
            raise RemoteFrameError(f"length field {value} gives a body of {body} bytes (negative)")
        if self.strip is not None and self.strip > header + body:
            raise RemoteFrameError(
                f"frame of {header + body} bytes is shorter than strip={self.strip}"
            )
        raise AssertionError(  # pragma: no cover - the scanners must agree with this
            f"raise_header_error: header at {pos} is valid"
        )


def _check_int(name: str, value: object, low: int, high: int) -> None:
    if type(value) is not int:
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    if not low <= value <= high:
        raise ValueError(f"{name} must be in [{low}, {high}], not {value}")


def _read_uvarint(data: bytes | bytearray, pos: int, end: int) -> tuple[int, int] | None:
    """Read a uvarint at ``pos``: ``(value, size)``; ``None`` if incomplete before
    ``end``; size -1 if longer than 10 bytes, -2 if it overflows 64 bits (Go's
    ``binary.Uvarint`` rules)."""
    value = 0
    shift = 0
    for k in range(_UVARINT_MAX_BYTES):
        if pos + k >= end:
            return None
        byte = data[pos + k]
        if k == _UVARINT_MAX_BYTES - 1 and byte > 1:
            return (0, -1) if byte >= 0x80 else (0, -2)
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, k + 1
        shift += 7
    raise AssertionError("unreachable")  # pragma: no cover


@dataclass(frozen=True, slots=True)
class DecoderStatistics:
    """A snapshot of a :class:`FrameDecoder` (trio's ``statistics()`` shape)."""

    #: Frames cut from the stream so far (returned or ready to return).
    frames_decoded: int
    #: Frames cut and not yet returned.
    frames_ready: int
    #: Bytes fed and not yet cut into frames (a partial frame, or frames behind a
    #: bad header).
    bytes_buffered: int


class FrameDecoder:
    """Turns a byte stream into frames; sans-IO, one reader.

    ``feed(data)`` buffers bytes (it never raises a FrameError); ``next_frame()``
    returns the next complete frame as ``bytes`` or :data:`NEED_DATA`; iterating
    yields every complete frame buffered, then stops. Frames come out exactly as
    :meth:`FrameFormat.encode` produced them, whatever the split of the input.

    A :class:`RemoteFrameError` (:class:`FrameTooLarge` among them) is raised when the
    next frame's header is invalid, after every frame before it was returned; the
    decoder is left unchanged and raises it again if asked again (see the module
    docstring). ``scan`` picks the boundary scanner: ``"auto"`` (the default: ``"c"``
    where the C extension is in use, else ``"numba"`` where numba compiles, else
    ``"python"``), ``"c"`` (the C loop of ``netframe._speedups``; ValueError when it
    is not in use), ``"numba"`` (the Python loop, then the numba kernel for the rest
    of a buffer holding many frames, once the kernel is compiled: the first such
    decoder starts that compilation in a background thread and decodes with the
    loop meanwhile, see :func:`netframe.load_kernel`), ``"python"`` (the loop only) or
    ``"kernel"`` (the kernel only, compiled on first use if need be, even interpreted
    under ``NUMBA_DISABLE_JIT=1``; for tests and benchmarks).
    """

    __slots__ = (
        "_auto",
        "_buffer",
        "_ends",
        "_format",
        "_frames_decoded",
        "_mode",
        "_need",
        "_ready",
        "_starts",
    )

    # Invariant: _ready holds frames cut from the stream in order, all before the
    # bytes still in _buffer; the buffer has no uncommitted reads between calls.
    # Invariant: _need == 0, or the next frame needs at least _need unread bytes.

    def __init__(
        self,
        format: FrameFormat | None = None,
        *,
        scan: Literal["auto", "c", "numba", "python", "kernel"] = "auto",
    ) -> None:
        if scan not in _SCAN_MODES:
            raise ValueError(
                f"scan must be 'auto', 'c', 'numba', 'python' or 'kernel', not {scan!r}"
            )
        if scan == "c" and _speedups is None:
            raise ValueError("scan='c': the C extension netframe._speedups is not in use")
        self._format = FrameFormat() if format is None else format
        self._buffer = OffsetBuffer()
        self._ready: deque[bytes] = deque()
        self._need = 0
        self._frames_decoded = 0
        # "auto" without the C loops is "numba" that uses the kernel only once it is
        # compiled: under NUMBA_DISABLE_JIT=1 it never is, and the loop does all (the
        # interpreted kernel would be far slower than the loop).
        self._auto = scan == "auto"
        if scan == "auto":
            # C: faster than the loop and the kernel at every size measured.
            scan = "c" if _speedups is not None else "numba"
        if scan == "numba":
            # Imported and compiled off the hot path; the loop decodes until READY.
            _load_kernel_in_background()
        elif scan == "kernel":
            _kernels_module()
        self._mode = _SCAN_MODES[scan]
        self._starts: Any = None  # the kernel's output arrays (numpy int64)
        self._ends: Any = None

    @property
    def format(self) -> FrameFormat:
        """The frame format this decoder reads."""
        return self._format

    def __repr__(self) -> str:
        stats = self.statistics()
        return (
            f"<FrameDecoder ready={stats.frames_ready} buffered={stats.bytes_buffered}"
            f" {self._format!r}>"
        )

    @property
    def bytes_needed(self) -> int:
        """At least this many more bytes must be fed before the next frame can be cut
        (0 when unknown or when a frame may already be complete).

        Known once bytes of the next frame are buffered (its header's size while the
        header is incomplete, the whole frame's once the header has been read): a
        reader can then ask its connection for the rest of a large frame in one
        receive. 0 when nothing is buffered, whichever scanner cut the frames before.
        """
        return max(0, self._need - len(self._buffer)) if not self._ready else 0

    def take_partial_frame(self, minimum: int) -> tuple[bytes, int, int] | None:
        """Hand the caller the start of a large frame, to receive the rest in place.

        When the buffer holds only the start of one frame whose size is known (a
        fixed-size length field, header complete) and at least ``minimum`` bytes, the
        buffered bytes are taken out of the decoder and ``(prefix, skip, size)`` is
        returned: the frame's returned bytes are ``prefix[skip:]`` followed by the
        next ``size - (len(prefix) - skip)`` bytes of the stream. Otherwise ``None``
        and nothing changes. A caller that cannot finish the frame (end of stream, an
        error, a timeout) feeds ``prefix`` and what it received back, which restores
        the decoder exactly.
        """
        fmt = self._format
        need = self._need
        header = fmt._fixed_header
        buffered = len(self._buffer)
        if self._ready or header < 0 or need < minimum or not header <= buffered < need:
            return None
        skip = header if fmt.strip is None else fmt.strip
        if skip > buffered:
            return None
        prefix = self._buffer.consume_at_most(buffered)
        self._buffer.commit()
        self._need = 0
        return prefix, skip, need - skip

    def count_frame(self) -> None:
        """Count a frame finished by the caller after :meth:`take_partial_frame`."""
        self._frames_decoded += 1

    def is_empty(self) -> bool:
        """No frame ready and no byte buffered."""
        return not self._ready and not len(self._buffer)

    def statistics(self) -> DecoderStatistics:
        """Return a snapshot of the counters (see :class:`DecoderStatistics`)."""
        return DecoderStatistics(
            frames_decoded=self._frames_decoded,
            frames_ready=len(self._ready),
            bytes_buffered=len(self._buffer),
        )

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        """Buffer ``data`` (copied unless it is ``bytes``); never raises a FrameError."""
        self._buffer.feed(data)

    def decode(self, data: bytes | bytearray | memoryview = b"") -> list[bytes]:
        """Feed ``data``, then return every complete frame buffered (possibly none).

        The same frames as :meth:`feed` followed by iteration, in one call (with the
        C loops, a whole receive is cut without passing through the buffer). An
        invalid header is raised only when no frame comes before it: frames before
        it are returned, and the next call raises.
        """
        if not data and not self._ready and len(self._buffer) < max(self._need, 1):
            return []  # nothing fed, nothing that could make a frame (the common ask)
        frames: list[bytes] = []
        if (
            self._mode == _SCAN_C
            and type(data) is bytes
            and data
            and not self._ready
            and not len(self._buffer)
        ):
            end = len(data)
            stop_pos, stop, need = _speedups.cut_frames(
                data, 0, end, _BATCH_BYTES, _BATCH_FRAMES, *self._format._scan_params, frames
            )
            self._frames_decoded += len(frames)
            self._need = 0
            if stop_pos < end:
                self._buffer.feed(data[stop_pos:] if stop_pos else data)
            if stop == _STOP_NEED_DATA:
                # Nothing left over: the next header has not been read, so what it needs
                # is unknown (0), as after every other path that cut the buffer empty.
                self._need = need if stop_pos < end else 0
                return frames
            if stop == _STOP_INVALID and frames:
                return frames  # the bad header is raised by the next call
        else:
            self.feed(data)
        ready = self._ready
        try:
            while True:  # whole batches of cut frames at a time, not a yield per frame
                if ready:
                    frames.extend(ready)
                    ready.clear()
                if not self._refill():
                    break
        except RemoteFrameError:
            if not frames:  # else those frames are returned; the next call raises
                raise
        return frames

    def next_frame(self) -> bytes | NeedData:
        """Return the next complete frame, or :data:`NEED_DATA` if none is buffered.

        Raises :class:`RemoteFrameError` if the next frame's header is invalid, leaving
        the decoder unchanged.
        """
        ready = self._ready
        if ready or self._refill():
            return ready.popleft()
        return NEED_DATA

    def __iter__(self) -> Iterator[bytes]:
        """Yield every complete frame buffered, then stop (feed more to go on).

        Raises :class:`RemoteFrameError` where an invalid header is reached; frames not
        yet yielded stay in the decoder if the loop is left early.
        """
        ready = self._ready
        pop = ready.popleft
        while True:
            while ready:
                yield pop()
            if not self._refill():
                return

    def _refill(self) -> bool:
        """Cut the complete frames at the buffer's head into ``_ready``; return whether
        any were cut. Raises the header's error if the very next frame is invalid."""
        buffer = self._buffer
        if len(buffer) < self._need or not len(buffer):
            return False
        fmt = self._format
        data, pos = buffer.peek()
        end = len(data)
        if self._mode == _SCAN_C:
            return self._refill_c(data, pos, end)
        bounds: list[int] = []
        kernel_starts: list[int] = []
        kernel_ends: list[int] = []
        mode = self._mode
        stop_at = pos + _BATCH_BYTES
        if mode == _SCAN_KERNEL:
            stop_pos, stop = self._scan_kernel(
                data, pos, end, stop_at=stop_at, starts_out=kernel_starts, ends_out=kernel_ends
            )
            need = 0
        elif mode == _SCAN_PYTHON:
            stop_pos, stop, need = fmt.scan(data, pos, end, _BATCH_FRAMES, bounds, stop_at=stop_at)
        else:
            stop_pos, stop, need = fmt.scan(
                data, pos, end, KERNEL_MIN_FRAMES, bounds, stop_at=stop_at
            )
            kernels = _kernels
            if (
                stop == _STOP_FULL
                and stop_pos < stop_at
                and kernels is not None
                and kernels.READY
                and (kernels.JIT_ENABLED or not self._auto)
            ):
                # KERNEL_MIN_FRAMES were scanned. At their average size, do the bytes
                # left in this batch hold as many again? Then the kernel is faster.
                if min(end, stop_at) - stop_pos >= stop_pos - pos:
                    stop_pos, stop = self._scan_kernel(
                        data,
                        stop_pos,
                        end,
                        stop_at=stop_at,
                        starts_out=kernel_starts,
                        ends_out=kernel_ends,
                    )
                    need = 0
                else:
                    stop_pos, stop, need = fmt.scan(
                        data, stop_pos, end, _BATCH_FRAMES, bounds, stop_at=stop_at
                    )
        if not bounds and not kernel_starts:
            if stop == _STOP_INVALID:
                fmt.raise_header_error(data, pos, end)
            self._need = need
            return False
        ready = self._ready
        if type(data) is bytes:
            it = iter(bounds)
            ready.extend([data[a:b] for a, b in zip(it, it, strict=True)])
            if kernel_starts:
                ready.extend([data[a:b] for a, b in zip(kernel_starts, kernel_ends, strict=True)])
        else:
            with memoryview(data) as view:
                it = iter(bounds)
                ready.extend([bytes(view[a:b]) for a, b in zip(it, it, strict=True)])
                if kernel_starts:
                    ready.extend(
                        [bytes(view[a:b]) for a, b in zip(kernel_starts, kernel_ends, strict=True)]
                    )
        self._frames_decoded += len(bounds) // 2 + len(kernel_starts)
        self._need = 0
        buffer.skip(stop_pos - pos)
        buffer.commit()
        return True

    def _refill_c(self, data: bytes | bytearray, pos: int, end: int) -> bool:
        """``_refill`` by netframe's C cutter (``cut_frames``) over ``data[pos:end]``, the
        buffer's head: the same frames, errors and result."""
        fmt = self._format
        frames: list[bytes] = []
        stop_pos, stop, need = _speedups.cut_frames(
            data, pos, end, pos + _BATCH_BYTES, _BATCH_FRAMES, *fmt._scan_params, frames
        )
        if not frames:
            if stop == _STOP_INVALID:
                fmt.raise_header_error(data, pos, end)
            self._need = need
            return False
        self._ready.extend(frames)
        self._frames_decoded += len(frames)
        self._need = 0
        self._buffer.skip(stop_pos - pos)
        self._buffer.commit()
        return True

    def _scan_kernel(
        self,
        data: bytes | bytearray,
        pos: int,
        end: int,
        *,
        stop_at: int,
        starts_out: list[int],
        ends_out: list[int],
    ) -> tuple[int, int]:
        """Run the numba scan from ``pos``; return ``(stop_pos, stop)``."""
        kernels = _kernels_module()
        starts = self._starts
        ends = self._ends
        if starts is None or ends is None:
            starts = self._starts = kernels.new_bounds(_BATCH_FRAMES)
            ends = self._ends = kernels.new_bounds(_BATCH_FRAMES)
        array = kernels.as_bytes_array(data)
        try:
            count, stop_pos, stop = kernels.scan_frames(
                array,
                pos,
                end,
                stop_at,
                *self._format._scan_params,
                starts,
                ends,
            )
        finally:
            # Release the export now: a bytearray with a live view cannot be compacted.
            del array
        starts_out.extend(starts[:count].tolist())
        ends_out.extend(ends[:count].tolist())
        return int(stop_pos), int(stop)
