"""A netframe Server in a process of its own, for tests that attack it from outside
(its descriptor limit, its memory). Run by test_hostile_peers.py.

python server_proc.py CONFIG_JSON

CONFIG_JSON keys (all optional): ``raw``, ``max_in_flight``, ``send_queue``,
``max_connections``, ``heartbeat_interval``, ``idle_timeout``, ``read_timeout`` (any
Server arguments); ``nofile``: the soft
RLIMIT_NOFILE to run under; ``amplify``: each reply is the request repeated this many
times (default 1, an echo).

Prints ``PORT <n>``, then serves. Each line on stdin is a command: ``stats`` prints
the server's stats as one JSON line. End of stdin shuts the server down and exits 0.
"""

from __future__ import annotations

import dataclasses
import json
import resource
import sys

import gosim
import netframe
from gosim import go, net


def main() -> None:
    config = json.loads(sys.argv[1])
    nofile = config.pop("nofile", None)
    if nofile is not None:
        _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, hard))
    amplify: int = config.pop("amplify", 1)

    def handler(payload: bytes) -> bytes:
        return payload * amplify

    # As a server should before taking traffic: without the C extension the frame scan
    # is a numba kernel, whose compilation would otherwise count in the first RSS rise.
    if not netframe._codec.C_ENABLED:
        netframe.load_kernel()

    async def run() -> None:
        ln = net.listen("tcp", "127.0.0.1:0")
        server = netframe.Server(handler, **config)
        go(server.serve, ln)
        print("PORT", ln.addr().rsplit(":", 1)[1], flush=True)
        while True:
            line = await gosim.syscall(sys.stdin.readline)
            if not line:
                break
            if line.strip() == "stats":
                print(json.dumps(dataclasses.asdict(server.statistics())), flush=True)
        await server.shutdown(grace=1.0)

    gosim.run(run, procs=1)


if __name__ == "__main__":
    main()
