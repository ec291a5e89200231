"""The RPC client's address argument: one "host:port" string, as gosim.net.dial takes it."""

from __future__ import annotations

import gosim
from gosim import go, net
from idempotency.rpc import Client, Server


def test_one_address_string_is_one_address() -> None:
    """A str is a Sequence[str]: it must not be taken as addresses one character long."""

    async def main() -> int:
        srv = Server(heartbeat_interval=None)
        srv.add_method(lambda a, b: a + b, "add")
        ln = net.listen("tcp", "127.0.0.1:0")
        go(srv.serve, ln)
        client = Client(ln.addr(), heartbeat_interval=None, connect_attempts=1)
        try:
            return int(await client.call("add", 2, 3, timeout=10.0))
        finally:
            await client.close()
            await srv.shutdown(1.0)

    assert gosim.run(main) == 5


def test_a_list_of_addresses_still_works() -> None:
    async def main() -> int:
        srv = Server(heartbeat_interval=None)
        srv.add_method(lambda a, b: a + b, "add")
        ln = net.listen("tcp", "127.0.0.1:0")
        go(srv.serve, ln)
        client = Client([ln.addr()], heartbeat_interval=None, connect_attempts=1)
        try:
            return int(await client.call("add", 4, 5, timeout=10.0))
        finally:
            await client.close()
            await srv.shutdown(1.0)

    assert gosim.run(main) == 9
