"""The plain stream's decoder refuses an over-limit str, bin or ext at its header.

msgpack's unpacker refuses array and map headers over their limits at once, but waits
for a whole str, bin or ext body before it compares its length; the stream decoder
scans the headers of a message that arrives in pieces, so a wrong header costs its
sender the connection at once instead of holding ``max_message_size`` bytes of ours.
Byte at a time: a body of exactly the limit passes, one byte more is refused as soon as
the header's last byte is in.
"""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from idempotency.rpc import (
    Limits,
    Notification,
    RemoteProtocolError,
    Request,
    StreamDecoder,
    encode,
)
from netframe import NEED_DATA


def _value(kind: str, n: int) -> object:
    if kind == "str":
        return "s" * n
    if kind == "bin":
        return b"b" * n
    return msgpack.ExtType(5, b"e" * n)


def _limits(kind: str, limit: int) -> Limits:
    return Limits(
        max_str_len=limit if kind == "str" else 1 << 20,
        max_bin_len=limit if kind == "bin" else 1 << 20,
        max_ext_len=limit if kind == "ext" else 1 << 20,
    )


@pytest.mark.parametrize("kind", ["str", "bin", "ext"])
@pytest.mark.parametrize("limit", [200, 300, 70_000])  # 8, 16 and 32-bit lengths
def test_a_sized_value_of_the_limit_passes_byte_at_a_time(kind: str, limit: int) -> None:
    msg = Request(7, "echo", [1, {"k": _value(kind, limit)}])
    wire = encode(msg)
    decoder = StreamDecoder(_limits(kind, limit))
    got = []
    for i in range(len(wire)):
        decoder.feed(wire[i : i + 1])
        out = decoder.next_message()
        if out is not NEED_DATA:
            got.append(out)
    assert got == [msg]


@pytest.mark.parametrize("kind", ["str", "bin", "ext"])
@pytest.mark.parametrize("limit", [200, 300, 70_000])
def test_a_sized_value_over_the_limit_is_refused_at_its_header(kind: str, limit: int) -> None:
    value = _value(kind, limit + 1)
    wire = encode(Request(7, "echo", [1, {"k": value}]))
    # The body is the message's last bytes; the length ends just before it (before
    # ext's type byte, for an ext).
    header_end = len(wire) - (limit + 1) - (1 if kind == "ext" else 0)
    decoder = StreamDecoder(_limits(kind, limit))
    for i in range(header_end - 1):
        decoder.feed(wire[i : i + 1])
        assert decoder.next_message() is NEED_DATA, f"refused early, at byte {i}"
    decoder.feed(wire[header_end - 1 : header_end])
    with pytest.raises(RemoteProtocolError, match=f"max_{kind}_len") as info:
        decoder.next_message()
    assert info.value.stream_lost
    with pytest.raises(RemoteProtocolError):  # final
        decoder.next_message()


def test_after_whole_messages_in_the_same_receive_the_partial_one_is_scanned() -> None:
    # The partial message starts mid-receive, after complete ones: its header is found
    # from the message's own first byte, not the receive's.
    limits = Limits(max_str_len=100)
    ok = [Notification("n", [i, "x" * 90]) for i in range(3)]
    bad = encode(Notification("n", ["y" * 101]))
    decoder = StreamDecoder(limits)
    decoder.feed(b"".join(map(encode, ok)) + bad[:8])
    assert [decoder.next_message() for _ in ok] == ok
    with pytest.raises(RemoteProtocolError, match="max_str_len"):
        decoder.next_message()


_leaf = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False)
    # max_str_len counts UTF-8 bytes: a text cut to 300 of them (300 characters may be
    # more), so the limit's own edge is drawn too.
    | st.text(max_size=300).map(lambda t: t.encode()[:300].decode("utf-8", "ignore"))
    | st.binary(max_size=300)
    | st.builds(msgpack.ExtType, st.integers(0, 127), st.binary(max_size=40))
)
_values = st.recursive(
    _leaf,
    lambda inner: st.lists(inner, max_size=20) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=40,
)


@settings(max_examples=300, deadline=None)
@given(
    params=st.lists(st.lists(_values, max_size=4), min_size=1, max_size=4),
    cuts=st.lists(st.integers(1, 64), min_size=1, max_size=50),
)
def test_any_stream_within_the_limits_decodes_whatever_its_cuts(
    params: list[list[object]], cuts: list[int]
) -> None:
    """The scan never refuses what the unpacker accepts: messages of every msgpack type
    and nesting, cut into receives anywhere, come out as sent."""
    msgs = [Request(i, "m", p) for i, p in enumerate(params)]
    wire = b"".join(map(encode, msgs))
    decoder = StreamDecoder(Limits(max_str_len=300, max_bin_len=300, max_ext_len=40))
    got: list[object] = []
    i = k = 0
    while i < len(wire):
        step = cuts[k % len(cuts)]
        k += 1
        decoder.feed(wire[i : i + step])
        i += step
        got.extend(decoder)
    assert got == msgs
