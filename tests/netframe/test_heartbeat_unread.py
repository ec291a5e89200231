"""A heartbeat does not declare a peer dead whose bytes wait unread (this side's reader
is behind, as under overload), and still declares dead a peer that sent nothing new:
``_keep_alive`` against stand-in connections in virtual time, and FramedConn's
``unread_bytes`` on a real socket."""

from __future__ import annotations

import socket
from typing import Any

import gosim
from gosim import go, net
from netframe import FramedConn, Session
from netframe._drivers import _Conn, _HeartbeatEnd, _keep_alive

INTERVAL = 1.0
TIMEOUT = 2.0


class StandIn:
    """The parts of a FramedConn a heartbeat uses; ``unread`` says what the kernel
    holds at each look (a function of the look's number)."""

    def __init__(self, unread: Any) -> None:
        self.looks = 0
        self.bytes_read = 100
        self._unread = unread
        self.sent: list[bytes] = []

    def unread_bytes(self) -> int | None:
        self.looks += 1
        return self._unread(self.looks)  # type: ignore[no-any-return]

    def send_nowait(self, payload: bytes) -> bool:
        self.sent.append(payload)
        return True


def _watch(unread: Any, seconds: float) -> tuple[str, float, int]:
    """Run a heartbeat for a peer that is never read from; how it ended and when."""

    async def main() -> tuple[str, float, int]:
        session = Session(gosim.now(), heartbeat_interval=INTERVAL, heartbeat_timeout=TIMEOUT)
        fc = StandIn(unread)
        st = _Conn(fc, session)  # type: ignore[arg-type]
        out: gosim.Chan[_HeartbeatEnd] = gosim.Chan(1)

        async def beat() -> None:
            await out.send(await _keep_alive(st))

        go(beat)
        end = gosim.after(seconds)
        i, got, _ = await gosim.select(gosim.recv(out), gosim.recv(end))
        if i == 1:
            st.closed = True
            st.alarm.ring()
            return "alive", gosim.now(), fc.looks
        assert got is not None
        return got.value, gosim.now(), fc.looks

    return gosim.run(main, virtual_time=True)  # type: ignore[no-any-return]


def test_a_peer_whose_bytes_keep_arriving_unread_stays_alive() -> None:
    # 30 bytes more at each look: pings the reader has not taken.
    ended, _, looks = _watch(lambda n: 30 * n, seconds=20.0)
    assert ended == "alive" and looks >= 5


def test_bytes_that_never_change_do_not_keep_a_dead_peer() -> None:
    # The same 30 unread bytes at every look (a stalled reader): heard once, then dead.
    ended, when, _ = _watch(lambda n: 30, seconds=20.0)
    assert ended == "dead" and when <= 2 * TIMEOUT + 1e-9


def test_nothing_unread_or_unknown_is_dead_at_the_timeout() -> None:
    for unread in (lambda n: 0, lambda n: None):
        ended, when, _ = _watch(unread, seconds=20.0)
        assert ended == "dead" and when == TIMEOUT


def test_unread_bytes_counts_what_the_kernel_holds() -> None:
    async def main() -> tuple[int | None, int | None]:
        ln = net.listen("tcp", "127.0.0.1:0")
        host, port = ln.addr().rsplit(":", 1)
        peer = socket.create_connection((host, int(port)))
        fc = FramedConn(await ln.accept())
        empty = fc.unread_bytes()
        peer.sendall(b"\x00\x00\x00\x03abc" * 5)
        for _ in range(5000):  # bounded: 5 s at most for loopback to deliver 35 bytes
            if fc.unread_bytes() == 35:
                break
            await gosim.sleep(0.001)
        full = fc.unread_bytes()
        peer.close()
        await fc.aclose()
        ln.close()
        return empty, full

    assert gosim.run(main) == (0, 35)
