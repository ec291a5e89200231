"""The plain stream's message cutter: netframe's C ``MsgpackCutter`` and its Python twin
(``netframe.PyMsgpackCutter``) cut the same bytes the same way, and
both cut where msgpack's own unpacker ends an object.

The C/Python agreement tests need the C accelerator (they skip under
``GOSIM_PURE_PYTHON=1``, whose run covers the twin through every other stream test);
the msgpack agreement tests run with whichever cutter the stream uses.
"""

from __future__ import annotations

import socket
from typing import Any

import msgpack
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from netframe import MAX_MSGPACK_DEPTH as MAX_DEPTH
from netframe import MsgpackCutter, PyMsgpackCutter
from netframe._accel import speedups

needs_c = pytest.mark.skipif(
    speedups is None, reason="the C accelerator is not built or GOSIM_PURE_PYTHON=1"
)

_limits = st.tuples(
    st.integers(1, 400),  # max_message_size
    st.integers(1, 40),  # max_str_len
    st.integers(1, 40),  # max_bin_len
    st.integers(1, 20),  # max_array_len
    st.integers(1, 10),  # max_map_len
    st.integers(1, 40),  # max_ext_len
    st.integers(1, 6),  # depth
)

_leaf = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=40)
    | st.binary(max_size=70_000).filter(lambda b: len(b) < 300 or len(b) > 65_536)
    | st.builds(msgpack.ExtType, st.integers(0, 127), st.binary(max_size=300))
)
_values = st.recursive(
    _leaf,
    lambda inner: st.lists(inner, max_size=20) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=30,
)


def _state(cutter: Any) -> tuple[Any, ...]:
    return (cutter.buffered, cutter.error, cutter.too_large)


def _feed_both(c: Any, py: Any, chunk: bytes) -> list[bytes]:
    got_c = c.feed(chunk)
    got_py = py.feed(chunk)
    assert got_c == got_py
    assert _state(c) == _state(py)
    return got_c


@needs_c
@settings(max_examples=400, deadline=None)
@given(
    limits=_limits,
    data=st.binary(max_size=600),
    cuts=st.lists(st.integers(1, 50), min_size=1, max_size=40),
)
def test_c_and_python_agree_on_any_bytes(
    limits: tuple[int, ...], data: bytes, cuts: list[int]
) -> None:
    c, py = speedups.MsgpackCutter(*limits), PyMsgpackCutter(*limits)
    i = 0
    for n in cuts * (len(data) // max(1, sum(cuts)) + 1):
        if i >= len(data):
            break
        _feed_both(c, py, data[i : i + n])
        i += n


@needs_c
@settings(max_examples=100, deadline=None)
@given(values=st.lists(_values, min_size=1, max_size=4))
def test_c_and_python_agree_on_valid_msgpack_split_at_every_offset(values: list[object]) -> None:
    parts = [msgpack.packb(v) for v in values]
    wire = b"".join(parts)
    big = (1 << 30, 1 << 20, 1 << 20, 1 << 17, 1 << 15, 1 << 20, MAX_DEPTH)
    for at in range(0, len(wire) + 1, max(1, len(wire) // 64)):
        c, py = speedups.MsgpackCutter(*big), PyMsgpackCutter(*big)
        got = _feed_both(c, py, wire[:at]) + _feed_both(c, py, wire[at:])
        assert got == parts
        assert c.buffered == 0 and c.error is None


class CutterMachine(RuleBasedStateMachine):
    """The two cutters fed the same chunks, valid msgpack and garbage interleaved, keep
    the same state (buffered bytes, error) across feeds, and return the same objects."""

    def __init__(self) -> None:
        super().__init__()
        limits = (300, 30, 30, 10, 5, 30, 4)
        self.c = speedups.MsgpackCutter(*limits)
        self.py = PyMsgpackCutter(*limits)
        self.pending = b""  # valid bytes sent and not yet returned
        self.garbled = False

    @rule(value=_values, cut=st.integers(0, 40))
    def valid(self, value: object, cut: int) -> None:
        wire = msgpack.packb(value)
        got = _feed_both(self.c, self.py, wire[:cut])
        got += _feed_both(self.c, self.py, wire[cut:])
        if not self.garbled and self.c.error is None:
            self.pending += wire
            joined = b"".join(got)
            assert self.pending.startswith(joined)
            self.pending = self.pending[len(joined) :]

    @rule(junk=st.binary(min_size=1, max_size=20))
    def garbage(self, junk: bytes) -> None:
        self.garbled = True
        _feed_both(self.c, self.py, junk)

    @invariant()
    def agree(self) -> None:
        assert _state(self.c) == _state(self.py)


TestCutterMachine = pytest.mark.skipif(speedups is None, reason="needs the C accelerator")(
    CutterMachine.TestCase
)
CutterMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)


def _unpacker_cut(data: bytes, limits: tuple[int, ...]) -> int | BaseException | None:
    """Where msgpack's unpacker, given the cutter's limits, ends the first object of
    ``data``: its length, None when it needs more, or what it raised. Strings stay
    bytes and maps lists of pairs: only where objects end is compared here."""
    unpacker = msgpack.Unpacker(
        max_buffer_size=max(limits[0], len(data)),
        raw=True,
        strict_map_key=False,
        object_pairs_hook=list,
        # Any ext type code, as the cutter (which decodes no value) takes it: ExtType
        # refuses negative codes as it builds the value, before a later header's bound.
        ext_hook=lambda code, data: (code, data),
        max_str_len=limits[1],
        max_bin_len=limits[2],
        max_array_len=limits[3],
        max_map_len=limits[4],
        max_ext_len=limits[5],
    )
    unpacker.feed(data)
    try:
        unpacker.unpack()
    except msgpack.OutOfData:
        return None
    except Exception as exc:
        return exc
    return int(unpacker.tell())


def _a_bound(exc: BaseException) -> bool:
    """An unpacker error that a header over a limit, too deep a nesting or a byte that
    is not msgpack gives (the cutter's refusals), not one of a decoded value."""
    return isinstance(exc, msgpack.StackError | msgpack.FormatError) or "exceeds" in str(exc)


@settings(max_examples=500, deadline=None)
@given(limits=_limits, data=st.binary(min_size=1, max_size=300))
# A map whose key is an ext of type code -128 and whose value's str header is over its
# bound: the cutter refuses the header; ExtType must not refuse the code first.
@example(limits=(8, 1, 1, 1, 1, 4, 1), data=b"\x81\xd6\x80\x00\x00\x00\x00\xa2")
def test_the_cutter_ends_an_object_where_the_unpacker_does(
    limits: tuple[int, ...], data: bytes
) -> None:
    limits = (*limits[:6], MAX_DEPTH)
    cutter = MsgpackCutter(*limits)
    got = cutter.feed(data)
    end = _unpacker_cut(data, limits)
    if got:
        if isinstance(end, BaseException):  # a value that does not decode, cut whole
            assert not _a_bound(end), end
        else:
            assert end == len(got[0])
    elif cutter.error is not None and not cutter.too_large:
        # Refused at a header: the unpacker refuses too, or still waits for the body.
        assert end is None or (isinstance(end, BaseException) and _a_bound(end)), (
            cutter.error,
            end,
        )
    elif isinstance(end, int):
        # The unpacker took an object the cutter did not: only one longer than the
        # message bound may be (the unpacker was given the whole buffer).
        assert end > limits[0]


@pytest.mark.parametrize("opener", [b"\x91", b"\x81\x00"])
@pytest.mark.parametrize("leaf", [b"\x00", b"\x90"])
def test_depth_is_msgpacks(opener: bytes, leaf: bytes) -> None:
    """msgpack's unpacker opens no container, empty or not, inside 1024 open ones."""
    for depth in (MAX_DEPTH - 1, MAX_DEPTH, MAX_DEPTH + 1):
        wire = opener * depth + leaf
        try:
            msgpack.unpackb(wire, strict_map_key=False)
            ok = True
        except msgpack.StackError:
            ok = False
        assert ok is (depth + (leaf == b"\x90") <= MAX_DEPTH)
        cutter = MsgpackCutter(1 << 20, 10, 10, 10, 10, 10, MAX_DEPTH)
        assert cutter.feed(wire) == ([wire] if ok else [])
        assert (cutter.error is None) is ok


def test_a_refusal_keeps_the_objects_before_it_and_is_final() -> None:
    cutter = MsgpackCutter(100, 5, 5, 5, 5, 5, 4)
    ok = msgpack.packb([1, "abc"])
    assert cutter.feed(ok + msgpack.packb("toolong") + ok) == [ok]
    assert cutter.error == "undecodable msgpack: str of 7 bytes exceeds max_str_len(5)"
    assert cutter.feed(ok) == []


def test_the_message_bound_is_exact() -> None:
    wire = msgpack.packb(["ab"] * 30)
    exact = MsgpackCutter(len(wire), 10, 10, 100, 10, 10, 4)
    short = MsgpackCutter(len(wire) - 1, 10, 10, 100, 10, 10, 4)
    got: list[bytes] = []
    for i in range(len(wire)):
        got += exact.feed(wire[i : i + 1])
        assert short.feed(wire[i : i + 1]) == []
        assert (short.error is None) is (i < len(wire) - 2)  # refused at the bound
    assert got == [wire]
    assert short.too_large and short.error == f"message longer than {len(wire) - 1} bytes"


@needs_c
def test_the_receiving_form_cuts_as_feed_does() -> None:
    """cutter(fd), RawConn.read's form: one receive a call, its whole objects for
    take(), False when the socket has nothing (or the last receive drained it), and
    the end of the stream seen."""
    parts = [msgpack.packb([1, "x" * 40]), msgpack.packb({"a": [1, 2]}), msgpack.packb(7)]
    wire = b"".join(parts)
    a, b = socket.socketpair()
    with a, b:
        b.setblocking(False)
        cutter = speedups.MsgpackCutter(1 << 20, 100, 100, 100, 100, 100, MAX_DEPTH, 16)
        assert cutter(b.fileno()) is False
        a.sendall(wire[:5])
        assert cutter(b.fileno()) is True and cutter.take() == []
        assert cutter.buffered == 5
        assert cutter(b.fileno()) is False  # drained: wait first
        a.sendall(wire[5:])
        got: list[bytes] = []
        while cutter(b.fileno()):  # receives of at most 16 bytes
            got += cutter.take()
        assert got == parts and cutter.buffered == 0
        a.shutdown(socket.SHUT_WR)
        assert cutter(b.fileno()) is True and cutter.eof
