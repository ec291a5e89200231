"""``python -m idempotency inspect|forget|sweep``, run as a subprocess against a real
SQLite file and a real redis-server, as an operator would."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import gosim
import idempotency
from idempotency import ApplicationError, Idempotency, SQLiteStore
from idempotency._keys import fingerprint
from idempotency.stores import Store

from .conftest import RedisServer, free_port

ROOT = Path(idempotency.__file__).resolve().parent.parent
FP = fingerprint("op", [1])


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    return subprocess.run(
        [sys.executable, "-m", "idempotency", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )


def one_line_error(r: subprocess.CompletedProcess[str], code: int, *words: str) -> None:
    assert r.returncode == code, (r.returncode, r.stdout, r.stderr)
    assert r.stdout == ""
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("python -m idempotency: "), r.stderr
    for w in words:
        assert w in lines[0], (w, lines[0])


def inspect_json(url: str, caller: str, key: str) -> dict[str, Any]:
    r = cli("inspect", url, caller, key, "--json")
    assert r.returncode == 0 and r.stderr == "", r
    got: dict[str, Any] = json.loads(r.stdout)
    return got


async def _value(call: Any) -> Any:
    return {"paid": call.args}


async def _refuse(call: Any) -> Any:
    raise ApplicationError("no", "insufficient funds", {"short": 5})


def fill(store: Store) -> None:
    """Keys of every kind: ``done`` (a value), ``refused`` (a final error), ``busy``
    (a live claim)."""

    async def main() -> None:
        idem = Idempotency(store)
        await idem.run(caller="acme", key="done", request=("op", [1]), handler=_value)
        await idem.run(caller="acme", key="refused", request=("op", [1]), handler=_refuse)
        await store.claim("acme", "busy", FP, 600.0)

    gosim.run(main)


def fill_expired(make: Any) -> None:
    """``old`` and ``older``: claims whose lease lapsed long ago (made by a store whose
    clock is a day behind, with a 600 s lease: Redis's own TTL of the key, on the
    server's clock, keeps it for the test's length)."""
    past = make(lambda: time.time() - 86_400)

    async def main() -> None:
        for key in ("old", "older"):
            await past.claim("acme", key, FP, 600.0)

    gosim.run(main)
    past.close()


def exercise(url: str, store: Store) -> None:
    """The operator's session every store must support alike."""
    # inspect: a completed value, a recorded error, a live claim.
    done = inspect_json(url, "acme", "done")
    assert done["state"] == "COMPLETED" and done["ok"] is True
    assert done["fingerprint"] == FP.hex() and done["fence"] >= 1
    assert done["outcome"].startswith("value {'paid': [1]}")
    assert 0 < done["expires_in"] <= 24 * 3600
    refused = inspect_json(url, "acme", "refused")
    assert refused["ok"] is False
    assert refused["outcome"].startswith("error [no] insufficient funds data {'short': 5}")
    busy = inspect_json(url, "acme", "busy")
    assert busy["state"] == "IN_PROGRESS" and busy["lease"].startswith("ends in ")
    text = cli("inspect", url, "acme", "done")
    assert text.returncode == 0 and "state        COMPLETED" in text.stdout
    one_line_error(cli("inspect", url, "acme", "nope"), 1, "nothing is stored", "'nope'")
    one_line_error(cli("inspect", url, "other", "done"), 1, "caller 'other'")
    # forget: refused while in progress, then forced; a completed key at once.
    one_line_error(cli("forget", url, "acme", "busy"), 3, "in progress", "--force")
    assert inspect_json(url, "acme", "busy")["state"] == "IN_PROGRESS"  # kept
    r = cli("forget", url, "acme", "busy", "--force")
    assert r.returncode == 0 and "forgot key 'busy' of caller 'acme' (IN_PROGRESS" in r.stdout
    one_line_error(cli("inspect", url, "acme", "busy"), 1)
    r = cli("forget", url, "acme", "done")
    assert r.returncode == 0 and "(COMPLETED, fence" in r.stdout
    one_line_error(cli("forget", url, "acme", "done"), 1, "nothing is stored")
    runs = []

    async def again() -> None:
        async def handler(call: Any) -> int:
            runs.append(call.fence)
            return 1

        out = await Idempotency(store).run(
            caller="acme", key="done", request=("op", [1]), handler=handler
        )
        assert not out.replayed

    gosim.run(again)
    assert len(runs) == 1 and runs[0] > done["fence"]  # the key was new again
    # sweep: the two expired records go, the live ones stay.
    assert inspect_json(url, "acme", "old")["state"] == "EXPIRED"
    r = cli("sweep", url)
    assert r.returncode == 0 and r.stdout == "swept 2 expired records\n", r
    one_line_error(cli("inspect", url, "acme", "old"), 1)
    assert inspect_json(url, "acme", "refused")["state"] == "COMPLETED"
    # bad keys are usage errors
    one_line_error(cli("inspect", url, "acme", "tab\there"), 2, "index 3")
    one_line_error(cli("forget", url, "", "k"), 2, "caller is empty")


def test_the_commands_on_a_sqlite_file(tmp_path: Path) -> None:
    path = tmp_path / "records.db"
    store = SQLiteStore(path)
    try:
        fill(store)
        fill_expired(lambda clock: SQLiteStore(path, clock=clock))
        exercise(f"sqlite://{path}", store)  # sqlite:///abs/path
        assert inspect_json(f"sqlite:///{path}", "acme", "refused")["state"] == "COMPLETED"
    finally:
        store.close()


def test_the_commands_on_redis(redis_server: RedisServer) -> None:
    from idempotency import RedisStore  # noqa: PLC0415 -- needs redis-py

    prefix = f"cli{time.monotonic_ns()}:idem:"
    store = RedisStore(redis_server.url, prefix=prefix)
    try:
        fill(store)
        fill_expired(lambda clock: RedisStore(redis_server.url, prefix=prefix, clock=clock))
        url = f"{redis_server.url}?prefix={prefix}"
        exercise(url, store)
        # Another prefix is another store: nothing there.
        one_line_error(cli("inspect", redis_server.url, "acme", "refused"), 1)
    finally:
        store.close()


def test_a_damaged_sqlite_record_is_shown_and_forgotten(tmp_path: Path) -> None:
    path = tmp_path / "records.db"
    SQLiteStore(path).close()
    with sqlite3.connect(path) as conn:
        conn.execute(
            "INSERT INTO idempotency_records VALUES ('acme', 'k', 7, ?, 1, 0, 1, NULL)", (FP,)
        )
    url = f"sqlite://{path}"
    seen = inspect_json(url, "acme", "k")
    assert seen["state"] == "CORRUPTED" and "state 7 is not 1 or 2" in seen["problem"]
    r = cli("forget", url, "acme", "k")
    assert r.returncode == 0 and "(CORRUPTED)" in r.stdout
    one_line_error(cli("inspect", url, "acme", "k"), 1)


def test_a_damaged_redis_record_is_shown_and_forgotten(redis_server: RedisServer) -> None:
    import redis  # noqa: PLC0415 -- needs redis-py

    prefix = f"cli{time.monotonic_ns()}:"
    client = redis.Redis.from_url(redis_server.url)
    client.set(f"{prefix}rec:4:acme:k", b"not a hash")
    client.close()
    url = f"{redis_server.url}?prefix={prefix}"
    seen = inspect_json(url, "acme", "k")
    assert seen["state"] == "CORRUPTED" and "does not hold a hash but a string" in seen["problem"]
    assert cli("forget", url, "acme", "k").returncode == 0
    one_line_error(cli("inspect", url, "acme", "k"), 1)


def test_bad_store_urls_are_one_line_errors(tmp_path: Path) -> None:
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is no database" * 100)
    other = tmp_path / "other.db"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE t (x)")
    missing = tmp_path / "missing.db"
    for url, code, words in [
        (f"sqlite://{missing}", 2, ["no such file"]),
        (f"sqlite://{other}", 2, ["not a store"]),
        (f"sqlite://{junk}", 4, ["not a database"]),
        (f"sqlite://{other}?x=1", 2, ["no host, query or fragment"]),
        ("sqlite://", 2, ["names no file"]),
        ("memory:", 2, ["inside one process"]),
        ("http://127.0.0.1/", 2, ["is not sqlite:///PATH, redis://", "postgresql://"]),
        ("nonsense", 2, ["is not sqlite:///PATH"]),
        (f"redis://127.0.0.1:{free_port()}/0", 4, ["ConnectionError"]),
        (f"postgresql://postgres@127.0.0.1:{free_port()}/postgres", 4, ["OperationalError"]),
    ]:
        one_line_error(cli("inspect", url, "acme", "k"), code, *words)
    assert not missing.exists()  # never created
    with sqlite3.connect(other) as conn:  # and no tables added to someone's database
        names = [r[0] for r in conn.execute("SELECT name FROM sqlite_master")]
    assert names == ["t"]


def test_a_bad_redis_url_parameter_is_a_usage_error(redis_server: RedisServer) -> None:
    one_line_error(cli("sweep", f"{redis_server.url}?bogus=1"), 2, "bogus")
    one_line_error(cli("sweep", f"{redis_server.url}?prefix=a&prefix=b"), 2, "more than once")


def test_the_commands_on_postgres(postgres_server: Any) -> None:
    from idempotency import PostgresStore  # noqa: PLC0415 -- needs psycopg

    schema = f"cli{time.monotonic_ns()}"
    store = PostgresStore(postgres_server.dsn, schema=schema)
    try:
        fill(store)
        fill_expired(lambda clock: PostgresStore(postgres_server.dsn, schema=schema, clock=clock))
        exercise(f"{postgres_server.dsn}?schema={schema}", store)
        # Another schema holds no store, and none is made there.
        url = f"{postgres_server.dsn}?schema=nothing_here"
        one_line_error(cli("inspect", url, "acme", "refused"), 2, "not a store")
        assert postgres_server.sql("SELECT to_regnamespace('nothing_here')") == [(None,)]
        one_line_error(cli("sweep", f"{postgres_server.dsn}?bogus=1"), 2, "bogus")
    finally:
        store.close()


def test_usage_and_help() -> None:
    r = cli()
    assert r.returncode == 2 and "usage: python -m idempotency" in r.stderr
    r = cli("--help")
    assert r.returncode == 0
    for words in ("inspect", "forget", "sweep", "migrate", "Exit status", "3 forget refused"):
        assert words in r.stdout, words
    assert cli("inspect", "sqlite:x.db", "c").returncode == 2  # a missing KEY


@pytest.mark.parametrize("flag", ["--force", "--json"])
def test_each_flag_belongs_to_its_command(flag: str, tmp_path: Path) -> None:
    other = "inspect" if flag == "--force" else "forget"
    assert cli(other, "sqlite:x.db", "c", "k", flag).returncode == 2
