"""The demo's conductor: start the ledger, the fault injector and the clients, kill a
server with SIGKILL and restart it mid-run, show progress, then audit the ledger.

Processes (each its own Python process, talking TCP on 127.0.0.1):

    clients x K --> fault proxy --> ledger server x N (one port, SO_REUSEPORT)
                                         |
                         SQLite file, or a redis-server (started for the run)

The conductor watches every process: one that ends unbidden (a crash, a kill from
outside) is reported as soon as its output ends, with the time it ended. A server or
the fault proxy ending ends the run (the clients would only retry against nothing): the
clients are stopped with SIGTERM and write the transfers they issued. A client ending
leaves the others to finish. Either way the ledger is then audited (``_audit``) with
what exists: the checks a missing log or the missing reconciliation make impossible are
reported as not checked, and the run fails. SIGINT or SIGTERM stops every process and
keeps the run directory for ``python -m idempotency.demo audit DIR``.

With ``trace``, every process traces itself (its runtime's events, in wall-clock time)
into the run directory, and the conductor merges the traces into one file at the end,
each process a Perfetto process of its own (:func:`merge_traces`). A process killed with
SIGKILL (the demo's ``kill -9``, or one from outside) takes its trace with it: the
report names the processes whose trace is missing. An interrupted run merges none.

Run directories (the SQLite file or the run's own redis-server's files, the clients'
logs, ``run.json``) are made under the system's temp dir and removed at the end unless
``keep`` is set or the run did not pass; a kept one is printed.
"""

from __future__ import annotations

import bisect
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table

from gosim import Trace

from .._secrets import masked
from ._audit import (
    Check,
    Ending,
    audit,
    audit_run,
    log_name,
    read_logs,
    report_tables,
    write_manifest,
)
from ._ledger import (
    LedgerSpec,
    create_ledger,
    postgres_application_name,
    postgres_deadlocks,
    read_ledger,
)

__all__ = [
    "CHILD_ENV",
    "Options",
    "RedisServer",
    "Workload",
    "audit",
    "read_logs",
    "report_tables",
    "run",
]

#: In the environment of the conductor's children: the conductor's PID. A child then
#: ignores SIGINT (a Ctrl-C reaches the terminal's whole process group; the conductor
#: stops its children itself) and dies with the conductor.
CHILD_ENV = "LEDGER_DEMO_CONDUCTOR"
#: Seconds between two log lines when stdout is not a terminal (or ``--plain``).
LOG_INTERVAL = 1.0


@dataclass
class Workload:
    """What a run and a simulated run share: the fleet, its load and the faults."""

    connections: int = 200
    clients: int = 2  # client hosts the connections are spread over (a fleet each)
    accounts: int = 100
    seconds: float = 15.0
    seed: int = 1
    faults: bool = True
    kills: int = 1
    heartbeat: float = 1.0
    think: float = 0.0  # mean pause between a connection's transfers


@dataclass
class Options(Workload):
    db: Path | None = None
    live: bool | None = None  # None: when stdout is a terminal
    plot: Path | None = None  # a throughput and latency chart (matplotlib)
    store: str = "sqlite"  # or "redis"
    redis: str | None = None  # a Redis URL; None: start a redis-server for the run
    postgres: str | None = None  # a PostgreSQL DSN; None: start a cluster for the run
    servers: int = 1  # server processes sharing one port (SO_REUSEPORT)
    trace: Path | None = None  # a Perfetto trace of every process whose trace survives
    keep: bool = False  # keep the run directory even when the run passes


class _Interrupted(BaseException):
    """SIGINT or SIGTERM reached the conductor (a BaseException: nothing swallows it)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


class _Signals:
    """SIGINT and SIGTERM raise :class:`_Interrupted` in the main thread, once; while
    a child is being spawned, the signal waits until it is registered (else it would be
    left running)."""

    def __init__(self) -> None:
        self.received: int | None = None
        self.held = 0
        self.pending = False
        self.previous: dict[int, Any] = {}

    def install(self) -> None:
        for sig in (signal.SIGINT, signal.SIGTERM):
            self.previous[sig] = signal.signal(sig, self._handle)

    def restore(self) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)

    def _handle(self, signum: int, frame: Any) -> None:
        if self.received is not None:
            return  # the conductor is already stopping: a second Ctrl-C changes nothing
        self.received = signum
        if self.held:
            self.pending = True
        else:
            raise _Interrupted(signum)

    @contextmanager
    def hold(self) -> Iterator[None]:
        self.held += 1
        try:
            yield
        finally:
            self.held -= 1
            if not self.held and self.pending:
                self.pending = False
                assert self.received is not None
                raise _Interrupted(self.received)


@dataclass(eq=False)
class _Proc:
    name: str
    proc: subprocess.Popen[str]
    addr: str = ""
    #: When the process's output ended and it was reaped (time.monotonic()).
    ended: float | None = None
    #: The conductor stopped it: its end is not a death.
    bidden: bool = False
    #: A client printed its last line: its run ended and its log is written.
    done: bool = False
    started: threading.Event = field(default_factory=threading.Event)
    reader: threading.Thread | None = None


def _spawn(
    name: str,
    args: list[str],
    on_line: Callable[[_Proc, dict[str, Any]], None],
    signals: _Signals,
    registry: list[_Proc],
    wait_listen: bool = True,
) -> _Proc:
    """Start ``python -m idempotency.demo ARGS``; its JSON lines go to ``on_line`` from a
    reader thread, which stamps the time its output ends (the process's death). With
    ``wait_listen``, return once it printed ``LISTEN addr``."""
    with signals.hold():
        proc = subprocess.Popen(
            [sys.executable, "-m", "idempotency.demo", *args],
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1", CHILD_ENV: str(os.getpid())},
        )
        p = _Proc(name, proc)
        registry.append(p)
    out = proc.stdout
    assert out is not None

    def read() -> None:
        for text in out:
            if text.startswith("LISTEN "):
                p.addr = text.split()[1]
                p.started.set()
            elif text.startswith("{"):
                try:
                    d = json.loads(text)
                except ValueError:  # a line torn by the process's death
                    continue
                p.done = p.done or bool(d.get("done"))
                on_line(p, d)
        proc.wait()
        p.ended = time.monotonic()
        p.started.set()

    p.reader = threading.Thread(target=read, daemon=True)
    p.reader.start()
    if wait_listen:
        p.started.wait()
        if not p.addr:
            raise SystemExit(f"{name} did not start (exit status {proc.wait()})")
    return p


def _stop(p: _Proc, sig: int = signal.SIGKILL, timeout: float = 30) -> None:
    """Stop ``p`` (bidden: not a death) and reap it; SIGKILL if ``sig`` is not enough."""
    if p.proc.poll() is None:  # one that already ended did so unbidden
        p.bidden = True
        p.proc.send_signal(sig)
    try:
        p.proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.proc.kill()
        p.proc.wait(timeout=30)
    if p.reader is not None:
        p.reader.join(timeout=10)
    if p.proc.stdout is not None:
        p.proc.stdout.close()


# The server gets SIGKILL when the conductor dies (setpriv's --pdeathsig, util-linux),
# so an interrupted demo leaves no redis-server behind.
_SETPRIV = shutil.which("setpriv")


class RedisServer:
    """A redis-server for one run: 127.0.0.1, a free port, its files in ``workdir``, AOF
    with ``appendfsync always`` (an acknowledged transfer is on disk, as with SQLite)."""

    def __init__(self, workdir: Path) -> None:
        self.dir = workdir
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = int(s.getsockname()[1])
        binary = shutil.which("redis-server")
        if binary is None:
            raise SystemExit("--store redis needs redis-server on PATH, or --redis URL")
        cmd = [binary, "--bind", "127.0.0.1", "--port", str(self.port), "--dir", str(workdir)]
        cmd += ["--save", "", "--appendonly", "yes", "--appendfsync", "always"]
        cmd += ["--protected-mode", "yes", "--loglevel", "warning"]
        self.proc = subprocess.Popen(
            [_SETPRIV, "--pdeathsig", "KILL", *cmd] if _SETPRIV else cmd,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as c:
                    c.sendall(b"PING\r\n")
                    if c.recv(64).startswith(b"+PONG"):
                        return
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise SystemExit(f"redis-server did not start on port {self.port}")
            time.sleep(0.02)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)


def own_postgres(workdir: Path, existing: bool = False) -> Any:
    """A PostgreSQL cluster for the run, started, its files in ``workdir/postgres``
    (``existing``: the cluster a kept run left there, started again on a new port)."""
    from idempotency.stores.pgcluster import PostgresCluster  # noqa: PLC0415

    if os.geteuid() == 0:  # the cluster runs as its own user, who must reach its dir
        workdir.chmod(workdir.stat().st_mode | 0o111)
    try:
        cluster = PostgresCluster(str(workdir / "postgres"), existing=existing)
        cluster.start()
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
        raise SystemExit(f"could not start PostgreSQL in {workdir / 'postgres'}: {exc}") from None
    return cluster


def terminate_backend(dsn: str, application_name: str, tries: int = 200) -> str | None:
    """End one backend of the servers' (``application_name``) that is inside a
    transaction, as a crash of that backend would (``pg_terminate_backend``); looks up
    to ``tries`` times, 10 ms apart. What was ended (its pid and state), or None."""
    import psycopg  # noqa: PLC0415 -- the postgres extra

    with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
        for _ in range(tries):
            row = conn.execute(
                "SELECT pid, state, pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE application_name = %s AND xact_start IS NOT NULL"
                " AND pid <> pg_backend_pid() LIMIT 1",
                (application_name,),
            ).fetchone()
            if row is not None and row[2]:
                return f"backend {row[0]} ({row[1]})"
            time.sleep(0.01)
    return None


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


def _where(spec: LedgerSpec, own_redis: bool) -> str:
    if spec.kind == "sqlite":
        return str(spec.path)
    if spec.kind == "postgres":
        own = " (the run's own cluster, stopped)" if own_redis else ""
        return f"PostgreSQL {masked(spec.url)}, schema {spec.prefix}{own}"
    own = " (the run's own redis-server, stopped)" if own_redis else ""
    return f"Redis {masked(spec.url)}, keys {spec.prefix}*{own}"


def run(opts: Options) -> int:
    """Run the demo; 0 when every check holds, 1 when one fails or could not be made,
    128 + the signal's number after SIGINT or SIGTERM."""
    console = Console(highlight=False)
    live_display = console.is_terminal if opts.live is None else opts.live
    signals = _Signals()
    signals.install()
    workdir = Path(tempfile.mkdtemp(prefix="ledger-demo-"))
    procs: list[_Proc] = []
    own_server: Any = None  # the run's own redis-server or PostgreSQL cluster
    conductor: _Conductor | None = None
    keep = opts.keep
    code = 1
    spec: LedgerSpec | None = None
    try:
        if opts.store == "redis":
            if opts.redis is None:
                own_server = RedisServer(workdir)
            url = opts.redis or (own_server.url if own_server else "")
            # A prefix of the run's own: a shared Redis may hold other runs' ledgers.
            prefix = f"ledger-demo:{os.getpid()}:{time.time_ns()}:"
            spec = LedgerSpec("redis", url=url, prefix=prefix)
        elif opts.store == "postgres":
            if opts.postgres is None:
                own_server = own_postgres(workdir)
            dsn = opts.postgres or own_server.dsn
            # A schema of the run's own: a shared database may hold other runs' ledgers.
            schema = f"ledger_demo_{os.getpid()}_{time.time_ns()}"
            spec = LedgerSpec("postgres", url=dsn, prefix=schema)
        else:
            spec = LedgerSpec("sqlite", path=opts.db or workdir / "ledger.db")
        create_ledger(spec, opts.accounts)
        own = own_server is not None
        conductor = _Conductor(
            opts, console, live_display, workdir, spec, signals, procs=procs, own_redis=own
        )
        write_manifest(workdir, spec, opts.accounts, conductor.per, own_server is not None)
        code = conductor.conduct()
        keep = keep or code != 0
    except _Interrupted as exc:
        keep = spec is not None
        for p in procs:  # the clients first: on SIGTERM they write what they issued
            if p.name.startswith("client"):
                p.bidden = True
                if p.proc.poll() is None:
                    p.proc.send_signal(signal.SIGTERM)
        for p in sorted(procs, key=lambda p: not p.name.startswith("client")):
            _stop(p, signal.SIGTERM if p.name.startswith("client") else signal.SIGKILL)
        sig = signal.Signals(exc.signum).name
        at = f" at {time.monotonic() - conductor.start:.1f} s" if conductor else ""
        if spec is not None:
            per = conductor.per if conductor else []
            died = conductor.died if conductor else []
            ending = Ending(died, reconciled=False, interrupted=exc.signum)
            write_manifest(workdir, spec, opts.accounts, per, own_server is not None, ending)
            console.print(
                f"interrupted by {sig}{at}: every process stopped; the run is kept in "
                f"{workdir} (ledger: {_where(spec, own_server is not None)}); audit it "
                f"with: python -m idempotency.demo audit {workdir}",
                soft_wrap=True,
            )
        else:
            console.print(f"interrupted by {sig} before the run started", soft_wrap=True)
        code = 128 + exc.signum
    finally:
        for p in procs:  # an early exit (an exception) leaves no process behind
            if p.proc.poll() is None:
                _stop(p)
        if own_server is not None:
            own_server.stop()
        signals.restore()
        if not keep:
            shutil.rmtree(workdir, ignore_errors=True)
    if code < 128 and spec is not None:
        where = _where(spec, own_server is not None)
        inside = own_server is not None or opts.db is None
        if keep:
            console.print(
                f"ledger: {where}; the run is kept in {workdir}: audit it again with "
                f"python -m idempotency.demo audit {workdir}",
                soft_wrap=True,
            )
        elif inside:
            console.print(
                f"ledger: {where}; removed with the run directory {workdir} (--keep keeps it)",
                soft_wrap=True,
            )
        else:
            console.print(
                f"ledger: {where}; the run directory {workdir} (the clients' logs) removed "
                "(--keep keeps it)",
                soft_wrap=True,
            )
    return code


class _Conductor:
    """One run's processes, from the start to the report."""

    def __init__(
        self,
        opts: Options,
        console: Console,
        live_display: bool,
        workdir: Path,
        spec: LedgerSpec,
        signals: _Signals,
        *,
        procs: list[_Proc],
        own_redis: bool,
    ) -> None:
        self.own_redis = own_redis
        self.opts, self.console, self.live_display = opts, console, live_display
        self.workdir, self.spec, self.signals, self.procs = workdir, spec, signals, procs
        # PostgreSQL counts the deadlocks it detects: the run reports those it caused.
        self.deadlocks_before = postgres_deadlocks(spec) if spec.kind == "postgres" else 0
        self.rng = random.Random(opts.seed)
        self.per = [
            opts.connections // opts.clients + (i < opts.connections % opts.clients)
            for i in range(opts.clients)
        ]
        self.lock = threading.Lock()
        self.client_stats: dict[str, dict[str, Any]] = {}
        # The live figures of the clients' latest lines (a last line's are the whole run's).
        self.client_latency: dict[str, tuple[float | None, float | None]] = {}
        # By PID: every incarnation's last line, and its server's name.
        self.server_stats: dict[int, tuple[str, dict[str, Any]]] = {}
        self.faults: dict[str, int] = {}
        self.proxy_cpu = 0.0
        self.events: list[str] = []
        self.kills: list[float] = []  # seconds into the run
        # Processes that ended on their own: (name, exit status, seconds into the run).
        self.died: list[tuple[str, int | None, float]] = []
        self.start = time.monotonic()
        self.series: list[tuple[float, int, float | None, float | None]] = []
        self.deadlines: dict[str, float] = {}  # each client's end of transfers
        # Each client's acknowledged count as its lines reported it: (seconds, count).
        self.acked_points: dict[str, list[tuple[float, int]]] = {}
        # With a trace: each traced process's name and the file it writes its trace to.
        self.trace_files: list[tuple[str, Path]] = []
        self.trace_counts: dict[str, int] = {}  # traced processes of each name so far

    # -- what the processes print ------------------------------------------------

    def on_client(self, p: _Proc, d: dict[str, Any]) -> None:
        with self.lock:
            # A client's first line comes half a second after its runtime started, its
            # transfers' clock: they stop ``seconds`` later, and it reconciles.
            self.deadlines.setdefault(p.name, self.elapsed() - 0.5 + self.opts.seconds)
            # Its first line covers the half second since its start: nothing before.
            mine = self.acked_points.setdefault(p.name, [(self.elapsed() - 0.5, 0)])
            mine.append((self.elapsed(), d.get("acked", 0)))
            self.client_stats[p.name] = d
            if not d.get("done"):
                self.client_latency[p.name] = (d.get("p50_ms"), d.get("p99_ms"))

    def on_proxy(self, p: _Proc, d: dict[str, Any]) -> None:
        with self.lock:
            self.faults.update(d.get("faults", {}))
            self.proxy_cpu = d.get("cpu", 0.0)

    def on_server(self, p: _Proc, d: dict[str, Any]) -> None:
        with self.lock:
            self.server_stats[p.proc.pid] = (p.name, d.get("server", {}))

    def totals(self) -> dict[str, Any]:
        with self.lock:
            stats = list(self.client_stats.values())
            latency = list(self.client_latency.values())
        keys = (
            "acked", "refused", "in_flight", "retries", "replays", "reconnects", "found_dead",
            "cpu",
        )  # fmt: skip
        out: dict[str, Any] = {k: sum(s.get(k, 0) for s in stats) for k in keys}
        p50 = [a for a, _ in latency if a is not None]
        p99 = [b for _, b in latency if b is not None]
        out["p50_ms"] = max(p50) if p50 else None
        out["p99_ms"] = max(p99) if p99 else None
        return out

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def say(self, at: float, what: str) -> None:
        """One line of the run's log, stamped with seconds into the run."""
        self.console.print(f"{at:6.1f} s  {what}", markup=False, soft_wrap=True)

    def progress_line(self) -> str:
        t = self.totals()
        elapsed = self.elapsed()
        rate = t["acked"] / elapsed if elapsed > 0 else 0.0
        return (
            f"acked {t['acked']:,} ({rate:,.0f}/s), in flight {t['in_flight']}, retries "
            f"{t['retries']}, replays {t['replays']}, reconnects {t['reconnects']}, "
            f"p50/p99 {_ms(t['p50_ms'])}/{_ms(t['p99_ms'])} ms"
        )

    def table(self) -> Table:
        t = self.totals()
        elapsed = self.elapsed()
        fault_text = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in self.faults.items() if v)
        caption = "; ".join(x for x in (fault_text, *self.events) if x) or "no faults yet"
        tbl = Table(
            title=f"ledger demo: {elapsed:5.1f} s of {self.opts.seconds:g} s",
            caption=f"faults: {caption}",
        )
        for col in ("acked", "per s", "in flight", "retries", "replays", "reconnects"):
            tbl.add_column(col, justify="right")
        tbl.add_column("p50/p99 ms", justify="right")
        rate = t["acked"] / elapsed if elapsed > 0 else 0.0
        tbl.add_row(
            str(t["acked"]),
            f"{rate:,.0f}",
            str(t["in_flight"]),
            str(t["retries"]),
            str(t["replays"]),
            str(t["reconnects"]),
            f"{_ms(t['p50_ms'])}/{_ms(t['p99_ms'])}",
        )
        return tbl

    # -- the run -------------------------------------------------------------------

    def kill_backend(self, at: float) -> None:
        """The fault plan's PostgreSQL fault (on a thread: it may look for a while):
        ``pg_terminate_backend`` of a server's connection inside a transaction; that
        batch's calls fail and their clients retry."""
        try:
            what = terminate_backend(self.spec.url, postgres_application_name(self.spec.prefix))
        except Exception as exc:  # the database unreachable: the run's other checks tell
            what, why = None, f"{type(exc).__name__}: {exc}"
        else:
            why = "no server connection was inside a transaction"
        with self.lock:
            self.faults["postgres_backends_terminated"] = 1 if what else 0
        if what:
            self.events.append(f"PostgreSQL {what} terminated mid-transaction at {at:.1f} s")
            self.say(at, f"PostgreSQL {what} of a server terminated mid-transaction")
        else:
            self.say(at, f"no PostgreSQL backend terminated: {why}")

    def traced(self, name: str) -> list[str]:
        """With a trace asked for, the options that make process ``name`` (the next
        of that name: a restarted server is another) trace itself into the run
        directory, for :func:`merge_traces` at the end."""
        if self.opts.trace is None:
            return []
        n = self.trace_counts[name] = self.trace_counts.get(name, 0) + 1
        label = f"{name} (incarnation {n})" if name.startswith("server") else name
        path = self.workdir / f"trace-{name}-{n}.json"
        self.trace_files.append((label, path))
        return ["--trace", str(path)]

    def spawn(self, name: str, args: list[str], on_line: Any, wait_listen: bool = True) -> _Proc:
        return _spawn(name, args, on_line, self.signals, self.procs, wait_listen)

    def conduct(self) -> int:
        opts, rng = self.opts, self.rng
        hb = str(opts.heartbeat)
        max_conns = str(opts.connections * 2 + 100)
        server_args = [
            "server", *self.spec.args(), "--heartbeat", hb, "--max-connections", max_conns,
        ]  # fmt: skip
        if opts.servers > 1:
            server_args.append("--reuse-port")

        def start_server(i: int, addr: str, wait: bool = True) -> _Proc:
            args = [*server_args, "--addr", addr, *self.traced(f"server{i}")]
            return self.spawn(f"server{i}", args, self.on_server, wait)

        servers = [start_server(0, "127.0.0.1:0")]
        upstream = servers[0].addr
        servers += [start_server(i, upstream) for i in range(1, opts.servers)]
        others: list[_Proc] = []
        if opts.faults:
            seed = str(rng.getrandbits(32))
            proxy_args = ["proxy", "--upstream", upstream, "--seed", seed, *self.traced("proxy")]
            proxy = self.spawn("proxy", proxy_args, self.on_proxy)
            others.append(proxy)
            entry = proxy.addr
        else:
            entry = upstream
        clients = []
        self.start = time.monotonic()  # the clients start working as soon as each is spawned
        for i, n in enumerate(self.per):
            log = self.workdir / log_name(i)
            args = ["clients", "--addr", entry, "--id", str(i), "--connections", str(n)]
            args += ["--accounts", str(opts.accounts), "--seconds", str(opts.seconds)]
            args += ["--seed", str(rng.getrandbits(32)), "--heartbeat", hb, "--log", str(log)]
            args += ["--think", str(opts.think), *self.traced(f"client{i}")]
            clients.append(self.spawn(f"client{i}", args, self.on_client, wait_listen=False))
        # Seconds into the clients' transfers (which start once the processes are up).
        kill_at = sorted(rng.uniform(0.25, 0.75) * opts.seconds for _ in range(opts.kills))
        # With PostgreSQL, one backend of the servers' is also terminated mid-transaction.
        pg_kill_at = (
            [rng.uniform(0.2, 0.8) * opts.seconds]
            if opts.faults and self.spec.kind == "postgres"
            else []
        )
        began: list[float] = []  # when every client's transfers had begun
        # Per kill: (seconds into the run, the new incarnation); then when it served.
        restarts: list[tuple[float, _Proc]] = []
        recovered: dict[int, float] = {}
        watched: set[int] = set()
        # A death is seen within one heartbeat (the poll is at most half of one).
        poll = min(0.1, opts.heartbeat / 2)

        def notice() -> bool:
            """Report every process that ended unbidden since the last call; True when
            one that the run cannot go on without (a server, the proxy) did."""
            fatal = False
            for p in [*servers, *others, *clients]:
                if p.ended is None or p.bidden or id(p) in watched:
                    continue
                watched.add(id(p))
                code = p.proc.returncode
                if p in clients and p.done and code == 0:
                    continue  # its run ended: its log is written
                at = p.ended - self.start
                self.died.append((p.name, code, at))
                self.say(at, f"{p.name} exited with status {code}, unbidden")
                fatal = fatal or p not in clients
            with self.lock:
                calls = {pid: s.get("calls", 0) for pid, (_, s) in self.server_stats.items()}
            for i, (_, p) in enumerate(restarts):
                if i not in recovered and calls.get(p.proc.pid, 0) > 0:
                    recovered[i] = self.elapsed() - restarts[i][0]
                    what = f"{p.name} serves again, {recovered[i]:.1f} s after its kill -9"
                    self.say(self.elapsed(), what)
            return fatal

        def step(refresh: Callable[[], None]) -> bool:
            """One turn of the watch; False when the run is over."""
            if notice():
                return False
            if not any(c.ended is None for c in clients):
                # The clients may all have ended because a server died between two
                # looks (they fail fast against nothing, more so on a loaded machine):
                # that server is the cause to report, not them.
                notice()
                return False
            now = self.elapsed()
            if not began:
                with self.lock:
                    if len(self.deadlines) == len(clients):
                        began.append(max(self.deadlines.values()) - opts.seconds)
            if kill_at and began and now >= began[0] + kill_at[0]:
                kill_at.pop(0)
                victim = rng.randrange(len(servers))
                _stop(servers[victim])  # kill -9: no goodbye, nothing beyond what committed
                name = "the server" if len(servers) == 1 else f"server {victim}"
                self.kills.append(now)
                self.events.append(f"kill -9 of {name} at {now:.1f} s")
                self.say(now, f"kill -9 of {name}; restarting it")
                servers[victim] = start_server(victim, upstream, wait=False)
                restarts.append((now, servers[victim]))
            if pg_kill_at and began and now >= began[0] + pg_kill_at[0]:
                pg_kill_at.pop(0)
                threading.Thread(target=self.kill_backend, args=(now,), daemon=True).start()
            refresh()
            return True

        sampling = threading.Event()

        def sample() -> None:  # on a thread, at its own pace
            while not sampling.wait(0.1):
                t = self.totals()
                self.series.append((self.elapsed(), t["acked"], t["p50_ms"], t["p99_ms"]))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        try:
            if self.live_display:
                with Live(self.table(), console=self.console, refresh_per_second=4) as live:
                    while step(lambda: live.update(self.table())):
                        time.sleep(poll)
                    live.update(self.table())
            else:
                last = [self.start]

                def log_line() -> None:
                    if time.monotonic() - last[0] >= LOG_INTERVAL:
                        last[0] = time.monotonic()
                        self.say(self.elapsed(), self.progress_line())

                while step(log_line):
                    time.sleep(poll)
                self.say(self.elapsed(), self.progress_line())
            # A server or the proxy died: the clients stop and write what they issued.
            reconciled = not any(not n.startswith("client") for n, _, _ in self.died)
            for c in clients:
                _stop(c, signal.SIGTERM)
            elapsed = self.elapsed()
        finally:
            sampling.set()
            sampler.join(timeout=5)
            for p in [*others, *servers]:  # on SIGTERM, one traced writes its trace
                _stop(p, signal.SIGKILL if opts.trace is None else signal.SIGTERM)
        notice()  # a server that died while the clients were stopping
        ending = Ending(list(self.died), reconciled)
        write_manifest(self.workdir, self.spec, opts.accounts, self.per, self.own_redis, ending)
        checks = audit_run(self.workdir, read_ledger(self.spec), opts.accounts, self.per, ending)
        return self.report(checks, elapsed, servers, recovered, restarts)

    def report(
        self,
        checks: list[Check],
        elapsed: float,
        servers: list[_Proc],
        recovered: dict[int, float],
        restarts: list[tuple[float, _Proc]],
    ) -> int:
        opts = self.opts
        t = self.totals()
        with self.lock:
            named = list(self.server_stats.values())
        incarnations = [s for _, s in named]
        calls = sum(s.get("calls", 0) for s in incarnations)
        cpu = sum(s.get("cpu", 0.0) for s in incarnations)
        ops = sum(s.get("store_ops", 0) for s in incarnations)
        batches = sum(s.get("store_batches", 0) for s in incarnations)

        def per_ack(seconds: float) -> str:
            return f"{seconds / t['acked'] * 1000:.3f}" if t["acked"] else "-"

        counts: list[tuple[str, Any]] = [
            *self.faults.items(),
            ("server kills (kill -9)", len(self.kills)),
            ("retries", t["retries"]),
            ("replays", t["replays"]),
            ("reconnects", t["reconnects"]),
            # The side that gave up first: the clients (no frame from the server for
            # their heartbeat timeout), or else the server or the network.
            (
                "connections the clients found dead (server silent past its heartbeats)",
                t["found_dead"],
            ),
            ("refused (insufficient funds)", t["refused"]),
            ("acknowledged transfers/s, whole run", f"{t['acked'] / elapsed:,.0f}"),
            ("acknowledged transfers/s, middle half", steady_rate(self.series)),
            ("server processes", opts.servers),
            *(
                [
                    (
                        "deadlocks PostgreSQL detected",
                        postgres_deadlocks(self.spec) - self.deadlocks_before,
                    )
                ]
                if self.spec.kind == "postgres"
                else []
            ),
            *(
                (f"calls served by {name}", sum(s.get("calls", 0) for n, s in named if n == name))
                for name in sorted({n for n, _ in named})
            ),
            ("server CPU per call (ms)", f"{cpu / calls * 1000:.3f}" if calls else "-"),
            ("client CPU per acknowledged transfer (ms)", per_ack(t["cpu"])),
            *(
                [("fault proxy CPU per acknowledged transfer (ms)", per_ack(self.proxy_cpu))]
                if opts.faults
                else []
            ),
            ("store commits/s (transactions or pipelines)", f"{batches / elapsed:,.0f}"),
            ("store operations per commit", f"{ops / batches:.1f}" if batches else "-"),
            (
                "largest server RSS (MiB)",
                max((s.get("rss", 0) for s in incarnations), default=0) >> 20,
            ),
        ]
        for i, (_, p) in enumerate(restarts):
            if i in recovered:
                r = recovered[i]
                beats = r / opts.heartbeat
                what = f"{r:.2f} s after the kill, {beats:.1f} heartbeats"
            elif p.ended is not None and not p.bidden:
                what = f"never: it exited at {p.ended - self.start:.1f} s"
            else:
                what = "not before the run ended"
            counts.append((f"served again after restart {i + 1}", what))
        code = report_tables(self.console, checks, counts)
        if opts.plot is not None:
            with self.lock:
                reconcile = max(self.deadlines.values(), default=opts.seconds)
                points = list(self.acked_points.values())
            _plot(opts.plot, points, self.series, self.kills, reconcile)
            self.console.print(f"chart written to {opts.plot}")
        if opts.trace is not None:
            merged, lost = merge_traces(self.trace_files, opts.trace)
            lost_text = (
                f"; none of {', '.join(lost)}: a process killed (kill -9) takes its trace with it"
                if lost
                else ""
            )
            self.console.print(
                f"trace of {len(merged)} processes ({', '.join(merged)}) written to "
                f"{opts.trace} (open in ui.perfetto.dev){lost_text}",
                soft_wrap=True,
            )
        return code


def merge_traces(files: list[tuple[str, Path]], out: Path) -> tuple[list[str], list[str]]:
    """Write the traces of ``files`` (``(name, path)``, each a process's Chrome JSON of
    its own pid) to ``out`` as one, each process a Perfetto process. Returns the names
    merged and those with no trace: a process killed with SIGKILL wrote none."""
    docs: list[str] = []
    merged: list[str] = []
    lost: list[str] = []
    for name, path in files:
        try:
            doc = path.read_text()
        except FileNotFoundError:
            lost.append(name)
            continue
        docs.append(doc)
        merged.append(name)
    out.write_text(Trace.merge_chrome_json(docs))
    return merged, lost


def steady_rate(series: list[tuple[float, int, float | None, float | None]]) -> str:
    """Acknowledged transfers/s over the middle half of the time transfers were being
    acknowledged: without the client processes' start and the reconciliation's tail."""
    active = [(t, a) for t, a, _, _ in series if a > 0]
    if len(active) < 4:
        return "-"
    final = active[-1][1]
    t0 = active[0][0]
    t1 = next(t for t, a in active if a == final)
    lo, hi = t0 + (t1 - t0) / 4, t0 + 3 * (t1 - t0) / 4
    (ta, a0), (tb, a1) = (next(p for p in active if p[0] >= x) for x in (lo, hi))
    return f"{(a1 - a0) / (tb - ta):,.0f}" if tb > ta else "-"


def plot_curves(
    points: list[list[tuple[float, int]]],
    series: list[tuple[float, int, float | None, float | None]],
) -> tuple[list[tuple[float, float]], dict[str, list[tuple[float, float]]]]:
    """The chart's curves. The rate of acknowledgements: each client's count, as its
    lines (``points``, every half second) reported it, taken as linear between two
    lines, summed over the clients, then differenced over one-second windows, each at
    its middle. (The sum as sampled steps whenever a line arrives, so windows that catch
    one more line than the next zigzag; and a rate at its window's end shows a drop half
    a second after the kill that caused it.) The latency percentiles of ``series``
    (``(t, acked, p50, p99)``), at the middle of the half second they were measured over."""
    rates: list[tuple[float, float]] = []
    if any(points):
        lo = min(c[0][0] for c in points if c)
        hi = max(c[-1][0] for c in points if c)

        def acked(t: float) -> float:
            total = 0.0
            for c in points:
                if not c or t <= c[0][0]:
                    continue
                if t >= c[-1][0]:
                    total += c[-1][1]
                    continue
                k = bisect.bisect_right(c, (t, float("inf")))
                (t0, a0), (t1, a1) = c[k - 1], c[k]
                total += a0 + (a1 - a0) * (t - t0) / (t1 - t0) if t1 > t0 else a1
            return total

        t = lo
        while t + 1.0 <= hi:
            rates.append((t + 0.5, acked(t + 1.0) - acked(t)))
            t += 0.1
    latency: dict[str, list[tuple[float, float]]] = {"p50": [], "p99": []}
    for t, _, p50, p99 in series:
        for name, value in (("p50", p50), ("p99", p99)):
            if value is not None:
                latency[name].append((t - 0.25, value))
    return rates, latency


def _plot(
    path: Path,
    points: list[list[tuple[float, int]]],
    series: list[tuple[float, int, float | None, float | None]],
    kills: list[float],
    reconcile: float,
) -> None:
    """Acknowledged transfers per second and latency percentiles over the run; the
    kills marked, and the reconciliation (from ``reconcile`` s) shaded and labelled."""
    import matplotlib  # noqa: PLC0415 - optional: only --plot needs it (checked at start)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    rates, latency = plot_curves(points, series)
    fig, (top, bottom) = plt.subplots(2, 1, sharex=True, figsize=(9, 6))
    top.plot([r[0] for r in rates], [r[1] for r in rates], lw=0.8)
    top.set_ylabel("acknowledged transfers/s")
    for name, pts in latency.items():
        bottom.plot([p[0] for p in pts], [p[1] for p in pts], lw=0.8, label=name)
    bottom.set_ylabel("latency, ms (last 0.5 s)")
    bottom.set_yscale("log")
    bottom.set_xlabel("seconds")
    bottom.legend(loc="upper left")
    for k in kills:
        for ax in (top, bottom):
            ax.axvline(k, color="red", lw=0.8, ls="--")
    end = series[-1][0] if series else reconcile
    if end > reconcile:
        # After their deadline the clients ask again about transfers whose outcome they
        # never learnt: few calls, each one a retry that waited out a backoff, so the
        # percentiles of those last lines spike.
        for ax in (top, bottom):
            ax.axvspan(reconcile, end, color="grey", alpha=0.15, lw=0)
        bottom.annotate(
            "reconciliation:\nunknown outcomes\nasked again",
            xy=(reconcile, 0.5),
            xycoords=("data", "axes fraction"),
            xytext=(4, 0),
            textcoords="offset points",
            fontsize=8,
            va="center",
        )
    top.set_title("ledger demo (red: kill -9 of the server; grey: reconciliation)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
