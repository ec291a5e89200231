"""A client process of the demo: many long connections issuing idempotent transfers.

Each connection is one :class:`~idempotency.rpc.Client` with its own caller name and
heartbeats, running transfers between random accounts until the deadline, one call in
flight at a time, each with a fresh idempotency key that every retry reuses. Then it
reconciles: a call whose outcome it never learnt (the retries ran out while the server
was down) is asked again with the same key until it gets an answer, so at the end every
transfer the client issued is either acknowledged or refused, and the log says which.

Between transfers a connection now and then reads one account's balance
(:data:`READ_SHARE` of its operations). The log has each transfer's call and return
times (when it was first sent, when its outcome arrived) and each answered balance read
with its times, on one clock for every process of a run (:func:`run_fleet`'s ``clock``):
the history the audit checks for linearizability.

Every half second the process prints a JSON line of its counters and latencies; at the
end it writes its log (one JSON object per issued transfer or answered balance read) and
a last line.
"""

from __future__ import annotations

import json
import os
import random
import signal
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import gosim
from gosim import Chan, go, net

from ..rpc import CallTimeout, Client, RetryPolicy, RPCError
from ._audit import MAX_AMOUNT, caller_name
from ._ledger import process_trace, raise_nofile_limit, write_trace

__all__ = ["run_clients", "run_fleet"]

#: How long a connection keeps asking about transfers whose outcome it does not know,
#: once its transfers have stopped (seconds): a killed server's claims lapse in LEASE.
RECONCILE_FOR = 60.0
#: Connections a client process opens per second at its start.
RAMP_RATE = 250.0
#: The share of a connection's operations that read a balance rather than transfer.
READ_SHARE = 0.2


class _Stats:
    def __init__(self) -> None:
        self.acked = 0
        self.refused = 0
        self.unknown = 0
        self.in_flight = 0
        self.latencies: list[float] = []  # since the last report
        self.all_latencies: list[float] = []

    def line(self, clients: list[Client], done: bool = False) -> str:
        stats = [c.statistics() for c in clients]
        self.all_latencies += self.latencies
        # Live lines show the last half second; the last line the whole run.
        lat = sorted(self.all_latencies if done else self.latencies)
        self.latencies = []

        def pct(p: float) -> float | None:
            return round(lat[min(len(lat) - 1, int(p * len(lat)))] * 1000, 2) if lat else None

        return json.dumps(
            {
                "acked": self.acked,
                "refused": self.refused,
                "unknown": self.unknown,
                "in_flight": self.in_flight,
                "retries": sum(s.retries for s in stats),
                "replays": sum(s.replays for s in stats),
                "reconnects": sum(max(s.connects - 1, 0) for s in stats),
                "found_dead": sum(s.servers_found_dead for s in stats),
                "p50_ms": pct(0.5),
                "p99_ms": pct(0.99),
                "cpu": round(time.process_time(), 3),
                "done": done,
            }
        )


async def run_fleet(
    dial: Callable[[], Awaitable[Any]],
    ident: int,
    connections: int,
    accounts: int,
    seconds: float,
    seed: int,
    heartbeat: float,
    *,
    report: Callable[[str], None] | None = None,
    think: float = 0.0,
    log: list[dict[str, Any]] | None = None,
    clock: Callable[[], float] = gosim.now,
) -> tuple[list[dict[str, Any]], str]:
    """Run ``connections`` connections for ``seconds`` (on the runtime's clock), then
    reconcile; returns the log (one dict per issued transfer, with ``kind``
    ``"balance"`` one per answered balance read) and the last stats line.
    ``report`` gets a stats line every half second. ``think``: the mean pause between a
    connection's transfers (exponential; 0, none): with many connections, most of them
    idle on their heartbeats at any moment, as a service's clients are. ``log``: the
    list to append the log to (read it whole between two of the runtime's steps).
    ``clock``: the times ``call`` and ``ret`` of the log's entries (a transfer's
    ``ret`` is set when its outcome is known); every process of a run must share it
    (``time.monotonic`` is one clock for the whole machine)."""
    rng = random.Random(seed)
    stats = _Stats()
    log = [] if log is None else log

    def client(i: int) -> Client:
        return Client(
            dial,
            caller=caller_name(ident, i),
            idempotent_methods={"transfer"},
            heartbeat_interval=heartbeat,
            connect_attempts=5,
            backoff_initial=0.05,
            backoff_max=0.5,
            retry=RetryPolicy(max_attempts=8, initial_backoff=0.05, max_backoff=1.0),
            rng=random.Random(rng.random()),
        )

    async def call(c: Client, entry: dict[str, Any], timeout: float) -> None:
        stats.in_flight += 1
        start = gosim.now()
        try:
            res = await c.call_result(
                "transfer",
                entry["src"],
                entry["dst"],
                entry["amount"],
                idempotency_key=entry["key"],
                timeout=timeout,
            )
        except (CallTimeout, RPCError) as exc:
            if isinstance(exc, RPCError) and exc.code in (3, 9):  # the ledger's refusals
                entry["ret"] = clock()
                entry["status"] = "refused"
                entry["code"] = exc.code
                stats.refused += 1
            else:
                entry["status"] = "unknown"
            return
        finally:
            stats.in_flight -= 1
        entry["ret"] = clock()
        entry["status"] = "acked"
        entry["fence"] = res.result
        entry["replayed"] = res.replayed
        stats.acked += 1
        stats.latencies.append(gosim.now() - start)

    async def read(c: Client, account: int) -> None:
        # Logged only when answered: a read that never returned constrains nothing.
        call = clock()
        try:
            balance = await c.call("balance", account, timeout=10.0)
        except (CallTimeout, RPCError):
            return
        log.append(
            {
                "kind": "balance",
                "caller": c.caller,
                "account": account,
                "balance": balance,
                "call": call,
                "ret": clock(),
            }
        )

    async def connection(i: int, c: Client, done: Chan[None]) -> None:
        crng = random.Random(rng.random())
        # The reads draw from their own generator: the transfers' draws are as before.
        rrng = random.Random(f"reads {seed} {ident} {i}")
        deadline = gosim.now() + seconds
        # Connections open over a ramp (RAMP_RATE a second per process), not in one
        # burst: thousands of connects at once overflow the server's accept queue, their
        # first calls time out before it accepts them, and the redials add to the queue.
        await gosim.sleep(crng.uniform(0, min(connections / RAMP_RATE, seconds / 2)))
        n = 0
        mine: list[dict[str, Any]] = []
        while gosim.now() < deadline:
            if rrng.random() < READ_SHARE:
                await read(c, rrng.randrange(accounts))
                continue
            src, dst = crng.sample(range(accounts), 2)
            entry = {
                "caller": c.caller,
                "key": f"t{n}",
                "src": src,
                "dst": dst,
                "amount": crng.randint(1, MAX_AMOUNT),
                "status": "issued",
                "call": clock(),
            }
            n += 1
            log.append(entry)
            mine.append(entry)
            await call(c, entry, timeout=10.0)
            if entry["status"] == "unknown":
                # The server is out of reach (its retries and the retry budget are
                # spent): give it a moment, as a person at a terminal would.
                await gosim.sleep(crng.uniform(0.1, 0.5))
            elif think > 0:
                await gosim.sleep(min(crng.expovariate(1 / think), deadline - gosim.now()))
        # Reconcile: ask again, with the same key, until every outcome is known; for
        # RECONCILE_FOR seconds at most, after which an outcome still unknown stays so
        # (and the audit says so) rather than the run going on without end.
        give_up = gosim.now() + RECONCILE_FOR
        for entry in mine:
            wait = 0.05
            while entry["status"] not in ("acked", "refused") and gosim.now() < give_up:
                await call(c, entry, timeout=min(10.0, max(give_up - gosim.now(), 0.1)))
                if entry["status"] == "unknown":
                    await gosim.sleep(crng.uniform(0, wait))
                    wait = min(wait * 2, 1.0)
            if entry["status"] not in ("acked", "refused"):
                stats.unknown += 1
        await done.send(None)

    async def reporter(clients: list[Client]) -> None:
        assert report is not None
        while True:
            await gosim.sleep(0.5)
            report(stats.line(clients))

    clients = [client(i) for i in range(connections)]
    done: Chan[None] = Chan(connections)
    if report is not None:
        go(reporter, clients)
    for i, c in enumerate(clients):
        go(connection, i, c, done)
    for _ in clients:
        await done.recv()
    for c in clients:
        await c.close()
    return log, stats.line(clients, done=True)


def run_clients(
    addr: str,
    ident: int,
    connections: int,
    accounts: int,
    seconds: float,
    seed: int,
    heartbeat: float,
    log_path: Path,
    *,
    think: float = 0.0,
    trace_path: Path | None = None,
) -> None:
    """A client process: :func:`run_fleet` over TCP to ``addr``; prints its stats lines,
    writes the log to ``log_path`` at the end, or at once on SIGTERM (the transfers
    issued so far, those in flight as ``issued``; then exit status 143). With
    ``trace_path``, the runtime's trace is written there too, at the end or on SIGTERM."""
    raise_nofile_limit()
    trace = process_trace(trace_path, f"client {ident}")
    log: list[dict[str, Any]] = []

    def write_log() -> None:
        with open(log_path, "w") as f:
            for entry in log:
                f.write(json.dumps(entry) + "\n")

    def stop(signum: int, frame: Any) -> None:
        # In the main thread between two bytecodes, so between two of the runtime's
        # steps: every entry is whole.
        write_log()
        write_trace(trace, trace_path)
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, stop)

    async def dial() -> Any:
        return await net.dial("tcp", addr)

    async def main() -> None:
        _, last = await run_fleet(
            dial,
            ident,
            connections,
            accounts,
            seconds,
            seed,
            heartbeat,
            report=lambda line: print(line, flush=True),
            think=think,
            log=log,
            # The client processes and their history share the machine's clock.
            clock=time.monotonic,
        )
        write_log()
        print(last, flush=True)

    gosim.run(main, trace=trace)
    write_trace(trace, trace_path)
