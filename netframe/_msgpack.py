"""Cutting a plain msgpack stream into its top-level objects, without decoding them.

A stream of msgpack objects has no frames: where one object ends is known only from its
headers. :data:`MsgpackCutter` finds those ends by reading the headers alone (each byte
once however the stream is cut, bodies skipped unread), and refuses what a bounded
unpacker would refuse at the header, before the body arrives: the plain msgpack-rpc
transport's receive (``idempotency.rpc``'s ``serve_stream``) is built on it.

:class:`PyMsgpackCutter` is the pure-Python reference; :data:`MsgpackCutter` is the C
twin (``netframe/_speedups_msgpack.c.h``) where the accelerator is built and not
``GOSIM_PURE_PYTHON=1``, else the reference. tests/idempotency/test_rpc_msgpack_cutter.py
holds the two to the same output.
"""

from __future__ import annotations

from typing import Any, Final

from netframe._accel import speedups as _speedups

__all__ = ["MAX_DEPTH", "MsgpackCutter", "PyMsgpackCutter"]

# msgpack's first bytes that start a str, bin or ext, and how many bytes follow them
# before the body: the length's, and ext's type byte (fixstr, 0xa0-0xbf, carries its
# length in its first byte).
_SIZED_HEADERS: Final[dict[int, tuple[str, int, int]]] = {
    0xC4: ("bin", 1, 0),
    0xC5: ("bin", 2, 0),
    0xC6: ("bin", 4, 0),
    0xC7: ("ext", 1, 1),
    0xC8: ("ext", 2, 1),
    0xC9: ("ext", 4, 1),
    0xD9: ("str", 1, 0),
    0xDA: ("str", 2, 0),
    0xDB: ("str", 4, 0),
}
# Scalars' total sizes, by first byte (fixints, nil, bools and fixstr are computed;
# fixext, 0xd4-0xd8, too: their data is checked against max_ext_len).
_FIXED_SIZES: Final[dict[int, int]] = {
    0xCA: 5,
    0xCB: 9,
    0xCC: 2,
    0xCD: 3,
    0xCE: 5,
    0xCF: 9,
    0xD0: 2,
    0xD1: 3,
    0xD2: 5,
    0xD3: 9,
}
#: msgpack's unpacker's bound on containers open at once (its stack).
MAX_DEPTH: Final = 1024


class PyMsgpackCutter:
    """Cuts a plain msgpack stream into its top-level objects without decoding them.

    ``PyMsgpackCutter`` is the pure-Python implementation; netframe's C one (its comment
    in ``netframe/_speedups_msgpack.c.h`` is the contract; the tests hold the two to the
    same output) is :data:`MsgpackCutter` where it is built, and also cuts straight off
    a socket (``cutter(fd)``, then ``take()``).

    ``feed(data)`` returns the objects now complete, each as its own bytes. Headers
    are checked as soon as they have arrived, before their bodies: a str, bin or ext
    over its length limit, an array or map over its element limit, a container (even
    empty) opened inside ``max_depth`` open ones, the byte 0xc1, or an object not
    complete within its first ``max_message_size`` bytes stop the cutter for good
    (``error`` says why, ``too_large`` for the last); the objects before it are
    returned. The scan resumes where the last feed stopped, so each byte is looked at
    once however the stream is cut; bodies are skipped unread.
    """

    __slots__ = (
        "_buf",
        "_items",
        "_limits",
        "_max_depth",
        "_max_message",
        "_pos",
        "_skip",
        "_stack",
        "error",
        "too_large",
    )

    def __init__(
        self,
        max_message_size: int,
        max_str_len: int,
        max_bin_len: int,
        max_array_len: int,
        max_map_len: int,
        max_ext_len: int,
        max_depth: int,
    ) -> None:
        limits = (max_message_size, max_str_len, max_bin_len, max_array_len, max_map_len)
        if min(*limits, max_ext_len, max_depth) < 1:
            raise ValueError("MsgpackCutter: every limit must be positive")
        self._max_message = max_message_size
        self._limits = {
            "str": max_str_len,
            "bin": max_bin_len,
            "ext": max_ext_len,
            "array": max_array_len,
            "map": max_map_len,
        }
        self._max_depth = max_depth
        self._buf = b""  # the object being cut, from its first byte
        self._pos = 0  # bytes of it scanned
        self._skip = 0  # body bytes still to pass over
        self._items = 1  # objects left at the innermost open level
        self._stack: list[int] = []  # the enclosing levels' objects left
        self.error: str | None = None
        self.too_large = False

    @property
    def buffered(self) -> int:
        """Bytes received and not yet returned."""
        return len(self._buf)

    def feed(self, data: bytes | bytearray | memoryview) -> list[bytes]:
        """Buffer ``data``; return the top-level objects now complete, in order."""
        out: list[bytes] = []
        if self.error is not None or not data:
            return out
        buf = self._buf + bytes(data)
        start = 0
        while True:
            if not self._scan(buf, start):
                break
            out.append(buf[start : self._pos])
            start = self._pos
            if start == len(buf):
                break
        self._buf = buf[start:]
        self._pos -= start
        return out

    def _fail(self, text: str, too_large: bool = False) -> bool:
        self.error = text
        self.too_large = too_large
        return False

    def _scan(self, buf: bytes, start: int) -> bool:
        """Scan the object at ``start`` from the saved state: True when it ended at
        ``self._pos``; False when more bytes are needed or the cutter stopped."""
        pos, skip, items, stack = self._pos, self._skip, self._items, self._stack
        end = min(len(buf), start + self._max_message)
        done = False
        while True:
            if skip:  # an item's body: passed over unread, the item ends with it
                step = min(skip, end - pos)
                pos += step
                skip -= step
                if skip:
                    break
                items -= 1
            else:
                if pos >= end:
                    break
                header = self._header(buf, pos, end, start, len(stack))
                if header is None:
                    break  # more bytes needed, or the cutter stopped
                pos, skip, count, is_map = header
                if count >= 0:  # a container: its elements are the next level's items
                    items -= 1
                    if count:
                        stack.append(items)
                        items = 2 * count if is_map else count
                elif not skip:
                    items -= 1  # an item without a body, ended with its header
            while not items and stack:
                items = stack.pop()
            if not items:
                done = True
                break
        if not done and self.error is None and len(buf) - start >= self._max_message:
            self._fail(f"message longer than {self._max_message} bytes", too_large=True)
        self._pos = pos
        if done:
            self._skip, self._items = 0, 1
            stack.clear()
        else:
            self._skip, self._items = skip, items
        return done

    def _header(
        self, buf: bytes, pos: int, end: int, start: int, depth: int
    ) -> tuple[int, int, int, bool] | None:
        """The item whose header starts at ``pos`` (``depth`` containers open):
        ``(pos, skip, count, is_map)``, ``pos`` past what was read of the header,
        ``skip`` the bytes still to pass over before the item ends (its body, and for a
        fixed-size type its type byte), ``count`` a container's elements or -1 for
        any other item. None when the header has not all arrived or is refused (the
        cutter stopped: ``error`` says why)."""
        b = buf[pos]
        limits = self._limits
        if b <= 0x7F or b >= 0xE0 or b in (0xC0, 0xC2, 0xC3):
            return pos + 1, 0, -1, False
        if b <= 0x9F:  # fixmap, fixarray
            return self._container(pos + 1, b & 0x0F, b <= 0x8F, depth)
        if b <= 0xBF:  # fixstr
            if b & 0x1F > limits["str"]:
                self._refuse(f"str of {b & 0x1F} bytes", "str")
                return None
            return pos + 1, b & 0x1F, -1, False
        if b == 0xC1:
            self._fail(f"undecodable msgpack: byte 0xc1 at offset {pos - start}")
            return None
        if b in _SIZED_HEADERS:
            kind, width, extra = _SIZED_HEADERS[b]
            if end - pos < 1 + width:
                return None  # the length has not all arrived
            length = int.from_bytes(buf[pos + 1 : pos + 1 + width], "big")
            if length > limits[kind]:
                self._refuse(f"{kind} of {length} bytes", kind)
                return None
            return pos + 1 + width, length + extra, -1, False
        if b in _FIXED_SIZES:
            return pos, _FIXED_SIZES[b], -1, False
        if 0xD4 <= b <= 0xD8:  # fixext: 1, 2, 4, 8 or 16 data bytes
            size = 1 << (b - 0xD4)
            if size > limits["ext"]:
                self._refuse(f"ext of {size} bytes", "ext")
                return None
            return pos, 2 + size, -1, False
        # array16/32, map16/32
        width = 2 if b in (0xDC, 0xDE) else 4
        if end - pos < 1 + width:
            return None  # the count has not all arrived
        count = int.from_bytes(buf[pos + 1 : pos + 1 + width], "big")
        return self._container(pos + 1 + width, count, b >= 0xDE, depth)

    def _container(
        self, pos: int, count: int, is_map: bool, depth: int
    ) -> tuple[int, int, int, bool] | None:
        """A container's header, read up to ``pos``: refused over its kind's element
        limit, or opened inside ``max_depth`` open ones (msgpack's unpacker opens none
        there, empty or not)."""
        kind = "map" if is_map else "array"
        if count > self._limits[kind]:
            self._refuse(f"{kind} of {count} elements", kind)
            return None
        if depth >= self._max_depth:
            self._fail(f"undecodable msgpack: containers nested deeper than {self._max_depth}")
            return None
        return pos, 0, count, is_map

    def _refuse(self, what: str, kind: str) -> None:
        """Stop the cutter: ``what`` exceeds the limit of its ``kind``."""
        self._fail(f"undecodable msgpack: {what} exceeds max_{kind}_len({self._limits[kind]})")


#: The cutter to use: netframe's C one where built (and not ``GOSIM_PURE_PYTHON=1``:
#: netframe's loader decides), else its Python twin above.
MsgpackCutter: Any = PyMsgpackCutter if _speedups is None else _speedups.MsgpackCutter
