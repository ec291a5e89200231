"""Keyed calls are resent until answered or out of time (issue 42): through a server
killed with SIGKILL and replaced on its port, and through a graceful shutdown's GOAWAY,
on both transports; unkeyed calls keep their at-most-once rule; every error of a keyed
call carries its key, and a resend under it returns the one run's outcome.

Real processes, real sockets on 127.0.0.1, real SQLite files; every wait is bounded.
"""

from __future__ import annotations

import random
import socket
import sqlite3
from pathlib import Path
from typing import Any

import pytest

import gosim
from gosim import Chan, go, net, recv, select
from idempotency import Idempotency, SQLiteStore
from idempotency.rpc import (
    CallTimeout,
    Client,
    ClientStatistics,
    RetryPolicy,
    RPCError,
    Server,
    Unavailable,
)

from .test_rpc import run_bounded
from .test_rpc_hostile import BOUND, ServerProcess

CLIENTS = 3  # connections: one client holds one
KEYED = 6  # keyed charges in flight per connection when the server dies
UNKEYED = 2  # unkeyed calls in flight beside them


def _payments_db(path: Path) -> None:
    with sqlite3.connect(path) as conn:  # the application's table, before the store opens
        conn.execute(
            "CREATE TABLE charges (key TEXT, account TEXT, amount_cents INTEGER, currency TEXT)"
        )
    conn.close()


def _charges(path: Path) -> dict[str, int]:
    with sqlite3.connect(path) as conn:
        rows = dict(conn.execute("SELECT key, COUNT(*) FROM charges GROUP BY key"))
    conn.close()
    return rows


async def _collect(out: Chan[tuple[str, Any]], n: int, bound: float) -> dict[str, Any]:
    got: dict[str, Any] = {}
    deadline = gosim.after(bound)
    while len(got) < n:
        i, item, _ = await select(recv(out), recv(deadline))
        if i == 1:
            raise AssertionError(f"only {len(got)} of {n} calls ended within {bound} s: {got}")
        assert item is not None
        got[item[0]] = item[1]
    return got


def _outcome(exc: BaseException) -> tuple[str, str, str | None]:
    return (type(exc).__name__, str(exc), getattr(exc, "key", None))


@pytest.mark.parametrize("transport", ["framed", "stream"])
def test_keyed_calls_outlive_a_server_killed_mid_flight(transport: str, tmp_path: Path) -> None:
    """Several keyed charges and two unkeyed calls in flight on each of three
    connections; the server process is killed with SIGKILL and a new one started on the
    same port and SQLite file. Every keyed charge is answered (none surfaces as
    Unavailable) and its row is written once; the unkeyed calls fail saying they may
    have run; the throttle is charged once per lost connection, not once per call."""
    db = tmp_path / "payments.db"
    _payments_db(db)
    base = {"transport": transport, "store": str(db), "lease": 1.0, "reuse_port": True}
    # The first server holds every charge (30 s) until it dies; its replacement answers.
    first = ServerProcess({**base, "charge_delay": 30.0})
    port = first.port
    procs = [first]

    async def main() -> tuple[dict[str, Any], list[ClientStatistics]]:
        out: Chan[tuple[str, Any]] = Chan(CLIENTS * (KEYED + UNKEYED))
        clients = [
            Client(
                f"127.0.0.1:{port}",
                transport=transport,
                caller="shop",
                # One dial spans the restart (about a second): no dial gives up meanwhile.
                connect_attempts=400,
                backoff_initial=0.02,
                backoff_max=0.05,
                retry=RetryPolicy(initial_backoff=0.02, max_backoff=0.2),
            )
            for _ in range(CLIENTS)
        ]

        async def charge(c: Client, key: str, amount: int) -> None:
            try:
                res = await c.call(
                    "charge", "acct-1", amount, "EUR", idempotency_key=key, timeout=3 * BOUND
                )
                await out.send((key, ("ok", res)))
            except RPCError as exc:
                await out.send((key, _outcome(exc)))

        async def unkeyed(c: Client, name: str) -> None:
            try:
                await out.send((name, ("ok", await c.call("slow", 30.0, name, timeout=3 * BOUND))))
            except RPCError as exc:
                await out.send((name, _outcome(exc)))

        for n, c in enumerate(clients):
            for i in range(KEYED):
                go(charge, c, f"k{n}-{i}", 100 + i)
            for i in range(UNKEYED):
                go(unkeyed, c, f"u{n}-{i}")
        # Wait until every call has entered the first server's methods: all in flight.
        want = {"charge": CLIENTS * KEYED, "slow": CLIENTS * UNKEYED}
        for _ in range(int(BOUND / 0.05)):
            stats = await gosim.syscall(first.stats)
            if stats["started"] == want:
                break
            await gosim.sleep(0.05)
        else:
            raise AssertionError(f"calls in the first server: {stats['started']}, not {want}")

        def kill_and_replace() -> None:
            first.proc.kill()  # SIGKILL: no GOAWAY, no reply, no completion
            first.proc.wait(BOUND)
            first.close()
            procs.append(ServerProcess({**base, "port": port, "charge_delay": 0.01}))

        await gosim.syscall(kill_and_replace)
        got = await _collect(out, CLIENTS * (KEYED + UNKEYED), 4 * BOUND)
        stats_list = [c.statistics() for c in clients]
        for c in clients:
            await c.close()
        return got, stats_list

    try:
        got, stats_list = run_bounded(main, 6 * BOUND)
    finally:
        for p in procs:
            p.close()
    keyed = {k: v for k, v in got.items() if k.startswith("k")}
    assert {k: v[0] for k, v in keyed.items()} == dict.fromkeys(keyed, "ok"), keyed
    assert all(v[1].startswith("charged 1") for v in keyed.values())
    # Each charge's effect happened exactly once, in the store's transactions.
    assert _charges(db) == {f"k{n}-{i}": 1 for n in range(CLIENTS) for i in range(KEYED)}
    # Unkeyed calls lost in flight are not resent (at most once), and say so.
    for name, (kind, message, key) in ((k, v) for k, v in got.items() if k.startswith("u")):
        assert kind == "Unavailable", (name, message)
        assert "may or may not have run" in message and key is None
    for s in stats_list:
        assert s.throttled == 0
        assert s.lost_in_flight >= KEYED + UNKEYED
        # One charge per lost connection or dial given up, not one per call it failed.
        assert s.throttle_failures <= s.connections_lost + s.connect_failures < s.lost_in_flight
        assert s.retries >= KEYED


def _hold_server(idem: Idempotency, runs: dict[int, int], seconds: float) -> Server:
    srv = Server(idempotency=idem, heartbeat_interval=None)

    @srv.method(idempotent=True)
    async def hold(x: int) -> int:
        runs[x] = runs.get(x, 0) + 1
        await gosim.sleep(seconds)
        return x * 10

    return srv


@pytest.mark.parametrize("transport", ["framed", "stream"])
def test_a_generated_key_travels_with_its_timeout_and_a_resend_gets_the_one_outcome(
    transport: str, tmp_path: Path
) -> None:
    """A call to a method of ``idempotent_methods`` (a generated key) times out while the
    method runs: the CallTimeout carries the key and says how to use it; resending under
    it returns the first attempt's outcome, and the method ran once."""
    runs: dict[int, int] = {}

    async def main() -> tuple[CallTimeout, Any, int]:
        store = SQLiteStore(tmp_path / "keys.db")
        srv = _hold_server(Idempotency(store), runs, 0.3)
        ln = net.listen("tcp", "127.0.0.1:0")
        go(srv.serve if transport == "framed" else srv.serve_stream, ln)
        c = Client(ln.addr(), transport=transport, caller="shop", idempotent_methods={"hold"})
        try:
            await c.call("hold", 7, timeout=0.05)
            raise AssertionError("the call did not time out")
        except CallTimeout as exc:
            err = exc
        again = await c.call_result("hold", 7, idempotency_key=err.key, timeout=BOUND)
        await c.close()
        await srv.shutdown(1.0)
        store.close()
        return err, again, runs[7]

    err, again, ran = run_bounded(main)
    assert isinstance(err.key, str) and len(err.key) == 32  # generated: 128 random bits
    assert f"resend under key {err.key!r}" in str(err) and f"key={err.key!r}" in repr(err)
    assert (again.result, again.key, again.replayed) == (70, err.key, True)
    assert ran == 1


def test_a_keyed_call_without_a_deadline_stops_at_the_resend_budget() -> None:
    """No server at all and no timeout: the keyed call is resent for the policy's
    resend budget, then fails with its key, never hanging."""
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        addr = f"127.0.0.1:{s.getsockname()[1]}"

    async def main() -> tuple[tuple[str, str, str | None], ClientStatistics]:
        c = Client(
            addr,
            connect_attempts=1,
            retry=RetryPolicy(initial_backoff=0.01, max_backoff=0.05, resend_budget=0.5),
        )
        try:
            await c.call("charge", "acct-1", 5, "EUR", idempotency_key="k-budget")
            raise AssertionError("a call reached no server and returned")
        except Unavailable as exc:
            got = _outcome(exc)
        return got, c.statistics()

    (kind, message, key), stats = run_bounded(main)
    assert (kind, key) == ("Unavailable", "k-budget")
    assert "no answer within the resend budget of 0.5 s" in message
    assert "resend under key 'k-budget'" in message
    # Past max_attempts (5) and the throttle: only the budget ended the resends.
    assert stats.attempts > 5 and stats.throttled == 0
    assert stats.connect_failures == stats.attempts == stats.throttle_failures


def test_the_resend_budget_is_a_finite_positive_time() -> None:
    for bad in (0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="resend_budget"):
            RetryPolicy(resend_budget=bad)


@pytest.mark.parametrize("transport", ["framed", "stream"])
def test_keyed_calls_move_to_a_new_connection_after_a_goaway(
    transport: str, tmp_path: Path
) -> None:
    """Server A shuts down gracefully (GOAWAY, then its connections close after a short
    grace) while a dozen keyed calls run on it: each call moves to a new connection
    (server B, sharing A's SQLite store) and returns the outcome of its one run."""
    runs: dict[int, int] = {}
    n_calls = 12

    async def main() -> tuple[dict[str, Any], ClientStatistics, int]:
        store = SQLiteStore(tmp_path / "shared.db")
        idem = Idempotency(store)
        a = _hold_server(idem, runs, 0.5)
        b = _hold_server(idem, runs, 0.5)
        ln_a = net.listen("tcp", "127.0.0.1:0")
        ln_b = net.listen("tcp", "127.0.0.1:0")
        serve = "serve" if transport == "framed" else "serve_stream"
        go(getattr(a, serve), ln_a)
        go(getattr(b, serve), ln_b)
        # Round-robin over the addresses: the first connection goes to A, the next to B.
        c = Client(
            [ln_a.addr(), ln_b.addr()],
            transport=transport,
            caller="shop",
            retry=RetryPolicy(initial_backoff=0.01, max_backoff=0.05),
        )
        out: Chan[tuple[str, Any]] = Chan(n_calls)

        async def one(x: int) -> None:
            try:
                res = await c.call_result("hold", x, idempotency_key=f"g{x}", timeout=BOUND)
                await out.send((f"g{x}", ("ok", res.result)))
            except RPCError as exc:
                await out.send((f"g{x}", _outcome(exc)))

        for x in range(n_calls):
            go(one, x)
        for _ in range(int(BOUND / 0.01)):  # every call running on A
            if len(runs) == n_calls:
                break
            await gosim.sleep(0.01)
        assert len(runs) == n_calls, runs
        await a.shutdown(0.05)  # the calls outlast the grace: their connection closes
        got = await _collect(out, n_calls, 2 * BOUND)
        stats = c.statistics()
        on_b = b.statistics().calls
        await c.close()
        await b.shutdown(1.0)
        store.close()
        return got, stats, on_b

    got, stats, on_b = run_bounded(main, 4 * BOUND)
    assert got == {f"g{x}": ("ok", x * 10) for x in range(n_calls)}
    assert runs == dict.fromkeys(range(n_calls), 1)  # each ran once, on A
    assert on_b >= n_calls  # every call was resent to B, which waited for A's run
    assert stats.throttled == 0 and stats.lost_in_flight == n_calls
    assert stats.throttle_failures <= stats.connections_lost < n_calls


def test_a_keyed_call_is_resent_up_to_its_deadline_whatever_the_backoff_draws() -> None:
    """Backoffs drawn longer than the time left (5 s against 0.5 s) are cut short: the
    keyed call keeps being resent until its deadline, and ends as CallTimeout."""
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        addr = f"127.0.0.1:{s.getsockname()[1]}"

    async def main() -> tuple[tuple[str, str, str | None], ClientStatistics]:
        c = Client(
            addr,
            connect_attempts=1,
            retry=RetryPolicy(initial_backoff=5.0, max_backoff=5.0),
            rng=random.Random(3),
        )
        try:
            await c.call("charge", "acct-1", 5, "EUR", idempotency_key="k-late", timeout=0.5)
            raise AssertionError("a call reached no server and returned")
        except CallTimeout as exc:
            got = _outcome(exc)
        return got, c.statistics()

    (kind, message, key), stats = run_bounded(main)
    assert (kind, key) == ("CallTimeout", "k-late")
    assert "deadline exceeded before resend" in message
    assert stats.attempts >= 3 and stats.throttled == 0
