"""The suites of ``python -m benchmarks``, built from the workloads of the pytest-benchmark
files: each round here calls the same function the ``bench_*.py`` item times (one
definition per workload), and every server is the same ``net_peers.py`` /
``rpc_peers.py`` / ``benchmarks/go`` program.

Sizes: a full run uses the sizes of the pytest-benchmark files; ``--quick`` the sizes of
their smoke runs (or near them), so the whole tour takes about a minute.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks import procs
from benchmarks.harness import Peer, Ratio, Row, Sample, Suite

HERE = Path(__file__).parent

GC_NOTE = (
    f"GC: every Python peer runs with CPython's collector thresholds {procs.GC_THRESHOLD} "
    "(the young-generation threshold gosim.run sets for itself; in-process peers through "
    "this process, peer processes through $BENCH_GC_THRESHOLD); in this process a "
    "gc.collect() before each round, with what a suite set up frozen (gc.freeze) so that "
    "collection stays cheap; Go peers run with Go's default GOGC=100, and with "
    "GOMAXPROCS=1 but where a peer's name says otherwise (the core suite's `go` runs with "
    "Go's default, the CPU count). gosim peers run with gosim.run's default procs."
)


class _Scratch:
    """A temporary directory for this run's Go binaries and data files, and the binaries
    built in it (each built once, when a suite first needs it)."""

    def __init__(self) -> None:
        self._dir: Path | None = None
        self._built: dict[str, Path] = {}
        self._lock = threading.Lock()

    @property
    def dir(self) -> Path:
        if self._dir is None:
            self._dir = Path(tempfile.mkdtemp(prefix="gosim-bench-"))
        return self._dir

    def go(self, module: str, *, test: bool = False) -> Path:
        with self._lock:
            if module not in self._built:
                out = self.dir / (f"{module}.test" if test else module)
                self._built[module] = procs.go_build(module, out, test=test)
            return self._built[module]

    def c(self, name: str) -> Path:
        with self._lock:
            key = f"c:{name}"
            if key not in self._built:
                self._built[key] = procs.c_build(name, self.dir / name)
            return self._built[key]

    def cleanup(self) -> None:
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
        # a later suite of the same process (a test) gets a directory of its own
        self._dir = None
        self._built = {}


SCRATCH = _Scratch()


def go_version_line() -> str:
    return procs.go_version()


def _value(v: float, **extras: float) -> Sample:
    return {"value": v, **extras}


# ============================================================================== core


def core_rows(quick: bool) -> list[Row]:
    from benchmarks import bench_core  # noqa: PLC0415 -- imports gevent, trio, asyncio

    # Every peer's round is a mean over the same duration of measured work: testing.B's
    # -benchtime for Go, the phases of as many rounds as fill it for the others.
    seconds = bench_core.MEASURE_SECONDS / (10 if quick else 1)
    benchtime = f"{seconds * 1000:g}ms"

    def go_peer(name: str, wl: Any) -> Peer:
        def measure() -> Sample:
            binary = SCRATCH.go("core", test=True)
            gomaxprocs = bench_core.GO_PEERS[name]
            cpu, wall = bench_core.go_round(binary, wl, benchtime, 1, gomaxprocs)[0]
            return _value(cpu, wall_ns=wall)

        return Peer(name, measure)

    names = ("gosim", "gosim-p1", "go", "go-p1", "gevent", "asyncio", "trio")
    rows = [
        _core_row(wl, [go_peer(name, wl) if name in bench_core.GO_PEERS
                       else _python_core_peer(wl, name, quick, seconds) for name in names])
        for wl in bench_core.WORKLOADS.values()
    ]  # fmt: skip
    rows.append(_parked_row(quick))
    return rows


def _python_core_peer(wl: Any, name: str, quick: bool, seconds: float) -> Peer:
    """Python peer ``name`` (gosim, gosim-pN, trio, ...) on core workload ``wl``: a mean
    over ``seconds`` of measured work, every answer checked."""
    from benchmarks import bench_core  # noqa: PLC0415

    n = wl.quick_n if quick else wl.n
    one = bench_core.round_for(wl.group, name)

    def measure() -> Sample:
        t = bench_core.timed(one, n, wl.expect(n), seconds)
        return _value(t.cpu_ns, wall_ns=t.wall_ns, rounds=t.rounds)

    return Peer(name, measure)


def _core_row(wl: Any, peers: list[Peer]) -> Row:
    return Row(wl.group, f"ns of CPU per {wl.unit}", "lower", peers, warmup=1,
               extras={"wall_ns": "ns of wall clock per op (the same runs)"})  # fmt: skip


# ============================================================================= procs

PROCS_MEASURED = (1, 2, 4, 8, 64)


def procs_rows(quick: bool) -> list[Row]:
    """The core workloads at ``procs`` 1, 2, 4, 8, 64 and the default, one row each:
    issue 41's check that a P costs nothing while it has no work (goal: every ratio to
    ``procs=1`` at most 1.2x)."""
    from benchmarks import bench_core  # noqa: PLC0415

    seconds = bench_core.MEASURE_SECONDS / (10 if quick else 1)
    names = [bench_core.gosim_peer(p) for p in (*PROCS_MEASURED, None)]
    return [
        _core_row(wl, [_python_core_peer(wl, name, quick, seconds) for name in names])
        for wl in bench_core.WORKLOADS.values()
    ]


def _parked_row(quick: bool) -> Row:
    """Memory of parked goroutines (each round a fresh process): RSS growth for gosim,
    the runtime's Sys growth for Go."""
    from benchmarks import bench_parked  # noqa: PLC0415

    n = bench_parked.SMOKE_N * 10 if quick else bench_parked.FULL_N

    def go_measure() -> Sample:
        r = bench_parked.go_parked(SCRATCH.go("parked"), n)
        return _value(r["bytes_per_goroutine"])

    return Row(f"{n:,} parked goroutines", "bytes per goroutine", "lower", [
        Peer("gosim", lambda: _value(bench_parked.gosim_parked(n)["bytes_per_goroutine"])),
        Peer("go", go_measure),
    ], max_rounds=3)  # fmt: skip


# ============================================================================== sync


def _per_op(one: Callable[[int], float], k: int) -> Callable[[], Sample]:
    """A round of ``k`` operations of ``one`` (which returns seconds): ns per op."""
    return lambda: _value(one(k) / k * 1e9)


def sync_rows(quick: bool) -> list[Row]:
    from benchmarks import bench_sync  # noqa: PLC0415

    n = 2_000 if quick else 200_000
    rows = []
    for workload in ("uncontended", "contended"):
        peers = []
        for name in ("gosim", "trio"):
            k = bench_sync.ops(workload, name, n)
            one = bench_sync.ROUNDS[(workload, name)]
            peers.append(Peer(name, _per_op(one, k)))
        rows.append(Row(f"mutex, {workload}", "ns per lock+unlock", "lower", peers, warmup=1))
    return rows


# ============================================================================== spin


def spin_rows(quick: bool) -> list[Row]:
    import threading as th  # noqa: PLC0415

    from benchmarks import bench_spin  # noqa: PLC0415 -- compiles numba kernels
    from gosim import spin  # noqa: PLC0415

    scale = 10 if quick else 1
    threads = bench_spin.THREADS

    def contention(make: Callable[[], Any]) -> Callable[[], Sample]:
        def measure() -> Sample:
            r = make()
            if r.total != r.counter:
                raise AssertionError("lost an update: the lock did not exclude")
            return _value(r.throughput, fairness=r.fairness)

        return measure

    def counter_peers(kernels: bool) -> list[Peer]:
        if kernels:
            budget = bench_spin.PYTHON_BUDGET // scale
        else:  # FIFO spinlocks from Python threads hand the GIL over at every acquisition
            budget = bench_spin.PYTHON_SPIN_BUDGET // (scale * 4)
        kernel_budget = bench_spin.KERNEL_BUDGET // scale

        def round_of(cls: Any) -> Callable[[], Any]:
            if kernels:
                return lambda: spin.measure_contention(cls(), threads, kernel_budget)
            return lambda: bench_spin.python_threads_contend(cls(), threads, budget)

        peers = [
            Peer("threading.Lock", contention(
                lambda: bench_spin.python_threads_contend(th.Lock(), threads, budget)))
        ]  # fmt: skip
        peers += [Peer(c.__name__, contention(round_of(c))) for c in bench_spin.LOCK_CLASSES]
        return peers

    def adds(fn: Callable[[int], tuple[int, float]], n: int) -> Callable[[], Sample]:
        def measure() -> Sample:
            total, seconds = fn(n)
            return _value(total / seconds)

        return measure

    fairness = {"fairness": "Jain's fairness index over the 2 threads"}
    return [
        Row("counter, spinlocks in nogil kernels", "acquisitions/s", "higher",
            counter_peers(kernels=True), warmup=1, extras=fairness),
        Row("counter, locks from Python threads", "acquisitions/s", "higher",
            counter_peers(kernels=False), warmup=1, extras=fairness),
        Row("atomic add, 2 threads", "adds/s", "higher", [
            Peer("threading.Lock",
                 adds(bench_spin.add_threading_lock, bench_spin.PYTHON_ADDS // scale)),
            Peer("atomic_add in kernels",
                 adds(bench_spin.add_atomic_kernels, bench_spin.ATOMIC_ADDS // scale)),
            Peer("Int64.add", adds(bench_spin.add_int64_python, bench_spin.PYTHON_ADDS // scale)),
        ], warmup=1),
    ]  # fmt: skip


# =============================================================================== mem


def _timed_ns_per(fn: Callable[[], None], objects: int, seconds: float) -> Callable[[], Sample]:
    """A round of ``fn`` over at least ``seconds``: CPU ns per object, wall clock beside."""
    from benchmarks import bench_mem  # noqa: PLC0415

    def measure() -> Sample:
        cpu, wall = bench_mem.timed(fn, objects, seconds)
        return _value(cpu, wall_ns=wall)

    return measure


def mem_rows(quick: bool) -> list[Row]:
    from benchmarks import bench_mem  # noqa: PLC0415

    n = bench_mem.N
    # Every peer's round is a mean over the same duration of work, by CPU time: Go's
    # testing.B over -benchtime, the others' calls until as long has passed.
    seconds = bench_mem.MEASURE_SECONDS / (10 if quick else 1)
    benchtime = f"{seconds * 1000:g}ms"
    wall = {"wall_ns": "ns of wall clock per object (the same runs)"}
    rows = []
    for label, size, go_name in (("batch 64 B", 64, "New64"), ("batch 1 KiB", 1024, "New1K")):

        def go_measure(go_name: str = go_name) -> Sample:
            binary = SCRATCH.go("mem", test=True)
            cpu, wall_ns = bench_mem.go_mem_round(binary, go_name, benchtime, 1)[0]
            return _value(cpu, wall_ns=wall_ns)

        rows.append(Row(label, "ns of CPU per object", "lower", [
            Peer("gosim", _timed_ns_per(bench_mem.gosim_batch(size), n, seconds)),
            Peer("bytearray", _timed_ns_per(bench_mem.bytearray_batch(size), n, seconds)),
            Peer("go", go_measure),
        ], warmup=2, extras=wall))  # fmt: skip
    rows.append(Row("one malloc(64) call from Python", "ns of CPU per object", "lower", [
        Peer("gosim", _timed_ns_per(bench_mem.gosim_single(), bench_mem.SINGLE_N, seconds)),
        Peer("bytearray", _timed_ns_per(bench_mem.bytearray_single(), bench_mem.SINGLE_N,
                                        seconds)),
    ], warmup=1, extras=wall))  # fmt: skip
    if not quick:  # the no-JIT peer is a fresh process importing numba: seconds a round
        batch = bench_mem.gosim_batch(64)  # one batch by the wall clock, as the no-JIT peer's
        rows.append(Row("64 B batch, numba kernels against NUMBA_DISABLE_JIT=1",
                        "ns per object", "lower", [
            Peer("gosim", lambda: _value(bench_mem.timed(batch, n, 0.0)[1])),
            Peer("gosim, no JIT", lambda: _value(bench_mem.nojit_ns_per_object())),
        ], warmup=1))  # fmt: skip
    return rows


# ============================================================================= codec


class _Loop:
    """Calls ``fn(arg)`` enough times for a round to last about ``budget`` seconds (the
    count is set by the first, warm-up, round); a round's figure is per call."""

    def __init__(self, fn: Callable[[Any], Any], arg: Any, check: Callable[[Any], bool],
                 budget: float) -> None:  # fmt: skip
        self.fn, self.arg, self.check, self.budget = fn, arg, check, budget
        self.calls = 0

    def seconds_per_call(self) -> float:
        fn, arg = self.fn, self.arg
        if self.calls == 0:
            t0 = time.perf_counter()
            out = fn(arg)
            first = time.perf_counter() - t0
            if not self.check(out):
                raise AssertionError(f"wrong result: {out!r:.80}")
            self.calls = max(1, int(self.budget / max(first, 1e-7)))
        t0 = time.perf_counter()
        for _ in range(self.calls):
            fn(arg)
        return (time.perf_counter() - t0) / self.calls


def codec_rows(quick: bool) -> list[Row]:
    from benchmarks import bench_codec as bc  # noqa: PLC0415
    from netframe import _codec, _kernels  # noqa: PLC0415

    _kernels.load()
    budget = 0.02 if quick else 0.2
    small = bc.FORMAT.encode_many(bc.make_payloads(bc.SMALL, bc.SMALL_FRAMES))
    large = bc.FORMAT.encode_many(bc.make_payloads(bc.LARGE, bc.LARGE_FRAMES))
    chunks = [small[i : i + bc.RECV_CHUNK] for i in range(0, len(small), bc.RECV_CHUNK)]
    small_payloads = bc.make_payloads(bc.SMALL, bc.SMALL_FRAMES)
    large_payloads = bc.make_payloads(bc.LARGE, bc.LARGE_FRAMES)

    def row(name: str, impls: dict[str, Callable[[Any], Any]], arg: Any, frames: int,
            nbytes: int, check: Callable[[Any], bool], per_byte: bool) -> Row:  # fmt: skip
        peers = []
        for impl, fn in impls.items():
            loop = _Loop(fn, arg, check, budget)

            def measure(loop: _Loop = loop) -> Sample:
                s = loop.seconds_per_call()
                return _value(nbytes / s / 1e6 if per_byte else frames / s)

            peers.append(Peer(impl, measure))
        unit = "MB/s" if per_byte else "frames/s"
        return Row(name, unit, "higher", peers, warmup=1)

    def count_is(k: int) -> Callable[[Any], bool]:
        return lambda out: out == k

    rows = [
        row("decode 64 B frames, one buffer", bc.DECODERS, small, bc.SMALL_FRAMES, len(small),
            count_is(bc.SMALL_FRAMES), per_byte=False),
        row("decode 64 KiB frames, one buffer", bc.DECODERS, large, bc.LARGE_FRAMES, len(large),
            count_is(bc.LARGE_FRAMES), per_byte=True),
        row("decode 64 B frames, 64 KiB chunks", bc.STREAMERS, chunks, bc.SMALL_FRAMES,
            len(small), count_is(bc.SMALL_FRAMES), per_byte=False),
        row("encode 64 B frames", bc.ENCODERS, small_payloads, bc.SMALL_FRAMES, len(small),
            lambda out: out == small, per_byte=False),
        row("encode 64 KiB frames", bc.ENCODERS, large_payloads, bc.LARGE_FRAMES, len(large),
            lambda out: out == large, per_byte=True),
    ]  # fmt: skip
    scanners = dict(bc.SCANNERS)
    if not _kernels.JIT_ENABLED:
        del scanners["numba-kernel"]  # interpreted: nothing to measure
    if not _codec.C_ENABLED:
        del scanners["c-loop-and-cut"]
    for frames in (1, 4, 8, 16, 64, 4096):
        data = bc.FORMAT.encode_many(bc.make_payloads(bc.SMALL - 4, frames))
        rows.append(row(f"scan {frames} x 64 B", scanners, data, frames, len(data),
                        count_is(frames), per_byte=False))  # fmt: skip
    return rows


# =========================================================================== network


class _ServerPool:
    """Server processes shared by the rows of a suite: each server kind starts once, at
    the first row that needs it (process start and imports are not measured, and cost
    seconds a server here), and all stop when the suite ends. A server that died is
    started again."""

    def __init__(self) -> None:
        self.servers: dict[tuple[str, ...], procs.Server] = {}

    def get(self, cmd: list[str], env: dict[str, str]) -> procs.Server:
        key = tuple(cmd)
        srv = self.servers.get(key)
        if srv is None or srv.proc.poll() is not None:
            srv = self.servers[key] = procs.Server(cmd, env=env)
        return srv

    def stop_all(self) -> None:
        while self.servers:
            _, srv = self.servers.popitem()
            srv.stop()


SERVERS = _ServerPool()


def cleanup() -> None:
    """Stop every server and cluster still running and remove this run's scratch
    directory."""
    SERVERS.stop_all()
    PG_CLUSTER.stop()
    SCRATCH.cleanup()


class _ServerPeer:
    """A peer that is a server process (from :data:`SERVERS`), its CPU read from /proc
    around each client run."""

    def __init__(self, cmd: Callable[[], list[str]], env: dict[str, str]) -> None:
        self.cmd, self.env = cmd, env
        self.server: procs.Server | None = None

    def open(self) -> None:
        self.server = SERVERS.get(self.cmd(), self.env)

    def drive(self, client: Callable[[str], list[str]]) -> dict[str, Any]:
        if self.server is None or self.server.proc.poll() is not None:
            raise RuntimeError(f"server {self.cmd()} is not running")
        return procs.drive(self.server, client(self.server.addr), self.env)


def _net_env() -> dict[str, str]:
    return {**os.environ, "GOMAXPROCS": "1", **procs.gc_settings_env()}


# A Go server as a Go user runs it: Go's default GOMAXPROCS, the CPU count. Beside the
# `go` peers of the server rows, which run with GOMAXPROCS=1.
GO_DEFAULT = "go-default"


def _go_default_env() -> dict[str, str]:
    env = _net_env()
    del env["GOMAXPROCS"]
    return env


def _served(name: str, cmd: Callable[[], list[str]], client: Callable[[str], list[str]],
            key: str, check: Callable[[dict[str, Any]], None],
            env: dict[str, str] | None = None) -> Peer:  # fmt: skip
    peer = _ServerPeer(cmd, env if env is not None else _net_env())

    def measure() -> Sample:
        r = peer.drive(client)
        check(r)
        return _value(float(r[key]), server_cpu_ns=r["server_cpu_us_per_op"] * 1e3)

    return Peer(name, measure, open=peer.open)


NET_RR_RATIOS = [
    Ratio("netframe-plain over uvloop, server CPU per request (target 0.8x)",
          "netframe-plain", "uvloop", "server_cpu_ns"),
    Ratio("netframe-plain over go, server CPU per request (target 1.3x)",
          "netframe-plain", "go", "server_cpu_ns"),
    Ratio("c-epoll over uvloop, server CPU per request (no interpreter: the kernel's share)",
          "c-epoll", "uvloop", "server_cpu_ns"),
    Ratio("c-epoll over go, server CPU per request", "c-epoll", "go", "server_cpu_ns"),
]  # fmt: skip


def network_rows(quick: bool) -> list[Row]:
    from benchmarks import bench_net_procs as bn  # noqa: PLC0415

    n, seconds, big = (20_000, 0.2, 8) if quick else (1_000_000, 2.0, 1000)
    peers_script = str(HERE / "net_peers.py")

    def go_net() -> str:
        return str(SCRATCH.go("net"))

    def cmd_for(kind: str) -> Callable[[], list[str]]:
        return lambda: bn.server_cmd(
            kind,
            Path(go_net()) if kind == "go" else None,
            SCRATCH.c("echo_epoll") if kind == "c-epoll" else None,
        )

    def frames_are(k: int) -> Callable[[dict[str, Any]], None]:
        def check(r: dict[str, Any]) -> None:
            if r["frames"] != k:
                raise AssertionError(f"{r['frames']} frames echoed, want {k}")

        return check

    def some_requests(r: dict[str, Any]) -> None:
        if r["requests"] <= 0:
            raise AssertionError("no request answered")

    def go_client(*args: str) -> Callable[[str], list[str]]:
        return lambda addr: [go_net(), args[0], "-addr", addr, *args[1:]]

    def py_client(mode: str, peer: str, *args: str) -> Callable[[str], list[str]]:
        return lambda addr: [sys.executable, peers_script, mode, peer, "--addr", addr, *args]

    cpu_frame = {"server_cpu_ns": "ns of server CPU per frame"}
    cpu_request = {"server_cpu_ns": "ns of server CPU per request"}
    rows = [
        Row(
            "pipelined 64 B, Go client",
            "frames/s",
            "higher",
            [
                _served(
                    k,
                    cmd_for(k),
                    go_client("pipelined", "-n", str(n)),
                    "frames_per_s",
                    frames_are(n),
                )
                for k in bn.GO_CLIENT_SERVERS
            ],
            extras=cpu_frame,
        ),
        Row(
            "request/response, 100 connections, Go client",
            "requests/s",
            "higher",
            [
                _served(
                    k,
                    cmd_for(k),
                    go_client("rr", "-seconds", str(seconds)),
                    "requests_per_s",
                    some_requests,
                )
                for k in bn.GO_CLIENT_SERVERS
            ]
            + [
                _served(
                    GO_DEFAULT,
                    cmd_for("go"),
                    go_client("rr", "-seconds", str(seconds)),
                    "requests_per_s",
                    some_requests,
                    _go_default_env(),
                )
            ],
            extras=cpu_request,
            ratios=NET_RR_RATIOS,
        ),
        Row(
            "1 MiB frames, Go client",
            "MB/s",
            "higher",
            [
                _served(
                    k,
                    cmd_for(k),
                    go_client("big", "-n", str(big), "-size", str(1 << 20)),
                    "MB_per_s",
                    frames_are(big),
                )
                for k in bn.BIG_SERVERS
            ],
            extras=cpu_frame,
        ),
    ]
    if quick:  # a client process of each library a round: seconds of imports each
        return rows
    conns, hold, heartbeat = bn.IDLE_FULL
    idle = Row(f"{conns:,} idle connections, {heartbeat:g} s heartbeats, {hold:g} s idle",
               "MB of peak server RSS", "lower", [
        Peer("netframe", lambda: _value(bn.idle_round(conns, hold, heartbeat)
                                        ["server_peak_rss_mb"])),
    ], max_rounds=3)  # fmt: skip
    return [*rows, idle,
        Row("pipelined 64 B, the library at both ends", "frames/s", "higher", [
            _served(k, cmd_for(k), py_client("pipelined", k, "--n", str(n)), "frames_per_s",
                    frames_are(n)) for k in bn.BOTH_ENDS
        ], extras=cpu_frame),
        Row("request/response, 100 connections, the library at both ends", "requests/s",
            "higher", [
            _served(k, cmd_for(k), py_client("rr", k, "--seconds", str(seconds)),
                    "requests_per_s", some_requests) for k in bn.BOTH_ENDS
        ], extras=cpu_request),
    ]  # fmt: skip


# =============================================================================== rpc

# Issue 30's figures: server CPU per call of the keyed peers, each over its anchor in the
# same round (the targets in brackets).
KEYED_RATIOS = [
    Ratio("keyed SQLite over the Go twin (target 1.5x)", "rpc-sqlite", "go-ledger",
          "server_cpu_ns"),
    Ratio("keyed SQLite over the unkeyed call (target 4x)", "rpc-sqlite", "rpc-nokey",
          "server_cpu_ns"),
    Ratio("keyed SQLite over the hand-written server (target 0.4x)", "rpc-sqlite",
          "hand-written", "server_cpu_ns"),
    Ratio("one-step over the Go twin (target 1.2x)", "rpc-sqlite-one-step", "go-ledger",
          "server_cpu_ns"),
    Ratio("keyed memory over the unkeyed call (target 2x)", "rpc-memory", "rpc-nokey",
          "server_cpu_ns"),
    Ratio("keyed memory over the Go twin from memory", "rpc-memory", "go-ledger-memory",
          "server_cpu_ns"),
    Ratio("keyed Redis over the unkeyed call (target 4x; redis-server's CPU not counted)",
          "rpc-redis", "rpc-nokey", "server_cpu_ns"),
    Ratio("Go twin: durable over from memory", "go-ledger", "go-ledger-memory",
          "server_cpu_ns"),
    Ratio("keyed SQLite over the Go twin at Go's default GOMAXPROCS", "rpc-sqlite",
          "go-ledger-default", "server_cpu_ns"),
]  # fmt: skip
TRANSPORT_RATIOS = [
    Ratio("framed echo over the Go msgpack-rpc server (target 1.5x)", "rpc", "go",
          "server_cpu_ns"),
    Ratio("framed echo over aio-msgpack-rpc (target 0.5x)", "rpc", "aio", "server_cpu_ns"),
    Ratio("plain stream over framed (target 1.2x)", "rpc-stream", "rpc", "server_cpu_ns"),
    Ratio("plain stream over aio-msgpack-rpc (target 0.6x)", "rpc-stream", "aio",
          "server_cpu_ns"),
]  # fmt: skip
TRANSFER_RATIOS = [
    Ratio("the demo's transfer over the Go twin's", "demo", "go-ledger", "server_cpu_ns"),
]


def rpc_rows(quick: bool) -> list[Row]:
    from benchmarks import bench_rpc as br  # noqa: PLC0415

    seconds = "0.2" if quick else "2"
    keyed_seconds = br.KEYED_SMOKE_SECONDS if quick else br.KEYED_SECONDS

    def go_rpc() -> Path:
        return SCRATCH.go("rpc")

    def cmd_for(kind: str) -> Callable[[], list[str]]:
        return lambda: br.server_cmd(kind, go_rpc())

    def some_calls(r: dict[str, Any]) -> None:
        if r["calls"] <= 0:
            raise AssertionError("no call answered")

    def client(mode: str, kind: str, *args: str) -> Callable[[str], list[str]]:
        stream = ["-stream"] if kind in br.STREAM else []
        return lambda addr: [str(go_rpc()), mode, "-addr", addr, *args, *stream]

    def keyed(kind: str, transfer: bool = False, default_procs: bool = False) -> Peer:
        """A fresh server each round: the second pass replays the first pass's keys.
        ``default_procs``: a Go peer with Go's default GOMAXPROCS (``-default``)."""
        redis: list[tuple[str, int]] = []
        stack = contextlib.ExitStack()

        def open_peer() -> None:
            why = br.keyed_missing(kind)
            if why is not None:
                raise RuntimeError(why)
            if kind == "rpc-redis":
                from benchmarks.bench_idempotency import redis_process  # noqa: PLC0415

                redis.append(stack.enter_context(redis_process(str(SCRATCH.dir))))

        def measure() -> Sample:
            ledger = SCRATCH.go("ledger") if kind in br.GO_LEDGER else None
            env = _go_default_env() if default_procs else _net_env()
            r = br.keyed_round(kind, go_rpc(), ledger, keyed_seconds, redis[-1] if redis else None,
                               env, transfer=transfer)  # fmt: skip
            sample = _value(r["calls_per_s"], server_cpu_ns=r["server_cpu_us_per_call"] * 1e3)
            if "replay_calls_per_s" in r:
                sample["replay"] = r["replay_calls_per_s"]
                sample["replay_cpu_ns"] = r["replay_server_cpu_us_per_call"] * 1e3
            if "redis_cpu_us_per_call" in r:
                sample["redis_cpu_ns"] = r["redis_cpu_us_per_call"] * 1e3
            return sample

        name = f"{kind}-default" if default_procs else kind
        return Peer(name, measure, open=open_peer, close=stack.close)

    def layer(kind: str) -> Peer:
        if kind == "rpc":
            return _served(kind, cmd_for("rpc"), client("rr", "rpc", "-seconds", seconds),
                           "calls_per_s", some_calls)  # fmt: skip
        net_cmd = [sys.executable, str(br.NET_PEERS), "server", kind]
        return _served(kind, lambda: net_cmd,
                       lambda addr: [str(SCRATCH.go("net")), "rr", "-addr", addr,
                                     "-seconds", seconds],
                       "requests_per_s", lambda r: None)  # fmt: skip

    cpu = {"server_cpu_ns": "ns of server CPU per call"}
    return [
        Row("100 connections, 1 call in flight each", "calls/s", "higher", [
            _served(k, cmd_for(k), client("rr", k, "-seconds", seconds), "calls_per_s",
                    some_calls) for k in ("go", "rpc", "rpc-async", "rpc-stream", "aio")
        ] + [
            _served(GO_DEFAULT, cmd_for("go"), client("rr", "go", "-seconds", seconds),
                    "calls_per_s", some_calls, _go_default_env())
        ], extras=cpu, ratios=TRANSPORT_RATIOS),
        Row("1 connection, 16 calls in flight", "calls/s", "higher", [
            _served(k, cmd_for(k), client("inflight", k, "-conns", "1", "-depth", "16",
                                          "-seconds", seconds), "calls_per_s", some_calls)
            for k in ("go", "rpc", "aio")
        ], extras=cpu),
        Row("keyed calls, 100 connections (first calls)", "calls/s", "higher",
            [keyed(k) for k in br.KEYED] + [keyed("go-ledger", default_procs=True)],
            extras={"replay": "calls/s of the same keys again (replays)", **cpu,
                    "replay_cpu_ns": "ns of server CPU per replayed call",
                    "redis_cpu_ns": "ns of redis-server's CPU per call (beside the server's)"},
            ratios=KEYED_RATIOS),
        Row("the ledger demo's transfers, 100 connections (first calls)", "calls/s", "higher",
            [keyed(k, transfer=True) for k in br.TRANSFER],
            extras={"replay": "calls/s of the same keys again (replays)", **cpu,
                    "replay_cpu_ns": "ns of server CPU per replayed call"},
            ratios=TRANSFER_RATIOS),
        Row("RPC layer over raw netframe request/response", "calls/s", "higher",
            [layer("netframe-plain"), layer("rpc")], extras=cpu),
    ]  # fmt: skip


# ======================================================================= idempotency


def idempotency_rows(quick: bool) -> list[Row]:
    from benchmarks import bench_idempotency as bi  # noqa: PLC0415

    directory = str(SCRATCH.dir)
    stack = contextlib.ExitStack()
    redis_url: list[str] = []

    def open_redis() -> None:
        redis_url.append(stack.enter_context(bi.redis_server(directory)))

    group, per_op, replay, redis, memory = (
        (400, 200, 400, 400, 2_000) if quick else (20_000, 2_000, 20_000, 20_000, 100_000)
    )
    return [
        Row("100 goroutines, distinct keys, durable SQLite", "calls/s", "higher", [
            Peer("group commit", lambda: _value(bi.sqlite_rate(directory, "group-commit",
                                                               group))),
            Peer("transaction per operation",
                 lambda: _value(bi.sqlite_rate(directory, "txn-per-op", per_op))),
        ]),
        Row("SQLite, first calls then the same keys (replays)", "calls/s", "higher", [
            Peer("first calls", lambda: dict(zip(("value", "replay"),
                                                 bi.replay_rates(directory, replay),
                                                 strict=True))),
        ], extras={"replay": "calls/s of the replays"}),
        Row("100 goroutines, distinct keys, Redis", "calls/s", "higher", [
            Peer("redis", lambda: _value(bi.redis_rate(redis_url[-1], redis)),
                 open=open_redis, close=stack.close),
        ]),
        Row("one goroutine, MemoryStore against the bare handler", "ns per call", "lower", [
            Peer("handler awaited directly", lambda: _value(bi.memory_ns_per_call(memory,
                                                                                  True))),
            Peer("Idempotency.run, MemoryStore",
                 lambda: _value(bi.memory_ns_per_call(memory, False))),
        ], warmup=1),
    ]  # fmt: skip


# ========================================================================== postgres


class _Cluster:
    """The postgres suite's throwaway PostgreSQL cluster: started by the first peer that
    needs it (a peer's ``open``: nothing starts while the rows are built), shared by
    every row, stopped and removed when the suite ends."""

    def __init__(self) -> None:
        self._stack = contextlib.ExitStack()
        self._cluster: Any = None

    def get(self) -> Any:
        if self._cluster is None:
            from benchmarks import bench_postgres as bp  # noqa: PLC0415 -- needs psycopg

            why = bp.missing()
            if why is not None:
                raise RuntimeError(f"skipped: {why}")
            self._cluster = self._stack.enter_context(bp.cluster())
        return self._cluster

    def stop(self) -> None:
        self._cluster = None
        self._stack.close()


PG_CLUSTER = _Cluster()

# Issue 32's figures, each ratio taken within a round (the targets in brackets).
PG_GROUP = "postgres group commit"
PG_PER_CALL = "postgres txn per call"
PG_RATIOS = [
    Ratio("group commit over a transaction per call, calls/s (target 8x)", PG_GROUP,
          PG_PER_CALL),
    Ratio("server CPU per call, PostgresStore over SQLiteStore (target 1.5x)", PG_GROUP,
          "sqlite FULL", "server_cpu_ns"),
]  # fmt: skip
# Server CPU per call of ours over PostgresStore, each mode over its Go twin (the same
# statements, round trips and commits a batch) in the same round.
PG_KEYED_RATIOS = [
    Ratio("PostgresStore two-step over its Go twin (target 1.5x)", "rpc-postgres",
          "go-ledger-postgres", "server_cpu_ns"),
    Ratio("one-step over its Go twin (target 1.2x)", "rpc-postgres-one-step",
          "go-ledger-postgres-one-step", "server_cpu_ns"),
    Ratio("two-step over its Go twin at Go's default GOMAXPROCS", "rpc-postgres",
          "go-ledger-postgres-default", "server_cpu_ns"),
]  # fmt: skip
# Issue 42's figures: two servers over one on the same hot rows, in each mode.
HOT_RATIOS = [
    Ratio("2 servers over 1, server CPU per transfer, two-step", "2 servers, two-step",
          "1 server, two-step", "server_cpu_ns"),
    Ratio("2 servers over 1, server CPU per transfer, one-step", "2 servers, one-step",
          "1 server, one-step", "server_cpu_ns"),
]  # fmt: skip
DEMO_RATIOS = [
    Ratio("2 servers over 1, server CPU per transfer (target 1x: no higher)", "2 servers",
          "1 server", "server_cpu_ns"),
    Ratio("2 servers over 1, the cluster's CPU per transfer", "2 servers", "1 server",
          "database_cpu_ns"),
]  # fmt: skip


def postgres_rows(quick: bool) -> list[Row]:
    from benchmarks import bench_postgres as bp  # noqa: PLC0415

    group, per_call, demo_calls = (400, 200, 5) if quick else (4_000, 500, 100)
    from benchmarks.bench_rpc import KEYED_SECONDS, KEYED_SMOKE_SECONDS  # noqa: PLC0415

    keyed_seconds = KEYED_SMOKE_SECONDS if quick else KEYED_SECONDS

    def opened() -> None:
        PG_CLUSTER.get()

    def pg(group_commit: bool, n: int) -> Peer:
        def measure() -> Sample:
            rate, cpu, db = bp.postgres_round(PG_CLUSTER.get(), n, group_commit)
            return _value(rate, server_cpu_ns=cpu * 1e3, database_cpu_ns=db * 1e3)

        return Peer(PG_GROUP if group_commit else PG_PER_CALL, measure, open=opened)

    def sqlite() -> Sample:
        rate, cpu = bp.sqlite_round(str(SCRATCH.dir), group)
        return _value(rate, server_cpu_ns=cpu * 1e3)

    def demo(servers: int) -> Peer:
        def measure() -> Sample:
            r = bp.demo_round(PG_CLUSTER.get(), SCRATCH.go("rpc"), servers, demo_calls,
                              _net_env())  # fmt: skip
            return _value(r["calls_per_s"], server_cpu_ns=r["server_cpu_us_per_call"] * 1e3,
                          database_cpu_ns=r["database_cpu_us_per_call"] * 1e3,
                          ops_per_commit=r["store_ops_per_commit"])  # fmt: skip

        return Peer("1 server" if servers == 1 else f"{servers} servers", measure, open=opened)

    def hot(servers: int, one_step: bool) -> Peer:
        def open_peer() -> None:
            why = bp.keyed_missing("rpc-postgres")
            if why is not None:
                raise RuntimeError(f"skipped: {why}")
            PG_CLUSTER.get()

        def measure() -> Sample:
            r = bp.hot_round(PG_CLUSTER.get(), SCRATCH.go("rpc"), servers, one_step,
                             keyed_seconds, _net_env())  # fmt: skip
            if r["deadlocks"]:
                raise AssertionError(f"{r['deadlocks']:g} deadlocks detected in the round")
            return _value(r["calls_per_s"], server_cpu_ns=r["server_cpu_us_per_call"] * 1e3,
                          lock_wait_ms=r["longest_lock_wait_ms"])  # fmt: skip

        name = "1 server" if servers == 1 else f"{servers} servers"
        return Peer(f"{name}, {'one-step' if one_step else 'two-step'}", measure, open=open_peer)

    def keyed(kind: str, default_procs: bool = False) -> Peer:
        """A server process of its own each round, over a fresh schema of the cluster
        (``default_procs``: a Go twin with Go's default GOMAXPROCS, ``-default``)."""

        def open_peer() -> None:
            why = bp.keyed_missing(kind)
            if why is not None:
                raise RuntimeError(f"skipped: {why}")
            PG_CLUSTER.get()

        def measure() -> Sample:
            ledger = SCRATCH.go("ledger") if kind in bp.GO_TWINS else None
            env = _go_default_env() if default_procs else _net_env()
            r = bp.keyed_round(PG_CLUSTER.get(), kind, SCRATCH.go("rpc"), ledger, keyed_seconds,
                               env)  # fmt: skip
            return _value(r["calls_per_s"], server_cpu_ns=r["server_cpu_us_per_call"] * 1e3,
                          database_cpu_ns=r["database_cpu_us_per_call"] * 1e3)  # fmt: skip

        return Peer(f"{kind}-default" if default_procs else kind, measure, open=open_peer)

    return [
        Row("100 goroutines, distinct keys, durable PostgreSQL and SQLite", "calls/s",
            "higher", [pg(True, group), pg(False, per_call), Peer("sqlite FULL", sqlite)],
            warmup=1, ratios=PG_RATIOS,
            extras={"server_cpu_ns": "ns of server CPU per call (the application's process)",
                    "database_cpu_ns": "ns of the cluster's CPU per call (all its processes)"}),
        Row("the ledger demo's transfers over PostgreSQL, 100 connections", "transfers/s",
            "higher", [demo(1), demo(2)], ratios=DEMO_RATIOS,
            extras={"server_cpu_ns": "ns of server CPU per transfer (all server processes)",
                    "database_cpu_ns": "ns of the cluster's CPU per transfer",
                    "ops_per_commit": "store operations per commit (all servers)"}),
        Row("the demo's transfers on 20 hot accounts, 1 and 2 servers, 100 connections",
            "transfers/s", "higher", [hot(1, False), hot(2, False), hot(1, True), hot(2, True)],
            ratios=HOT_RATIOS,
            extras={"server_cpu_ns": "ns of server CPU per transfer (all server processes)",
                    "lock_wait_ms": "the longest lock wait of the servers' transactions (ms;"
                                    " 0: none past 10 ms)"}),
        Row("keyed calls over PostgreSQL, 100 connections", "calls/s", "higher",
            [*(keyed(k) for k in bp.KEYED), keyed("go-ledger-postgres", default_procs=True)],
            ratios=PG_KEYED_RATIOS,
            extras={"server_cpu_ns": "ns of server CPU per call (the server's process)",
                    "database_cpu_ns": "ns of the cluster's CPU per call (all its processes)"}),
    ]  # fmt: skip


# =========================================================================== explore


def explore_rows(quick: bool) -> list[Row]:
    """Issue 45's figures: gosim.testing's exploration on the catalogue of seeded bugs
    (runs to the first failure, the shrunk replay's size), its linearizability checker,
    and virtual time on idle connections. The exploration's figures are counts from
    seeded runs, the same in every round: one round each."""
    import statistics  # noqa: PLC0415

    from benchmarks import bench_explore as be  # noqa: PLC0415
    from benchmarks import bench_linearizability as bl  # noqa: PLC0415

    seeds = range(3 if quick else be.SEEDS)
    samples = 20 if quick else be.RATE_SAMPLES
    history_ops = 2_000 if quick else 10_000

    def first_failure(bug: Any, scheduler: str) -> Callable[[], Sample]:
        def measure() -> Sample:
            first = be.runs_to_failure(bug, scheduler, seeds)
            out = _value(statistics.median(first), worst=max(first))
            if scheduler == "pct" and bug.depth is not None:
                out.update(pct_rate=be.pct_rate(bug, samples), pct_bound=be.pct_bound(bug))
            return out

        return measure

    def shrunk(bug: Any, scheduler: str) -> Callable[[], Sample]:
        def measure() -> Sample:
            got = be.shrunk(bug, scheduler, seeds)
            return _value(
                statistics.median(got["shrunk_decisions"]),
                worst=max(got["shrunk_decisions"]),
                found=statistics.median(got["found_decisions"]),
                faults=statistics.median(got["shrunk_faults"]),
                shrink_runs=statistics.median(got["shrink_runs"]),
            )

        return measure

    def ledger_check() -> Sample:
        history = bl.simulate(history_ops, "ledger")
        return _value(bl.check_seconds(history) * 1e9, operations=len(history))

    def caught(case: str) -> Callable[[], Sample]:
        def measure() -> Sample:
            seconds, result = bl.caught(case, history_ops)
            return _value(seconds * 1e9, counterexample=len(result.counterexample))

        return measure

    def idle_connections(connections: int, seconds: float) -> Callable[[], Sample]:
        def measure() -> Sample:
            out = be.sparse(connections, seconds)
            return _value(
                out["simulated_s"] / out["wall_s"],
                wall_per_frame=out["wall_s"] / out["frames"] * 1e9,
                simulated=out["simulated_s"],
            )

        return measure

    depth = {b.name: f", depth {b.depth}" if b.depth else ", a fault" for b in be.CATALOGUE}
    rows = [
        Row(
            f"{bug.name}{depth[bug.name]}",
            "runs to the first failure",
            "lower",
            [Peer("random", first_failure(bug, "random")), Peer("PCT", first_failure(bug, "pct"))],
            max_rounds=1,
            extras={
                "worst": "runs to the first failure, the worst seed",
                "pct_rate": "failing share of PCT's runs (observed)",
                "pct_bound": "failing share of PCT's runs (its bound, 1/(n k^(d-1)))",
            },
        )
        for bug in be.CATALOGUE
    ]
    rows += [
        Row(
            f"{bug.name}, shrunk",
            "decisions kept in the replay",
            "lower",
            [
                Peer("random, shrunk", shrunk(bug, "random")),
                Peer("PCT, shrunk", shrunk(bug, "pct")),
            ],
            max_rounds=1,
            extras={
                "worst": "decisions kept, the worst seed",
                "found": "decisions of the failing run found",
                "faults": "faults kept",
                "shrink_runs": "runs the shrinking took",
            },
        )
        for bug in be.CATALOGUE
    ]
    rows += [
        Row(
            "a correct ledger's history",
            "ns per check",
            "lower",
            [Peer("checker", ledger_check)],
            max_rounds=3,
            extras={"operations": "operations in the history"},
        ),
        Row(
            "a key-value replica's stale reads",
            "ns per check and shrink",
            "lower",
            [Peer("checker", caught("kv-stale-read"))],
            max_rounds=1,
            extras={"counterexample": "operations in the counterexample"},
        ),
        Row(
            "a ledger's transfers applied twice",
            "ns per check and shrink",
            "lower",
            [Peer("checker", caught("ledger-double-apply"))],
            max_rounds=1,
            extras={"counterexample": "operations in the counterexample"},
        ),
    ]
    sizes = [(20, 30.0)] if quick else [(100, 3600.0), (1_000, 360.0), (10_000, 36.0)]
    rows += [
        Row(
            f"{n:,} idle connections",
            "simulated s per wall s",
            "higher",
            [Peer("virtual time", idle_connections(n, seconds))],
            max_rounds=3,
            extras={
                "wall_per_frame": "ns of wall time per heartbeat frame",
                "simulated": "simulated seconds a round",
            },
        )
        for n, seconds in sizes
    ]
    return rows  # fmt: skip


SUITES: dict[str, Suite] = {
    s.name: s
    for s in (
        Suite("core", "Goroutines and channels", core_rows, reference="go"),
        Suite("procs", "The core workloads at procs=1 to 64", procs_rows,
              reference="gosim-p1"),
        Suite("sync", "gosim.sync.Mutex against trio.Lock", sync_rows, reference="gosim"),
        Suite("spin", "Spinlocks and atomics, 2 threads", spin_rows, reference="threading.Lock"),
        Suite("mem", "The allocator", mem_rows, reference="go"),
        Suite("codec", "Frame codec, in memory", codec_rows, reference="struct-baseline"),
        Suite("network", "Network echo, server and client processes", network_rows,
              reference="go", finish=SERVERS.stop_all),
        Suite("rpc", "msgpack-rpc, server and client processes", rpc_rows, reference="go",
              finish=SERVERS.stop_all),
        Suite("idempotency", "Idempotent calls through each store", idempotency_rows),
        Suite("postgres", "PostgresStore beside SQLiteStore and its Go twin, and the demo's "
              "servers over it",
              postgres_rows, finish=PG_CLUSTER.stop),
        Suite("explore", "Finding the schedule that breaks a program", explore_rows),
    )
}  # fmt: skip
