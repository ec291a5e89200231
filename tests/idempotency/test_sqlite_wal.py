"""SQLiteStore keeps its write-ahead log bounded by itself (see "The write-ahead log
stays bounded" in ``idempotency/stores/sqlite.py``).

On a small disk a log that is never checkpointed fills the room freed after a full disk
again, and the store never works again without a restart. These tests fill a real small
disk (a tmpfs they mount, as root), free it, and drive the same store object through the
public API; others check the bound and ``close()`` on a regular temporary directory,
beside another process that reads the file.
"""

from __future__ import annotations

import contextlib
import os
import random
import select
import signal
import sqlite3
import subprocess
import sys
import tempfile
import textwrap
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import gosim
from idempotency import Idempotency, SQLiteStore, StoreUnavailable

PAGE = 4096
FRAME = PAGE + 24  # a WAL frame: its header and the page
WAIT = 60.0  # seconds: a bound on every wait for an answer (a loaded 2-core machine)
WIDTH = 32  # calls in flight at once


def wal_size(path: Path) -> int:
    try:
        return os.stat(f"{path}-wal").st_size
    except FileNotFoundError:
        return 0


def run_keys(
    idem: Idempotency,
    keys: list[str],
    *,
    width: int = WIDTH,
    after_each: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """Run a keyed call for every key, ``width`` at a time: each key's answer (the value
    recorded for it, the key itself) or the exception its call raised. Every wait for an
    answer is bounded (WAIT)."""

    async def main() -> dict[str, Any]:
        done: gosim.Chan[tuple[str, Any]] = gosim.Chan(width)

        async def one(key: str) -> None:
            try:
                out = await idem.run(
                    caller="c", key=key, request=("put", [key]), handler=lambda call: key
                )
            except Exception as exc:
                await done.send((key, exc))
                return
            await done.send((key, out.value))

        answers: dict[str, Any] = {}
        started = in_flight = 0
        while started < len(keys) or in_flight:
            while started < len(keys) and in_flight < width:
                gosim.go(one, keys[started])
                started += 1
                in_flight += 1
            await _answer(done, answers)
            in_flight -= 1
            if after_each is not None:
                after_each()
        return answers

    return gosim.run(main, procs=2)


async def _answer(done: gosim.Chan[tuple[str, Any]], answers: dict[str, Any]) -> None:
    i, got, _ = await gosim.select(gosim.recv(done), gosim.recv(gosim.after(WAIT)))
    if i == 1:
        raise AssertionError(f"no call answered within {WAIT} s: the store hangs")
    key, answer = got
    answers[key] = answer


def transact(store: SQLiteStore, fn: Callable[[sqlite3.Connection], Any]) -> Any:
    """``store.transact(fn)``: its result, or the exception it raised (bounded wait)."""

    async def main() -> Any:
        done: gosim.Chan[Any] = gosim.Chan(1)

        async def one() -> None:
            try:
                await done.send(await store.transact(fn))
            except Exception as exc:
                await done.send(exc)

        gosim.go(one)
        i, got, _ = await gosim.select(gosim.recv(done), gosim.recv(gosim.after(WAIT)))
        if i == 1:
            raise AssertionError(f"transact did not answer within {WAIT} s: the store hangs")
        return got

    return gosim.run(main)


def acknowledged(answers: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in answers.items() if not isinstance(v, BaseException)}


def assert_all_answered(answers: dict[str, Any], when: str) -> None:
    failed = {k: v for k, v in answers.items() if isinstance(v, BaseException)}
    assert not failed, f"{len(failed)} of {len(answers)} calls failed {when}: {failed.popitem()}"


def assert_replayed(path: Path, acked: dict[str, Any]) -> None:
    """Reopened, the file answers every acknowledged key with its recorded value, as a
    replay (the handler does not run again)."""
    store = SQLiteStore(path, busy_timeout=5.0)
    try:
        idem = Idempotency(store)

        async def main() -> list[str]:
            wrong: list[str] = []
            for key, value in acked.items():
                out = await idem.run(
                    caller="c", key=key, request=("put", [key]), handler=lambda call: "again"
                )
                if not (out.replayed and out.value == value):
                    wrong.append(key)
            return wrong

        wrong = gosim.run(main)
    finally:
        store.close()
    assert wrong == [], f"{len(wrong)} acknowledged outcomes lost, e.g. {wrong[:5]}"


def fill(path: Path) -> None:
    """Write ``path`` until the disk has no room left (ENOSPC), a page at a time."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for _ in range(1 << 20):  # bounded: 4 GiB of pages
            try:
                os.write(fd, b"\0" * PAGE)
            except OSError as exc:
                assert exc.errno == 28, exc  # ENOSPC
                return
        raise AssertionError(f"{path}: the disk never filled")
    finally:
        os.close(fd)


@pytest.fixture
def small_disk(request: pytest.FixtureRequest) -> Iterator[Path]:
    """A tmpfs of ``request.param`` (e.g. "2m"), mounted on a fresh directory for the
    test and unmounted after it."""
    size = request.param
    if os.geteuid() != 0:
        pytest.skip(f"mounting a {size} tmpfs to fill up needs root (euid {os.geteuid()})")
    where = Path(tempfile.mkdtemp(prefix="idem-small-disk-"))
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(where)],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    if mounted.returncode != 0:
        where.rmdir()
        pytest.skip(f"mounting a {size} tmpfs was refused: {mounted.stderr.strip()}")
    try:
        yield where
    finally:
        done = subprocess.run(["umount", str(where)], capture_output=True, timeout=30, check=False)
        if done.returncode != 0:  # a file left open by a failed test: detach it all the same
            subprocess.run(["umount", "-l", str(where)], timeout=30, check=False)
        where.rmdir()


READER = textwrap.dedent(
    """
    import sqlite3, sys
    conn = sqlite3.connect(sys.argv[1], isolation_level=None)
    for line in sys.stdin:
        if line.strip() == "open":  # a read: the file is open, SQLite's lock on it held
            conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
        elif line.strip() == "begin":  # a read transaction: a snapshot the log must keep
            conn.execute("BEGIN")
            conn.execute("SELECT count(*) FROM idempotency_records").fetchone()
        elif line.strip() == "end":
            conn.execute("COMMIT")
        print("ok", flush=True)
    """
)


class Reader:
    """Another process with the file open: idle, or in a read transaction."""

    def __init__(self, path: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", READER, str(path)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        self.tell("open")

    def tell(self, what: str) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(what + "\n")
        self.proc.stdin.flush()
        ready, _, _ = select.select([self.proc.stdout], [], [], WAIT)
        assert ready, f"the reader did not answer {what!r} within {WAIT} s"
        assert self.proc.stdout.readline().strip() == "ok"

    def stop(self) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=WAIT)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(timeout=WAIT)
            self.proc.stdout.close()


@contextlib.contextmanager
def reading(path: Path) -> Iterator[Reader]:
    reader = Reader(path)
    try:
        yield reader
    finally:
        reader.stop()


def bound(store: SQLiteStore, pages_a_commit: int) -> int:
    """The most the log's file may hold: the store's bound, and what the commits in
    flight when it is passed write past it (``pages_a_commit`` pages each) before the
    log is written again from its start."""
    return 32 + store.wal_limit + pages_a_commit * FRAME


# ------------------------------------------------------------------ a full small disk


@pytest.mark.parametrize("small_disk", ["2m", "8m"], indirect=True)
def test_a_full_disk_freed_again_serves_the_same_store_with_a_bounded_log(
    small_disk: Path,
) -> None:
    """The disk fills up under the store: calls fail with a clear StoreUnavailable and
    none hangs. The filler is removed: the same store object (no restart) runs thousands
    more calls -- more than the log could hold unchecked -- with the log's file within
    its bound, and after a reopen every acknowledged outcome is there."""
    path = small_disk / "records.db"
    filler = small_disk / "filler"
    store = SQLiteStore(path, busy_timeout=5.0)
    try:
        idem = Idempotency(store)
        acked = acknowledged(run_keys(idem, [f"before-{i}" for i in range(200)]))
        assert len(acked) == 200

        fill(filler)
        failures: list[BaseException] = []
        for chunk in range(100):  # bounded: 10,000 calls on a full disk
            answers = run_keys(idem, [f"full-{chunk}-{i}" for i in range(100)])
            acked |= acknowledged(answers)
            failures += [a for a in answers.values() if isinstance(a, BaseException)]
            if failures:
                break
        assert failures, "the store never ran out of room on a full disk"
        # A few more rounds on the full disk: each failure is the store's clear error.
        for chunk in range(3):
            answers = run_keys(idem, [f"still-full-{chunk}-{i}" for i in range(64)])
            acked |= acknowledged(answers)
            failures += [a for a in answers.values() if isinstance(a, BaseException)]
        for exc in failures:
            assert isinstance(exc, StoreUnavailable), repr(exc)
            assert "records.db" in str(exc) and "full" in str(exc), str(exc)

        filler.unlink()
        largest = 0

        def watch() -> None:
            nonlocal largest
            largest = max(largest, wal_size(path))

        after = run_keys(idem, [f"after-{i}" for i in range(4000)], after_each=watch)
        assert_all_answered(after, "after room was freed")
        acked |= after
        # A batch of WIDTH new keys rewrites a few table pages, an index page each, the
        # counter's page.
        assert largest <= bound(store, WIDTH + 8), (largest, store.wal_limit)
    finally:
        store.close()
    assert wal_size(path) == 0  # close() checkpointed the log
    assert_replayed(path, acked)


@pytest.mark.parametrize("small_disk", ["2m"], indirect=True)
def test_a_failed_write_gives_back_the_log_a_reader_held(small_disk: Path) -> None:
    """A reader in another process holds a snapshot, so the log can neither be copied
    past it nor written again from its start: it grows until the disk is full. Once the
    reader is done, nothing else is freed: the automatic checkpoint runs only after a
    commit, and none gets through. The checkpoint after the failed write copies the log
    (pages the database file has) and truncates it, and the store goes on."""
    path = small_disk / "records.db"
    app = sqlite3.connect(path, isolation_level=None)
    app.execute("PRAGMA journal_mode=WAL")
    app.execute("CREATE TABLE counter (n INTEGER NOT NULL)")
    app.execute("INSERT INTO counter VALUES (0)")
    app.close()

    def bump(conn: sqlite3.Connection) -> int:
        conn.execute("UPDATE counter SET n = n + 1")
        return int(conn.execute("SELECT n FROM counter").fetchone()[0])

    store = SQLiteStore(path, busy_timeout=5.0)
    try:
        idem = Idempotency(store)
        acked = acknowledged(run_keys(idem, [f"k{i}" for i in range(100)]))
        assert len(acked) == 100
        bumped = 0
        with reading(path) as reader:
            reader.tell("begin")
            failure = None
            for _ in range(5000):  # bounded: the log of 2 MiB holds about 500 bumps
                got = transact(store, bump)
                if isinstance(got, BaseException):
                    failure = got
                    break
                bumped = got
            assert isinstance(failure, StoreUnavailable), failure
            assert "full" in str(failure), str(failure)
            assert wal_size(path) > store.wal_limit  # the reader kept it from being reused
            reader.tell("end")
            # A write that finds no room gives the log back: the next has room.
            first, second = transact(store, bump), transact(store, bump)
            if isinstance(first, BaseException):
                assert isinstance(first, StoreUnavailable), first
            else:
                assert first == bumped + 1, first
                bumped = first
            assert second == bumped + 1, second
            bumped = second
            assert wal_size(path) <= store.wal_limit
            for _ in range(300):
                got = transact(store, bump)
                assert got == bumped + 1, got
                bumped = got
            more = run_keys(idem, [f"after-{i}" for i in range(500)])
            assert_all_answered(more, "after the log was given back")
            acked |= more
    finally:
        store.close()
    check = sqlite3.connect(path)
    try:
        assert check.execute("SELECT n FROM counter").fetchone()[0] == bumped
    finally:
        check.close()
    assert_replayed(path, acked)


# ------------------------------------------------------------- on a regular directory


@pytest.mark.parametrize("wal_limit", [64 * 1024, None], ids=["64KiB", "default"])
def test_the_log_stays_within_its_bound_through_many_commits(
    tmp_path: Path, wal_limit: int | None
) -> None:
    """In normal operation the log's file never grows past the store's bound, however
    many commits; everything committed is in the file."""
    path = tmp_path / "records.db"
    store = SQLiteStore(path) if wal_limit is None else SQLiteStore(path, wal_limit=wal_limit)
    assert store.wal_limit == (wal_limit or 1 << 20)
    keys = [f"k{i}" for i in range(3000 if wal_limit is None else 1000)]
    sizes: list[int] = []
    try:
        idem = Idempotency(store)
        answers = run_keys(idem, keys, width=8, after_each=lambda: sizes.append(wal_size(path)))
        assert_all_answered(answers, "in normal operation")
        # Every batch wrote a frame at least: the log could not have held them all.
        assert store.statistics().batches > 2 * store.wal_limit // PAGE
        assert max(sizes) <= bound(store, 8 + 8), (max(sizes), store.wal_limit)
        assert max(sizes) > store.wal_limit // 2  # it was used up to near the bound
    finally:
        store.close()
    assert_replayed(path, answers)


def test_a_reader_that_holds_the_log_fails_no_call_and_the_file_is_cut_back_after(
    tmp_path: Path,
) -> None:
    """A checkpoint that a reader keeps from finishing fails no call and makes none wait;
    once the reader is done, the log is written again from its start and its file cut
    back to the bound."""
    path = tmp_path / "records.db"
    store = SQLiteStore(path, wal_limit=64 * 1024, busy_timeout=5.0)
    try:
        idem = Idempotency(store)
        acked = acknowledged(run_keys(idem, [f"a{i}" for i in range(50)]))
        with reading(path) as reader:
            reader.tell("begin")
            held = run_keys(idem, [f"held-{i}" for i in range(400)])
            assert_all_answered(held, "while a reader held the log")
            acked |= held
            grown = wal_size(path)
            assert grown > 4 * store.wal_limit  # nothing could be reused meanwhile
            reader.tell("end")
            after = run_keys(idem, [f"after-{i}" for i in range(400)], width=8)
            assert_all_answered(after, "after the reader was done")
            acked |= after
            assert wal_size(path) <= bound(store, 16), (wal_size(path), grown)
    finally:
        store.close()
    assert_replayed(path, acked)


def test_close_leaves_the_log_checkpointed_beside_another_process(tmp_path: Path) -> None:
    """SQLite checkpoints at close only as the file's last connection; the store checkpoints
    and truncates the log itself, so another process that has the file open (idle)
    finds an empty log and every record in the database file."""
    path = tmp_path / "records.db"
    store = SQLiteStore(path, busy_timeout=5.0)
    with reading(path):
        try:
            answers = run_keys(Idempotency(store), [f"k{i}" for i in range(300)])
            assert_all_answered(answers, "beside an idle reader")
            assert wal_size(path) > 0
        finally:
            store.close()
        assert wal_size(path) == 0
    assert_replayed(path, answers)


def test_close_beside_a_reader_neither_waits_nor_fails(tmp_path: Path) -> None:
    """A reader that holds the log keeps ``close()`` from truncating it: close returns
    all the same without waiting for the reader (the checkpoint waits for nobody, even
    with an hour's busy timeout), and loses nothing."""
    path = tmp_path / "records.db"
    store = SQLiteStore(path, busy_timeout=3600.0)
    with reading(path) as reader:
        reader.tell("begin")
        answers = run_keys(Idempotency(store), [f"k{i}" for i in range(300)])
        assert_all_answered(answers, "beside a reader")
        closing = threading.Thread(target=store.close, daemon=True)
        closing.start()
        closing.join(WAIT)
        waited = closing.is_alive()
        reader.tell("end")  # a close that waits for the reader is let go here
        closing.join(WAIT)
        assert not waited, "close() waited for the reader"
        assert wal_size(path) > 0  # the reader's snapshot kept it
    assert_replayed(path, answers)


def test_wal_limit_is_checked(tmp_path: Path) -> None:
    for bad in (0, -1, 1.5, "1m"):
        with pytest.raises(ValueError, match="wal_limit must be a positive int"):
            SQLiteStore(tmp_path / "x.db", wal_limit=bad)  # type: ignore[arg-type]


SHARER = textwrap.dedent(
    """
    import sys
    import gosim
    from idempotency import Idempotency, SQLiteStore

    path, prefix, n_keys, workers = sys.argv[1], sys.argv[2], int(sys.argv[3]), 16
    store = SQLiteStore(path, wal_limit=16 * 1024, busy_timeout=30.0)
    idem = Idempotency(store)

    async def main():
        done = gosim.Chan(workers)

        async def worker(w):
            for i in range(w, n_keys, workers):
                key = f"{prefix}{i}"
                await idem.run(caller="c", key=key, request=("put", [key]),
                               handler=lambda call, key=key: key)
                sys.stdout.write(f"ack {key}\\n")
                sys.stdout.flush()
            await done.send(None)

        for w in range(workers):
            gosim.go(worker, w)
        for _ in range(workers):
            await done.recv()

    gosim.run(main)
    store.close()
    print("finished", flush=True)
    """
)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_processes_sharing_the_file_checkpoint_it_and_one_killed_loses_nothing(
    tmp_path: Path, seed: int
) -> None:
    """Two processes write one file with a bound of four pages, so that nearly every
    commit checkpoints, each process's checkpoints racing the other's commits; one is
    killed (SIGKILL) at a random instant, mid-commit or mid-checkpoint. The file is
    whole, and every outcome either process saw acknowledged is in it."""
    rnd = random.Random(seed)
    path = tmp_path / "shared.db"
    SQLiteStore(path).close()  # the tables, made once
    n_keys = 600
    procs = {
        name: subprocess.Popen(
            [sys.executable, "-c", SHARER, str(path), name, str(n_keys)],
            stdout=subprocess.PIPE,
            text=True,
        )
        for name in ("killed-", "kept-")
    }
    acked: dict[str, Any] = {}
    try:
        victim = procs["killed-"]
        assert victim.stdout is not None
        for _ in range(rnd.randint(1, n_keys - 1)):
            ready, _, _ = select.select([victim.stdout], [], [], WAIT)
            assert ready, f"no acknowledgement within {WAIT} s"
            line = victim.stdout.readline()
            assert line.startswith("ack "), line
            key = line.split()[1]
            acked[key] = key
        victim.send_signal(signal.SIGKILL)
        for name, proc in procs.items():
            out, _ = proc.communicate(timeout=10 * WAIT)
            lines = out.splitlines()
            acked |= {line.split()[1]: line.split()[1] for line in lines if line[:4] == "ack "}
            if name == "kept-":
                assert proc.returncode == 0 and lines[-1] == "finished", lines[-3:]
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=WAIT)
            assert proc.stdout is not None
            proc.stdout.close()
    assert sum(k.startswith("kept-") for k in acked) == n_keys
    check = sqlite3.connect(path)
    try:
        assert check.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    finally:
        check.close()
    assert_replayed(path, acked)
