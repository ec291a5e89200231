"""The plain-stream transport's writer: a peer that sends calls but never reads their
replies does not hold its connection (and the server's goroutines) until shutdown; the
server closes it once a write has made no progress for ``idle_timeout``."""

from __future__ import annotations

import errno
import select
import socket
import threading
import time

import gosim
from gosim import net
from idempotency.rpc import Server
from idempotency.rpc._protocol import encode_request

CALLS = 16
BLOB = b"x" * (1 << 20)  # each echo reply is 1 MiB: far more than the socket buffers


def flood_without_reading(addr: str, stop: threading.Event, out: dict[str, object]) -> None:
    """Send CALLS echo calls of 1 MiB on a non-blocking socket with a tiny receive
    buffer and never read; stop on an error from the server's side or on ``stop``,
    or after 20 s in any case (its own deadline: it never blocks in a socket call)."""
    host, port = addr.rsplit(":", 1)
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.settimeout(5)
    s.connect((host, int(port)))
    s.setblocking(False)
    data = memoryview(b"".join(encode_request(i, "echo", [BLOB]) for i in range(CALLS)))
    sent = 0
    deadline = time.monotonic() + 20
    try:
        while not stop.is_set() and time.monotonic() < deadline:
            if sent == len(data):
                stop.wait(0.05)
                continue
            select.select([], [s], [], 0.05)
            try:
                sent += s.send(data[sent : sent + 65536])
            except BlockingIOError:
                continue
            except OSError as exc:  # the server closed: a reset or a broken pipe
                out["error"] = errno.errorcode.get(exc.errno or 0, str(exc))
                return
    finally:
        out["sent"] = sent
        s.close()


def test_a_peer_that_never_reads_its_replies_loses_its_connection() -> None:
    stop = threading.Event()
    out: dict[str, object] = {}

    async def main() -> tuple[bool, float]:
        # A short send queue: its replies cannot all queue, so calls stay running
        # (blocked in send) and the reader's idle rule never applies; the default queue
        # (1024) needs more calls for the same.
        srv = Server(heartbeat_interval=None, idle_timeout=0.5, send_queue=2)

        @srv.method()
        def echo(blob: bytes) -> bytes:
            return blob

        ln = net.listen("tcp", "127.0.0.1:0")
        gosim.go(srv.serve_stream, ln)
        flooder = threading.Thread(target=flood_without_reading, args=(ln.addr(), stop, out))
        flooder.start()
        start = gosim.now()
        while not srv._stream_links and gosim.now() - start < 10:
            await gosim.sleep(0.01)
        assert srv._stream_links, "the flooder never connected"
        # Its replies fill the socket buffers; the writer's deadline must end the link.
        while srv._stream_links and gosim.now() - start < 15:
            await gosim.sleep(0.05)
        closed = not srv._stream_links
        took = gosim.now() - start
        stop.set()
        await gosim.syscall(flooder.join, 25)
        await srv.shutdown(0.5)
        return closed, took

    closed, took = gosim.run(main)
    assert closed, f"the connection was still open after {took:.1f} s ({out})"
