"""The sans-IO msgpack-rpc layer: shapes, the idempotency extension, limits, streams."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from idempotency.rpc import (
    MAX_MSGID,
    CallMeta,
    ErrorInfo,
    Limits,
    LocalProtocolError,
    MessageTooLarge,
    Notification,
    RemoteProtocolError,
    Request,
    Response,
    Status,
    StreamDecoder,
    decode,
    encode,
    encode_error,
    encode_notification,
    encode_plain_error,
    encode_request,
    encode_response,
    parse_error,
    plain_error,
)
from netframe import NEED_DATA

# Values msgpack carries both ways unchanged (no tuples: they come back as lists).
_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=20)
    | st.binary(max_size=20)
)
values = st.recursive(
    _scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
msgids = st.integers(min_value=0, max_value=MAX_MSGID)
methods = st.text(max_size=30)
keys = st.text(
    alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=255
)
metas = st.builds(
    CallMeta,
    key=st.none() | keys,
    caller=st.none() | st.text(max_size=40),
    timeout_ms=st.none() | st.integers(min_value=0, max_value=2**40),
    attempt=st.integers(min_value=1, max_value=10),
)
messages = (
    st.builds(Request, msgids, methods, st.lists(values, max_size=5), st.none() | metas)
    | st.builds(Response, msgids, values, values, st.booleans(), st.booleans())
    | st.builds(Notification, methods, st.lists(values, max_size=5))
)


def _normal(msg: Request | Response | Notification) -> Request | Response | Notification:
    """What a message decodes back to: a metadata map that says nothing is not sent."""
    if isinstance(msg, Request) and msg.meta is not None and not msg.meta.to_wire():
        return Request(msg.msgid, msg.method, msg.params, None)
    return msg


@given(messages)
def test_every_message_round_trips(msg: Request | Response | Notification) -> None:
    assert decode(encode(msg)) == _normal(msg)


@given(st.lists(messages, max_size=8), st.data())
def test_stream_decoder_yields_the_messages_in_any_split(
    msgs: list[Request | Response | Notification], data: st.DataObject
) -> None:
    wire = b"".join(map(encode, msgs))
    cuts = sorted(data.draw(st.lists(st.integers(0, len(wire)), max_size=10)))
    decoder = StreamDecoder()
    out = []
    start = 0
    for cut in [*cuts, len(wire)]:
        decoder.feed(wire[start:cut])
        start = cut
        out.extend(decoder)
    assert out == [_normal(m) for m in msgs]
    assert decoder.next_message() is NEED_DATA
    assert decoder.buffered == 0


def test_stream_decoder_byte_at_a_time() -> None:
    msgs = [
        Request(1, "nvim_eval", ["1+1"]),
        Response(1, None, 2),
        Notification("redraw", [[1, 2]]),
        Request(2, "transfer", ["a", "b", 10], CallMeta(key="k-1", caller="c", timeout_ms=500)),
    ]
    wire = b"".join(map(encode, msgs))
    decoder = StreamDecoder()
    out = []
    for i in range(len(wire)):
        decoder.feed(wire[i : i + 1])
        out.extend(decoder)
    assert out == msgs


def test_plain_peers_see_the_specs_four_element_arrays() -> None:
    # A call without metadata, and a reply that is not a replay, are the spec's shapes.
    assert msgpack.unpackb(encode_request(3, "m", [1])) == [0, 3, "m", [1]]
    assert msgpack.unpackb(encode_request(3, "m", [1], CallMeta())) == [0, 3, "m", [1]]
    assert msgpack.unpackb(encode_response(3, None, "ok")) == [1, 3, None, "ok"]
    assert msgpack.unpackb(encode_notification("n", ())) == [2, "n", []]


def test_protocol_md_examples_byte_for_byte() -> None:
    # The examples in PROTOCOL.md, "Idempotent msgpack-rpc".
    req = encode_request(
        7, "transfer", ["a", "b", 10], CallMeta(key="t-1", caller="acct-7", timeout_ms=2000)
    )
    assert req.hex(" ") == (
        "95 00 07 a8 74 72 61 6e 73 66 65 72 93 a1 61 a1 62 0a 83 a3 6b 65 79 a3 74 2d 31 "
        "a6 63 61 6c 6c 65 72 a6 61 63 63 74 2d 37 a7 74 69 6d 65 6f 75 74 cd 07 d0"
    )
    rep = encode_response(7, None, "ok", replayed=True)
    assert rep.hex(" ") == "95 01 07 c0 a2 6f 6b 81 a8 72 65 70 6c 61 79 65 64 c3"
    err = encode_error(7, Status.ALREADY_EXISTS, "key reused", {"type": "KeyReused"})
    assert err.hex(" ") == (
        "94 01 07 93 06 aa 6b 65 79 20 72 65 75 73 65 64 81 a4 74 79 70 65 a9 4b 65 79 "
        "52 65 75 73 65 64 c0"
    )
    hello = encode_request(0, "idempotency.rpc.hello", [1])
    assert hello.hex(" ") == (
        "94 00 00 b5 69 64 65 6d 70 6f 74 65 6e 63 79 2e 72 70 63 2e 68 65 6c 6c 6f 91 01"
    )
    welcome = encode_response(0, None, {"extension": 1})
    assert welcome.hex(" ") == "94 01 00 c0 81 a9 65 78 74 65 6e 73 69 6f 6e 01"
    refusal = encode_error(
        8, Status.UNAVAILABLE, "server is shutting down", {"type": "Refused"}, refused=True
    )
    assert msgpack.unpackb(refusal) == [
        1,
        8,
        [14, "server is shutting down", {"type": "Refused"}],
        None,
        {"refused": True},
    ]
    assert refusal.hex(" ") == (
        "95 01 08 93 0e b7 73 65 72 76 65 72 20 69 73 20 73 68 75 74 74 69 6e 67 20 64 "
        "6f 77 6e 81 a4 74 79 70 65 a7 52 65 66 75 73 65 64 c0 81 a7 72 65 66 75 73 65 "
        "64 c3"
    )
    plain = encode_plain_error(7, Status.UNKNOWN, "bad value", {"type": "ValueError"})
    assert msgpack.unpackb(plain) == [1, 7, [0, "UNKNOWN: ValueError: bad value"], None]
    assert plain.hex(" ") == (
        "94 01 07 92 00 be 55 4e 4b 4e 4f 57 4e 3a 20 56 61 6c 75 65 45 72 72 6f 72 3a "
        "20 62 61 64 20 76 61 6c 75 65 c0"
    )


def test_attempt_and_unknown_metadata_keys() -> None:
    wire = msgpack.packb([0, 1, "m", [], {"key": "k", "attempt": 3, "future": [1, 2]}])
    msg = decode(wire)
    assert isinstance(msg, Request)
    assert msg.meta == CallMeta(key="k", attempt=3)


def test_method_sent_as_raw_bytes_is_accepted() -> None:
    # msgpack's old raw type: early msgpack-rpc peers send method names as raw.
    wire = msgpack.packb([0, 1, b"m", []], use_bin_type=True)
    assert decode(wire) == Request(1, "m", [])


@pytest.mark.parametrize(
    ("obj", "reason", "msgid"),
    [
        ({"a": 1}, "message must be an array, not dict", None),
        ([], "message is an empty array", None),
        ([9, 1, "m", []], "unknown message type 9", None),
        ([True, 1, "m", []], "unknown message type True", None),
        ([0, 1, "m"], "request has 3 elements, expected 4 or 5", None),
        ([0, 1, "m", [], None, 1], "request has 6 elements, expected 4 or 5", None),
        ([0, -1, "m", []], "request msgid must be a uint32, not -1", None),
        ([0, 2**32, "m", []], "request msgid must be a uint32, not 4294967296", None),
        ([0, "1", "m", []], "request msgid must be a uint32, not '1'", None),
        ([0, 5, 12, []], "request method must be a string, not int", 5),
        ([0, 5, b"\xff", []], "request method is not UTF-8", 5),
        ([0, 5, "m", {}], "request params must be an array, not dict", 5),
        ([0, 5, "m", [], [1]], "request metadata must be a map, not list", 5),
        ([0, 5, "m", [], {"key": 1}], "request metadata 'key' must be a string", 5),
        (
            [0, 5, "m", [], {"key": "k" * 256}],
            "request metadata 'key' is 256 characters, at most 255 allowed",
            5,
        ),
        ([0, 5, "m", [], {"caller": 1}], "request metadata 'caller' must be a string", 5),
        (
            [0, 5, "m", [], {"timeout": -1}],
            "request metadata 'timeout' must be a non-negative integer (milliseconds)",
            5,
        ),
        (
            [0, 5, "m", [], {"timeout": 1.5}],
            "request metadata 'timeout' must be a non-negative integer (milliseconds)",
            5,
        ),
        (
            [0, 5, "m", [], {"attempt": 0}],
            "request metadata 'attempt' must be a positive integer",
            5,
        ),
        ([1, 5, None], "response has 3 elements, expected 4 or 5", None),
        ([1, 5, None, 1, {"replayed": 1}], "response metadata 'replayed' must be a boolean", None),
        ([1, 5, None, 1, {"refused": 1}], "response metadata 'refused' must be a boolean", None),
        ([1, 5, None, 1, "x"], "response metadata must be a map, not str", None),
        ([2, "n"], "notification has 2 elements, expected 3", None),
        ([2, "n", 5], "notification params must be an array, not int", None),
    ],
)
def test_malformed_messages_say_what_is_wrong(obj: object, reason: str, msgid: int | None) -> None:
    with pytest.raises(RemoteProtocolError) as info:
        decode(msgpack.packb(obj, use_bin_type=True))
    assert str(info.value) == reason
    assert info.value.msgid == msgid
    assert not info.value.stream_lost


def test_undecodable_frames() -> None:
    with pytest.raises(RemoteProtocolError, match="undecodable msgpack"):
        decode(b"\xc1")  # never used in msgpack
    with pytest.raises(RemoteProtocolError, match="undecodable msgpack"):
        decode(b"\x94\x00")  # truncated
    with pytest.raises(RemoteProtocolError, match="more than one msgpack object"):
        decode(encode_notification("a", []) * 2)
    with pytest.raises(RemoteProtocolError, match="undecodable msgpack"):
        decode(msgpack.packb([2, "n", [{1: 2}]]))  # non-string map key (hash flooding)
    with pytest.raises(RemoteProtocolError, match="undecodable msgpack"):
        decode(b"\x93\x02\xa1n\x91" + b"\xa2\xff\xfe")  # invalid UTF-8 string


def test_limits_pass_at_the_limit_and_refuse_one_more() -> None:
    limits = Limits(max_str_len=10, max_array_len=4, max_map_len=2, max_bin_len=4)
    ok = Notification("n", ["x" * 10, [1, 2, 3, 4], {"a": 1, "b": 2}, b"1234"])
    assert decode(encode(ok), limits) == ok
    for bad in (["x" * 11], [[1, 2, 3, 4, 5]], [{"a": 1, "b": 2, "c": 3}], [b"12345"]):
        with pytest.raises(RemoteProtocolError, match="undecodable msgpack"):
            decode(encode(Notification("n", bad)), limits)
    wire = encode(Notification("n", ["y" * 50]))
    assert decode(wire, Limits(max_message_size=len(wire))) is not None
    with pytest.raises(MessageTooLarge, match=f"message of {len(wire)} bytes, at most"):
        decode(wire, Limits(max_message_size=len(wire) - 1))


def test_limits_reject_nonsense() -> None:
    with pytest.raises(ValueError, match="max_message_size must be a positive int"):
        Limits(max_message_size=0)
    with pytest.raises(ValueError, match="max_map_len must be a positive int"):
        Limits(max_map_len=True)


def test_stream_decoder_refuses_a_message_over_the_limit_before_reading_it_all() -> None:
    big = encode(Notification("n", ["z" * 1000]))
    decoder = StreamDecoder(Limits(max_message_size=100))
    decoder.feed(big[:100])
    with pytest.raises(MessageTooLarge) as info:
        decoder.next_message()
    assert info.value.stream_lost
    with pytest.raises(MessageTooLarge):  # final: asking again raises the same error
        decoder.next_message()


def test_stream_decoder_bounds_a_message_of_many_small_elements() -> None:
    # The unpacker builds an array element by element as bytes arrive, so its own
    # buffer stays small; the message bound must still hold, exactly.
    msg = Notification("n", ["ab"] * 300)
    wire = encode(msg)
    exact = StreamDecoder(Limits(max_message_size=len(wire)))
    short = StreamDecoder(Limits(max_message_size=len(wire) - 1))
    for i in range(0, len(wire), 7):
        exact.feed(wire[i : i + 7])
        short.feed(wire[i : i + 7])
    assert list(exact) == [msg]
    with pytest.raises(MessageTooLarge, match=f"longer than {len(wire) - 1} bytes"):
        list(short)


def test_stream_decoder_many_small_messages_beyond_the_buffer_bound() -> None:
    # One receive may carry more bytes than the bound in many small messages: they are
    # all delivered, never more than the bound buffered inside the unpacker at once.
    msgs = [Notification("n", [i]) for i in range(500)]
    wire = b"".join(map(encode, msgs))
    decoder = StreamDecoder(Limits(max_message_size=16))
    decoder.feed(wire)
    assert list(decoder) == msgs


def test_stream_decoder_after_garbage_is_final() -> None:
    decoder = StreamDecoder()
    decoder.feed(encode_notification("ok", []) + b"\xc1" + encode_notification("lost", []))
    assert decoder.next_message() == Notification("ok", [])
    with pytest.raises(RemoteProtocolError, match="undecodable") as info:
        decoder.next_message()
    assert info.value.stream_lost
    with pytest.raises(RemoteProtocolError, match="undecodable"):
        decoder.next_message()


def test_stream_decoder_a_bad_shape_is_consumed_and_the_stream_goes_on() -> None:
    decoder = StreamDecoder()
    decoder.feed(msgpack.packb([0, 4, 5, []]) + encode_notification("next", []))
    with pytest.raises(RemoteProtocolError, match="method must be a string") as info:
        decoder.next_message()
    assert info.value.msgid == 4 and not info.value.stream_lost
    assert decoder.next_message() == Notification("next", [])


def test_local_errors_encode_nothing() -> None:
    with pytest.raises(LocalProtocolError, match="msgid must be an int"):
        encode_request(2**32, "m", [])
    with pytest.raises(LocalProtocolError, match="msgid must be an int"):
        encode_response(True, None, None)
    with pytest.raises(LocalProtocolError, match="method must be a str"):
        encode_request(1, b"m", [])  # type: ignore[arg-type]
    with pytest.raises(LocalProtocolError, match="cannot encode as msgpack"):
        encode_request(1, "m", [object()])
    with pytest.raises(LocalProtocolError, match="not a message"):
        encode("x")  # type: ignore[arg-type]


def test_parse_error_reads_every_shape() -> None:
    assert parse_error([3, "bad args", {"type": "TypeError"}]) == ErrorInfo(
        3, "bad args", {"type": "TypeError"}
    )
    assert parse_error([3, "bad args", {"type": "TypeError"}]).type_name == "TypeError"
    # An error recorded by Redis's Lua encoder, which drops a trailing nil data.
    assert parse_error([9, "account 11 has 30"]) == ErrorInfo(9, "account 11 has 30")
    # A string is a peer's message (aio-msgpack-rpc's str(exc)), whatever it says.
    assert parse_error("boom") == ErrorInfo(Status.UNKNOWN, "boom")
    assert parse_error("NOT_FOUND: no such account") == ErrorInfo(
        Status.UNKNOWN, "NOT_FOUND: no such account"
    )
    assert parse_error({"weird": 1}).data == {"weird": 1}
    assert parse_error([1, b"raw msg"]).message == "raw msg"
    assert parse_error([1, 2]).message == "2"
    assert parse_error([1, "m"]).type_name is None
    assert parse_error([5, "m", "x", "y"]) == ErrorInfo(Status.UNKNOWN, "m", ["x", "y"], 5)


def test_a_peer_that_is_not_ours_never_gets_its_errors_read_as_ours() -> None:
    # Neovim: [error type, message]; its type is not a status (0 is not OK, 1 is not
    # CANCELLED): UNKNOWN, the type kept apart.
    assert parse_error([0, "Vim:E15: Invalid expression: 1 +"], ours=False) == ErrorInfo(
        Status.UNKNOWN, "Vim:E15: Invalid expression: 1 +", None, peer_type=0
    )
    assert parse_error([1, "Key not found: x"], ours=False) == ErrorInfo(
        Status.UNKNOWN, "Key not found: x", None, peer_type=1
    )
    # From a plain peer (no handshake), even our three-element shape is the peer's.
    assert parse_error([14, "going away", None], ours=False) == ErrorInfo(
        Status.UNKNOWN, "going away", None, peer_type=14
    )
    # Our plain shape read as a plain peer's [type, message]: the status in the text
    # is for people (Neovim, pynvim), never parsed.
    assert parse_error(plain_error(Status.UNAVAILABLE, "draining"), ours=False) == ErrorInfo(
        Status.UNKNOWN, "UNAVAILABLE: draining", None, peer_type=0
    )


def test_plain_errors_use_neovims_types() -> None:
    assert plain_error(Status.INVALID_ARGUMENT, "add() takes 2 argument(s), 1 given") == [
        1,
        "INVALID_ARGUMENT: add() takes 2 argument(s), 1 given",
    ]
    assert plain_error(Status.NOT_FOUND, "no such account", {"account": "a"}) == [
        0,
        "NOT_FOUND: no such account",
    ]
    assert plain_error(77, "odd", {"type": "X"}) == [0, "77: X: odd"]


@given(values, st.booleans())
def test_parse_error_never_fails_and_a_peer_that_is_not_ours_is_unknown(
    error: object, ours: bool
) -> None:
    info = parse_error(error, ours)
    assert isinstance(info.message, str)
    if not ours:
        assert info.code == Status.UNKNOWN


@given(st.integers(min_value=0, max_value=2**31), st.text(max_size=40), values)
def test_our_shape_round_trips_and_a_plain_peer_keeps_its_type(
    code: int, message: str, data: object
) -> None:
    assert parse_error([code, message, data]) == ErrorInfo(code, message, data)
    assert parse_error([code, message]) == ErrorInfo(code, message)
    plain = parse_error(plain_error(code, message, data), ours=False)
    assert plain.code == Status.UNKNOWN and plain.peer_type in (0, 1)
    assert plain.message.endswith(message)
