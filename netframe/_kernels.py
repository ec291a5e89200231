"""The frame-boundary scan as one numba kernel call over a whole receive buffer.

:func:`scan_frames` walks length prefixes from ``start`` and records, for each complete
frame, where its returned bytes begin and where the frame ends. It stops at the first
frame that is incomplete, at the first header that is invalid (too large, too short
for its own header, a bad uvarint), or when the output arrays are full, and says which.
It never raises and never reports *why* a header is invalid: the decoder re-reads that
one header in Python, which owns every error message, so the kernel and the Python loop
cannot disagree on wording and the kernel stays small.

Used by :class:`netframe.FrameDecoder` where the C extension is not in use, and there
only where it measurably beats the Python loop (many frames in one buffer; see
``_codec.KERNEL_MIN_FRAMES``). Under
``NUMBA_DISABLE_JIT=1`` the same function runs as plain Python (slowly, on numpy
scalars), so the decoder then keeps to its Python loop unless told otherwise.

Loading without a stall: this module imports numpy and numba (through
``gosim.jit``), and numba compiles (or loads from its disk cache) on the first call:
together a second or more. A decoder that did either in the middle of traffic would stop
every goroutine of its runtime for that long, and a process on the C loops never needs
them. So the codec imports this module only on first need, and its ``"numba"`` mode
(what ``"auto"`` is when the C extension is not in use) imports and compiles it in a
background thread and calls the kernel only once :data:`READY` is set; until then the
Python loop decodes. A server that wants the kernel from its first request calls
``netframe.load_kernel()`` before it accepts connections.

Integer care: a length field is read as ``uint64`` (an 8-byte prefix can announce up to
``2**64 - 1``) and compared with :data:`LENGTH_CUTOFF` *as uint64* before it is turned
into ``int64``: numba would otherwise mix ``uint64`` and ``int64`` into ``float64``. The
cutoff is safe because :class:`~netframe.FrameFormat` bounds every parameter so that no
valid length reaches it.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from gosim.jit import JIT_ENABLED, kernel

from ._codec import STOP_FULL, STOP_INVALID, STOP_NEED_DATA

__all__ = [
    "JIT_ENABLED",
    "LENGTH_CUTOFF",
    "STOP_FULL",
    "STOP_INVALID",
    "STOP_NEED_DATA",
    "as_bytes_array",
    "load",
    "new_bounds",
    "scan_frames",
]

#: True once :func:`scan_frames` is compiled (or, under ``NUMBA_DISABLE_JIT=1``, at
#: once): calling it then costs a call, not a compilation.
READY: bool = not JIT_ENABLED

_load_lock = threading.Lock()

#: Any length field value at or above this is invalid for every allowed format
#: (``FrameFormat`` keeps max_frame_length <= 2**60, |adjustment| <= 2**40, offset <
#: 2**16), so the kernel may treat it as "invalid" without exact arithmetic.
LENGTH_CUTOFF = 1 << 61


def new_bounds(capacity: int) -> Any:
    """An output array for :func:`scan_frames`: ``capacity`` int64 slots."""
    return np.empty(capacity, dtype=np.int64)


def as_bytes_array(data: bytes | bytearray) -> Any:
    """``data`` as the 1-d uint8 array :func:`scan_frames` reads (a view, no copy)."""
    return np.frombuffer(data, dtype=np.uint8)


@kernel
def scan_frames(
    buf: Any,
    start: int,
    end: int,
    stop_at: int,
    width: int,
    big_endian: int,
    length_offset: int,
    adjustment: int,
    includes_prefix: int,
    strip: int,
    max_body: int,
    payload_starts: Any,
    frame_ends: Any,
) -> tuple[int, int, int]:
    """Find the complete frames in ``buf[start:end]`` that start before ``stop_at``;
    return ``(count, pos, stop)``.

    ``buf`` is a 1-d uint8 array; ``width`` is 1, 2, 4 or 8, or 0 for a uvarint;
    ``strip`` is initial_bytes_to_strip, or -1 for "the whole header". Frame ``i``'s
    returned bytes are ``buf[payload_starts[i]:frame_ends[i]]`` for ``i < count``;
    ``pos`` is where the next frame starts (``frame_ends[count-1]``, or ``start``);
    ``stop`` is one of ``STOP_FULL``, ``STOP_NEED_DATA``, ``STOP_INVALID``.
    Must agree with ``_codec._FrameParser.scan`` (the Python loop) frame for frame:
    ``tests/netframe/test_codec.py`` checks them against each other.
    """
    capacity = frame_ends.shape[0]
    cutoff = np.uint64(LENGTH_CUTOFF)
    count = 0
    pos = start
    while count < capacity and pos < stop_at:
        field = pos + length_offset
        length = np.uint64(0)
        if width == 0:
            shift = np.uint64(0)
            k = 0
            done = False
            while k < 10:
                if field + k >= end:
                    return count, pos, STOP_NEED_DATA
                b = np.uint64(buf[field + k])
                k += 1
                if k == 10 and b > np.uint64(1):
                    return count, pos, STOP_INVALID  # overflows 64 bits or > 10 bytes
                length |= (b & np.uint64(0x7F)) << shift
                shift += np.uint64(7)
                if b < np.uint64(0x80):
                    done = True
                    break
            if not done:
                return count, pos, STOP_INVALID
            header = length_offset + k
        else:
            header = length_offset + width
            if end - pos < header:
                return count, pos, STOP_NEED_DATA
            if big_endian:
                for i in range(width):
                    length = (length << np.uint64(8)) | np.uint64(buf[field + i])
            else:
                for i in range(width - 1, -1, -1):
                    length = (length << np.uint64(8)) | np.uint64(buf[field + i])
        if length >= cutoff:
            return count, pos, STOP_INVALID
        body: Any = np.int64(length) + adjustment
        if includes_prefix:
            body -= header
        if body < 0 or body > max_body:
            return count, pos, STOP_INVALID
        skip = header if strip < 0 else strip
        if skip > header + body:
            return count, pos, STOP_INVALID
        stop = pos + header + body
        if stop > end:
            return count, pos, STOP_NEED_DATA
        payload_starts[count] = pos + skip
        frame_ends[count] = stop
        count += 1
        pos = stop
    return count, pos, STOP_FULL


def _ready() -> bool:
    # Read through a call: READY may change in another thread between two reads
    # (a type checker would otherwise take the second read as the first's value).
    return READY


def load() -> None:
    """Compile :func:`scan_frames` now (from numba's disk cache when it is there).

    Blocks for as long as that takes (0.3 s to a few seconds; once per process) and
    sets :data:`READY`. Safe to call from any thread, any number of times.
    """
    global READY
    if READY:
        return
    with _load_lock:
        if _ready():  # another thread compiled it while this one waited for the lock
            return
        # Every argument type the decoder passes: a uint8 view and int64 outputs.
        # Python ints and bools are typed as int64 and bool, as in the decoder's call.
        buf = np.zeros(8, dtype=np.uint8)
        out = np.empty(1, dtype=np.int64)
        scan_frames(buf, 0, 8, 8, 4, True, 0, 0, False, -1, 16, out, out.copy())
        READY = True
