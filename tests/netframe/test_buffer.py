"""netframe's offset buffer against a model, and its O(n) feeding."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from netframe import OffsetBuffer


class BufferMachine(RuleBasedStateMachine):
    """OffsetBuffer against a model: all bytes fed, the committed and read offsets."""

    def __init__(self) -> None:
        super().__init__()
        self.buffer = OffsetBuffer()
        self.stream = b""
        self.committed = 0
        self.read = 0

    @rule(
        chunk=st.binary(max_size=40),
        kind=st.sampled_from(["bytes", "bytearray", "memoryview"]),
    )
    def feed(self, chunk: bytes, kind: str) -> None:
        source: bytes | bytearray | memoryview = chunk
        if kind == "bytearray":
            source = bytearray(chunk)
        elif kind == "memoryview":
            source = memoryview(bytearray(chunk))
        self.buffer.feed(source)
        if kind != "bytes":
            # The buffer copied it: the caller may reuse its storage.
            target = source.obj if isinstance(source, memoryview) else source
            assert isinstance(target, bytearray)
            target[:] = b"\xee" * len(target)
        self.stream += chunk

    @rule(n=st.integers(0, 50))
    def consume_exactly(self, n: int) -> None:
        got = self.buffer.consume_exactly(n)
        if self.read + n > len(self.stream):
            assert got is None
        else:
            assert got == self.stream[self.read : self.read + n]
            assert type(got) is bytes
            self.read += n

    @rule(n=st.integers(0, 50))
    def consume_at_most(self, n: int) -> None:
        got = self.buffer.consume_at_most(n)
        assert got == self.stream[self.read : self.read + n]
        self.read += len(got)

    @rule(n=st.integers(0, 50))
    def skip(self, n: int) -> None:
        if self.read + n > len(self.stream):
            with pytest.raises(ValueError, match="cannot skip"):
                self.buffer.skip(n)
        else:
            self.buffer.skip(n)
            self.read += n

    @rule()
    def commit(self) -> None:
        self.buffer.commit()
        self.committed = self.read

    @rule()
    def rollback(self) -> None:
        self.buffer.rollback()
        self.read = self.committed

    @invariant()
    def unread_bytes_match(self) -> None:
        assert len(self.buffer) == len(self.stream) - self.read
        data, pos = self.buffer.peek()
        assert bytes(data[pos:]) == self.stream[self.read :]


BufferMachine.TestCase.settings = settings(max_examples=200, stateful_step_count=40)
TestBufferMachine = BufferMachine.TestCase


def test_negative_sizes_are_refused() -> None:
    buffer = OffsetBuffer(b"abc")
    with pytest.raises(ValueError, match="cannot consume"):
        buffer.consume_exactly(-1)
    with pytest.raises(ValueError, match="cannot consume"):
        buffer.consume_at_most(-1)
    with pytest.raises(ValueError, match="cannot skip"):
        buffer.skip(-1)
    assert len(buffer) == 3


def test_fed_bytes_are_kept_without_a_copy() -> None:
    chunk = b"x" * 1000
    buffer = OffsetBuffer()
    buffer.feed(chunk)
    assert buffer.peek() == (chunk, 0)
    assert buffer.peek()[0] is chunk


def test_byte_at_a_time_appends_in_place() -> None:
    # A large retained part and one-byte feeds: the storage is one bytearray appended
    # in place, never rebuilt per feed (which would copy the retained part each time,
    # n**2/2 bytes in all).
    buffer = OffsetBuffer(b"h" * 10_000)
    buffer.feed(b"a")
    storage, _ = buffer.peek()
    assert type(storage) is bytearray
    for _ in range(5000):
        buffer.feed(b"b")
        assert buffer.peek()[0] is storage
    assert len(buffer) == 15_001


def test_commit_compacts_only_when_dead_bytes_dominate() -> None:
    buffer = OffsetBuffer(b"h" * 100)
    buffer.feed(b"a" * 10)  # retained (100) > chunk (10): bytearray
    storage, _ = buffer.peek()
    buffer.skip(40)
    buffer.commit()  # 40 dead < 70 live: no move
    assert buffer.peek() == (storage, 40)
    buffer.skip(20)
    buffer.commit()  # 60 dead >= 50 live: compact, moving 50 bytes
    data, pos = buffer.peek()
    assert pos == 0
    assert bytes(data) == b"h" * 40 + b"a" * 10
    buffer.skip(50)
    buffer.commit()  # all read: the storage is released
    assert buffer.peek() == (b"", 0)


@given(
    chunks=st.lists(st.binary(min_size=1, max_size=30), max_size=60),
    reads=st.lists(st.integers(0, 40), max_size=60),
)
@settings(max_examples=200)
def test_bytes_copied_are_linear_in_bytes_fed(chunks: list[bytes], reads: list[int]) -> None:
    """Count the bytes the buffer's storage moves: at most a constant times those fed.

    The count is taken from the storage itself (each time the object changes, or a
    bytearray shrinks, its live bytes were copied), so it measures the real policy.
    """
    buffer = OffsetBuffer()
    fed = copied = 0
    for i, chunk in enumerate(chunks):
        before, _ = buffer.peek()
        before_len = len(before)
        buffer.feed(chunk)
        fed += len(chunk)
        after, _ = buffer.peek()
        if after is not before and after is not chunk:
            copied += len(after)  # rebuilt: everything in it was copied once
        elif after is before and type(after) is bytearray:
            copied += len(after) - before_len  # appended in place
        if i < len(reads):
            buffer.consume_at_most(reads[i])
            old, _ = buffer.peek()
            old_len = len(old)
            buffer.commit()
            new, _ = buffer.peek()
            if new is not old or len(new) != old_len:
                copied += len(new)  # compaction moved the live bytes
    assert copied <= 4 * fed + 1
