"""netframe.Later: a handler's reply settled later by other code, with no goroutine
waiting for it; on every handler strategy, with the in-flight slot, the send queue and
shutdown accounted for as for a handler goroutine."""

from __future__ import annotations

from typing import Any

import pytest

import gosim
from gosim import Chan, go
from netframe import Later
from netframe._client import Client, ConnectionLost
from netframe._server import Server

from .test_server import MemoryListener, vrun


class Parked:
    """A handler that answers every request with a Later, settled when the test says:
    ``release(n)`` replies to the oldest ``n`` (``b"re:" + payload``)."""

    def __init__(self, none_for: bytes = b"") -> None:
        self.waiting: list[tuple[Later, bytes]] = []
        self.none_for = none_for

    def __call__(self, payload: bytes) -> Later:
        later = Later()
        self.waiting.append((later, payload))
        return later

    def release(self, n: int | None = None) -> None:
        n = len(self.waiting) if n is None else n
        batch, self.waiting = self.waiting[:n], self.waiting[n:]
        for later, payload in batch:
            later.reply(None if payload == self.none_for else b"re:" + payload)

    async def release_from_a_goroutine(self) -> None:
        self.release()


def test_a_later_reply_is_sent_with_no_goroutine_waiting_for_it() -> None:
    """Replies settled in a burst by another goroutine all arrive; while they wait the
    server holds no goroutine per request; a None reply sends nothing."""
    handler = Parked(none_for=b"7")

    async def main() -> tuple[list[bytes], int, int, int]:
        ln = MemoryListener()
        server = Server(handler, heartbeat_interval=None)
        go(server.serve, ln)
        c = Client(ln.dial, heartbeat_interval=None)
        await c.connect()
        await c.send(b"0")
        while not handler.waiting:  # the connection's own goroutines are up
            await gosim.sleep(0.01)
        base = gosim.num_goroutine()
        for i in range(1, 50):
            await c.send(str(i).encode())
        while len(handler.waiting) < 50:
            await gosim.sleep(0.01)
        parked = gosim.num_goroutine() - base
        go(handler.release_from_a_goroutine)
        got = [await c.recv() for _ in range(49)]
        in_flight = server._conns and next(iter(server._conns)).in_flight
        await c.close()
        await server.shutdown()
        return sorted(got), parked, int(in_flight), server.statistics().handler_errors

    got, parked, in_flight, errors = vrun(main)
    assert got == sorted(b"re:" + str(i).encode() for i in range(50) if i != 7)
    assert parked == 0  # no goroutine per waiting request (an async handler: 49)
    assert in_flight == 0 and errors == 0


def test_a_later_settled_before_the_handler_returns_is_sent() -> None:
    def at_once(payload: bytes) -> Later:
        later = Later()
        later.reply(payload.upper())
        return later

    async def main() -> list[bytes]:
        ln = MemoryListener()
        server = Server(at_once, heartbeat_interval=None)
        go(server.serve, ln)
        c = Client(ln.dial, heartbeat_interval=None)
        await c.connect()
        for word in (b"a", b"b", b"c"):
            await c.send(word)
        got = [await c.recv() for _ in range(3)]
        await c.close()
        await server.shutdown()
        return got

    assert sorted(vrun(main)) == [b"A", b"B", b"C"]


@pytest.mark.parametrize("max_in_flight", [1, 3])
def test_later_replies_hold_the_in_flight_slots(max_in_flight: int) -> None:
    """At max_in_flight unsettled Laters the reader stops taking requests (inline: it
    awaits the one Later); settling them lets the rest in, and every reply arrives."""
    handler = Parked()

    async def main() -> tuple[list[int], list[bytes]]:
        ln = MemoryListener()
        server = Server(handler, heartbeat_interval=None, max_in_flight=max_in_flight)
        go(server.serve, ln)
        c = Client(ln.dial, heartbeat_interval=None)
        await c.connect()
        for i in range(7):
            await c.send(str(i).encode())
        seen = []
        while sum(seen) < 7:
            await gosim.sleep(0.05)  # the reader has taken what its slots allow
            seen.append(len(handler.waiting))
            handler.release()
        # (Inline, the replies to one receive leave together, after its last handler.)
        got = [await c.recv() for _ in range(7)]
        await c.close()
        await server.shutdown()
        return seen, got

    seen, got = vrun(main)
    assert max(seen) == max_in_flight
    assert sorted(got) == sorted(b"re:" + str(i).encode() for i in range(7))


def test_a_later_reply_that_meets_a_full_send_queue_waits_for_room() -> None:
    """Replies settled at once past send_queue wait (in a goroutine) for room, in the
    queue's order of arrival; none is lost, and the slot is freed after the send."""
    handler = Parked()

    async def main() -> tuple[int, int]:
        ln = MemoryListener()
        server = Server(handler, heartbeat_interval=None, send_queue=2)
        go(server.serve, ln)
        c = Client(ln.dial, heartbeat_interval=None)
        await c.connect()
        for i in range(40):
            await c.send(b"x" * 100 + str(i).encode())
        while len(handler.waiting) < 40:
            await gosim.sleep(0.01)
        handler.release()  # the client reads nothing yet: the queue fills
        await gosim.sleep(0.1)
        got = [await c.recv() for _ in range(40)]
        await gosim.sleep(0.1)
        st = next(iter(server._conns))
        in_flight = st.in_flight
        await c.close()
        await server.shutdown()
        return len(set(got)), in_flight

    assert vrun(main) == (40, 0)


def test_shutdown_waits_for_unsettled_laters_within_its_grace() -> None:
    handler = Parked()

    async def main() -> tuple[list[bytes], str]:
        ln = MemoryListener()
        server = Server(handler, heartbeat_interval=None, grace_period=5.0)
        go(server.serve, ln)
        c = Client(ln.dial, heartbeat_interval=None)
        await c.connect()
        for i in range(5):
            await c.send(str(i).encode())
        await gosim.sleep(0.1)
        go(server.shutdown)

        async def later_on() -> None:
            await gosim.sleep(1.0)
            handler.release()

        go(later_on)
        got: list[bytes] = []
        reason = ""
        try:
            while True:
                got.append(await c.recv())
        except ConnectionLost as exc:
            reason = exc.reason
        return sorted(got), reason

    got, reason = vrun(main)
    assert got == sorted(b"re:" + str(i).encode() for i in range(5))
    assert "GOAWAY(0)" in reason


def test_a_later_settled_after_its_connection_closed_is_lost_quietly() -> None:
    handler = Parked()

    async def main() -> tuple[int, int]:
        ln = MemoryListener()
        server = Server(handler, heartbeat_interval=None)
        go(server.serve, ln)
        c = Client(ln.dial, heartbeat_interval=None)
        await c.connect()
        await c.send(b"gone")
        while not handler.waiting:
            await gosim.sleep(0.01)
        await c.close()
        await gosim.sleep(0.1)
        handler.release()  # no panic, no error: the reply is lost with its connection
        await gosim.sleep(0.1)
        await server.shutdown()
        stats = server.statistics()
        return stats.connections, stats.handler_errors

    assert vrun(main) == (0, 0)


def test_a_later_is_awaitable_and_replies_once() -> None:
    async def main() -> tuple[Any, Any, str]:
        early = Later()
        early.reply(b"early")
        first = await early
        late = Later()
        done: Chan[Any] = Chan(1)

        async def waiter() -> None:
            await done.send(await late)

        go(waiter)
        await gosim.sleep(0.01)
        late.reply(b"late")
        second = await done.recv()
        try:
            late.reply(b"again")
        except RuntimeError as exc:
            return first, second, str(exc)
        return first, second, "no error"

    first, second, error = vrun(main)
    assert (first, second) == (b"early", b"late")
    assert "already" in error


def test_a_later_whose_awaiting_goroutine_left_drops_its_reply() -> None:
    # The awaiting goroutine leaves by an exception (a cancellation thrown in): the
    # Later's wait is withdrawn, and the work that replies later must not fail for it,
    # nor wake the goroutine that left; it parked as "netframe reply".
    async def main() -> tuple[str, bool]:
        later = Later()
        waiting = later.__await__()
        waiting.send(None)  # parked on the Later (the trap is for a driver not told)
        reason = str(gosim.lowlevel.current_g().waitreason)
        try:
            waiting.throw(KeyboardInterrupt())
        except KeyboardInterrupt:
            pass
        later.reply(b"too late")  # dropped: no RuntimeError
        return reason, later.done()

    assert vrun(main) == ("netframe reply", True)


def test_reply_hands_the_later_to_its_taker_once() -> None:
    """``reply_to`` is how the server takes a reply: ``reply`` settles the Later and
    calls the taker with it (once; a second reply is refused and calls nothing); a
    taker given after the reply is called at once; a second taker is refused."""
    handed: list[tuple[str, bytes | None]] = []

    def taker(arg: str, later: Later) -> None:
        handed.append((arg, later.result()))

    later = Later()
    later.reply_to(taker, "conn-1")
    with pytest.raises(RuntimeError, match="taker already"):
        later.reply_to(taker, "conn-2")
    assert handed == []
    later.reply(b"one")
    assert handed == [("conn-1", b"one")]
    with pytest.raises(RuntimeError, match="reply already"):
        later.reply(b"two")
    assert handed == [("conn-1", b"one")] and later.data is None

    early = Later()
    early.reply(None)
    early.reply_to(taker, "conn-3")
    assert handed[-1] == ("conn-3", None)


def test_a_later_with_a_taker_cannot_be_awaited_and_takes_no_data() -> None:
    """One consumer: awaiting a Later that has a taker is refused before it parks;
    ``Later()`` takes no data (its ``data`` holds the taker)."""
    later = Later()
    later.reply_to(lambda arg, done: None)

    async def main() -> str:
        try:
            await later
        except RuntimeError as exc:
            return str(exc)
        return "awaited"

    assert "taker already" in vrun(main)
    with pytest.raises(TypeError):
        Later(b"data")  # type: ignore[call-arg]
