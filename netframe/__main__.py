"""A short tour of netframe: ``python -m netframe``.

Runs a framed server on loopback TCP (127.0.0.1, an ephemeral port) inside a gosim
runtime: three clients connect, exchange frames, stay quiet long enough for heartbeats
to keep their connections alive, and close; the server shuts down gracefully and prints
its statistics. ``python -m gosim`` tours the runtime underneath.
"""

from __future__ import annotations

import gosim
import netframe
from gosim import Chan, go, net


async def long_connections() -> None:
    """A netframe server on loopback TCP: heartbeats, three clients, graceful shutdown."""

    async def shout(payload: bytes) -> bytes:
        return payload.upper()

    ln = net.listen("tcp", "127.0.0.1:0")
    server = netframe.Server(shout, heartbeat_interval=0.05)
    go(server.serve, ln)
    replies: Chan[str] = Chan(3)

    async def client(name: str) -> None:
        c = netframe.Client(lambda: net.dial("tcp", ln.addr()), heartbeat_interval=0.05)
        await c.connect()
        await c.send(f"hello from {name}".encode())
        first = await c.recv()
        await gosim.sleep(0.2)  # quiet for four heartbeat intervals: pings keep it alive
        await c.send(b"still there?")
        second = await c.recv()
        await c.close()
        await replies.send(f"{first.decode()} / {second.decode()}")

    for name in ("ada", "bob", "cy"):
        go(client, name)
    answers = sorted([await replies.recv() or "" for _ in range(3)])
    await server.shutdown()
    st = server.statistics()
    print(f"netframe tour: long connections on {ln.addr()}:")
    for a in answers:
        print(f"  {a}")
    print(
        f"  server: accepted={st.accepted} frames in={st.frames_received} "
        f"out={st.frames_sent} dead peers={st.dead_peers} (heartbeats every 50 ms)"
    )


if __name__ == "__main__":
    gosim.run(long_connections)
