"""netframe.Later replies settled in one pass (a group commit answering its batch) leave
together: one send per connection at the end of the pass, every reply, in the order
settled, over real loopback TCP (the C send path where built; the writer goroutine on
the pure-Python path)."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

import gosim
import netframe
from gosim import go, net
from netframe import Later


class Parked:
    """Answers every request with a Later, kept by payload until the test settles it."""

    def __init__(self) -> None:
        self.waiting: dict[bytes, Later] = {}

    def __call__(self, payload: bytes) -> Later:
        later = Later()
        self.waiting[payload] = later
        return later


def _reply(payload: bytes) -> bytes:
    return b"re:" + payload


async def _serve(handler: Parked, conns: int) -> tuple[netframe.Server, list[netframe.Client], Any]:
    ln = net.listen("tcp", "127.0.0.1:0")
    server = netframe.Server(handler, heartbeat_interval=None, max_in_flight=1024)
    go(server.serve, ln)
    clients = []
    for _ in range(conns):
        c = netframe.Client(lambda: net.dial("tcp", ln.addr()), heartbeat_interval=None)
        await c.connect()
        clients.append(c)
    return server, clients, ln


def _writes(server: netframe.Server) -> int:
    return sum(st.fc.statistics().writes for st in server._conns)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hs.data())
def test_replies_settled_in_passes_arrive_all_in_order_one_send_per_connection(
    data: hs.DataObject,
) -> None:
    sizes = data.draw(hs.lists(hs.integers(1, 8), min_size=1, max_size=4), label="requests")
    requests = [b"%d/%d" % (c, i) for c, n in enumerate(sizes) for i in range(n)]
    order = data.draw(hs.permutations(requests), label="settle order")
    cuts = (
        sorted(data.draw(hs.sets(hs.integers(1, len(order) - 1)), label="cuts"))
        if (len(order) > 1)
        else []
    )
    passes = [order[a:b] for a, b in zip([0, *cuts], [*cuts, len(order)], strict=True)]

    async def main() -> tuple[list[list[bytes]], list[tuple[int, int]], int]:
        handler = Parked()
        server, clients, ln = await _serve(handler, len(sizes))
        for c, n in enumerate(sizes):
            for i in range(n):
                await clients[c].send(b"%d/%d" % (c, i))
        while len(handler.waiting) < len(requests):
            await gosim.sleep(0.005)
        got: list[list[bytes]] = [[] for _ in sizes]
        sends: list[tuple[int, int]] = []  # (connections answered, sends made) a pass
        for one_pass in passes:
            before = _writes(server)
            for payload in one_pass:  # settled in one go, as a commit's batch is
                handler.waiting.pop(payload).reply(_reply(payload))
            owed = sorted({int(p.split(b"/")[0]) for p in one_pass})
            for c in owed:
                for _ in range(sum(int(p.split(b"/")[0]) == c for p in one_pass)):
                    got[c].append(await clients[c].recv())
            sends.append((len(owed), _writes(server) - before))
        in_flight = sum(st.in_flight for st in server._conns)
        for client in clients:
            await client.close()
        await server.shutdown()
        ln.close()
        return got, sends, in_flight

    got, sends, in_flight = gosim.run(main)
    for c in range(len(sizes)):
        settled = [_reply(p) for p in order if int(p.split(b"/")[0]) == c]
        assert got[c] == settled  # every reply, in the order settled
    assert all(made == answered for answered, made in sends)  # one send a connection
    assert in_flight == 0  # every Later's slot freed once its reply was sent


def test_gathered_replies_the_socket_cannot_take_at_once_go_on_through_the_writer() -> None:
    """A pass's replies larger than the socket takes: the rest goes to the connection's
    writer, which sends it ahead of later replies; all arrive, in order."""
    big = 400_000
    count = 6

    async def main() -> tuple[list[bytes], list[bytes], int]:
        handler = Parked()
        server, (client,), ln = await _serve(handler, 1)
        payloads = [b"%d:" % i + b"x" * big for i in range(count)]
        for p in payloads:
            await client.send(p)
        while len(handler.waiting) < count:
            await gosim.sleep(0.005)
        for p in payloads[:-1]:
            handler.waiting.pop(p).reply(_reply(p))
        await gosim.sleep(0.05)  # the first pass sent, its rest with the writer
        handler.waiting.pop(payloads[-1]).reply(_reply(payloads[-1]))
        got = [await client.recv() for _ in range(count)]
        in_flight = sum(st.in_flight for st in server._conns)
        await client.close()
        await server.shutdown()
        ln.close()
        return got, [_reply(p) for p in payloads], in_flight

    got, want, in_flight = gosim.run(main)
    assert got == want
    assert in_flight == 0
