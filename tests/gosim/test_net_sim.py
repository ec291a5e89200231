"""The simulated network: same seed, same bytes and faults; partitions and resets as
planned; netframe's server detects a partitioned peer through heartbeats."""

from __future__ import annotations

import pytest

import gosim
import netframe
from gosim import Chan, go, net


async def system(seed: int, reset_rate: float, log: bool = True) -> tuple[list[bytes], bytes]:
    """A small client/server system: 5 clients, 20 messages each, an echo server."""
    network = net.SimNetwork(
        seed=seed,
        latency=(0.001, 0.02),
        bandwidth=1e6,
        reset_rate=reset_rate,
        **({} if log else {"log": None}),
    )
    net.use_sim_network(network)
    ln = net.listen("sim", "server:1")

    async def serve() -> None:
        while True:
            try:
                c = await ln.accept()
            except net.ClosedError:
                return

            async def handle(c: net.SimConn) -> None:
                try:
                    while data := await c.read(4096):
                        await c.write(data)
                except net.BrokenError:
                    pass
                c.close()

            go(handle, c)

    go(serve)
    out: Chan[bytes] = Chan(100)

    async def client(k: int) -> None:
        c = await net.dial("sim", "server:1", local_host=f"c{k}")
        got = b""
        try:
            for i in range(20):
                msg = b"<%d.%d>" % (k, i)
                await c.write(msg)
                got += await c.read_exactly(len(msg))
                await gosim.sleep(0.01 * (k + 1))
        except net.BrokenError:
            got += b"!reset"
        c.close()
        await out.send(got)

    for k in range(5):
        go(client, k)
    results = sorted([await out.recv() or b"" for _ in range(5)])
    ln.close()
    return results, network.log_bytes()


def replay(seed: int, reset_rate: float = 0.0, log: bool = True) -> tuple[list[bytes], bytes]:
    result: tuple[list[bytes], bytes] = gosim.run(
        system, seed, reset_rate, log, procs=2, seed=seed, virtual_time=True
    )
    return result


def test_a_network_without_a_log_keeps_no_events_and_runs_the_same() -> None:
    """``log=None``: a long simulation does not keep a tuple per segment; the run is the
    same one (the log only watches)."""
    logged, quiet = replay(7, reset_rate=0.02), replay(7, reset_rate=0.02, log=False)
    assert logged[1] and quiet[1] == b""
    assert quiet[0] == logged[0]


def test_same_seed_same_bytes_delivered_and_same_faults() -> None:
    first = replay(7, reset_rate=0.02)
    assert b"reset" in first[1]  # the plan's resets happen
    for _ in range(3):
        assert replay(7, reset_rate=0.02) == first


def test_different_seeds_differ_and_clean_runs_deliver_everything() -> None:
    a, b = replay(1), replay(2)
    assert a[1] != b[1]
    assert (
        a[0] == b[0] == sorted(b"".join(b"<%d.%d>" % (k, i) for i in range(20)) for k in range(5))
    )


def test_partition_holds_segments_and_refuses_dials_until_it_heals() -> None:
    async def main() -> tuple[float, str]:
        network = net.SimNetwork(
            seed=3, latency=(0.01, 0.01), partitions=[(1.0, 4.0, {"a"}, {"server"})]
        )
        net.use_sim_network(network)
        ln = net.listen("sim", "server:1")
        accepted: Chan[net.SimConn] = Chan(1)

        async def acceptor() -> None:
            await accepted.send(await ln.accept())  # type: ignore[arg-type]

        go(acceptor)
        c = await net.dial("sim", "server:1", local_host="a")
        s = await accepted.recv()
        assert s is not None
        await gosim.sleep(2.0)  # now inside the partition
        refused = ""
        try:
            await net.dial("sim", "server:1", local_host="a")
        except ConnectionRefusedError:
            refused = "refused"
        sent_at = gosim.now()
        await c.write(b"held")
        await s.read_exactly(4)
        assert 1.0 < sent_at < 4.0
        return gosim.now(), refused

    arrived, refused = gosim.run(main, procs=1, seed=3, virtual_time=True)
    assert refused == "refused"
    assert arrived == pytest.approx(4.0 + 0.01)  # held until the heal at t=4, then one latency


def test_netframe_server_detects_a_partitioned_client_by_heartbeats() -> None:
    async def echo(p: bytes) -> bytes:
        return p

    async def main() -> int:
        net.use_sim_network(net.SimNetwork(seed=5, partitions=[(2.0, 100.0, {"c"}, {"server"})]))
        ln = net.listen("sim", "server:1")
        server = netframe.Server(echo, heartbeat_interval=0.5)
        go(server.serve, ln)
        client = netframe.Client(
            lambda: net.dial("sim", "server:1", local_host="c"), heartbeat_interval=0.5
        )
        await client.connect()
        await client.send(b"hi")
        assert await client.recv() == b"hi"
        await gosim.sleep(5.0)  # the partition began at t=2: two intervals later, dead
        dead = server.statistics().dead_peers
        await server.shutdown(grace=0)
        return dead

    assert gosim.run(main, procs=1, seed=5, virtual_time=True) == 1


async def resetting_system(resets: frozenset[int] | None) -> tuple[list[int], bytes]:
    """Three echo clients, ten messages each, reconnecting after every reset."""
    network = net.SimNetwork(seed=11, latency=(0.001, 0.01), reset_rate=0.1, resets=resets)
    net.use_sim_network(network)
    ln = net.listen("sim", "server:1")

    async def handle(c: net.SimConn) -> None:
        try:
            while data := await c.read(4096):
                await c.write(data)
        except net.BrokenError:
            pass
        c.close()

    async def serve() -> None:
        while True:
            try:
                c = await ln.accept()
            except net.ClosedError:
                return
            go(handle, c)

    done: Chan[None] = Chan(3)

    async def client(k: int) -> None:
        conn: net.SimConn | None = None
        for i in range(10):
            while True:
                try:
                    if conn is None:
                        conn = await net.dial("sim", "server:1", local_host=f"c{k}")
                    await conn.write(b"<%d.%d>" % (k, i))
                    await conn.read_exactly(len(b"<%d.%d>" % (k, i)))
                    break
                except net.BrokenError:
                    conn.close()  # type: ignore[union-attr]
                    conn = None
        await done.send(None)

    go(serve)
    for k in range(3):
        go(client, k)
    for _ in range(3):
        await done.recv()
    ln.close()
    return list(network.resets_made), network.log_bytes()


def test_named_resets_replay_the_run_and_fewer_of_them_remove_only_those() -> None:
    def run(resets: frozenset[int] | None) -> tuple[list[int], bytes]:
        out: tuple[list[int], bytes] = gosim.run(
            resetting_system, resets, procs=1, seed=11, virtual_time=True
        )
        return out

    made, log = run(None)
    assert len(made) >= 2 and made == sorted(made)
    # Naming the resets a run made is that run again, event for event.
    assert run(frozenset(made)) == (made, log)
    # Keeping the first only: the same run up to and including it, and no other reset.
    first_made, first_log = run(frozenset(made[:1]))
    assert first_made == made[:1]
    cut = log.index(b" reset ")
    cut = log.index(b"\n", cut) + 1
    assert first_log[:cut] == log[:cut]
    assert first_log.count(b" reset ") == 1
    # None named: none happen, though the rate draws them.
    assert run(frozenset())[0] == [] and b" reset " not in run(frozenset())[1]
