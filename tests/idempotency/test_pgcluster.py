"""The throwaway cluster dies with its owner: a demo conductor SIGKILLed mid-run leaves
no PostgreSQL server behind (its watchdog stops the postmaster)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from idempotency.stores.pgcluster import PG_BIN

pytestmark = pytest.mark.skipif(PG_BIN is None, reason="PostgreSQL is not installed")

# The demo conductor's way to a cluster of its own (own_postgres), then it waits to be
# killed.
_CONDUCTOR = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from idempotency.demo._run import own_postgres
    cluster = own_postgres(Path(sys.argv[1]))
    print(cluster.postmaster_pid(), flush=True)
    time.sleep(600)
    """
)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_sigkilled_conductors_cluster_stops() -> None:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    # Not pytest's tmp_path: the cluster's user must reach the directory (/tmp is o+x).
    workdir = tempfile.mkdtemp(prefix="idem-conductor-")
    conductor = subprocess.Popen(
        [sys.executable, "-c", _CONDUCTOR, workdir],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    postmaster = 0
    try:
        assert conductor.stdout is not None
        line = conductor.stdout.readline()
        assert line.strip().isdigit(), line
        postmaster = int(line)
        assert _alive(postmaster)
        conductor.send_signal(signal.SIGKILL)
        conductor.wait(timeout=30)
        deadline = time.monotonic() + 60  # generous: a loaded 2-core machine
        while _alive(postmaster) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(postmaster), "the cluster outlived its SIGKILLed conductor"
    finally:
        if conductor.poll() is None:
            conductor.kill()
            conductor.wait()
        if conductor.stdout is not None:
            conductor.stdout.close()
        if postmaster and _alive(postmaster):  # the failure's cleanup
            os.kill(postmaster, signal.SIGQUIT)
            for _ in range(100):  # bounded: until it is gone
                if not _alive(postmaster):
                    break
                time.sleep(0.1)
        shutil.rmtree(workdir, ignore_errors=True)
