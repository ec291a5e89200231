"""``python -m idempotency migrate`` (``SQLiteStore.migrate``): a SQLite file of the older
layout (the records table clustered on the key) moved into the current one, run as an
operator would, against real files, with a store using the file meanwhile and with the
command killed part-way."""

from __future__ import annotations

import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import gosim
from idempotency import Idempotency, SQLiteStore

from .test_cli import ROOT, cli, one_line_error
from .test_store_failures import _CLUSTERED_ON_KEY_SCHEMA

ROWS = "SELECT * FROM idempotency_records ORDER BY caller, key"
META = "SELECT name, value FROM idempotency_meta ORDER BY name"


def _read(path: Path, sql: str) -> list[Any]:
    with sqlite3.connect(path) as conn:
        return conn.execute(sql).fetchall()


def _clustered(path: Path) -> bool:
    [(sql,)] = _read(path, "SELECT sql FROM sqlite_master WHERE name = 'idempotency_records'")
    return "WITHOUT ROWID" in str(sql)


def _older_file(path: Path) -> None:
    with sqlite3.connect(path) as conn:
        conn.executescript(_CLUSTERED_ON_KEY_SCHEMA)


def _calls(store: SQLiteStore, keys: list[str], runs: list[str]) -> list[Any]:
    def handler(call: Any) -> str:
        runs.append(call.key)
        return f"did {call.key}"

    async def main() -> list[Any]:
        idem = Idempotency(store)
        return [
            await idem.run(caller="c", key=k, request=("op", [k]), handler=handler) for k in keys
        ]

    return gosim.run(main, procs=2)  # type: ignore[no-any-return]


def test_migrate_moves_the_records_as_they_are_and_only_once(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    _older_file(path)
    store = SQLiteStore(path)
    runs: list[str] = []
    _calls(store, ["a", "b", "c"], runs)

    async def hold() -> None:  # a claim left in progress
        await store.claim("c", "held", b"\x05" * 32, 600.0)

    gosim.run(hold, procs=1)
    store.close()
    rows, meta = _read(path, ROWS), _read(path, META)
    assert len(rows) == 4 and _clustered(path)

    r = cli("migrate", f"sqlite://{path}")
    assert (r.returncode, r.stdout, r.stderr) == (
        0, "moved 4 records into the current layout\n", ""
    )  # fmt: skip
    assert not _clustered(path)
    assert _read(path, ROWS) == rows
    # The fencing tokens only go on (a store that opens skips to its reservation).
    before, after = dict(meta), dict(_read(path, META))
    assert after.keys() == before.keys() and all(after[k] >= before[k] for k in before)
    assert _read(path, "PRAGMA integrity_check") == [("ok",)]

    # The same records, used as before: replays, the held key busy, new keys claimed.
    store = SQLiteStore(path)
    again = _calls(store, ["a", "d", "b"], runs)
    assert [o.replayed for o in again] == [True, False, True]
    assert runs == ["a", "b", "c", "d"]

    async def busy() -> Any:
        return await store.claim("c", "held", b"\x05" * 32, 600.0)

    assert gosim.run(busy, procs=1).kind.name == "BUSY"
    store.close()

    r = cli("migrate", f"sqlite:{os.path.relpath(path)}")
    assert (r.returncode, r.stderr) == (0, "")
    assert r.stdout == "the records already have the current layout: nothing to do\n"
    assert len(_read(path, ROWS)) == 5


def test_a_store_using_the_file_goes_on_across_the_migration(tmp_path: Path) -> None:
    """Migrated by another process while this one's store is open on the file (and
    remembers the older layout): its calls, replays and sweeps go on working."""
    path = tmp_path / "live.db"
    _older_file(path)
    now = [time.time()]
    store = SQLiteStore(path, clock=lambda: now[0], sweep_every=1)
    runs: list[str] = []
    try:
        _calls(store, [f"k{i}" for i in range(50)], runs)
        r = cli("migrate", f"sqlite://{path}")
        assert r.returncode == 0 and r.stdout.startswith("moved 50 records"), r
        assert not _clustered(path)
        more = _calls(store, [f"k{i}" for i in range(45, 55)], runs)
        assert [o.replayed for o in more] == [True] * 5 + [False] * 5
        assert len(runs) == 55
        now[0] += 2 * 24 * 3600.0  # past the records' retention: swept

        async def sweep() -> int:
            return await store.sweep()

        assert gosim.run(sweep, procs=1) == 55
    finally:
        store.close()
    assert _read(path, ROWS) == []


def test_a_killed_migration_leaves_the_file_whole(tmp_path: Path) -> None:
    """SIGKILL at random moments of the migration of 300,000 records (timed first on a
    copy, so most kills land while it runs): the file has either layout, with every
    record, never half of one."""
    path = tmp_path / "big.db"
    _older_file(path)
    SQLiteStore(path).close()
    with sqlite3.connect(path) as conn:
        conn.executemany(
            "INSERT INTO idempotency_records VALUES ('c', ?, 2, zeroblob(32), ?, 4e9, 1, x'a1')",
            ((f"key-{i:07d}", i + 1) for i in range(300_000)),
        )
        conn.commit()
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # the whole file in big.db: copied
    rows = _read(path, ROWS)
    copy = tmp_path / "timing.db"
    shutil.copyfile(path, copy)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    command = [sys.executable, "-m", "idempotency", "migrate"]
    start = time.monotonic()
    subprocess.run([*command, f"sqlite://{copy}"], env=env, check=True, capture_output=True)
    took = time.monotonic() - start
    rng = random.Random(7)
    for _ in range(4):
        proc = subprocess.Popen(
            [*command, f"sqlite://{path}"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(rng.uniform(0.3, 0.95) * took)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        assert _read(path, "PRAGMA integrity_check") == [("ok",)]
        assert _read(path, ROWS) == rows  # whichever layout it has now
    r = cli("migrate", f"sqlite://{path}")
    assert r.returncode == 0, r
    assert not _clustered(path) and _read(path, ROWS) == rows


def test_migrate_refuses_other_stores(tmp_path: Path) -> None:
    for url in ("redis://127.0.0.1:1/0", "postgresql://u@127.0.0.1:1/db", "memory:"):
        one_line_error(cli("migrate", url), 2, "migrate applies to SQLiteStore files")
    one_line_error(cli("migrate", f"sqlite://{tmp_path / 'missing.db'}"), 2, "no such file")
    assert not (tmp_path / "missing.db").exists()
