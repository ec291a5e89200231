"""The demo's conductor as a user meets it: bad options refused at once in one line, a
log when stdout is not a terminal, deaths reported at once with their time and the
ledger audited all the same, SIGINT and SIGTERM answered with one line, run directories
removed unless kept, and a kept run audited again by ``audit DIR``."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from idempotency.demo.__main__ import main
from idempotency.demo._run import plot_curves

DEMO = [sys.executable, "-m", "idempotency.demo"]
SMALL = ["--connections", "20", "--accounts", "10"]
ENV = {**os.environ, "COLUMNS": "250"}  # the report's tables unwrapped


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--heartbeat", "0"], "--heartbeat must be a number > 0"),
        (["--heartbeat", "nan"], "--heartbeat must be a number > 0"),
        (["--heartbeat", "0.001"], "--heartbeat must be >= 0.05 s"),
        (["--kills", "-1"], "--kills must be >= 0"),
        (["--think", "-1"], "--think must be a number >= 0"),
        (["--seconds", "inf"], "--seconds must be a number > 0"),
        (["--connections", "0"], "--connections must be >= 1"),
        (["--clients", "0"], "--clients must be >= 1"),
        (["--accounts", "1"], "--accounts must be >= 2"),
        (["--servers", "0"], "--servers must be >= 1"),
        (["--kills", "2", "--no-faults"], "--no-faults means no kills"),
        (["--plot", "/nonexistent-dir/chart.png"], "--plot /nonexistent-dir/chart.png: No such"),
        (["--plot", "chart.txt"], "the name must end in one of"),
        (["--trace", "/nonexistent-dir/t.json"], "--trace /nonexistent-dir/t.json: No such"),
        (["--db", "/nonexistent-dir/l.db"], "no directory /nonexistent-dir"),
        (["--redis", "redis://127.0.0.1:1/0"], "--redis needs --store redis"),
        (["--simulate", "--keep"], "--simulate keeps its ledger in memory"),
        (["--seed", "x"], "invalid int value"),
    ],
)
def test_a_bad_option_fails_at_once_in_one_line(
    args: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(args)
    assert exc.value.code == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1, err
    assert says in err, err


def test_an_existing_db_and_an_unreachable_redis_fail_at_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "ledger.db"
    db.write_text("")
    port = _free_port()  # nothing listens there
    for args, says in (
        (["--db", str(db)], "exists: the demo starts from a new ledger"),
        (["--store", "redis", "--redis", f"redis://127.0.0.1:{port}/0"], "Connection refused"),
        (["--store", "redis", "--redis", "http://x"], "--redis http://x:"),
    ):
        with pytest.raises(SystemExit) as exc:
            main(args)
        assert exc.value.code == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and says in err, err


def test_the_plot_is_not_left_behind_by_the_check(tmp_path: Path) -> None:
    """The writability check of ``--plot`` tries the path: it leaves no file."""
    chart = tmp_path / "chart.png"
    with pytest.raises(SystemExit):  # a later option fails: nothing ran
        main(["--plot", str(chart), "--kills", "-1"])
    assert not chart.exists()


def test_the_rate_curve_is_centred_on_the_drop_it_shows() -> None:
    """Two clients ack 500/s each, reporting every half second at offset times, until
    the server dies at 5 s: the rate is flat (no zigzag) and halves at 5 s."""
    points: list[list[tuple[float, int]]] = []
    for offset in (0.0, 0.23):
        pts = [(offset, 0)]
        t = offset
        while t < 10:
            t += 0.5
            pts.append((t, int(500 * min(t, 5.0))))
        points.append(pts)
    rates, _ = plot_curves(points, [])
    steady = [r for t, r in rates if 1.5 <= t <= 4.0]
    assert max(steady) - min(steady) < 1e-6 * 1000 + 1  # flat: 1000/s throughout
    assert abs(steady[0] - 1000) < 1
    half = next(t for t, r in rates if t > 4 and r <= 500)
    assert abs(half - 5.0) < 0.15, half


# -- whole runs ---------------------------------------------------------------------


class _Demo:
    """A demo run whose stdout lines are read as they come, each with its wall time."""

    def __init__(self, args: list[str], **popen: object) -> None:
        self.proc = subprocess.Popen(
            [*DEMO, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=ENV,
            **popen,  # type: ignore[call-overload]
        )
        self.lines: list[tuple[float, str]] = []
        self.cond = threading.Condition()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self.cond:
                self.lines.append((time.monotonic(), line.rstrip("\n")))
                self.cond.notify_all()

    def wait_for(self, pattern: str, timeout: float = 120) -> tuple[float, re.Match[str]]:
        """The first line matching ``pattern`` and when it was read."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                for at, line in self.lines:
                    if m := re.search(pattern, line):
                        return at, m
                left = deadline - time.monotonic()
                assert left > 0 and self.proc.poll() is None, (pattern, self.text())
                self.cond.wait(min(left, 0.5))

    def children(self, what: str) -> list[int]:
        out = subprocess.run(
            ["ps", "-o", "pid=,args=", "--ppid", str(self.proc.pid)],
            capture_output=True, text=True, check=False,
        ).stdout  # fmt: skip
        return [int(line.split()[0]) for line in out.splitlines() if what in line]

    def finish(self, timeout: float = 240) -> tuple[int, str, str]:
        code = self.proc.wait(timeout=timeout)
        self.reader.join(timeout=10)
        assert self.proc.stderr is not None
        err = self.proc.stderr.read()
        self.close()
        return code, self.text(), err

    def close(self) -> None:
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()

    def text(self) -> str:
        return "\n".join(line for _, line in self.lines)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.reader.join(timeout=10)
        self.close()


@contextmanager
def _demo(args: list[str], **popen: object) -> Iterator[_Demo]:
    d = _Demo(args, **popen)
    try:
        yield d
    finally:
        d.stop()


def _flat(text: str) -> str:
    return re.sub(r"[│\s]+", " ", text)


def _kept_dir(text: str) -> Path:
    m = re.search(r"python -m idempotency\.demo audit (\S+)", text)
    assert m, text
    return Path(m.group(1))


def _audit_dir(path: Path) -> subprocess.CompletedProcess[str]:
    cmd = [*DEMO, "audit", str(path)]
    return subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=120, env=ENV)


@pytest.mark.slow
def test_a_server_killed_right_after_its_restart_is_reported_at_once_and_audited() -> None:
    with _demo(["--seconds", "8", *SMALL, "--seed", "3"]) as demo:
        seen, m = demo.wait_for(r"^\s*(\d+\.\d) s\s+kill -9 of the server; restarting it")
        killed_at = float(m.group(1))
        old = set()
        deadline = time.monotonic() + 60
        while True:  # the new incarnation, as soon as it exists
            new = [p for p in demo.children("idempotency.demo server") if p not in old]
            if new:
                break
            assert time.monotonic() < deadline, demo.text()
            time.sleep(0.02)
        os.kill(new[0], signal.SIGKILL)  # the demo's own child, by its PID
        late = time.monotonic() - seen
        _, m = demo.wait_for(r"^\s*(\d+\.\d) s\s+server0 exited with status -9, unbidden")
        reported = float(m.group(1))
        code, out, err = demo.finish()
    # Its time is when it died: after the restart, no later than our kill (plus the
    # time it took to print the line we waited for, and rounding).
    assert killed_at <= reported <= killed_at + late + 3.0, (killed_at, late, out)
    assert code == 1, out + err
    flat = _flat(out)
    assert "balances conserved yes" in flat, out  # the audit ran
    assert "every acknowledged transfer in the ledger once yes" in flat, out
    assert "every outcome known after reconciliation not checked" in flat, out
    assert f"server0 exited with status -9 at {reported:.1f} s" in flat, out
    assert f"served again after restart 1 never: it exited at {reported:.1f} s" in flat, out
    assert "Traceback" not in err, err
    shutil.rmtree(_kept_dir(out))  # a failed run is kept


@pytest.mark.slow
def test_a_client_killed_mid_run_is_reported_at_once_and_the_rest_audited() -> None:
    with _demo(["--seconds", "6", "--no-faults", *SMALL, "--seed", "4"]) as demo:
        seen, m = demo.wait_for(r"^\s*(\d+\.\d) s\s+acked [1-9]")
        at_line = float(m.group(1))
        (client1,) = [p for p in demo.children("idempotency.demo clients") if p > 0][1:2]
        os.kill(client1, signal.SIGKILL)
        late = time.monotonic() - seen
        _, m = demo.wait_for(r"^\s*(\d+\.\d) s\s+client\d exited with status -9, unbidden")
        reported = float(m.group(1))
        code, out, err = demo.finish()
    assert at_line <= reported <= at_line + late + 3.0, (at_line, late, out)
    assert code == 1, out + err
    flat = _flat(out)
    assert "balances conserved yes" in flat, out
    assert "nothing applied twice or unasked yes" in flat, out
    assert re.search(r"client\d's transfers not checked its log is missing", flat), out
    assert "every outcome known after reconciliation yes" in flat, out  # the other's
    shutil.rmtree(_kept_dir(out))


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupt_stops_everything_and_says_how_to_audit_the_run(sig: int) -> None:
    # Its own process group, as a shell's job: a terminal's Ctrl-C reaches every
    # process of the group, the children included.
    with _demo(["--seconds", "30", *SMALL], start_new_session=True) as demo:
        demo.wait_for(r"^\s*\d+\.\d s\s+acked [1-9]")
        os.killpg(demo.proc.pid, sig)
        code, out, err = demo.finish(timeout=120)
    assert code == 128 + sig, out + err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    last = out.strip().splitlines()[-1]
    name = signal.Signals(sig).name
    assert re.match(rf"interrupted by {name} at \d+\.\d s: every process stopped", last), out
    with pytest.raises(ProcessLookupError):  # no process of the group is left
        os.killpg(demo.proc.pid, 0)
    run = _kept_dir(last)
    try:
        again = _audit_dir(run)
        flat = _flat(again.stdout)
        assert again.returncode == 1, again.stdout + again.stderr  # outcomes not checked
        assert "balances conserved yes" in flat, again.stdout
        assert "every acknowledged transfer in the ledger once yes" in flat, again.stdout
        assert "every outcome known after reconciliation not checked" in flat, again.stdout
    finally:
        shutil.rmtree(run)


@pytest.mark.slow
def test_a_demo_run_on_a_ledger_that_refuses_everything_fails() -> None:
    """The issue's case, end to end: the demo's server swapped (through the test hook)
    for one that refuses every transfer for want of funds."""
    here = Path(__file__).parent
    env = {
        **ENV,
        "PYTHONPATH": os.pathsep.join([str(here), os.environ.get("PYTHONPATH", "")]),
        "LEDGER_DEMO_TEST_SERVER_FACTORY": "_broken_ledger:refuse_all",
    }
    out = subprocess.run(
        [*DEMO, "--seconds", "3", *SMALL, "--no-faults"],
        check=False, capture_output=True, text=True, timeout=240, env=env,
    )  # fmt: skip
    assert out.returncode == 1, out.stdout + out.stderr
    assert "FAILED: the clients ran the workload, refusals the workload explains" in out.stdout
    assert re.search(r"\d+ issued by 20 of 20 connections, 0 acknowledged", out.stdout), out.stdout
    shutil.rmtree(_kept_dir(out.stdout))


@pytest.mark.slow
def test_a_kept_redis_run_is_audited_again_from_its_directory() -> None:
    out = subprocess.run(
        [*DEMO, "--seconds", "3", *SMALL, "--store", "redis", "--keep", "--seed", "6"],
        check=False, capture_output=True, text=True, timeout=240, env=ENV,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    run = _kept_dir(out.stdout)
    try:
        assert (run / "run.json").exists()
        again = _audit_dir(run)  # restarts the run's redis-server on its files
        assert again.returncode == 0, again.stdout + again.stderr
        assert "all checks hold" in again.stdout
        assert _flat(out.stdout).count(" yes ") == _flat(again.stdout).count(" yes ")
    finally:
        shutil.rmtree(run)
