"""``python -m netframe``: the framing layer's tour runs and shows what it promises."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_tour_serves_three_clients_over_loopback() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "netframe"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        check=True,
    ).stdout
    assert "netframe tour: long connections on 127.0.0.1:" in out
    for name in ("ADA", "BOB", "CY"):
        assert f"HELLO FROM {name} / STILL THERE?" in out
    assert "server: accepted=3 " in out
