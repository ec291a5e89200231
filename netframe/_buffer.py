"""An offset buffer: bytes in, bytes out, with commit and rollback.

A parser reads from the buffer with :meth:`OffsetBuffer.consume_exactly` (``None`` when
the bytes are not there yet) and then either :meth:`~OffsetBuffer.commit`\\ s what it
read (the message was complete) or :meth:`~OffsetBuffer.rollback`\\ s to where it
started (it was not: try again after the next :meth:`~OffsetBuffer.feed`). This is
wsproto's ``Buffer`` shape; the storage underneath is chosen so that no feeding pattern
makes it quadratic.

Why the buffer is O(n) in the worst case
----------------------------------------
The obvious buffers are quadratic for some input: ``buf = buf + data`` copies the whole
buffer on every feed (fed one byte at a time, n bytes cost n²/2 copies), and
``buf = buf[k:]`` after each message copies the rest on every message. A peer can pick
the feeding pattern (one byte per TCP segment), so it must not matter. Here:

1. Bytes are read at an offset (``_pos``) and never moved to read them.
2. Dead bytes (consumed and committed) are dropped by :meth:`~OffsetBuffer.commit` only
   when there are at least as many dead bytes as live ones. The copy moves the live
   bytes, no more than the dead ones it frees; each byte dies once, so all compactions
   together copy at most n bytes.
3. :meth:`~OffsetBuffer.feed` costs O(len(chunk)) amortized: an empty buffer keeps a
   ``bytes`` chunk as it is (no copy); a retained part no longer than the new chunk is
   joined with it into one new ``bytes`` object (at most 2 x the chunk, charged to the
   chunk); otherwise the chunk is appended to a ``bytearray`` (amortized O(chunk)).
   Turning a retained ``bytes`` into that ``bytearray`` copies each byte at most once,
   charged to the chunk that brought it.

So feeding n bytes in any split, and consuming them in any pattern, costs O(n) in total.
Keeping data as immutable ``bytes`` where that is free is also what lets the decoder cut
frames with one plain slice each (a ``bytearray`` slice is a ``bytearray``, which would
need a second copy to become the ``bytes`` a frame is).
"""

from __future__ import annotations

__all__ = ["OffsetBuffer"]

_BytesLike = bytes | bytearray | memoryview


class OffsetBuffer:
    """A byte buffer read at an offset, with :meth:`commit` and :meth:`rollback`.

    ``len(buffer)`` is the number of unread bytes. Not thread-safe: one reader.
    """

    __slots__ = ("_data", "_pos", "_start")

    # Invariant: 0 <= _start <= _pos <= len(_data).
    # _data[:_start] is dead (consumed and committed); _data[_start:_pos] is consumed but
    # not committed (rollback() makes it unread again); _data[_pos:] is unread.
    # _data is bytes when it could be kept immutable for free, else a bytearray we own.
    _data: bytes | bytearray
    _start: int
    _pos: int

    def __init__(self, data: _BytesLike = b"") -> None:
        self._data = b""
        self._start = 0
        self._pos = 0
        self.feed(data)

    def __len__(self) -> int:
        return len(self._data) - self._pos

    def __repr__(self) -> str:
        return f"<OffsetBuffer unread={len(self)} uncommitted={self._pos - self._start}>"

    def feed(self, data: _BytesLike) -> None:
        """Append ``data``; O(len(data)) amortized (see the module docstring).

        ``data`` is copied unless it is ``bytes`` (immutable, so it is safe to keep):
        a caller may reuse its ``bytearray`` or ``memoryview`` after the call.
        """
        kind = type(data)
        n = len(data) if kind is bytes or kind is bytearray else memoryview(data).nbytes
        if n == 0:
            return
        old = self._data
        start = self._start
        retained = len(old) - start
        if retained == 0:
            self._data = data if kind is bytes else bytes(data)  # type: ignore[assignment]
            self._start = self._pos = 0
        elif retained <= n:
            # Cost <= 2n, charged to this chunk.
            self._data = b"".join((memoryview(old)[start:], data))
            self._pos -= start
            self._start = 0
        else:
            if type(old) is not bytearray:
                # Each byte of a bytes object is converted at most once.
                old = bytearray(memoryview(old)[start:])
                self._pos -= start
                self._start = 0
                self._data = old
            old += data

    def consume_exactly(self, n: int) -> bytes | None:
        """Read the next ``n`` bytes, or return ``None`` (reading nothing) if fewer are
        buffered."""
        if n < 0:
            raise ValueError(f"cannot consume {n} bytes")
        pos = self._pos
        stop = pos + n
        data = self._data
        if stop > len(data):
            return None
        self._pos = stop
        if type(data) is bytes:
            return data[pos:stop]
        return bytes(memoryview(data)[pos:stop])

    def consume_at_most(self, n: int) -> bytes:
        """Read up to ``n`` bytes: as many as are buffered, possibly none."""
        if n < 0:
            raise ValueError(f"cannot consume {n} bytes")
        pos = self._pos
        data = self._data
        stop = min(pos + n, len(data))
        self._pos = stop
        if type(data) is bytes:
            return data[pos:stop]
        return bytes(memoryview(data)[pos:stop])

    def skip(self, n: int) -> None:
        """Consume ``n`` unread bytes without copying them out.

        Raises ValueError (consuming nothing) if fewer than ``n`` are buffered.
        """
        if n < 0 or n > len(self._data) - self._pos:
            raise ValueError(f"cannot skip {n} bytes: {len(self)} unread")
        self._pos += n

    def peek(self) -> tuple[bytes | bytearray, int]:
        """Return ``(data, pos)``: the unread bytes are ``data[pos:]``, not copied.

        For parsers that scan in place (the frame decoder). The object is the buffer's
        own storage: read it before the next :meth:`feed` or :meth:`commit`, never
        write to it, and release any ``memoryview`` of it before then (a ``bytearray``
        with an exported view cannot grow).
        """
        return self._data, self._pos

    def commit(self) -> None:
        """Make the bytes consumed so far permanent: :meth:`rollback` no longer
        returns them. Drops dead bytes once they are at least half the storage."""
        pos = self._pos
        data = self._data
        size = len(data)
        if pos == size:
            # Everything read: release the storage (it may be a large fed chunk).
            self._data = b""
            self._start = self._pos = 0
        elif pos >= size - pos:
            # Dead >= live: moving the live bytes costs no more than the dead ones
            # freed, so all compactions together copy O(total fed).
            if type(data) is bytearray:
                del data[:pos]
            else:
                self._data = data[pos:]
            self._start = self._pos = 0
        else:
            self._start = pos

    def rollback(self) -> None:
        """Unread every byte consumed since the last :meth:`commit`."""
        self._pos = self._start
