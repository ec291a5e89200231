"""The ledger demo: a short real run (processes, faults, kill -9, SQLite) passes its
audit, and the audit fails on a ledger that lost or doubled a transfer."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from idempotency.demo._ledger import create_ledger
from idempotency.demo._run import audit


@pytest.mark.slow
def test_a_short_run_under_faults_and_a_kill_passes_its_audit(tmp_path: Path) -> None:
    db = tmp_path / "ledger.db"
    cmd = [sys.executable, "-m", "idempotency.demo", "--plain", "--seconds", "4"]
    cmd += ["--connections", "30", "--accounts", "20", "--db", str(db), "--seed", "3"]
    out = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "all checks hold" in out.stdout
    assert "kill -9 at" in out.stdout
    with sqlite3.connect(db) as conn:
        (applied,) = conn.execute("SELECT COUNT(*) FROM transfers").fetchone()
    assert applied > 0


def _ledger(tmp_path: Path, transfers: list[tuple[str, str, int, int, int]]) -> Path:
    db = tmp_path / "ledger.db"
    create_ledger(db, 3)
    with sqlite3.connect(db) as conn:
        for caller, key, src, dst, amount in transfers:
            conn.execute("UPDATE accounts SET balance = balance - ? WHERE id = ?", (amount, src))
            conn.execute("UPDATE accounts SET balance = balance + ? WHERE id = ?", (amount, dst))
            conn.execute(
                "INSERT INTO transfers VALUES (?, ?, ?, ?, ?, 1)", (caller, key, src, dst, amount)
            )
    return db


def _log(tmp_path: Path, entries: list[dict[str, object]]) -> Path:
    path = tmp_path / "client0.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in entries))
    return path


def _entry(key: str, status: str, src: int = 0, dst: int = 1, amount: int = 5) -> dict[str, object]:
    return {"caller": "c0", "key": key, "src": src, "dst": dst, "amount": amount, "status": status}


def test_the_audit_passes_a_consistent_ledger(tmp_path: Path) -> None:
    db = _ledger(tmp_path, [("c0", "t0", 0, 1, 5), ("c0", "t1", 1, 2, 7)])
    log = _log(tmp_path, [_entry("t0", "acked"), _entry("t1", "acked", 1, 2, 7)])
    assert all(ok for _, ok, _ in audit(db, 3, [log]))


def test_the_audit_catches_a_lost_acknowledged_transfer(tmp_path: Path) -> None:
    db = _ledger(tmp_path, [("c0", "t0", 0, 1, 5)])
    log = _log(tmp_path, [_entry("t0", "acked"), _entry("t1", "acked", 1, 2, 7)])
    failed = [name for name, ok, _ in audit(db, 3, [log]) if not ok]
    assert failed == ["every acknowledged transfer in the ledger once"]


def test_the_audit_catches_a_doubled_or_unasked_transfer(tmp_path: Path) -> None:
    db = _ledger(tmp_path, [("c0", "t0", 0, 1, 5), ("c0", "t9", 0, 1, 5)])
    with sqlite3.connect(db) as conn:  # the effect applied twice: balances moved twice
        conn.execute("UPDATE accounts SET balance = balance - 5 WHERE id = 0")
        conn.execute("UPDATE accounts SET balance = balance + 5 WHERE id = 1")
    log = _log(tmp_path, [_entry("t0", "acked")])
    failed = [name for name, ok, _ in audit(db, 3, [log]) if not ok]
    assert failed == ["nothing applied twice or unasked"]


def test_the_audit_catches_lost_money_and_unknown_outcomes(tmp_path: Path) -> None:
    db = _ledger(tmp_path, [])
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE accounts SET balance = balance - 1 WHERE id = 2")
    log = _log(tmp_path, [_entry("t0", "unknown")])
    failed = [name for name, ok, _ in audit(db, 3, [log]) if not ok]
    assert failed == [
        "balances conserved",
        "nothing applied twice or unasked",
        "every outcome known after reconciliation",
    ]
