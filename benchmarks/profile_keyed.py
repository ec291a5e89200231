"""Where a keyed call's server CPU goes: the runtime's thread against the store's, user
against system time, beside the peers the keyed figures are compared with.

The keyed rows of BENCHMARKS.md give one number a call (the server's CPU from
``/proc/<pid>/stat``). This script splits that number by thread, from
``/proc/<pid>/task/<tid>/stat`` around the same load (the Go load generator's 100
connections, one call in flight each, a fresh key a call, every reply checked): the
server's main thread (for our servers, gosim's runtime: msgpack, the dispatch, the
protocol's steps, the handler), its other threads (for our servers, the store's
committer: SQLite's or PostgreSQL's client library and the commit's ``fsync`` or socket
round trips), each as user and system time. Go's servers spread over several threads;
for them only the total is meaningful. Peers run interleaved round by round, the same
seconds each, as the benchmark suites do::

    .venv/bin/python -m benchmarks.profile_keyed sqlite      # rpc-sqlite, rpc-nokey, go-ledger
    .venv/bin/python -m benchmarks.profile_keyed postgres    # PostgresStore and its Go twin

Options: ``--rounds N`` (default 7), ``--seconds S`` (default 3). Prints a table of
medians (and ranges) in microseconds of CPU a call. ``--sample`` adds, for each of our
servers (the unkeyed call's too: the floor the keyed call is set against), an extra
run under py-spy (a dev dependency; 200 samples a second of the thread that holds the
GIL, so a wait in a system call or for a lock is not counted, nor C code that released
the GIL: SQLite's statements and the commit's fsync) and the share of the samples whose
innermost Python frame is in each module: the project's own (gosim, netframe,
idempotency) against the libraries it drives (msgpack, psycopg, sqlite3, trio, the
rest of the standard library). C code run with the GIL held is counted under the
Python frame that called it (libpq's sends and receives, through ``RawConn.control``
and ``RawConn.read``, say).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from benchmarks import bench_postgres, bench_rpc
from benchmarks.procs import TICKS, Server, find_go, go_build, run_json

ENV = bench_rpc.ENV  # GOMAXPROCS=1 and the GC settings, as the keyed rows run
FAMILIES = {
    "sqlite": ("rpc-sqlite", "rpc-sqlite-one-step", "rpc-nokey", "go-ledger"),
    "postgres": (
        "rpc-postgres",
        "rpc-postgres-one-step",
        "go-ledger-postgres",
        "go-ledger-postgres-one-step",
    ),
}


def thread_times(pid: int) -> dict[int, tuple[float, float]]:
    """(user, system) seconds of every live thread of ``pid``, by thread id."""
    out: dict[int, tuple[float, float]] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # the thread ended meanwhile
        out[int(tid)] = (int(fields[11]) / TICKS, int(fields[12]) / TICKS)
    return out


def split(pid: int, before: dict[int, tuple[float, float]]) -> dict[str, float]:
    """CPU seconds since ``before``: the main thread's and the others', user and system."""
    after = thread_times(pid)
    parts = {"main_user": 0.0, "main_sys": 0.0, "other_user": 0.0, "other_sys": 0.0}
    for tid, (user, system) in after.items():
        user0, system0 = before.get(tid, (0.0, 0.0))
        side = "main" if tid == pid else "other"
        parts[f"{side}_user"] += user - user0
        parts[f"{side}_sys"] += system - system0
    return parts


def server_cmd(kind: str, directory: Path, go_ledger: Path, dsn: str | None) -> list[str]:
    """The command line of peer ``kind``: the keyed rows' own (bench_rpc's for SQLite,
    bench_postgres's over the cluster at ``dsn``, its records under a schema named
    after ``directory``)."""
    if dsn is not None:
        return bench_postgres.keyed_server_cmd(kind, dsn, directory.name, go_ledger)
    return bench_rpc.keyed_server_cmd(kind, directory, go_ledger, None)


def one_round(
    kind: str, go_rpc: Path, go_ledger: Path, seconds: float, dsn: str | None
) -> dict[str, float]:
    """One peer's run on a fresh server: its CPU a call, split (microseconds)."""
    with tempfile.TemporaryDirectory(prefix="profile_keyed_") as tmp:
        srv = Server(server_cmd(kind, Path(tmp), go_ledger, dsn), env=ENV)
        try:
            load = [str(go_rpc), "rr", "-addr", srv.addr, "-seconds", f"{seconds:g}"]
            if kind != "rpc-nokey":
                load.append("-key")
            before = thread_times(srv.proc.pid)
            result = run_json(load, ENV)
            parts = split(srv.proc.pid, before)
        finally:
            srv.stop()
    calls = result["calls"]
    out = {name: value * 1e6 / calls for name, value in parts.items()}
    out["total"] = sum(out.values())
    return out


def package_of(frame: str) -> str:
    """Where a py-spy frame (``function (path:line)``) runs: the module for the project's
    own code (``idempotency.stores.sqlite``), the package for an installed library
    (``msgpack``), ``stdlib:<module>`` for the standard library."""
    path = frame.rsplit("(", 1)[-1].rsplit(":", 1)[0]
    if "site-packages/" in path:
        return path.split("site-packages/", 1)[1].split("/", 1)[0].removesuffix(".py")
    for ours in ("gosim", "netframe", "idempotency", "benchmarks"):
        if path.startswith(f"{ours}/"):
            tail = path[len(ours) + 1 :]
        elif f"/{ours}/" in path:
            tail = path.split(f"/{ours}/", 1)[1]
        else:
            continue
        return ".".join([ours, *tail.removesuffix(".py").split("/")])
    if path.startswith("<"):
        return "interpreter"
    return "stdlib:" + Path(path).stem


def sampled_shares(
    kind: str, go_rpc: Path, go_ledger: Path, seconds: float, dsn: str | None
) -> dict[str, float]:
    """One run of Python peer ``kind`` under py-spy: the share of the GIL holder's samples
    by the module of their innermost frame, then (keys ``frame <frame>``) the 12 innermost
    frames taking the most samples."""
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    with tempfile.TemporaryDirectory(prefix="profile_keyed_") as tmp:
        raw = Path(tmp) / "samples.txt"
        srv = Server(server_cmd(kind, Path(tmp), go_ledger, dsn), env=ENV)
        try:
            load = [str(go_rpc), "rr", "-addr", srv.addr, "-seconds", f"{seconds:g}", "-key"]
            sampler = subprocess.Popen(
                [py_spy, "record", "--pid", str(srv.proc.pid), "--rate", "200", "--format",
                 "raw", "--output", str(raw), "--duration", f"{seconds + 1:g}", "--nonblocking",
                 "--gil"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
            time.sleep(0.5)  # py-spy attached before the load starts
            run_json(load, ENV)
            sampler.wait(timeout=60)
        finally:
            srv.stop()
        counts: collections.Counter[str] = collections.Counter()
        leaves: collections.Counter[str] = collections.Counter()
        for line in raw.read_text().splitlines():
            stack, _, n = line.rpartition(" ")
            if stack:
                leaf = stack.rsplit(";", 1)[-1]
                counts[package_of(leaf)] += int(n)
                leaves[leaf] += int(n)
    total = sum(counts.values()) or 1
    shares = {pkg: n / total for pkg, n in counts.most_common()}
    shares.update({f"frame {leaf}": n / total for leaf, n in leaves.most_common(12)})
    return shares


@contextlib.contextmanager
def postgres() -> Iterator[str]:
    """A throwaway PostgreSQL cluster's DSN (stopped and removed at the end)."""
    from idempotency.stores.pgcluster import PostgresCluster  # noqa: PLC0415

    cluster = PostgresCluster()
    cluster.start()
    try:
        yield cluster.dsn
    finally:
        cluster.destroy()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("family", choices=sorted(FAMILIES))
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--sample", action="store_true", help="add a py-spy run per peer")
    args = parser.parse_args()
    if find_go() is None:
        print("no Go toolchain: the load generator is a Go program", file=sys.stderr)
        return 1
    build = Path(tempfile.mkdtemp(prefix="profile_keyed_go_"))
    go_rpc = go_build("rpc", build / "rpc")
    go_ledger = go_build("ledger", build / "ledger")
    peers = FAMILIES[args.family]
    rounds: dict[str, list[dict[str, float]]] = {kind: [] for kind in peers}
    with contextlib.ExitStack() as stack:
        dsn = stack.enter_context(postgres()) if args.family == "postgres" else None
        for r in range(args.rounds):
            order = peers if r % 2 == 0 else tuple(reversed(peers))
            for kind in order:
                rounds[kind].append(one_round(kind, go_rpc, go_ledger, args.seconds, dsn))
            print(f"round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)
        shares = {
            kind: sampled_shares(kind, go_rpc, go_ledger, args.seconds, dsn)
            for kind in peers
            if args.sample and kind.startswith("rpc-")
        }
    columns = ("total", "main_user", "main_sys", "other_user", "other_sys")
    if args.rounds < 1:
        peers = ()
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    print(
        f"Server CPU per call, µs: median (min to max) of {args.rounds} rounds, "
        f"{args.seconds:g} s a peer, {when}"
    )
    print("| peer | " + " | ".join(columns) + " |")
    print("| --- |" + " ---: |" * len(columns))
    for kind in peers:
        cells = []
        for col in columns:
            values = [row[col] for row in rounds[kind]]
            cells.append(
                f"{statistics.median(values):.1f} ({min(values):.1f} to {max(values):.1f})"
            )
        print(f"| {kind} | " + " | ".join(cells) + " |")
    for kind, by_place in shares.items():
        packages = {p: v for p, v in by_place.items() if not p.startswith("frame ")}
        top = ", ".join(f"{pkg} {share:.0%}" for pkg, share in packages.items() if share >= 0.01)
        print(f"\n{kind}, GIL-holding samples by innermost module: {top}")
        print("innermost frames:")
        for place, share in by_place.items():
            if place.startswith("frame "):
                print(f"  {share:5.1%}  {place.removeprefix('frame ')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
