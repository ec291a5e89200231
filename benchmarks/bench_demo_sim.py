"""The ledger demo simulated (``--simulate``) against the same demo on real processes.

* ``simulated``: ``python -m idempotency.demo --simulate --seed 7`` at the defaults (200
  connections, 2 client hosts, 15 virtual seconds, the default fault plan and one
  ``kill -9``), as a process of its own: its wall time, its CPU (user + system, from
  ``wait4``), its peak RSS, and its CPU per acknowledged transfer.
* ``real``: ``python -m idempotency.demo --plain --seed 7`` at the same defaults (server,
  fault proxy and two client processes on 127.0.0.1, SQLite): the CPU of the server,
  proxy and client processes, read from ``/proc/PID/stat`` every 0.1 s while they live
  (a process's last reading counts; the conductor's own CPU is left out), per
  acknowledged transfer; and the run's wall time.

``extra_info``: ``wall_s``, ``cpu_s``, ``cpu_ms_per_transfer``, ``transfers`` and, for
the simulation, ``peak_rss_mib``. Reproduce::

    .venv/bin/python -m pytest benchmarks/bench_demo_sim.py --benchmark-json=demo-sim.json

With ``--benchmark-disable`` (CI's smoke pass) both run 1 second of 20 connections.
The machine is shared: wall time moves with its load; CPU per transfer much less.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent.parent
TICK = os.sysconf("SC_CLK_TCK")


def _args(benchmark: Any) -> list[str]:
    if benchmark.disabled:
        return ["--seed", "7", "--seconds", "1", "--connections", "20"]
    return ["--seed", "7"]


def _acked(out: str) -> int:
    """The acknowledged transfers the audit counted (its "N acknowledged" detail)."""
    found = re.findall(r"(\d[\d,]*) acknowledged,", out)
    assert found, out
    return int(found[-1].replace(",", ""))


def simulated(args: list[str]) -> dict[str, float]:
    """One simulated run as a child process: its wall time, CPU, peak RSS, transfers."""
    cmd = [sys.executable, "-m", "idempotency.demo", "--simulate", *args]
    start = time.monotonic()
    proc = subprocess.Popen(
        cmd, cwd=HERE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    assert proc.stdout is not None
    out = proc.stdout.read()
    proc.stdout.close()
    # wait4, not communicate: the rusage of this child alone (its peak RSS included).
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.monotonic() - start
    assert proc.returncode == 0, out
    cpu = usage.ru_utime + usage.ru_stime
    acked = _acked(out)
    return {
        "wall_s": wall,
        "cpu_s": cpu,
        "peak_rss_mib": usage.ru_maxrss / 1024,
        "transfers": acked,
        "cpu_ms_per_transfer": cpu / acked * 1000,
    }


def _children(pid: int) -> list[int]:
    out = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                out += [int(c) for c in f.read().split()]
    except OSError:
        pass
    return out


def _cpu_ticks(pid: int) -> tuple[str, int] | None:
    """(command line, utime + stime in clock ticks) of a live process, or None."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read().replace(b"\0", b" ").decode()
    except OSError:
        return None
    return cmdline, int(fields[11]) + int(fields[12])  # utime, stime (fields 14, 15)


def real(args: list[str]) -> dict[str, float]:
    """One real run: the CPU of its server, proxy and client processes from /proc."""
    cmd = [sys.executable, "-m", "idempotency.demo", "--plain", *args]
    start = time.monotonic()
    proc = subprocess.Popen(
        cmd, cwd=HERE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    last: dict[int, tuple[str, int]] = {}  # pid -> (cmdline, ticks)
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            for child in _children(proc.pid):
                got = _cpu_ticks(child)
                if got is not None and re.search(r"demo (server|proxy|clients)\b", got[0]):
                    last[child] = got
            time.sleep(0.1)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, _ = proc.communicate(timeout=900)
    done.set()
    sampler.join()
    wall = time.monotonic() - start
    assert proc.returncode == 0, out
    roles: dict[str, float] = {"server": 0.0, "proxy": 0.0, "clients": 0.0}
    for cmdline, ticks in last.values():
        role = re.search(r"demo (server|proxy|clients)\b", cmdline)
        assert role is not None
        roles[role.group(1)] += ticks / TICK
    acked = _acked(out)
    cpu = sum(roles.values())
    return {
        "wall_s": wall,
        "cpu_s": cpu,
        "transfers": acked,
        "cpu_ms_per_transfer": cpu / acked * 1000,
        **{f"{role}_cpu_s": v for role, v in roles.items()},
    }


def bench_demo_simulated(benchmark: Any) -> None:
    benchmark.group = "demo-sim"
    got: list[dict[str, float]] = []
    benchmark.pedantic(lambda: got.append(simulated(_args(benchmark))), rounds=1, iterations=1)
    benchmark.extra_info.update(got[0])


def bench_demo_real(benchmark: Any) -> None:
    benchmark.group = "demo-sim"
    got: list[dict[str, float]] = []
    benchmark.pedantic(lambda: got.append(real(_args(benchmark))), rounds=1, iterations=1)
    benchmark.extra_info.update(got[0])


if __name__ == "__main__":
    which = sys.argv[1] if len(sys.argv) > 1 else "simulated"
    figures = (simulated if which == "simulated" else real)(sys.argv[2:] or ["--seed", "7"])
    print(" ".join(f"{k}={v:.4g}" for k, v in figures.items()))
