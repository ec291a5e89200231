"""The C ``Exchange`` in its frameless mode (a plain msgpack stream: a MsgpackCutter
reads, replies go out as the handler's bytes), called directly on loopback TCP sockets
with the owner a plain object: every state it hands back in, and what it leaves for its
caller then (``idempotency.rpc``'s ``StreamLink._reader`` is that caller; its tests are
tests/idempotency/test_rpc_stream_exchange.py)."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import msgpack
import pytest

from netframe import _conn as conn_module

pytestmark = pytest.mark.skipif(
    conn_module._Exchange is None, reason="netframe._speedups not in use (pure Python)"
)


class Owner:
    """The attributes the loop reads of its owner (a StreamLink's)."""

    def __init__(self) -> None:
        self.closed = False
        self._owed = 0
        self._handed = 0


def _msg(i: int, body: Any = None) -> bytes:
    return bytes(msgpack.packb([0, i, "m", [body]]))


def _reply(message: bytes) -> bytes:
    """The test handler's reply to a message: ``[1, msgid, None, params]``."""
    _, i, _, params = msgpack.unpackb(message)
    return bytes(msgpack.packb([1, i, None, params]))


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    """(the loop's socket, non-blocking; its peer's) over loopback TCP."""
    ln = socket.create_server(("127.0.0.1", 0))
    peer = socket.create_connection(ln.getsockname())
    ours, _ = ln.accept()
    ln.close()
    ours.setblocking(False)
    peer.settimeout(5)
    yield ours, peer
    ours.close()
    peer.close()


def _exchange(handler: Any, owner: Owner, max_owed: int = -1) -> tuple[Any, Any]:
    from netframe import MsgpackCutter  # noqa: PLC0415

    cutter = MsgpackCutter(1 << 22, 1 << 22, 1 << 22, 1 << 16, 1 << 16, 1 << 20, 64)
    return conn_module._Exchange(cutter, None, handler, owner, max_owed), cutter


def _run(ex: Any, sock: socket.socket) -> bool:
    """ex(fd) until it stops for its caller (True) or waits for input (False), as
    RawConn.read calls it; a receive not yet arrived is waited for a little."""
    import select  # noqa: PLC0415

    for _ in range(50):
        if ex(sock.fileno()):
            return True
        if not select.select([sock], [], [], 0.1)[0]:
            return False
    raise AssertionError("the loop never stopped")


def _recv_exactly(peer: socket.socket, n: int) -> bytes:
    got = b""
    while len(got) < n:
        chunk = peer.recv(n - len(got))
        assert chunk, "closed"
        got += chunk
    return got


def _nothing_to_read(peer: socket.socket) -> bool:
    peer.setblocking(False)
    try:
        peer.recv(1)
    except BlockingIOError:
        return True
    finally:
        peer.settimeout(5)
    return False


def test_the_replies_of_a_receive_leave_with_one_send_and_no_header(pair: Any) -> None:
    ours, peer = pair
    owner = Owner()
    msgs = [_msg(1, "a"), _msg(2, "skip"), _msg(3, "c")]

    def handler(message: bytes) -> bytes | None:
        return None if b"skip" in message else _reply(message)

    ex, _ = _exchange(handler, owner)
    peer.sendall(b"".join(msgs))
    assert _run(ex, ours) is False  # all handled; then it waits for input
    want = _reply(msgs[0]) + _reply(msgs[2])
    assert _recv_exactly(peer, len(want)) == want
    assert (ex.frames_in, ex.frames_out, ex.writes) == (3, 2, 1)
    assert owner._owed == 0


def test_a_message_begun_hands_back_after_the_whole_ones(pair: Any) -> None:
    ours, peer = pair
    ex, cutter = _exchange(_reply, Owner())
    second = _msg(2, "x" * 50)
    peer.sendall(_msg(1) + second[:5])
    assert _run(ex, ours) is True
    assert ex.state == conn_module.EXCHANGE_READER
    assert cutter.buffered == 5
    assert _recv_exactly(peer, len(_reply(_msg(1)))) == _reply(_msg(1))
    # And again at once: the caller reads on (the message's deadline is its).
    assert ex(ours.fileno()) is True
    assert ex.state == conn_module.EXCHANGE_READER


def test_the_end_of_the_stream_and_the_cutters_error_hand_back(pair: Any) -> None:
    ours, peer = pair
    ex, cutter = _exchange(_reply, Owner())
    peer.sendall(_msg(1) + b"\xc1" + _msg(2))
    assert _run(ex, ours) is True
    assert ex.state == conn_module.EXCHANGE_READER
    assert cutter.error is not None and "0xc1" in cutter.error
    assert ex.frames_in == 1  # the message before the error was handled and answered
    assert _recv_exactly(peer, len(_reply(_msg(1)))) == _reply(_msg(1))

    ex2, cutter2 = _exchange(_reply, Owner())
    ours2, peer2 = socket.socketpair()
    try:
        ours2.setblocking(False)
        peer2.sendall(_msg(7))
        peer2.shutdown(socket.SHUT_WR)
        assert _run(ex2, ours2) is True
        assert ex2.state == conn_module.EXCHANGE_READER
        assert cutter2.eof and ex2.frames_in == 1
    finally:
        ours2.close()
        peer2.close()


def test_an_awaitable_result_hands_back_with_the_replies_before_it(pair: Any) -> None:
    ours, peer = pair
    waiting = object()  # anything neither bytes nor None: the caller awaits it

    def handler(message: bytes) -> Any:
        return waiting if b"wait" in message else _reply(message)

    ex, _ = _exchange(handler, Owner())
    msgs = [_msg(1), _msg(2, "wait"), _msg(3)]
    peer.sendall(b"".join(msgs))
    assert _run(ex, ours) is True
    assert ex.state == conn_module.EXCHANGE_PENDING
    assert ex.take_replies() == [_reply(msgs[0])]  # for the caller to send first
    with pytest.raises(RuntimeError):
        ex(ours.fileno())  # the pending result is not taken yet
    assert ex.take_pending() == (waiting, False)
    ex.resume(None)
    assert _run(ex, ours) is False
    assert _recv_exactly(peer, len(_reply(msgs[2]))) == _reply(msgs[2])
    assert ex.frames_in == 3


def test_the_owed_bound_is_checked_before_each_receive_and_each_message(pair: Any) -> None:
    ours, peer = pair
    owner = Owner()
    msgs = [_msg(i, "y" * 20) for i in range(3)]
    size = len(_reply(msgs[0]))
    ex, _ = _exchange(_reply, owner, max_owed=size)
    owner._owed = size + 1  # owed already: no receive
    peer.sendall(b"".join(msgs))
    assert ex(ours.fileno()) is True
    assert ex.state == conn_module.EXCHANGE_OWED
    assert ex.frames_in == 0
    owner._owed = 0
    # The first reply brings the owed bytes to the bound, the second over it: the
    # third message waits, and the gathered replies go to the caller.
    assert _run(ex, ours) is True
    assert ex.state == conn_module.EXCHANGE_OWED
    assert ex.frames_in == 2
    with pytest.raises(RuntimeError):
        ex(ours.fileno())  # the replies handed back are not taken
    assert ex.take_replies() == [_reply(m) for m in msgs[:2]]
    assert _run(ex, ours) is False
    assert ex.frames_in == 3
    assert _recv_exactly(peer, size) == _reply(msgs[2])


def test_replies_go_to_the_caller_while_the_writer_has_items(pair: Any) -> None:
    ours, peer = pair
    owner = Owner()
    owner._handed = 1
    ex, _ = _exchange(_reply, owner)
    peer.sendall(_msg(1))
    assert _run(ex, ours) is True
    assert ex.state == conn_module.EXCHANGE_WRITE_GENERAL
    assert ex.take_replies() == [_reply(_msg(1))]
    assert _nothing_to_read(peer)
    assert ex.frames_out == 0


def test_a_send_the_socket_does_not_take_whole_hands_the_rest_back(pair: Any) -> None:
    ours, peer = pair
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    big = b"z" * (4 << 20)
    ex, _ = _exchange(lambda m: big, Owner())
    peer.sendall(_msg(1))
    assert _run(ex, ours) is True
    assert ex.state == conn_module.EXCHANGE_WRITE_HANDOFF
    rest = ex.take_unsent()
    assert 0 < len(rest) < len(big)
    assert (ex.frames_out, ex.writes) == (0, 1)  # counted once the rest is sent
    sent = len(big) - len(rest)
    assert _recv_exactly(peer, sent) == big[:sent]
    assert rest == big[sent:]


def test_a_send_that_fails_hands_the_replies_back_unsent() -> None:
    ours, peer = socket.socketpair()
    try:
        ours.setblocking(False)
        ex, _ = _exchange(_reply, Owner())
        peer.sendall(_msg(1))
        peer.close()  # the send meets a broken pipe
        assert _run(ex, ours) is True
        assert ex.state == conn_module.EXCHANGE_WRITE_GENERAL
        assert ex.take_replies() == [_reply(_msg(1))]  # the caller's send ends the link
    finally:
        ours.close()


def test_a_handler_that_closes_the_owner_stops_the_loop_with_nothing_sent(pair: Any) -> None:
    ours, peer = pair
    owner = Owner()

    def handler(message: bytes) -> bytes:
        owner.closed = True
        return _reply(message)

    ex, _ = _exchange(handler, owner)
    peer.sendall(_msg(1) + _msg(2))
    assert _run(ex, ours) is True
    assert ex.state == conn_module.EXCHANGE_CLOSED
    assert ex.frames_in == 2  # a receive's messages are all handled, as by the Python reader
    assert ex.take_replies() == []
    assert _nothing_to_read(peer)


def test_a_handlers_exception_propagates_after_its_message_is_counted(pair: Any) -> None:
    ours, peer = pair

    def handler(message: bytes) -> bytes:
        if msgpack.unpackb(message)[1] == 2:
            raise ValueError("bad")
        return _reply(message)

    ex, _ = _exchange(handler, Owner())
    peer.sendall(_msg(1) + _msg(2) + _msg(3))
    with pytest.raises(ValueError, match="bad"):
        _run(ex, ours)
    assert ex.frames_in == 2


def test_the_frameless_mode_takes_no_writer() -> None:
    from netframe import MsgpackCutter  # noqa: PLC0415

    cutter = MsgpackCutter(100, 10, 10, 10, 10, 10, 10)
    with pytest.raises(TypeError):
        conn_module._Exchange(cutter, b"", _reply, Owner(), -1)
    ex = conn_module._Exchange(cutter, None, _reply, Owner(), -1)
    ex.release()
    with pytest.raises(RuntimeError, match="released"):
        ex(0)
