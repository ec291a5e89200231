"""The plain-stream transport answers the messages of a receive together: whatever way
the peer's bytes are split into receives, every call gets its reply, plain calls'
replies in request order, bad messages with a msgid answered, notifications not, and a
message that is whole msgpack but does not decode (a str that is not UTF-8) costs
only itself, not the stream."""

from __future__ import annotations

from typing import Any

import msgpack
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

import gosim
from gosim import go, net
from idempotency.rpc import Server

# One message of the peer's: a plain call, an async call, a notification, or a request
# with a bad shape (a msgid and a method that is not a str: answered INVALID_ARGUMENT),
# or one whose method is not UTF-8 (it does not decode: no msgid read, no answer).
KINDS = hs.sampled_from(["sync", "async", "note", "bad", "garbled"])


def _message(kind: str, msgid: int) -> bytes:
    if kind == "garbled":  # [0, msgid, <str of the bytes ff fe>, []]
        return b"\x94\x00" + bytes(msgpack.packb(msgid)) + b"\xa2\xff\xfe\x90"
    shape: list[Any] = {
        "sync": [0, msgid, "echo", [msgid]],
        "async": [0, msgid, "aecho", [msgid]],
        "note": [2, "echo", [msgid]],
        "bad": [0, msgid, 7, []],
    }[kind]
    return bytes(msgpack.packb(shape))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hs.lists(KINDS, min_size=1, max_size=30), hs.data())
def test_every_call_of_a_stream_split_anyhow_is_answered(
    kinds: list[str], data: hs.DataObject
) -> None:
    wire = b"".join(_message(kind, i) for i, kind in enumerate(kinds))
    cuts = sorted(data.draw(hs.sets(hs.integers(1, max(1, len(wire) - 1))), label="cuts"))
    chunks = [wire[a:b] for a, b in zip([0, *cuts], [*cuts, len(wire)], strict=True) if a < b]
    owed = {i for i, kind in enumerate(kinds) if kind not in ("note", "garbled")}

    async def main() -> list[list[Any]]:
        srv = Server(heartbeat_interval=None)

        @srv.method()
        def echo(x: int) -> int:
            return x

        @srv.method()
        async def aecho(x: int) -> int:
            await gosim.sleep(0)
            return x

        ln = net.listen("tcp", "127.0.0.1:0")
        go(srv.serve_stream, ln)
        conn = await net.dial("tcp", ln.addr())
        for chunk in chunks:
            await conn.write(chunk)
            await gosim.sleep(0)  # the server may take this chunk as a receive of its own
        unpacker = msgpack.Unpacker()
        replies: list[list[Any]] = []
        while len(replies) < len(owed):
            got = await conn.read(65536)
            assert got, "the server closed the stream"
            unpacker.feed(got)
            replies.extend(unpacker)
        conn.close()
        await srv.shutdown(grace=1.0)
        ln.close()
        return replies

    replies = gosim.run(main)
    assert sorted(int(r[1]) for r in replies) == sorted(owed)  # each once
    for r in replies:
        i = int(r[1])
        if kinds[i] == "bad":
            assert r[2] is not None and r[3] is None
        else:
            assert r[2] is None and r[3] == i
    plain = [int(r[1]) for r in replies if kinds[int(r[1])] in ("sync", "bad")]
    assert plain == sorted(plain)  # the reader's own replies keep the request order
