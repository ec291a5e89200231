"""``python -m idempotency.demo``: the ledger demo (see ``idempotency.demo``).

The subcommands ``server``, ``proxy`` and ``clients`` are the demo's own processes;
run without one, it conducts them all (or, with ``--simulate``, runs the whole system
in this process on the simulated network).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from ._clients import run_clients
from ._ledger import LedgerSpec, serve
from ._proxy import FaultPlan, run_proxy
from ._run import Options, run
from ._sim import SimOptions, simulate


def main(argv: list[str]) -> int:
    if argv and argv[0] in ("server", "proxy", "clients"):
        return _sub(argv)
    p = argparse.ArgumentParser(
        prog="python -m idempotency.demo",
        description="A ledger of idempotent transfers on long connections, under faults "
        "and a kill -9 of its server; audited at the end (exit 0 when every check holds).",
    )
    p.add_argument("--connections", type=int, default=200, help="long connections (200)")
    p.add_argument("--clients", type=int, default=2, help="client processes (2)")
    p.add_argument("--accounts", type=int, default=100, help="ledger accounts (100)")
    p.add_argument("--seconds", type=float, default=15.0, help="transfers run this long (15)")
    p.add_argument("--seed", type=int, default=1, help="seeds the fault plan and the kills")
    p.add_argument("--kills", type=int, default=1, help="server kill -9s and restarts (1)")
    p.add_argument("--no-faults", action="store_true", help="no fault injector, no kills")
    p.add_argument("--heartbeat", type=float, default=1.0, help="heartbeat interval, s (1)")
    p.add_argument(
        "--think",
        type=float,
        default=0.0,
        help="mean pause between a connection's transfers, s (0: none; use one with "
        "thousands of connections, or their queue outgrows the calls' timeouts)",
    )
    p.add_argument("--db", type=Path, help="the ledger file to create (default: a temp dir)")
    p.add_argument("--plain", action="store_true", help="no live display")
    p.add_argument("--plot", type=Path, help="write a throughput/latency chart (PNG)")
    p.add_argument(
        "--store",
        choices=("sqlite", "redis"),
        default="sqlite",
        help="where the ledger and its idempotency records live (sqlite)",
    )
    p.add_argument(
        "--redis", metavar="URL", help="with --store redis: this Redis (default: start one)"
    )
    p.add_argument(
        "--servers", type=int, default=1, help="server processes on one port, SO_REUSEPORT (1)"
    )
    p.add_argument(
        "--simulate",
        action="store_true",
        help="the whole system in one process on gosim's simulated network, in virtual "
        "time: the same --seed prints the same report",
    )
    p.add_argument("--trace", type=Path, help="write a Perfetto trace (Chrome JSON)")
    a = p.parse_args(argv)
    if a.connections < 1 or a.clients < 1 or a.accounts < 2 or a.seconds <= 0:
        p.error("--connections and --clients must be >= 1, --accounts >= 2, --seconds > 0")
    if a.servers < 1:
        p.error("--servers must be >= 1")
    if a.redis and a.store != "redis":
        p.error("--redis needs --store redis")
    if a.servers > 1 and a.store != "redis" and not a.simulate:
        # Several processes on one SQLite file do keep every check, but they take turns
        # on the file's one write lock by polling it: throughput collapses.
        p.error("--servers N > 1 needs --store redis (SQLite has one writer per file)")
    # What a run is, whether it runs on real processes or in the simulator.
    common: dict[str, Any] = {
        "connections": a.connections,
        "accounts": a.accounts,
        "seconds": a.seconds,
        "seed": a.seed,
        "faults": not a.no_faults,
        "kills": 0 if a.no_faults else a.kills,
        "heartbeat": a.heartbeat,
        "think": a.think,
        "trace": a.trace,
    }
    if a.simulate:
        if a.store != "sqlite" or a.servers != 1 or a.plot or a.db:
            p.error("--simulate keeps its ledger in memory: no --store, --servers, --db, --plot")
        return simulate(SimOptions(clients=a.clients, **common))
    opts = Options(
        clients=min(a.clients, a.connections),
        db=a.db,
        live=False if a.plain else None,
        plot=a.plot,
        store=a.store,
        redis=a.redis,
        servers=a.servers,
        **common,
    )
    return run(opts)


def _sub(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog=f"python -m idempotency.demo {argv[0]}")
    if argv[0] == "server":
        p.add_argument("--store", choices=("sqlite", "redis"), default="sqlite")
        p.add_argument("--db", type=Path)
        p.add_argument("--redis", default="redis://127.0.0.1:6379/0")
        p.add_argument("--prefix", default="ledger:")
        p.add_argument("--addr", default="127.0.0.1:0")
        p.add_argument("--reuse-port", action="store_true")
        p.add_argument("--heartbeat", type=float, default=1.0)
        p.add_argument("--max-connections", type=int, default=10_000)
        p.add_argument("--trace", type=Path)
        a = p.parse_args(argv[1:])
        if a.store == "sqlite":
            if a.db is None:
                p.error("--store sqlite needs --db")
            spec = LedgerSpec("sqlite", path=a.db)
        else:
            spec = LedgerSpec("redis", url=a.redis, prefix=a.prefix)
        serve(spec, a.addr, a.heartbeat, a.max_connections, a.reuse_port, a.trace)
    elif argv[0] == "proxy":
        p.add_argument("--listen", default="127.0.0.1:0")
        p.add_argument("--upstream", required=True)
        p.add_argument("--seed", type=int, default=1)
        a = p.parse_args(argv[1:])
        run_proxy(a.listen, a.upstream, FaultPlan(a.seed))
    else:
        p.add_argument("--addr", required=True)
        p.add_argument("--id", type=int, default=0)
        p.add_argument("--connections", type=int, default=100)
        p.add_argument("--accounts", type=int, default=100)
        p.add_argument("--seconds", type=float, default=10.0)
        p.add_argument("--seed", type=int, default=1)
        p.add_argument("--heartbeat", type=float, default=1.0)
        p.add_argument("--think", type=float, default=0.0)
        p.add_argument("--log", type=Path, required=True)
        a = p.parse_args(argv[1:])
        run_clients(
            a.addr, a.id, a.connections, a.accounts, a.seconds, a.seed, a.heartbeat, a.log, a.think
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
