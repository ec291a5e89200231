"""Interoperability with a framing implementation written elsewhere: Twisted's
Int32StringReceiver (4-byte big-endian length prefix) as server and as client, against
netframe over real loopback sockets."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import gosim
import netframe
from gosim import net

pytest.importorskip("twisted", reason="Twisted is a dev dependency (pip install -e '.[dev]')")

PEER = Path(__file__).with_name("twisted_peer.py")


def payload(i: int) -> bytes:  # the same sequence as twisted_peer.payload
    return bytes((i * 7 + k) % 256 for k in range((i * 37) % 5000))


def test_netframe_client_against_twisted_server() -> None:
    proc = subprocess.Popen(
        [sys.executable, str(PEER), "server"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline().split()[1])

        async def main() -> int:
            fc = netframe.FramedConn(await net.dial("tcp", f"127.0.0.1:{port}", timeout=10))
            n = 300
            await fc.write_frames(payload(i) for i in range(n))
            ok = 0
            for i in range(n):
                ok += await fc.read_frame() == payload(i)
            fc.conn.close()
            return ok

        assert gosim.run(main, procs=2) == 300
    finally:
        proc.kill()
        proc.wait(timeout=30)
        if proc.stdout is not None:
            proc.stdout.close()


@pytest.mark.parametrize("max_in_flight", [1, 64])
def test_twisted_client_against_netframe_server(max_in_flight: int) -> None:
    # Twisted's client pipelines all its strings and matches echoes by order. With 64
    # handlers at once, the longer payloads take longer here, so the handlers finish
    # out of order: the replies must still leave in request order.
    async def echo(data: bytes) -> bytes:
        await gosim.sleep(len(data) % 7 / 1000)
        return data

    async def main() -> str:
        ln = net.listen("tcp", "127.0.0.1:0")
        port = ln.addr().rsplit(":", 1)[1]
        server = netframe.Server(echo, raw=True, max_in_flight=max_in_flight)
        gosim.go(server.serve, ln)

        def client() -> subprocess.CompletedProcess[str]:
            cmd = [sys.executable, str(PEER), "client", port, "300"]
            return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)

        out = await gosim.syscall(client)
        await server.shutdown()
        return out.stdout.strip() + out.stderr.strip()

    assert gosim.run(main, procs=2) == "OK 300"
