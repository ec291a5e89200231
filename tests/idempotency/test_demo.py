"""The ledger demo: short real runs (processes, faults, kill -9, SQLite or a real
redis-server, several servers on one port) pass their audit; the simulated run prints
the same report for the same seed and keeps exactly-once and conservation over fault
plans; and the audit fails on a ledger that lost or doubled a transfer."""

from __future__ import annotations

import json
import re
import shutil
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gosim
from gosim import go, net
from idempotency.demo._ledger import (
    BAD_TRANSFER,
    INITIAL_BALANCE,
    INSUFFICIENT_FUNDS,
    LedgerSpec,
    LedgerState,
    MemoryLedger,
    create_ledger,
    make_server,
    read_ledger,
)
from idempotency.demo._run import audit, merge_traces, read_logs
from idempotency.demo._sim import SimOptions, run_simulation
from idempotency.rpc import Client, RPCError

from .conftest import PG_BIN, PostgresServer, RedisServer


@pytest.mark.slow
def test_a_short_run_under_faults_and_a_kill_passes_its_audit(tmp_path: Path) -> None:
    db = tmp_path / "ledger.db"
    cmd = [sys.executable, "-m", "idempotency.demo", "--plain", "--seconds", "4"]
    cmd += ["--connections", "30", "--accounts", "20", "--db", str(db), "--seed", "3"]
    out = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "all checks hold" in out.stdout
    assert re.search(r"\d s\s+kill -9 of the server; restarting it", out.stdout), out.stdout
    with sqlite3.connect(db) as conn:
        (applied,) = conn.execute("SELECT COUNT(*) FROM transfers").fetchone()
    assert applied > 0
    # stdout is no terminal: a log line a second, the tables once at the end.
    titles = re.findall(r"^\s*(audit|counts)\s*$", out.stdout, re.M)
    assert titles == ["audit", "counts"], out.stdout
    before = re.split(r"^\s*audit\s*$", out.stdout, flags=re.M)[0]
    assert len(re.findall(r"^\s*\d+\.\d s\s+acked", before, re.M)) >= 3, out.stdout
    assert "│" not in before and "┏" not in before, out.stdout
    # The run directory (the clients' logs) is removed; --db's ledger is the user's.
    m = re.search(r"the run directory (/\S+) \(the clients' logs\) removed", out.stdout)
    assert m and not Path(m.group(1)).exists(), out.stdout


def _demo(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "idempotency.demo", "--plain", "--seconds", "4"]
    cmd += ["--connections", "30", "--accounts", "20", *args]
    return subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=240)


@pytest.mark.slow
def test_a_run_on_a_redis_server_of_its_own_passes_its_audit_and_stops_it() -> None:
    out = _demo("--store", "redis", "--seed", "5")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "all checks hold" in out.stdout
    assert re.search(r"\d s\s+kill -9 of the server; restarting it", out.stdout), out.stdout
    port = int(re.search(r"redis://127\.0\.0\.1:(\d+)/0", out.stdout).group(1))  # type: ignore[union-attr]
    with pytest.raises(OSError):  # the demo stopped the redis-server it started
        socket.create_connection(("127.0.0.1", port), timeout=2).close()


@pytest.mark.slow
def test_two_servers_on_one_port_share_redis_and_a_killed_ones_clients_fail_over(
    own_redis: RedisServer,
) -> None:
    import redis  # noqa: PLC0415

    out = _demo("--store", "redis", "--redis", own_redis.url, "--servers", "2", "--seed", "4")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "all checks hold" in out.stdout
    assert re.search(r"\d s\s+kill -9 of server [01]; restarting it", out.stdout), out.stdout
    # Both servers served (the kernel spread the connections over the two listeners).
    served = [int(n) for n in re.findall(r"calls served by server[01]\s*│\s*(\d+)", out.stdout)]
    assert len(served) == 2 and min(served) > 0, out.stdout
    # The audit read this Redis: the ledger is there, its money conserved.
    client = redis.Redis.from_url(own_redis.url)
    try:
        (balances,) = client.keys("ledger-demo:*:balances")
        assert sum(int(v) for v in client.hvals(balances)) == 20 * INITIAL_BALANCE
    finally:
        client.close()


def test_several_servers_on_one_sqlite_file_are_refused() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "idempotency.demo", "--servers", "2"],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2 and "--servers N > 1 needs --store redis" in out.stderr


@pytest.mark.slow
def test_a_run_on_a_postgres_cluster_of_its_own_passes_its_audit_and_stops_it() -> None:
    """``--store postgres``: a cluster started for the run; the server's kill -9 and a
    backend terminated mid-transaction; the audit (which read PostgreSQL) passes."""
    if PG_BIN is None:
        pytest.skip("PostgreSQL is not installed (.ci/run installs it with apt)")
    pytest.importorskip("psycopg", reason="--store postgres needs psycopg 3")
    out = _demo("--store", "postgres", "--seconds", "3", "--seed", "6", "--keep")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "all checks hold" in out.stdout
    assert re.search(r"\d s\s+kill -9 of the server; restarting it", out.stdout), out.stdout
    assert re.search(r"postgres backends terminated\s*│\s*1\b", out.stdout), out.stdout
    m = re.search(r"postgresql://postgres@127\.0\.0\.1:(\d+)/postgres", out.stdout)
    assert m, out.stdout
    with pytest.raises(OSError):  # the demo stopped the cluster it started
        socket.create_connection(("127.0.0.1", int(m.group(1))), timeout=2).close()
    kept = re.search(r"audit it again with python -m idempotency.demo audit (\S+)", out.stdout)
    assert kept, out.stdout
    try:  # audit DIR starts the run's cluster again on its files, reads it, stops it
        again = subprocess.run(
            [sys.executable, "-m", "idempotency.demo", "audit", kept.group(1)],
            check=False,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert again.returncode == 0 and "all checks hold" in again.stdout, again.stdout
    finally:
        shutil.rmtree(kept.group(1), ignore_errors=True)


@pytest.mark.slow
def test_two_servers_share_a_postgres_of_the_users_under_a_schema_of_the_runs(
    own_postgres: PostgresServer,
) -> None:
    out = _demo("--store", "postgres", "--postgres", own_postgres.dsn, "--servers", "2")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "all checks hold" in out.stdout
    assert re.search(r"\d s\s+kill -9 of server [01]; restarting it", out.stdout), out.stdout
    served = [int(n) for n in re.findall(r"calls served by server[01]\s*│\s*(\d+)", out.stdout)]
    assert len(served) == 2 and min(served) > 0, out.stdout
    # The servers' batches lock shared accounts: they take turns, never deadlock.
    assert re.search(r"deadlocks PostgreSQL detected\s*│\s*0\b", out.stdout), out.stdout
    # The run's tables are in a schema of its own, its money conserved; nothing in public.
    (schema,) = own_postgres.sql(
        "SELECT nspname FROM pg_namespace WHERE nspname LIKE 'ledger_demo_%%'"
    )[0]
    (total,) = own_postgres.sql(f"SELECT sum(balance) FROM {schema}.accounts")[0]
    assert total == 20 * INITIAL_BALANCE
    assert own_postgres.sql("SELECT to_regclass('public.accounts')") == [(None,)]


def test_an_unreachable_postgres_fails_at_once_in_one_line() -> None:
    pytest.importorskip("psycopg", reason="--store postgres needs psycopg 3")
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        dsn = f"postgresql://postgres@127.0.0.1:{s.getsockname()[1]}/postgres"
    out = subprocess.run(
        [sys.executable, "-m", "idempotency.demo", "--store", "postgres", "--postgres", dsn],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stderr.count("\n") == 1 and "cannot connect" in out.stderr, out.stderr


def _simulate(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "idempotency.demo", "--simulate", "--seconds", "2"]
    cmd += ["--connections", "6", "--accounts", "10", *args]
    return subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=240)


def test_a_simulated_run_prints_the_same_report_for_the_same_seed(tmp_path: Path) -> None:
    first, second = _simulate("--seed", "11"), _simulate("--seed", "11")
    assert first.returncode == 0, first.stdout + first.stderr
    assert "all checks hold" in first.stdout and "kill -9 at" in first.stdout
    assert first.stdout == second.stdout
    other = _simulate("--seed", "12")
    assert other.returncode == 0, other.stdout + other.stderr
    assert other.stdout != first.stdout


def test_a_simulated_run_writes_a_perfetto_trace(tmp_path: Path) -> None:
    trace = tmp_path / "trace.json"
    out = _simulate("--seed", "2", "--seconds", "0.5", "--trace", str(trace))
    assert out.returncode == 0, out.stdout + out.stderr
    events = json.loads(trace.read_text())["traceEvents"]
    assert any(e.get("ph") == "X" for e in events)  # goroutine run slices


@pytest.mark.slow
def test_a_real_run_writes_one_perfetto_trace_of_its_processes(tmp_path: Path) -> None:
    trace = tmp_path / "trace.json"
    before = time.time()
    # No kill: on a loaded machine the demo's kill may land after the clients' last
    # transfer, and a restarted server then serves nothing to trace. (A killed
    # process's missing trace: test_the_processes_traces_merge_into_one_perfetto_trace.)
    out = _demo("--seed", "2", "--kills", "0", "--trace", str(trace))
    after = time.time()
    assert out.returncode == 0, out.stdout + out.stderr
    events = json.loads(trace.read_text())["traceEvents"]
    # Each process a Perfetto process under its pid, named.
    processes = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    roles = sorted(re.sub(r" \(pid \d+\)$", "", n) for n in processes.values())
    assert roles == ["client 0", "client 1", "fault proxy", "ledger server"], processes
    assert all(n.endswith(f"(pid {pid})") for pid, n in processes.items())
    assert re.search(
        r"trace of 4 processes \(server0 \(incarnation 1\), proxy, client0, client1\) "
        r"written to \S+ \(open in ui\.perfetto\.dev\)$",
        out.stdout,
        re.M,
    ), out.stdout
    # A track per goroutine of each process, named by its function.
    tracks = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["name"] == "thread_name"}
    functions: dict[str, set[str]] = {}
    for (pid, _), name in tracks.items():
        role = re.sub(r" \(pid \d+\)$", "", processes[pid])
        functions.setdefault(role, set()).add(name.split(" ", 1)[-1])
    assert "netframe._server.Server._serve_conn" in functions["ledger server"]
    assert "idempotency.demo._proxy._pump" in functions["fault proxy"]
    for k in (0, 1):
        assert "idempotency.demo._clients.run_fleet.<locals>.connection" in functions[f"client {k}"]
    slices = [e for e in events if e["ph"] == "X"]
    assert {e["pid"] for e in slices} == set(processes)
    assert all((e["pid"], e["tid"]) in tracks for e in slices)
    # Wall-clock times: every process's slices fall within the run, so they line up.
    assert all(before <= e["ts"] / 1e6 <= after for e in slices)


def test_the_processes_traces_merge_into_one_perfetto_trace(tmp_path: Path) -> None:
    async def work() -> None:
        done: gosim.Chan[None] = gosim.Chan()

        async def worker() -> None:
            await gosim.sleep(0.001)
            await done.send(None)

        go(worker)
        await done.recv()

    files = []
    for pid, name in ((101, "server0"), (102, "client0")):
        trace = gosim.Trace(f"{name} (pid {pid})", pid, wall_clock=True)
        gosim.run(work, procs=1, trace=trace)
        path = tmp_path / f"{name}.json"
        path.write_text(trace.to_chrome_json())
        files.append((name, path))
    files.insert(1, ("server0 (incarnation 2)", tmp_path / "killed.json"))  # never written
    out = tmp_path / "merged.json"
    merged, lost = merge_traces(files, out)
    assert merged == ["server0", "client0"] and lost == ["server0 (incarnation 2)"]
    events = json.loads(out.read_text())["traceEvents"]
    processes = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert processes == {101: "server0 (pid 101)", 102: "client0 (pid 102)"}
    tracks = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["name"] == "thread_name"}
    for pid in (101, 102):  # the same goroutine ids, a track of each in its own process
        names = {n.split(" ", 1)[-1] for (p, _), n in tracks.items() if p == pid}
        assert any(n.endswith("work.<locals>.worker") for n in names), names
    slices = [e for e in events if e["ph"] == "X"]
    assert all((e["pid"], e["tid"]) in tracks for e in slices)
    # Wall-clock times: the second process ran after the first.
    first = max(e["ts"] for e in slices if e["pid"] == 101)
    assert min(e["ts"] for e in slices if e["pid"] == 102) >= first


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32 - 1),
    drop=st.sampled_from([0.0, 0.01, 0.05]),
    lose_reply=st.sampled_from([0.0, 0.01, 0.05]),
    duplicate=st.sampled_from([0.0, 0.01, 0.05]),
    stall=st.sampled_from([0.0, 0.002]),
    kills=st.integers(0, 2),
)
def test_simulated_fault_plans_keep_exactly_once_and_conservation(
    seed: int, drop: float, lose_reply: float, duplicate: float, stall: float, kills: int
) -> None:
    plan = {"drop": drop, "lose_reply": lose_reply, "duplicate": duplicate, "stall": stall}
    opts = SimOptions(connections=4, accounts=6, seconds=1.5, seed=seed, kills=kills, plan=plan)
    result = run_simulation(opts)
    failed = [(name, detail) for name, ok, detail in result.checks if not ok]
    assert not failed, (opts, failed)
    acked = dict(result.counts)["acked"]
    assert acked > 0


def _ledger(tmp_path: Path, transfers: list[tuple[str, str, int, int, int]]) -> Path:
    db = tmp_path / "ledger.db"
    create_ledger(LedgerSpec("sqlite", path=db), 3)
    with sqlite3.connect(db) as conn:
        for caller, key, src, dst, amount in transfers:  # the ledger's trigger moves the money
            conn.execute(
                "INSERT INTO transfers VALUES (?, ?, ?, ?, ?, 1)", (caller, key, src, dst, amount)
            )
    return db


def _log(tmp_path: Path, entries: list[dict[str, object]]) -> list[dict[str, object]]:
    path = tmp_path / "client0.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in entries))
    return read_logs([path])


def _state(db: Path) -> LedgerState:
    return read_ledger(LedgerSpec("sqlite", path=db))


def _entry(key: str, status: str, src: int = 0, dst: int = 1, amount: int = 5) -> dict[str, object]:
    # All called at once; those with an outcome returned together (the history check's
    # times): any order of them fits.
    e = {"caller": "c0", "key": key, "src": src, "dst": dst, "amount": amount, "status": status}
    return {**e, "call": 0.0, **({"ret": 1.0} if status in ("acked", "refused") else {})}


@pytest.mark.parametrize("kind", ["sqlite", "memory", "postgres"])
def test_refused_transfers_change_nothing_and_say_why(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Each refusal (a missing source or destination, too little in the source) leaves
    balances and the transfers table as they were, in each home of the ledger."""
    if kind == "sqlite":
        ledger: LedgerSpec | MemoryLedger = LedgerSpec("sqlite", tmp_path / "ledger.db")
        create_ledger(ledger, 3)
    elif kind == "postgres":
        server = request.getfixturevalue("postgres_server")
        ledger = LedgerSpec("postgres", url=server.dsn, prefix=f"refused{time.monotonic_ns()}")
        create_ledger(ledger, 3)
    else:
        ledger = MemoryLedger(3)

    async def main() -> list[tuple[int, str] | int]:
        srv = make_server(ledger, 10.0, 10)
        ln = net.listen("tcp", "127.0.0.1:0")
        go(srv.serve, ln)
        client = Client([ln.addr()], heartbeat_interval=None)
        out: list[tuple[int, str] | int] = []
        for k, (src, dst, amount) in enumerate(
            [(0, 1, INITIAL_BALANCE + 1), (0, 7, 5), (7, 0, 5), (0, 1, 10)]
        ):
            try:
                out.append(await client.call("transfer", src, dst, amount, idempotency_key=f"t{k}"))
            except RPCError as exc:
                out.append((exc.code, exc.message))
        await client.close()
        await srv.shutdown(1.0)
        assert srv.idempotency is not None
        srv.idempotency.store.close()  # its connections (PostgreSQL: the pool)
        return out

    outcomes = gosim.run(main)
    assert outcomes[:3] == [
        (INSUFFICIENT_FUNDS, f"account 0 has {INITIAL_BALANCE}"),
        (BAD_TRANSFER, "no account 7"),
        (BAD_TRANSFER, "no account 7"),
    ]
    assert isinstance(outcomes[3], int)  # the applied transfer's fence
    state = read_ledger(ledger) if isinstance(ledger, LedgerSpec) else ledger.state()
    assert state.balances == {0: INITIAL_BALANCE - 10, 1: INITIAL_BALANCE + 10, 2: INITIAL_BALANCE}
    assert [(s, d, a) for _, _, s, d, a in state.transfers] == [(0, 1, 10)]


def test_the_audit_passes_a_consistent_ledger(tmp_path: Path) -> None:
    db = _ledger(tmp_path, [("c0", "t0", 0, 1, 5), ("c0", "t1", 1, 2, 7)])
    log = _log(tmp_path, [_entry("t0", "acked"), _entry("t1", "acked", 1, 2, 7)])
    assert all(ok for _, ok, _ in audit(_state(db), 3, log))


def test_the_audit_catches_a_lost_acknowledged_transfer(tmp_path: Path) -> None:
    db = _ledger(tmp_path, [("c0", "t0", 0, 1, 5)])
    log = _log(tmp_path, [_entry("t0", "acked"), _entry("t1", "acked", 1, 2, 7)])
    failed = [name for name, ok, _ in audit(_state(db), 3, log) if not ok]
    assert failed == ["every acknowledged transfer in the ledger once"]


def test_the_audit_catches_a_doubled_or_unasked_transfer(tmp_path: Path) -> None:
    db = _ledger(tmp_path, [("c0", "t0", 0, 1, 5), ("c0", "t9", 0, 1, 5)])
    with sqlite3.connect(db) as conn:  # the effect applied twice: balances moved twice
        conn.execute("UPDATE accounts SET balance = balance - 5 WHERE id = 0")
        conn.execute("UPDATE accounts SET balance = balance + 5 WHERE id = 1")
    log = _log(tmp_path, [_entry("t0", "acked")])
    failed = [name for name, ok, _ in audit(_state(db), 3, log) if not ok]
    assert failed == ["nothing applied twice or unasked"]


def test_the_audit_catches_lost_money_and_unknown_outcomes(tmp_path: Path) -> None:
    db = _ledger(tmp_path, [("c0", "t1", 1, 2, 7)])
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE accounts SET balance = balance - 1 WHERE id = 2")
    log = _log(tmp_path, [_entry("t0", "unknown"), _entry("t1", "acked", 1, 2, 7)])
    failed = [name for name, ok, _ in audit(_state(db), 3, log) if not ok]
    assert failed == [
        "balances conserved",
        "nothing applied twice or unasked",
        "every outcome known after reconciliation",
    ]
