"""``python -m idempotency.demo``: the ledger demo (see ``idempotency.demo``).

The subcommands ``server``, ``proxy`` and ``clients`` are the demo's own processes;
run without one, it conducts them all (or, with ``--simulate``, runs the whole system
in this process on the simulated network). ``audit DIR`` audits the ledger a run left
in DIR (kept with ``--keep``, or after a failure or an interrupt).

Every option is checked before anything starts: a bad one ends the command with one
line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import ctypes
import math
import os
import signal
import sys
from pathlib import Path
from typing import Any, NoReturn

from idempotency import StoreUnavailable

from ._audit import reaudit
from ._clients import run_clients
from ._ledger import LedgerSpec, serve
from ._proxy import FaultPlan, run_proxy
from ._run import CHILD_ENV, Options, run
from ._sim import SimOptions, simulate

#: The shortest heartbeat interval the demo takes (seconds).
MIN_HEARTBEAT = 0.05


class _Parser(argparse.ArgumentParser):
    """An error is one line (not the usage block): what is wrong, and where to look."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (--help lists the options)\n")


def main(argv: list[str]) -> int:
    if argv and argv[0] in ("server", "proxy", "clients"):
        return _sub(argv)
    if argv and argv[0] == "audit":
        ap = _Parser(
            prog="python -m idempotency.demo audit",
            description="Audit the ledger a run left in DIR (its run.json, ledger and "
            "client logs): the run's checks, exit 0 when every one holds.",
        )
        ap.add_argument("dir", type=Path, metavar="DIR")
        ap.add_argument(
            "--redis",
            metavar="URL",
            help="the Redis the run named, given again with its password (run.json masks it)",
        )
        ap.add_argument(
            "--postgres",
            metavar="DSN",
            help="the PostgreSQL the run named, given again with its password (run.json masks it)",
        )
        args = ap.parse_args(argv[1:])
        where = args.dir
        try:
            return reaudit(where, redis=args.redis, postgres=args.postgres)
        except KeyboardInterrupt:
            print(f"interrupted: {where} is as it was; audit it again", file=sys.stderr)
            return 130
    p = _Parser(
        prog="python -m idempotency.demo",
        description="A ledger of idempotent transfers on long connections, under faults "
        "and a kill -9 of its server; audited at the end (exit 0 when every check holds).",
        epilog="python -m idempotency.demo audit DIR audits a kept run's directory again.",
    )
    p.add_argument("--connections", type=int, default=200, help="long connections (200)")
    p.add_argument("--clients", type=int, default=2, help="client processes (2)")
    p.add_argument("--accounts", type=int, default=100, help="ledger accounts (100)")
    p.add_argument("--seconds", type=float, default=15.0, help="transfers run this long (15)")
    p.add_argument("--seed", type=int, default=1, help="seeds the fault plan and the kills")
    p.add_argument("--kills", type=int, help="server kill -9s and restarts (1)")
    p.add_argument("--no-faults", action="store_true", help="no fault injector, no kills")
    p.add_argument(
        "--heartbeat", type=float, default=1.0, help="heartbeat interval, s (1; >= 0.05)"
    )
    p.add_argument(
        "--think",
        type=float,
        default=0.0,
        help="mean pause between a connection's transfers, s (0: none; use one with "
        "thousands of connections, or their queue outgrows the calls' timeouts)",
    )
    p.add_argument("--db", type=Path, help="the ledger file to create (default: a temp dir)")
    p.add_argument("--plain", action="store_true", help="a log line a second, not the live display")
    p.add_argument(
        "--keep",
        action="store_true",
        help="keep the run directory (ledger, client logs) for `audit DIR`; without it, "
        "it is removed when the run passes",
    )
    p.add_argument("--plot", type=Path, help="write a throughput/latency chart (PNG)")
    p.add_argument(
        "--store",
        choices=("sqlite", "redis", "postgres"),
        default="sqlite",
        help="where the ledger and its idempotency records live (sqlite)",
    )
    p.add_argument(
        "--postgres",
        metavar="DSN",
        help="with --store postgres: this PostgreSQL, the run's tables under a schema of "
        "their own (default: start a cluster for the run)",
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
    p.add_argument(
        "--trace",
        type=Path,
        help="write a Perfetto trace (Chrome JSON) of every process, or of the simulation",
    )
    a = p.parse_args(argv)
    _check(p, a)
    # What a run is, whether it runs on real processes or in the simulator.
    common: dict[str, Any] = {
        "connections": a.connections,
        "accounts": a.accounts,
        "seconds": a.seconds,
        "seed": a.seed,
        "faults": not a.no_faults,
        "kills": 0 if a.no_faults else 1 if a.kills is None else a.kills,
        "heartbeat": a.heartbeat,
        "think": a.think,
        "trace": a.trace,
    }
    if a.simulate:
        return simulate(SimOptions(clients=a.clients, **common))
    opts = Options(
        clients=min(a.clients, a.connections),
        db=a.db,
        live=False if a.plain else None,
        plot=a.plot,
        store=a.store,
        redis=a.redis,
        postgres=a.postgres,
        servers=a.servers,
        keep=a.keep,
        **common,
    )
    return run(opts)


def _check(p: argparse.ArgumentParser, a: argparse.Namespace) -> None:
    """Every option, before anything starts (a run fails late and loud otherwise)."""
    for name, value, low in (
        ("--connections", a.connections, 1),
        ("--clients", a.clients, 1),
        ("--accounts", a.accounts, 2),
        ("--servers", a.servers, 1),
        ("--kills", a.kills or 0, 0),
    ):
        if value < low:
            p.error(f"{name} must be >= {low}, not {value}")
    for name, value, zero in (
        ("--seconds", a.seconds, False),
        ("--heartbeat", a.heartbeat, False),
        ("--think", a.think, True),
    ):
        if not math.isfinite(value) or value < 0 or (value == 0 and not zero):
            p.error(f"{name} must be a number {'>=' if zero else '>'} 0, not {value}")
    if a.heartbeat < MIN_HEARTBEAT:
        p.error(
            f"--heartbeat must be >= {MIN_HEARTBEAT} s, not {a.heartbeat} (every connection "
            "pings each way every interval: shorter ones leave no time for transfers)"
        )
    if a.no_faults and a.kills:
        p.error("--kills with --no-faults: --no-faults means no kills")
    if a.redis and a.store != "redis":
        p.error("--redis needs --store redis")
    if a.postgres and a.store != "postgres":
        p.error("--postgres needs --store postgres")
    if a.db is not None and a.store != "sqlite":
        p.error(f"--db is the SQLite ledger's file: not with --store {a.store}")
    if a.simulate:
        if a.store != "sqlite" or a.servers != 1 or a.plot or a.db or a.keep:
            p.error(
                "--simulate keeps its ledger in memory: no --store, --servers, --db, --plot, --keep"
            )
    elif a.servers > 1 and a.store == "sqlite":
        # Several processes on one SQLite file do keep every check, but they take turns
        # on the file's one write lock by polling it: throughput collapses.
        p.error("--servers N > 1 needs --store redis or postgres (SQLite has one writer per file)")
    if a.db is not None:
        if a.db.exists():
            p.error(f"--db {a.db} exists: the demo starts from a new ledger")
        if not a.db.parent.is_dir():
            p.error(f"--db {a.db}: no directory {a.db.parent}")
    for name, path in (("--plot", a.plot), ("--trace", a.trace), ("--db", a.db)):
        if path is not None and (why := _unwritable(path)):
            p.error(f"{name} {path}: {why}")
    if a.plot is not None:
        try:
            from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: PLC0415
        except ImportError as exc:
            p.error(f"--plot needs matplotlib (pip install matplotlib): {exc}")
        kinds = FigureCanvasAgg.get_supported_filetypes()
        if a.plot.suffix.lstrip(".").lower() not in kinds:
            p.error(f"--plot {a.plot}: the name must end in one of .{', .'.join(kinds)}")
    if a.store == "redis" and not a.simulate:
        _check_redis(p, a.redis)
    if a.store == "postgres" and not a.simulate:
        _check_postgres(p, a.postgres)


def _unwritable(path: Path) -> str | None:
    """Why a file cannot be written at ``path`` (tried: permissions lie to root), or None."""
    if path.is_dir():
        return "is a directory"
    existed = path.exists()
    try:
        with open(path, "a"):
            pass
    except OSError as exc:
        return exc.strerror or str(exc)
    if not existed:
        path.unlink()
    return None


def _check_redis(p: argparse.ArgumentParser, url: str | None) -> None:
    try:
        from idempotency.stores.redis import check_reachable  # noqa: PLC0415 -- the redis extra
    except ImportError:
        p.error("--store redis needs redis-py (pip install -e '.[redis]')")
    if url is None:
        import shutil  # noqa: PLC0415

        if shutil.which("redis-server") is None:
            p.error("--store redis needs redis-server on PATH, or --redis URL")
        return
    try:
        check_reachable(url)
    except StoreUnavailable as exc:
        p.error(f"--redis {url}: {exc}")


def _check_postgres(p: argparse.ArgumentParser, dsn: str | None) -> None:
    try:
        import psycopg  # noqa: PLC0415 -- the postgres extra
    except ImportError:
        p.error("--store postgres needs psycopg 3 (pip install -e '.[postgres]')")
    if dsn is None:
        from idempotency.stores.pgcluster import PG_BIN  # noqa: PLC0415

        if PG_BIN is None:
            p.error(
                "--store postgres needs PostgreSQL installed (/usr/lib/postgresql/*/bin), "
                "or --postgres DSN"
            )
        return
    try:
        with psycopg.connect(dsn, autocommit=True, connect_timeout=5) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as exc:
        why = " ".join(str(exc).split())
        p.error(f"--postgres {dsn}: cannot connect: {why}")


def _as_child() -> None:
    """A process of the conductor's: Ctrl-C is the conductor's to handle (it reaches
    the terminal's whole process group), and the process dies with the conductor."""
    parent = os.environ.get(CHILD_ENV)
    if parent is None:
        return
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG (Linux)
    except (OSError, AttributeError):
        pass  # elsewhere: the conductor's own stop is all there is
    if os.getppid() != int(parent):  # it died before the line above
        os._exit(1)


def _sub(argv: list[str]) -> int:
    _as_child()
    p = argparse.ArgumentParser(prog=f"python -m idempotency.demo {argv[0]}")
    if argv[0] == "server":
        p.add_argument("--store", choices=("sqlite", "redis", "postgres"), default="sqlite")
        p.add_argument("--db", type=Path)
        p.add_argument("--redis", default="redis://127.0.0.1:6379/0")
        p.add_argument("--prefix", default="ledger:")
        p.add_argument("--postgres", help="the ledger's DSN (--store postgres)")
        p.add_argument("--schema", help="the ledger's schema (--store postgres)")
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
        elif a.store == "postgres":
            if a.postgres is None or a.schema is None:
                p.error("--store postgres needs --postgres and --schema")
            spec = LedgerSpec("postgres", url=a.postgres, prefix=a.schema)
        else:
            spec = LedgerSpec("redis", url=a.redis, prefix=a.prefix)
        serve(spec, a.addr, a.heartbeat, a.max_connections, a.reuse_port, a.trace)
    elif argv[0] == "proxy":
        p.add_argument("--listen", default="127.0.0.1:0")
        p.add_argument("--upstream", required=True)
        p.add_argument("--seed", type=int, default=1)
        p.add_argument("--trace", type=Path)
        a = p.parse_args(argv[1:])
        run_proxy(a.listen, a.upstream, FaultPlan(a.seed), a.trace)
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
        p.add_argument("--trace", type=Path)
        a = p.parse_args(argv[1:])
        run_clients(
            a.addr,
            a.id,
            a.connections,
            a.accounts,
            a.seconds,
            a.seed,
            a.heartbeat,
            a.log,
            think=a.think,
            trace_path=a.trace,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
