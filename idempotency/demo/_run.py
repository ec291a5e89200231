"""The demo's conductor: start the ledger, the fault injector and the clients, kill a
server with SIGKILL and restart it mid-run, show progress live, then audit the ledger.

Processes (each its own Python process, talking TCP on 127.0.0.1):

    clients x K --> fault proxy --> ledger server x N (one port, SO_REUSEPORT)
                                         |
                         SQLite file, or a redis-server (started for the run)

The audit reads the ledger (the SQLite file, or the Redis hashes) after every process
but Redis has stopped, and checks:

1. balances are conserved: their sum is what the ledger started with;
2. every transfer a client saw acknowledged is in the ledger exactly once, as issued;
3. no transfer is in the ledger that no client issued, and none was applied twice:
   replaying the applied transfers from the opening balances gives every account's
   balance exactly;
4. every issued transfer's outcome is known (acknowledged or refused) after the
   clients' reconciliation;
5. every process ran until the conductor stopped it. A server or the fault proxy that
   exits on its own (a crash, a kill from outside) ends the run at once; a client that
   fails is found when the others finish. The report then names the process, its exit
   status and when, and there is no audit (the clients write their logs when their
   run ends).
"""

from __future__ import annotations

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
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from rich.console import Console
from rich.live import Live
from rich.table import Table

from ._ledger import INITIAL_BALANCE, LedgerSpec, LedgerState, create_ledger, read_ledger

__all__ = ["Options", "audit", "read_logs", "run"]


@dataclass
class Options:
    connections: int = 200
    clients: int = 2
    accounts: int = 100
    seconds: float = 15.0
    seed: int = 1
    faults: bool = True
    kills: int = 1
    heartbeat: float = 1.0
    think: float = 0.0  # mean pause between a connection's transfers
    db: Path | None = None
    live: bool | None = None  # None: when stdout is a terminal
    plot: Path | None = None  # a throughput and latency chart (matplotlib)
    store: str = "sqlite"  # or "redis"
    redis: str | None = None  # a Redis URL; None: start a redis-server for the run
    servers: int = 1  # server processes sharing one port (SO_REUSEPORT)
    trace: Path | None = None  # a Perfetto trace of the first server process


@dataclass
class _Proc:
    name: str
    proc: subprocess.Popen[str]
    addr: str = ""
    last: dict[str, Any] = field(default_factory=dict)
    reader: threading.Thread | None = None


def _spawn(name: str, args: list[str], on_line: Callable[[_Proc, dict[str, Any]], None]) -> _Proc:
    proc = subprocess.Popen(
        [sys.executable, "-m", "idempotency.demo", *args],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    p = _Proc(name, proc)
    out = proc.stdout
    assert out is not None
    line = out.readline()
    if line.startswith("LISTEN "):
        p.addr = line.split()[1]
    elif line:
        on_line(p, json.loads(line))

    def read(stream: TextIO) -> None:
        for text in stream:
            if text.startswith("{"):
                on_line(p, json.loads(text))

    p.reader = threading.Thread(target=read, args=(out,), daemon=True)
    p.reader.start()
    return p


def _stop(p: _Proc, sig: int = signal.SIGKILL) -> None:
    if p.proc.poll() is None:
        p.proc.send_signal(sig)
    p.proc.wait(timeout=30)
    if p.reader is not None:
        p.reader.join(timeout=10)
    if p.proc.stdout is not None:
        p.proc.stdout.close()


def read_logs(logs: list[Path]) -> list[dict[str, Any]]:
    """The clients' logs: one dict per issued transfer."""
    entries = []
    for path in logs:
        with open(path) as f:
            entries += [json.loads(text) for text in f]
    return entries


def audit(
    state: LedgerState, accounts: int, entries: list[dict[str, Any]]
) -> list[tuple[str, bool, str]]:
    """The checks of the module docstring: ``(name, passed, detail)`` each."""
    issued: dict[tuple[str, str], dict[str, Any]] = {}
    for e in entries:
        issued[(e["caller"], e["key"])] = e
    balances, rows = state.balances, state.transfers
    checks = []
    total = sum(balances.values())
    want = accounts * INITIAL_BALANCE
    checks.append(("balances conserved", total == want, f"sum {total}, started with {want}"))
    applied = {(c, k): (s, d, a) for c, k, s, d, a in rows}
    acked = [e for e in issued.values() if e["status"] == "acked"]
    missing = [
        e
        for e in acked
        if applied.get((e["caller"], e["key"])) != (e["src"], e["dst"], e["amount"])
    ]
    checks.append(
        (
            "every acknowledged transfer in the ledger once",
            not missing and len(applied) == len(rows),
            f"{len(acked)} acknowledged, {len(missing)} missing or altered",
        )
    )
    stray = [k for k in applied if k not in issued]
    refused_applied = [k for k, e in issued.items() if e["status"] == "refused" and k in applied]
    replayed = {i: INITIAL_BALANCE for i in balances}
    for s, d, a in applied.values():
        replayed[s] -= a
        replayed[d] += a
    exact = replayed == balances
    checks.append(
        (
            "nothing applied twice or unasked",
            exact and not stray and not refused_applied,
            f"{len(rows)} applied; {len(stray)} not issued; {len(refused_applied)} refused yet "
            f"applied; balances {'match' if exact else 'differ from'} the transfers",
        )
    )
    unknown = [e for e in issued.values() if e["status"] not in ("acked", "refused")]
    checks.append(
        (
            "every outcome known after reconciliation",
            not unknown,
            f"{len(issued)} issued, {len(unknown)} unknown",
        )
    )
    return checks


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


def report_tables(
    console: Console, checks: list[tuple[str, bool, str]], counts: list[tuple[str, Any]]
) -> int:
    """Print the audit and the counts; 0 when every check holds."""
    result = Table(title="audit")
    result.add_column("check")
    result.add_column("holds")
    result.add_column("detail")
    for name, ok, detail in checks:
        result.add_row(name, "yes" if ok else "NO", detail)
    console.print(result)
    table = Table(title="counts")
    table.add_column("what")
    table.add_column("how many", justify="right")
    for k, v in counts:
        table.add_row(k.replace("_", " "), str(v))
    console.print(table)
    failed = [name for name, ok, _ in checks if not ok]
    if failed:
        console.print(f"[bold red]FAILED[/]: {', '.join(failed)}")
        return 1
    console.print("[bold green]all checks hold[/]")
    return 0


def run(opts: Options) -> int:
    """Run the demo; 0 when every check holds."""
    console = Console()
    live_display = console.is_terminal if opts.live is None else opts.live
    rng = random.Random(opts.seed)
    workdir = Path(tempfile.mkdtemp(prefix="ledger-demo-"))
    redis_server: RedisServer | None = None
    if opts.store == "redis":
        if opts.redis is None:
            redis_server = RedisServer(workdir)
        url = opts.redis or (redis_server.url if redis_server else "")
        own = f" (the run's own redis-server, stopped; its files in {workdir})"
        # A prefix of the run's own: a shared Redis may hold other runs' ledgers.
        spec = LedgerSpec("redis", url=url, prefix=f"ledger-demo:{os.getpid()}:{time.time_ns()}:")
        where = f"Redis {url}, keys {spec.prefix}*" + (own if redis_server else "")
    else:
        db = opts.db or workdir / "ledger.db"
        if db.exists():
            raise SystemExit(f"{db} exists: the demo starts from a new ledger")
        spec = LedgerSpec("sqlite", path=db)
        where = str(db)

    def terminate(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)  # unwinds through the finally blocks below

    # A SIGTERM (a timeout, a supervisor) stops the processes this run started, too.
    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        create_ledger(spec, opts.accounts)
        return _conduct(opts, console, live_display, rng, workdir, spec, where)
    finally:
        signal.signal(signal.SIGTERM, previous)
        if redis_server is not None:
            redis_server.stop()


def _conduct(
    opts: Options,
    console: Console,
    live_display: bool,
    rng: random.Random,
    workdir: Path,
    spec: LedgerSpec,
    where: str,
) -> int:
    lock = threading.Lock()
    client_stats: dict[str, dict[str, Any]] = {}
    # By PID: every incarnation's last line, and its server's name.
    server_stats: dict[int, tuple[str, dict[str, Any]]] = {}
    faults: dict[str, int] = {}
    proxy_cpu = [0.0]
    events: list[str] = []

    def on_client(p: _Proc, d: dict[str, Any]) -> None:
        with lock:
            client_stats[p.name] = d

    def on_proxy(p: _Proc, d: dict[str, Any]) -> None:
        with lock:
            faults.update(d.get("faults", {}))
            proxy_cpu[0] = d.get("cpu", 0.0)

    def on_server(p: _Proc, d: dict[str, Any]) -> None:
        with lock:
            server_stats[p.proc.pid] = (p.name, d.get("server", {}))

    hb = str(opts.heartbeat)
    max_conns = str(opts.connections * 2 + 100)
    server_args = ["server", *spec.args(), "--heartbeat", hb, "--max-connections", max_conns]
    if opts.servers > 1:
        server_args.append("--reuse-port")

    def start_server(i: int, addr: str) -> _Proc:
        args = [*server_args, "--addr", addr]
        if opts.trace is not None and i == 0:
            args += ["--trace", str(opts.trace)]
        return _spawn(f"server{i}", args, on_server)

    servers = [start_server(0, "127.0.0.1:0")]
    upstream = servers[0].addr
    servers += [start_server(i, upstream) for i in range(1, opts.servers)]
    procs: list[_Proc] = []
    if opts.faults:
        proxy = _spawn(
            "proxy",
            ["proxy", "--upstream", upstream, "--seed", str(rng.getrandbits(32))],
            on_proxy,
        )
        procs.append(proxy)
        entry = proxy.addr
    else:
        entry = upstream
    logs = []
    per = [
        opts.connections // opts.clients + (i < opts.connections % opts.clients)
        for i in range(opts.clients)
    ]
    clients = []
    start = time.monotonic()  # the clients start working as soon as each is spawned
    for i, n in enumerate(per):
        log = workdir / f"client{i}.jsonl"
        logs.append(log)
        args = ["clients", "--addr", entry, "--id", str(i), "--connections", str(n)]
        args += ["--accounts", str(opts.accounts), "--seconds", str(opts.seconds)]
        args += ["--seed", str(rng.getrandbits(32)), "--heartbeat", hb, "--log", str(log)]
        args += ["--think", str(opts.think)]
        clients.append(_spawn(f"client{i}", args, on_client))
    kill_at = sorted(rng.uniform(0.25, 0.75) * opts.seconds for _ in range(opts.kills))
    recovered: list[float] = []

    def totals() -> dict[str, Any]:
        with lock:
            stats = list(client_stats.values())
        keys = (
            "acked", "refused", "in_flight", "retries", "replays", "reconnects", "found_dead",
            "cpu",
        )  # fmt: skip
        out: dict[str, Any] = {k: sum(s.get(k, 0) for s in stats) for k in keys}
        p99 = [s["p99_ms"] for s in stats if s.get("p99_ms") is not None]
        p50 = [s["p50_ms"] for s in stats if s.get("p50_ms") is not None]
        out["p50_ms"] = max(p50) if p50 else None
        out["p99_ms"] = max(p99) if p99 else None
        return out

    def table() -> Table:
        t = totals()
        elapsed = time.monotonic() - start
        fault_text = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in faults.items() if v)
        caption = "; ".join(x for x in (fault_text, *events) if x) or "no faults yet"
        tbl = Table(
            title=f"ledger demo: {elapsed:5.1f} s of {opts.seconds:g} s",
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
            f"{t['p50_ms']}/{t['p99_ms']}",
        )
        return tbl

    series: list[tuple[float, int, float | None, float | None]] = []
    sampling = threading.Event()

    def sample() -> None:  # on a thread: a server restart blocks the conductor
        while not sampling.wait(0.1):
            t = totals()
            series.append((time.monotonic() - start, t["acked"], t["p50_ms"], t["p99_ms"]))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()

    # Processes that ended on their own: (name, exit status, seconds into the run).
    died: list[tuple[str, int | None, float]] = []

    def conduct(refresh: Callable[[], None]) -> None:
        pending = list(kill_at)
        while any(c.proc.poll() is None for c in clients):
            now = time.monotonic() - start
            # A server or the proxy that exits unbidden (a crash) ends the run: the
            # clients would only retry against nothing until their time is up.
            gone = [(p.name, p.proc.poll(), now) for p in [*servers, *procs]]
            died.extend(d for d in gone if d[1] is not None)
            if died:
                break
            if pending and now >= pending[0]:
                pending.pop(0)
                victim = rng.randrange(len(servers))
                _stop(servers[victim])  # kill -9: no goodbye, nothing beyond what committed
                name = "the server" if len(servers) == 1 else f"server {victim}"
                events.append(f"kill -9 of {name} at {now:.1f} s")
                servers[victim] = start_server(victim, upstream)
                restarted = time.monotonic()
                before = totals()["acked"]
                while time.monotonic() - restarted < 30 and totals()["acked"] == before:
                    time.sleep(0.01)
                recovered.append(time.monotonic() - restarted)
            refresh()
            time.sleep(0.1)
        if not died:
            # The clients may all have ended because a server died between two looks
            # (they fail fast against nothing, more so on a loaded machine): the server
            # is the cause to report, not them.
            now = time.monotonic() - start
            died.extend(
                (p.name, code, now)
                for p in [*servers, *procs]
                if (code := p.proc.poll()) is not None
            )
        refresh()

    try:
        if live_display:
            with Live(table(), console=console, refresh_per_second=4) as live:
                conduct(lambda: live.update(table()))
        else:
            last = [0.0]

            def plain() -> None:
                if time.monotonic() - last[0] >= 2:
                    last[0] = time.monotonic()
                    console.print(table())

            conduct(plain)
        for c in clients:
            _stop(c)
        elapsed = time.monotonic() - start
    finally:
        sampling.set()
        sampler.join(timeout=5)
        if opts.trace is not None and servers[0].proc.poll() is None:
            _stop(servers[0], signal.SIGTERM)  # it writes its trace on SIGTERM
        for p in [*clients, *procs, *servers]:
            _stop(p)
    if not died:  # else the clients were stopped here, for the early end
        died += [(c.name, code, elapsed) for c in clients if (code := c.proc.returncode)]
    if died:
        # The clients write their logs when their run ends: after an early end there is
        # nothing to audit against, and the report says why the run stopped instead.
        what = "; ".join(
            f"{name} exited with status {code} at {at:.1f} s" for name, code, at in died
        )
        checks = [
            ("every process ran until stopped", False, f"{what} (no audit: the run ended early)")
        ]
    else:
        checks = audit(read_ledger(spec), opts.accounts, read_logs(logs))
        who = f"{len(servers)} server(s), {len(clients)} client process(es)"
        checks.append(("every process ran until stopped", True, who))
    t = totals()
    if not live_display:  # the live display already shows the last figures
        console.print(table())
    with lock:
        named = list(server_stats.values())
    incarnations = [s for _, s in named]
    calls = sum(s.get("calls", 0) for s in incarnations)
    cpu = sum(s.get("cpu", 0.0) for s in incarnations)
    ops = sum(s.get("store_ops", 0) for s in incarnations)
    batches = sum(s.get("store_batches", 0) for s in incarnations)

    def per_ack(seconds: float) -> str:
        return f"{seconds / t['acked'] * 1000:.3f}" if t["acked"] else "-"

    counts: list[tuple[str, Any]] = [
        *faults.items(),
        ("server kills (kill -9)", opts.kills),
        ("retries", t["retries"]),
        ("replays", t["replays"]),
        ("reconnects", t["reconnects"]),
        # The side that gave up first: the clients (no frame from the server for their
        # heartbeat timeout), or else the server or the network.
        ("connections the clients found dead (server silent past its heartbeats)", t["found_dead"]),
        ("refused (insufficient funds)", t["refused"]),
        ("acknowledged transfers/s, whole run", f"{t['acked'] / elapsed:,.0f}"),
        ("acknowledged transfers/s, middle half", steady_rate(series)),
        ("server processes", opts.servers),
        *(
            (f"calls served by {name}", sum(s.get("calls", 0) for n, s in named if n == name))
            for name in sorted({n for n, _ in named})
        ),
        ("server CPU per call (ms)", f"{cpu / calls * 1000:.3f}" if calls else "-"),
        ("client CPU per acknowledged transfer (ms)", per_ack(t["cpu"])),
        *(
            [("fault proxy CPU per acknowledged transfer (ms)", per_ack(proxy_cpu[0]))]
            if opts.faults
            else []
        ),
        ("store commits/s (transactions or pipelines)", f"{batches / elapsed:,.0f}"),
        ("store operations per commit", f"{ops / batches:.1f}" if batches else "-"),
        ("largest server RSS (MiB)", max((s.get("rss", 0) for s in incarnations), default=0) >> 20),
    ]
    for i, r in enumerate(recovered):
        intervals = r / opts.heartbeat
        counts.append(
            (f"served again after restart {i + 1}", f"{r:.2f} s, {intervals:.1f} heartbeats")
        )
    code = report_tables(console, checks, counts)
    console.print(f"ledger: {where}")
    if opts.plot is not None:
        kills = [float(e.split(" at ")[1].split()[0]) for e in events]
        _plot(opts.plot, series, kills)
        console.print(f"chart written to {opts.plot}")
    if opts.trace is not None:
        console.print(f"trace of server 0 written to {opts.trace} (open in ui.perfetto.dev)")
    return code


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


def _plot(
    path: Path, series: list[tuple[float, int, float | None, float | None]], kills: list[float]
) -> None:
    """Acknowledged transfers per second and latency percentiles over the run."""
    try:
        import matplotlib  # noqa: PLC0415 - optional: only --plot needs it

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415
    except ImportError as exc:
        raise SystemExit(f"--plot needs matplotlib (pip install matplotlib): {exc}") from exc
    # Rates over one-second windows: the clients report every half second.
    times, rates = [], []
    j = 0
    for t1, a1, _, _ in series:
        while series[j][0] < t1 - 1.0:
            j += 1
        t0, a0 = series[j][0], series[j][1]
        if t1 - t0 >= 0.5:
            times.append(t1)
            rates.append((a1 - a0) / (t1 - t0))
    fig, (top, bottom) = plt.subplots(2, 1, sharex=True, figsize=(9, 6))
    top.plot(times, rates, lw=0.8)
    top.set_ylabel("acknowledged transfers/s")
    for name, index in (("p50", 2), ("p99", 3)):
        pts = [(s[0], s[index]) for s in series if s[index] is not None]
        bottom.plot([p[0] for p in pts], [p[1] for p in pts], lw=0.8, label=name)
    bottom.set_ylabel("latency, ms (last 0.5 s)")
    bottom.set_yscale("log")
    bottom.set_xlabel("seconds")
    bottom.legend()
    for k in kills:
        for ax in (top, bottom):
            ax.axvline(k, color="red", lw=0.8, ls="--")
    top.set_title("ledger demo (red: kill -9 of the server)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
