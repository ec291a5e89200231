"""The demo's audit against ledgers and clients broken on purpose: a ledger that does
nothing, refuses what it could pay, answers errors the workload never provokes, or
acknowledges and applies nothing; clients that issue nothing or what the workload never
would; a client that died without its log. And ``audit DIR`` on a run's directory."""

from __future__ import annotations

import json
import os
import random
import re
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gosim
from gosim import go, net
from gosim.testing import check_linearizability
from idempotency.demo._audit import (
    MAX_AMOUNT,
    Ending,
    audit,
    audit_run,
    caller_name,
    ledger_history,
    ledger_model,
    refusal_bound,
    write_manifest,
)
from idempotency.demo._clients import run_fleet
from idempotency.demo._ledger import (
    INITIAL_BALANCE,
    LedgerSpec,
    LedgerState,
    create_ledger,
    read_ledger,
)
from idempotency.rpc import Server

from . import _broken_ledger

ACCOUNTS = 10
CONNECTIONS = 4
LINZ = "transfers and balance reads linearizable"


def _failed(checks: list[tuple[str, bool | None, str]]) -> list[str]:
    return [name for name, ok, _ in checks if ok is False]


def _run_fleet_against(
    make: Callable[[LedgerSpec, float, int], Server], db: Path, seconds: float = 1.0
) -> tuple[LedgerState, list[dict[str, Any]]]:
    """The demo's client fleet (in this process, over TCP on 127.0.0.1) against the
    server ``make`` builds on a new SQLite ledger; the ledger and the log after."""
    spec = LedgerSpec("sqlite", path=db)
    create_ledger(spec, ACCOUNTS)

    async def main() -> list[dict[str, Any]]:
        srv = make(spec, 5.0, 100)
        ln = net.listen("tcp", "127.0.0.1:0")
        go(srv.serve, ln)

        async def dial() -> Any:
            return await net.dial("tcp", ln.addr())

        log, _ = await run_fleet(dial, 0, CONNECTIONS, ACCOUNTS, seconds, 7, 5.0)
        await srv.shutdown(1.0)
        return log

    log = gosim.run(main)
    return read_ledger(spec), log


def _callers() -> list[str]:
    return [caller_name(0, i) for i in range(CONNECTIONS)]


def test_the_demos_fleet_passes_on_a_correct_ledger(tmp_path: Path) -> None:
    """The control: the broken servers' own plumbing, unbroken, passes every check."""
    state, log = _run_fleet_against(_broken_ledger.correct, tmp_path / "ledger.db")
    checks = audit(state, ACCOUNTS, log, _callers())
    assert all(ok is True for _, ok, _ in checks), checks
    assert len(log) > refusal_bound(0)  # enough transfers for the bound to bite


@pytest.mark.parametrize(
    ("server", "fails"),
    [
        # Refuses everything: nothing acknowledged, every refusal unexplained (and
        # refused with the money there).
        ("refuse_all", ["the clients ran the workload", "refusals the workload explains", LINZ]),
        # Refuses three in ten it could pay: more than the workload explains.
        ("refuse_some", ["refusals the workload explains", LINZ]),
        # Answers an error the workload never provokes (an unknown account).
        ("fail_all", ["the clients ran the workload", "refusals the workload explains", LINZ]),
        # Acknowledges and applies nothing: the balances read do not move.
        ("ack_nothing", ["every acknowledged transfer in the ledger once", LINZ]),
    ],
)
def test_the_audit_fails_a_broken_ledger(server: str, fails: list[str], tmp_path: Path) -> None:
    state, log = _run_fleet_against(getattr(_broken_ledger, server), tmp_path / "ledger.db")
    assert _failed(audit(state, ACCOUNTS, log, _callers())) == fails


def test_the_clients_history_has_times_and_balance_reads(tmp_path: Path) -> None:
    """What the history check reads: every transfer with its call time and, once its
    outcome is known, its return; balance reads with theirs; and they pass on the
    correct ledger, all of them checked."""
    state, log = _run_fleet_against(_broken_ledger.correct, tmp_path / "ledger.db")
    transfers = [e for e in log if "kind" not in e]
    reads = [e for e in log if e.get("kind") == "balance"]
    assert transfers and reads
    assert all(e["call"] <= e["ret"] for e in [*transfers, *reads])
    assert all(type(e["balance"]) is int for e in reads)
    history, total = ledger_history(log)
    assert total == len(history) == 2 * len(transfers) + len(reads)
    (detail,) = [d for n, ok, d in audit(state, ACCOUNTS, log, _callers()) if n == LINZ and ok]
    assert f"{len(history)} operations ({len(reads)} balance reads)" in detail


def test_the_history_check_catches_a_ledger_that_applies_nothing(tmp_path: Path) -> None:
    """A ledger that acknowledges transfers and applies none: an account's history
    is not linearizable, and the counterexample is small: a read of the account that
    shows its opening balance, acknowledged transfers of it that returned before the
    read began, and transfers left pending that could not have made up for them."""
    state, log = _run_fleet_against(_broken_ledger.ack_nothing, tmp_path / "ledger.db")
    history, _ = ledger_history(log)
    result = check_linearizability(ledger_model(ACCOUNTS), history)
    assert not result and result.minimal
    ce = result.counterexample
    account = result.partition
    done = [op for op in ce if op.ret is not None]
    reads = [op for op in done if op.input[0] == "balance"]
    transfers = [op for op in done if op.input[0] == "transfer"]
    assert len(reads) == 1 and reads[0].input == ("balance", account), result
    assert reads[0].output == INITIAL_BALANCE
    assert 1 <= len(transfers) <= 3 and all(op.output == "acked" for op in transfers), result
    others = [op for op in ce if op is not reads[0]]  # the pending ones too
    assert all(op.input[0] == "transfer" and op.input[-1] == account for op in others)
    assert len(ce) <= 12 < len(history), result
    (detail,) = [d for n, ok, d in audit(state, ACCOUNTS, log, _callers()) if n == LINZ]
    assert f"account {account}: these {len(ce)} cannot be put in one order" in detail
    assert f"balance({account}) -> {INITIAL_BALANCE}" in detail


def test_the_history_is_cut_at_a_window_with_the_calls_in_flight_pending() -> None:
    log = [
        _entry("t0", "acked", call=0.0, ret=1.0),
        _entry("t1", "acked", call=2.0, ret=9.0),  # in flight at the cut
        {"kind": "balance", "caller": "c0-1", "account": 2, "balance": 1000, "call": 3.0,
         "ret": 4.0},
        _entry("t2", "refused", code=9, call=5.0, ret=6.0),  # after the cut
    ]  # fmt: skip
    history, total = ledger_history(log, window=5)
    assert total == 7
    assert [(op.input[0], op.call, op.ret) for op in history] == [
        ("transfer", 0.0, 1.0),
        ("transfer", 0.0, 1.0),
        ("transfer", 2.0, None),
        ("transfer", 2.0, None),
        ("balance", 3.0, None),
    ]
    # The window's last call is the read's: it returned after it, so it is pending too.
    assert history[4].output is None


def test_the_audit_fails_a_client_that_issued_nothing(tmp_path: Path) -> None:
    state, log = _run_fleet_against(_broken_ledger.correct, tmp_path / "ledger.db", 0.5)
    # A second client process whose connections issued nothing (its log is empty).
    callers = [*_callers(), caller_name(1, 0), caller_name(1, 1)]
    checks = audit(state, ACCOUNTS, log, callers)
    assert _failed(checks) == ["the clients ran the workload"]
    detail = dict((n, d) for n, _, d in checks)["the clients ran the workload"]
    assert "2 connection(s) issued nothing" in detail
    # No log at all, no connection named: nothing issued, nothing acknowledged.
    empty = LedgerState(dict.fromkeys(range(ACCOUNTS), INITIAL_BALANCE), [])
    assert _failed(audit(empty, ACCOUNTS, [])) == ["the clients ran the workload"]


def _entry(key: str, status: str, **kw: Any) -> dict[str, Any]:
    e = {"caller": "c0-0", "key": key, "src": 0, "dst": 1, "amount": 5, "status": status}
    return {**e, **kw}


def test_the_audit_fails_transfers_the_workload_never_issues() -> None:
    state = LedgerState({0: 995, 1: 1005, 2: 1000}, [("c0-0", "t0", 0, 1, 5)])
    for odd in ({"amount": MAX_AMOUNT + 1}, {"dst": 0}, {"dst": 3}, {"amount": 0}):
        log = [_entry("t0", "acked"), _entry("t1", "refused", code=9, **odd)]
        assert _failed(audit(state, 3, log)) == ["the clients ran the workload"], odd


def test_the_audit_checks_the_rest_when_a_clients_log_is_missing() -> None:
    """Client 1 died without its log: its applied transfers cannot be matched (not
    checked), while conservation, the replay and client 0's transfers still are."""
    rows = [("c0-0", "t0", 0, 1, 5), ("c1-0", "t0", 1, 2, 7)]
    state = LedgerState({0: 995, 1: 998, 2: 1007}, rows)
    checks = audit(state, 3, [_entry("t0", "acked")], unlogged=[1])
    assert all(ok is True for n, ok, _ in checks if ok is not None), checks
    # The balances hold client 1's transfers, which no history has: no history check.
    assert [(n, ok) for n, ok, _ in checks if ok is not True] == [
        ("client1's transfers", None),
        ("transfers and balance reads linearizable", None),
    ]
    # A row of client 0's that its log does not have is still caught.
    stray = LedgerState({0: 990, 1: 1003, 2: 1007}, [*rows, ("c0-0", "t9", 0, 1, 5)])
    assert _failed(audit(stray, 3, [_entry("t0", "acked")], unlogged=[1])) == [
        "nothing applied twice or unasked"
    ]


def test_with_no_log_at_all_the_workload_checks_are_not_made() -> None:
    state = LedgerState({0: 995, 1: 1005, 2: 1000}, [("c0-0", "t0", 0, 1, 5)])
    checks = {n: ok for n, ok, _ in audit(state, 3, [], unlogged=[0])}
    assert checks["the clients ran the workload"] is None
    assert checks["refusals the workload explains"] is None
    assert checks["balances conserved"] is True and checks["client0's transfers"] is None


def test_the_audit_catches_an_account_gone_from_the_ledger() -> None:
    state = LedgerState({0: 995, 1: 2005}, [("c0-0", "t0", 0, 1, 5)])
    assert "nothing applied twice or unasked" in _failed(audit(state, 3, [_entry("t0", "acked")]))


def test_an_unreconciled_run_does_not_check_outcomes() -> None:
    state = LedgerState({0: 995, 1: 1005, 2: 1000}, [("c0-0", "t0", 0, 1, 5)])
    log = [_entry("t0", "acked", call=0.0, ret=1.0), _entry("t1", "issued", call=2.0)]
    checks = {n: ok for n, ok, _ in audit(state, 3, log, reconciled=False)}
    assert checks["every outcome known after reconciliation"] is None
    assert all(ok for n, ok in checks.items() if n != "every outcome known after reconciliation")


@settings(max_examples=25, deadline=None)
@given(
    accounts=st.integers(2, 100),
    issued=st.integers(1, 20_000),
    seed=st.integers(0, 2**32 - 1),
)
def test_a_correct_ledger_stays_within_the_refusal_bound(
    accounts: int, issued: int, seed: int
) -> None:
    """The workload's transfers applied in sequence (as a correct ledger serializes
    them): the refusals stay within :func:`refusal_bound`."""
    rng = random.Random(seed)
    balances = [INITIAL_BALANCE] * accounts
    refused = 0
    for _ in range(issued):
        src, dst = rng.sample(range(accounts), 2)
        amount = rng.randint(1, MAX_AMOUNT)
        if balances[src] < amount:
            refused += 1
        else:
            balances[src] -= amount
            balances[dst] += amount
    assert refused <= refusal_bound(issued)


def _run_dir(tmp_path: Path, ending: Ending) -> Path:
    """A run's directory as the conductor leaves it: SQLite ledger, logs, run.json."""
    spec = LedgerSpec("sqlite", path=tmp_path / "ledger.db")
    create_ledger(spec, 3)
    with sqlite3.connect(tmp_path / "ledger.db") as conn:
        conn.execute("INSERT INTO transfers VALUES ('c0-0', 't0', 0, 1, 5, 1)")
        conn.execute("INSERT INTO transfers VALUES ('c1-0', 't0', 1, 2, 7, 1)")
    logs = [
        [_entry("t0", "acked", call=0.0, ret=1.0)],
        [_entry("t0", "acked", caller="c1-0", src=1, dst=2, amount=7, call=0.5, ret=1.5)],
    ]
    for i, log in enumerate(logs):
        (tmp_path / f"client{i}.jsonl").write_text("".join(json.dumps(e) + "\n" for e in log))
    write_manifest(tmp_path, spec, 3, [1, 1], own_server=False, ending=ending)
    return tmp_path


def _audit_dir(path: Path, *options: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "idempotency.demo", "audit", str(path), *options]
    env = {**os.environ, "COLUMNS": "250"}  # the report's tables unwrapped
    return subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=120, env=env)


def test_audit_dir_passes_a_good_run_and_fails_a_tampered_one(tmp_path: Path) -> None:
    run = _run_dir(tmp_path, Ending([], reconciled=True))
    out = _audit_dir(run)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "all checks hold" in out.stdout
    with sqlite3.connect(run / "ledger.db") as conn:  # money made up after the run
        conn.execute("UPDATE accounts SET balance = balance + 1 WHERE id = 2")
    out = _audit_dir(run)
    assert out.returncode == 1 and "FAILED: balances conserved" in out.stdout, out.stdout


def test_audit_dir_marks_what_a_dead_clients_missing_log_hides(tmp_path: Path) -> None:
    run = _run_dir(tmp_path, Ending([("client1", -9, 3.2)], reconciled=True))
    (run / "client1.jsonl").unlink()  # it died before writing it
    checks = audit_run(run, read_ledger(LedgerSpec("sqlite", path=run / "ledger.db")), 3, [1, 1],
                       Ending([("client1", -9, 3.2)], reconciled=True))  # fmt: skip
    verdicts = {n: ok for n, ok, _ in checks}
    assert verdicts["balances conserved"] is True
    assert verdicts["client1's transfers"] is None
    assert verdicts["every process ran until stopped"] is False
    out = _audit_dir(run)
    flat = re.sub(r"[│\s]+", " ", out.stdout)  # the table's cells wrap their text
    assert out.returncode == 1, out.stdout + out.stderr
    assert "client1 exited with status -9 at 3.2 s" in flat, out.stdout
    assert "NOT CHECKED: client1's transfers" in flat, out.stdout


def test_audit_dir_reads_a_postgres_ledger(tmp_path: Path, postgres_server: Any) -> None:
    """``audit DIR`` of a run whose ledger is in a PostgreSQL it named (``--postgres``):
    it reads the run's schema there, passes it, and fails it once money is made up.
    The DSN carries a password (the cluster trusts every local login, so any one
    connects): run.json keeps it masked, and the audit is given it again."""
    schema = f"audit{time.monotonic_ns()}"
    secret = "hunter2-audit"
    dsn = postgres_server.dsn.replace("postgres@", f"postgres:{secret}@", 1)
    assert secret in dsn
    spec = LedgerSpec("postgres", url=dsn, prefix=schema)
    create_ledger(spec, 3)
    # Inserting a transfer moves its money (the ledger's trigger), as the server's does.
    postgres_server.sql(f"INSERT INTO {schema}.transfers VALUES ('c0-0', 't0', 0, 1, 5, 1)")
    postgres_server.sql(f"INSERT INTO {schema}.transfers VALUES ('c1-0', 't0', 1, 2, 7, 1)")
    state = read_ledger(spec)
    assert state.balances == {
        0: INITIAL_BALANCE - 5,
        1: INITIAL_BALANCE - 2,
        2: INITIAL_BALANCE + 7,
    }
    logs = [
        [_entry("t0", "acked", call=0.0, ret=1.0)],
        [_entry("t0", "acked", caller="c1-0", src=1, dst=2, amount=7, call=0.5, ret=1.5)],
    ]
    for i, log in enumerate(logs):
        (tmp_path / f"client{i}.jsonl").write_text("".join(json.dumps(e) + "\n" for e in log))
    write_manifest(tmp_path, spec, 3, [1, 1], own_server=False, ending=Ending([], reconciled=True))
    assert secret not in (tmp_path / "run.json").read_text()
    out = _audit_dir(tmp_path)
    assert out.returncode == 1 and "give it again with --postgres DSN" in out.stderr, out.stderr
    out = _audit_dir(tmp_path, "--postgres", dsn)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "all checks hold" in out.stdout and schema in out.stdout
    assert secret not in out.stdout + out.stderr
    postgres_server.sql(f"UPDATE {schema}.accounts SET balance = balance + 1 WHERE id = 2")
    out = _audit_dir(tmp_path, "--postgres", dsn)
    assert out.returncode == 1 and "FAILED: balances conserved" in out.stdout, out.stdout


def test_run_json_masks_a_redis_password_and_the_audit_asks_for_it(tmp_path: Path) -> None:
    # Refused before any connection: no server is needed to see it.
    secret = "s3cret-ledger"
    spec = LedgerSpec("redis", url=f"redis://:{secret}@127.0.0.1:1/0", prefix="ledger:")
    write_manifest(tmp_path, spec, 3, [1], own_server=False, ending=Ending([], reconciled=True))
    kept = json.loads((tmp_path / "run.json").read_text())
    assert secret not in json.dumps(kept) and kept["redis"] == "redis://:***@127.0.0.1:1/0"
    out = _audit_dir(tmp_path)
    assert out.returncode == 1 and "give it again with --redis URL" in out.stderr, out.stderr
    assert secret not in out.stdout + out.stderr
    out = _audit_dir(tmp_path, "--postgres", "postgresql://x@127.0.0.1:1/db")
    assert out.returncode == 1 and "kept its ledger in redis" in out.stderr, out.stderr


def test_audit_dir_refuses_a_directory_that_is_no_run(tmp_path: Path) -> None:
    out = _audit_dir(tmp_path)
    assert out.returncode == 1 and "is not a demo run's directory" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
