"""The simulated demo (``--simulate``): its disk model, its progress, its cost.

The whole-run checks (same seed, same report; audits under fault plans) are in
test_demo.py; these look at the pieces the simulation adds.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import gosim
from gosim import Chan, go
from idempotency import MemoryStore, StoreUnavailable
from idempotency.demo._sim import SimOptions, _CrashableStore, run_simulation

_ENV = {**os.environ, "COLUMNS": "250"}  # lines unwrapped


def _claims(n: int, kill_at: float | None) -> list[tuple[str, float]]:
    """n claims issued together on a group-commit store; with ``kill_at``, the server
    dies then. Returns each claim's outcome and the virtual time it came back."""

    async def main() -> list[tuple[str, float]]:
        store = _CrashableStore(MemoryStore(), random.Random(1), (0.004, 0.004))
        out: Chan[tuple[str, float]] = Chan(n)

        async def claim(k: int) -> None:
            try:
                await store.claim("c", f"k{k}", b"fp", 5.0)
                await out.send(("claimed", gosim.now()))
            except StoreUnavailable:
                await out.send(("lost", gosim.now()))

        async def killer() -> None:
            assert kill_at is not None
            await gosim.sleep(kill_at)
            store.kill()

        t0 = gosim.now()
        for k in range(n):
            go(claim, k)
        if kill_at is not None:
            go(killer)
        got = [await out.recv() for _ in range(n)]
        records = await store.inner.get("c", "k0")
        got.append(("k0 recorded" if records is not None else "k0 absent", t0))
        return [(what, round(t - t0, 6)) for what, t in got]

    result: list[tuple[str, float]] = gosim.run(main, procs=1, seed=1, virtual_time=True)
    return result


def test_operations_issued_together_share_one_commit() -> None:
    got = _claims(20, None)
    # The first starts a commit at once; the 19 behind it make the next one together
    # (two commits' time, not 20).
    assert got[:-1] == [("claimed", 0.004)] + [("claimed", 0.008)] * 19
    assert got[-1][0] == "k0 recorded"


def test_a_kill_during_a_commit_loses_the_whole_batch() -> None:
    got = _claims(20, 0.002)
    # Killed during the first commit: it fails, and so does the second, which had not
    # begun (the process is gone).
    assert got[:-1] == [("lost", 0.004)] + [("lost", 0.008)] * 19
    assert got[-1][0] == "k0 absent"  # nothing of the dead incarnation's batch applied


def test_progress_is_reported_in_virtual_seconds_and_replays() -> None:
    def run() -> list[tuple[float, dict[str, int]]]:
        seen: list[tuple[float, dict[str, int]]] = []
        opts = SimOptions(connections=8, accounts=10, seconds=3.0, seed=5)
        result = run_simulation(opts, lambda at, totals: seen.append((round(at, 6), totals)))
        acked = dict(result.counts)["acked"]
        assert all(ok for _, ok, _ in result.checks)
        assert seen[-1][1]["acked"] <= acked
        return seen

    first = run()
    assert [at for at, _ in first[:3]] == [1.0, 2.0, 3.0]
    acked = [totals["acked"] for _, totals in first]
    assert acked == sorted(acked) and acked[0] > 0
    assert run() == first


def test_the_trace_shows_each_simulated_process_and_each_goroutine(tmp_path: Path) -> None:
    path = tmp_path / "trace.json"
    opts = SimOptions(connections=4, accounts=6, seconds=1.0, seed=3, kills=1, trace=path)
    run_simulation(opts)
    events = json.loads(path.read_text())["traceEvents"]
    processes = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert sorted(processes.values()) == [
        "client 0",
        "client 1",
        "fault proxy",
        "server, incarnation 1",
        "server, incarnation 2",
        "simulation, seed 3: conductor",
    ]
    tracks = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["name"] == "thread_name"}
    # One track per goroutine: no goroutine id in two processes.
    goids = [tid for _, tid in tracks]
    assert len(goids) == len(set(goids))
    by_process: dict[str, set[str]] = {}
    for (pid, tid), name in tracks.items():
        if tid:
            g, fn = name.split(" ", 1)
            assert g == f"G{tid}"
            by_process.setdefault(processes[pid], set()).add(fn)
    assert "idempotency.demo._sim._Incarnation._serve" in by_process["server, incarnation 2"]
    assert "netframe._server.Server._serve_conn" in by_process["server, incarnation 1"]
    assert "idempotency.demo._proxy._pump" in by_process["fault proxy"]
    assert "idempotency.demo._clients.run_fleet.<locals>.connection" in by_process["client 0"]
    slices = [e for e in events if e["ph"] == "X"]
    assert {processes[e["pid"]] for e in slices} == set(processes.values())
    assert all((e["pid"], e["tid"]) in tracks for e in slices)


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupt_stops_a_simulated_run_at_once_with_one_line(sig: int) -> None:
    # A run far longer than the test: only the signal can end it in time.
    cmd = [sys.executable, "-m", "idempotency.demo", "--simulate", "--seconds", "600"]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_ENV
    )
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()  # the first progress line: the simulation runs
        assert line.startswith("virtual 1 s of 600"), line
        proc.send_signal(sig)
        # At once: a second's grace for a loaded machine's scheduling, not the 12 s
        # and more of a run that waited for the driver's next checkpoint.
        code = proc.wait(timeout=30)
        out, err = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert code == 128 + sig, out + err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    last = out.strip().splitlines()[-1]
    name = signal.Signals(sig).name
    assert re.fullmatch(
        rf"interrupted by {name} at virtual \d+ s: the simulation stopped; replay it with: "
        r"python -m idempotency\.demo --simulate --seed 1 --connections 200 .*",
        last,
    ), out


def test_a_simulated_run_with_faults_and_a_kill_passes_the_history_check() -> None:
    """The clients' transfers and balance reads, timed on the virtual clock, through
    lost replies, duplicates, stalls and a kill -9: each account's history is
    linearizable, and the check saw every operation."""
    opts = SimOptions(connections=8, accounts=10, seconds=3.0, seed=11, kills=1)
    result = run_simulation(opts)
    assert all(ok for _, ok, _ in result.checks), result.checks
    (detail,) = [d for n, _, d in result.checks if n == "transfers and balance reads linearizable"]
    m = re.fullmatch(r"each account's history: (\d+) operations \((\d+) balance reads\)", detail)
    assert m is not None, detail
    assert int(m.group(2)) > 0 and int(m.group(1)) > 2 * int(m.group(2))
    counts = dict(result.counts)
    assert counts["server kills (kill -9)"] == 1 and counts["retries"] > 0
