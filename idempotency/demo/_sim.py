"""``--simulate``: the whole demo in one process, on gosim's simulated network, in
virtual time.

The same pieces as the real run (the ledger server of ``_ledger``, the fault proxy of
``_proxy``, the client fleets of ``_clients``), on ``net.listen("sim", ...)`` instead of
TCP, with the ledger in memory (:class:`~._ledger.MemoryLedger`, which outlives a crash
as a disk would) behind a group commit at a disk's pace (:data:`STORE_COMMIT`). A crash
of the server is a ``kill -9`` as seen from outside: every connection it accepted closes
at once (no GOAWAY, no reply flushed), its listener goes, and its store refuses whatever
the dead incarnation still tries (a process that no longer exists commits nothing); a
new incarnation starts after a restart delay on the same address and the same ledger.
With ``--trace``, each simulated process (server incarnation, fault proxy, client host)
is a Perfetto process of its own, each goroutine a track.

Everything runs on one seeded runtime (``gosim.run(seed=..., virtual_time=True)``), the
network's latencies and the fault plan come from the seed, and the report has no wall-clock
figure in it, so one seed prints one report, byte for byte; a failing seed is a bug
report anyone can replay.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

import gosim
from gosim import Chan, go, lowlevel, net

from .._errors import StoreUnavailable
from .._record import ClaimResult, Record
from ..stores import Completion, Store, StoreStatistics
from ._clients import run_fleet
from ._ledger import MemoryLedger, make_server
from ._proxy import FaultPlan, serve_proxy
from ._run import Workload, audit, report_tables

__all__ = ["SimOptions", "SimResult", "run_simulation", "simulate"]

#: How long a killed server stays down before its restart (virtual seconds).
RESTART_DELAY = 0.5
#: How long one group commit of the store takes (virtual seconds): an fsync of its log
#: (about 5 ms on the disk the real run was measured on) and the batch's statements.
STORE_COMMIT = (0.002, 0.008)


@dataclass
class SimOptions(Workload):
    trace: Path | None = None
    #: FaultPlan probabilities (drop, lose_reply, duplicate, stall, stall_for) to
    #: override; the default plan otherwise.
    plan: dict[str, float] = field(default_factory=dict)


@dataclass
class SimResult:
    checks: list[tuple[str, bool | None, str]]  # None: not checked
    counts: list[tuple[str, Any]]


class _CrashableStore(Store):
    """The store as one server incarnation sees it, on a disk with group commit, as the
    real run's SQLite store: operations wait for the next commit (which starts when the
    one in progress ends; each takes a time drawn from ``commit``) and apply when it is
    durable, so a crash can fall between a transfer's claim and its completion. After
    :meth:`kill`, every operation fails (the process is gone), those of the commit in
    progress included: nothing the dead incarnation had under way commits."""

    def __init__(self, inner: Store, rng: random.Random, commit: tuple[float, float]) -> None:
        self.inner = inner
        self.rng = rng
        self.commit = commit
        self.dead = False
        self._next: Chan[None] | None = None  # the batch gathering for the next commit
        self._committing = False

    async def _alive(self) -> Store:
        if self.dead:
            raise StoreUnavailable("the server process was killed")
        batch = self._next
        if batch is None:
            batch = self._next = Chan()
            if not self._committing:
                self._committing = True
                go(self._committer)
        await batch.recv()  # closed when its commit is durable
        if self.dead:
            raise StoreUnavailable("the server process was killed")
        return self.inner

    async def _committer(self) -> None:
        # One commit at a time; what arrives meanwhile makes the next one (one timer per
        # batch, not one per operation).
        while (batch := self._next) is not None:
            self._next = None
            await gosim.sleep(self.rng.uniform(*self.commit))
            batch.close()
        self._committing = False

    def kill(self) -> None:
        self.dead = True

    async def claim(self, caller: str, key: str, fingerprint: bytes, lease: float) -> ClaimResult:
        return await (await self._alive()).claim(caller, key, fingerprint, lease)

    async def complete(self, caller: str, key: str, fence: int, completion: Completion) -> Record:
        return await (await self._alive()).complete(caller, key, fence, completion)

    async def release(self, caller: str, key: str, fence: int) -> bool:
        return await (await self._alive()).release(caller, key, fence)

    async def get(self, caller: str, key: str) -> Record | None:
        return await (await self._alive()).get(caller, key)

    async def sweep(self) -> int:
        return await (await self._alive()).sweep()

    def now(self) -> float:
        return self.inner.now()

    def statistics(self) -> StoreStatistics:
        return self.inner.statistics()


class _Incarnation:
    """One life of the server process: its listener, its connections and its store."""

    def __init__(
        self,
        ledger: MemoryLedger,
        address: str,
        heartbeat: float,
        conns: int,
        rng: random.Random,
        name: str = "server",
    ) -> None:
        self.name = name
        self.store = _CrashableStore(ledger.store, rng, STORE_COMMIT)
        self.server = make_server(ledger, heartbeat, conns, store_wrapper=lambda _: self.store)
        self.listener = net.listen("sim", address)
        self.conns: list[Any] = []  # a list, not a set: the crash closes them in order
        self.killed = False
        go(self._serve)

    async def _serve(self) -> None:
        _as_process(self.name)
        try:
            await self.server.serve(self)
        except net.ClosedError:
            if not self.killed:
                raise

    # The server accepts through the incarnation, which keeps what a kill must close.
    network = "sim"

    def addr(self) -> str:
        return self.listener.addr()

    async def accept(self) -> Any:
        conn = await self.listener.accept()
        self.conns.append(conn)
        return conn

    def close(self) -> None:
        self.listener.close()

    def kill(self) -> None:
        self.killed = True
        self.store.kill()
        self.listener.close()
        for conn in self.conns:
            conn.close()


#: How often (virtual seconds) the simulation reports its progress.
PROGRESS_EVERY = 1.0


def _as_process(name: str) -> None:
    """Show the calling goroutine and those it starts as the process ``name`` in the
    runtime's trace (when one is recorded): a process of the simulated system."""
    trace = lowlevel.current_runtime().trace
    if trace is not None:
        trace.name_process(lowlevel.goid(), name)


def run_simulation(
    opts: SimOptions, progress: Callable[[float, dict[str, int]], None] | None = None
) -> SimResult:
    """Run the system on the simulated network from ``opts.seed``; audit the ledger.

    ``progress(virtual_seconds, totals)`` is called every :data:`PROGRESS_EVERY`
    virtual seconds with the fleets' summed ``acked``, ``refused`` and ``in_flight``
    (from their stats lines, so the figures depend on the seed alone)."""
    trace = None
    if opts.trace is not None:
        trace = gosim.Trace(process=f"simulation, seed {opts.seed}: conductor")
    ledger = MemoryLedger(opts.accounts)
    counts: dict[str, Any] = {}
    logs: list[dict[str, Any]] = []
    events: list[str] = []

    async def system() -> list[str]:
        rng = random.Random(opts.seed)
        # No event log: it would keep a few tuples per segment for the whole run.
        network = net.SimNetwork(seed=rng.getrandbits(32), latency=(0.0005, 0.002), log=None)
        net.use_sim_network(network)
        t0 = gosim.now()
        store_rng = random.Random(rng.getrandbits(32))
        max_conns = opts.connections * 2 + 100
        server = _Incarnation(
            ledger, "server:1", opts.heartbeat, max_conns, store_rng, "server, incarnation 1"
        )
        plan = FaultPlan(rng.getrandbits(32), **opts.plan)
        entry = "server:1"
        proxy_ln = None
        if opts.faults:
            proxy_ln = net.listen("sim", "proxy:1")

            async def upstream() -> Any:
                return await net.dial("sim", "server:1", local_host="proxy")

            async def proxy() -> None:
                _as_process("fault proxy")
                await serve_proxy(proxy_ln, upstream, plan)

            go(proxy)
            entry = "proxy:1"
        kill_at = sorted(rng.uniform(0.25, 0.75) * opts.seconds for _ in range(opts.kills))
        hosts = max(1, min(opts.clients, opts.connections))
        fleet_seeds = [rng.getrandbits(32) for _ in range(hosts)]

        async def killer() -> None:
            nonlocal server
            for t in kill_at:
                await gosim.sleep(max(t0 + t - gosim.now(), 0.0))
                server.kill()
                events.append(f"kill -9 at {gosim.now() - t0:.3f} s")
                await gosim.sleep(RESTART_DELAY)
                server = _Incarnation(
                    ledger,
                    "server:1",
                    opts.heartbeat,
                    max_conns,
                    store_rng,
                    f"server, incarnation {len(events) + 1}",
                )

        lines: Chan[tuple[list[dict[str, Any]], str]] = Chan(hosts)
        latest: list[dict[str, int]] = [{} for _ in range(hosts)]

        def reporter(k: int) -> Callable[[str], None] | None:
            if progress is None:
                return None

            def report(line: str) -> None:
                latest[k] = json.loads(line)

            return report

        async def show_progress() -> None:
            assert progress is not None
            while True:
                await gosim.sleep(PROGRESS_EVERY)
                keys = ("acked", "refused", "in_flight")
                progress(gosim.now() - t0, {k: sum(s.get(k, 0) for s in latest) for k in keys})

        async def fleet(k: int, n: int) -> None:
            _as_process(f"client {k}")

            async def dial() -> Any:
                return await net.dial("sim", entry, local_host=f"client{k}")

            result = await run_fleet(
                dial,
                k,
                n,
                opts.accounts,
                opts.seconds,
                fleet_seeds[k],
                opts.heartbeat,
                report=reporter(k),
                think=opts.think,
            )
            await lines.send(result)

        go(killer)
        if progress is not None:
            go(show_progress)
        for k in range(hosts):
            go(fleet, k, opts.connections // hosts + (k < opts.connections % hosts))
        last = []
        for _ in range(hosts):
            log, line = await lines.recv()  # type: ignore[misc]
            logs.extend(log)
            last.append(line)
        counts.update(plan.counts if opts.faults else {})
        counts["virtual seconds"] = f"{gosim.now() - t0:.3f}"
        server.kill()
        if proxy_ln is not None:
            proxy_ln.close()
        return last

    # procs is fixed, not the CPU count: a seed must replay the same run on any machine.
    last = gosim.run(system, procs=1, seed=opts.seed, virtual_time=True, trace=trace)
    if trace is not None and opts.trace is not None:
        opts.trace.write_text(trace.to_chrome_json())
    stats = [json.loads(line) for line in last]
    checks = audit(ledger.state(), opts.accounts, logs)
    rows: list[tuple[str, Any]] = list(counts.items())
    rows += [("server kills (kill -9)", len(events)), *((e, "") for e in events)]
    for k in ("acked", "refused", "retries", "replays", "reconnects"):
        rows.append((k, sum(s[k] for s in stats)))
    rows.append(
        (
            "p50/p99 ms (virtual)",
            f"{max(s['p50_ms'] or 0 for s in stats)}/{max(s['p99_ms'] or 0 for s in stats)}",
        )
    )
    return SimResult(checks, rows)


def simulate(opts: SimOptions) -> int:
    """``--simulate``: run, print the report; 0 when every check holds."""
    console = Console()
    console.print(
        f"simulated ledger demo: seed {opts.seed}, {opts.connections} connections, "
        f"{opts.seconds:g} virtual seconds, faults {'on' if opts.faults else 'off'}"
    )
    replay = (
        f"python -m idempotency.demo --simulate --seed {opts.seed} "
        f"--connections {opts.connections} --clients {opts.clients} "
        f"--accounts {opts.accounts} --seconds {opts.seconds:g} --kills {opts.kills} "
        f"--heartbeat {opts.heartbeat:g} --think {opts.think:g}"
        + ("" if opts.faults else " --no-faults")
    )
    err = Console(stderr=True)
    live = err.is_terminal
    reached = [0.0]  # the virtual seconds of the latest progress line

    def interrupted(signum: int, frame: Any) -> None:
        # The simulation is one busy thread that trio's own Ctrl-C handling reaches
        # only at a checkpoint of the driver's, which a virtual-time run may not make
        # for long: stop here, between two bytecodes. Nothing outside this process
        # holds state of the run (the ledger is in memory), so there is nothing to
        # clean up but the terminal's line.
        # The signal may land inside a write to either stream (a progress line): a
        # buffered stream refuses the handler's reentrant call ("reentrant call inside
        # <_io.BufferedWriter>"), so what is held is flushed where it can be and this
        # line goes out with os.write, under the buffers.
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except RuntimeError:
                pass  # interrupted mid-write: the rest of that write goes with the process
        if live:
            os.write(2, b"\r\x1b[K")
        name = signal.Signals(signum).name
        line = (
            f"interrupted by {name} at virtual {reached[0]:.0f} s: the simulation "
            f"stopped; replay it with: {replay}\n"
        )
        os.write(1, line.encode())
        os._exit(128 + signum)

    def progress(at: float, totals: dict[str, int]) -> None:
        reached[0] = at
        # On stderr, so that stdout is the report alone; the figures are virtual.
        phase = f"of {opts.seconds:g}" if at <= opts.seconds + 1e-9 else "(reconciling)"
        text = (
            f"virtual {at:.0f} s {phase}: {totals['acked']:,} transfers acknowledged, "
            f"{totals['refused']:,} refused, {totals['in_flight']} in flight"
        )
        if live:
            err.file.write("\r" + text + "\x1b[K")
            err.file.flush()
        else:
            err.print(text, highlight=False, soft_wrap=True)

    previous = {sig: signal.signal(sig, interrupted) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        result = run_simulation(opts, progress)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if live:
        err.file.write("\r\x1b[K")
    code = report_tables(console, result.checks, result.counts)
    if code:
        console.print(f"replay this run: {replay}")
    if opts.trace is not None:
        console.print(f"trace written to {opts.trace} (open in ui.perfetto.dev)")
    return code
