"""``python -m idempotency.demo``: the ledger demo (see ``idempotency.demo``).

The subcommands ``server``, ``proxy`` and ``clients`` are the demo's own processes;
run without one, it conducts them all.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ._clients import run_clients
from ._ledger import serve
from ._proxy import FaultPlan, run_proxy
from ._run import Options, run


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
    p.add_argument("--db", type=Path, help="the ledger file to create (default: a temp dir)")
    p.add_argument("--plain", action="store_true", help="no live display")
    p.add_argument("--plot", type=Path, help="write a throughput/latency chart (PNG)")
    a = p.parse_args(argv)
    if a.connections < 1 or a.clients < 1 or a.accounts < 2 or a.seconds <= 0:
        p.error("--connections and --clients must be >= 1, --accounts >= 2, --seconds > 0")
    opts = Options(
        connections=a.connections,
        clients=min(a.clients, a.connections),
        accounts=a.accounts,
        seconds=a.seconds,
        seed=a.seed,
        faults=not a.no_faults,
        kills=0 if a.no_faults else a.kills,
        heartbeat=a.heartbeat,
        db=a.db,
        live=False if a.plain else None,
        plot=a.plot,
    )
    return run(opts)


def _sub(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog=f"python -m idempotency.demo {argv[0]}")
    if argv[0] == "server":
        p.add_argument("--db", type=Path, required=True)
        p.add_argument("--addr", default="127.0.0.1:0")
        p.add_argument("--heartbeat", type=float, default=1.0)
        p.add_argument("--max-connections", type=int, default=10_000)
        a = p.parse_args(argv[1:])
        serve(a.db, a.addr, a.heartbeat, a.max_connections)
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
        p.add_argument("--log", type=Path, required=True)
        a = p.parse_args(argv[1:])
        run_clients(a.addr, a.id, a.connections, a.accounts, a.seconds, a.seed, a.heartbeat, a.log)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
