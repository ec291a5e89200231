"""``python -m idempotency inspect|forget|sweep``, run as a subprocess against a real
SQLite file and a real redis-server, as an operator would."""

from __future__ import annotations

import base64
import datetime
import json
import math
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gosim
import idempotency
from idempotency import ApplicationError, Idempotency, SQLiteStore
from idempotency._keys import fingerprint
from idempotency._outcome import encode_result
from idempotency.stores import Store

from .conftest import RedisServer, free_port

ROOT = Path(idempotency.__file__).resolve().parent.parent
FP = fingerprint("op", [1])


def cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
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
        cwd=cwd,
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
    raise ApplicationError("no", "insufficient funds", {"short": 5, "raw": b"\x00\xfe"})


# A value with what JSON lacks: bytes, a float that is not a number, keys that are not
# strings, a map whose one key starts with "$", an integer past 2**53.
ODD = {
    "receipt": b"\x00\x01\xfe\xff",
    "rate": float("inf"),
    "by_id": {7: "seven"},
    "tagged": {"$bytes": "not a tag"},
    "big": 2**63 + 1,
    "one": 1.0,
}
ODD_JSON = {
    "receipt": {"$bytes": "AAH+/w=="},
    "rate": {"$float": "Infinity"},
    "by_id": {"$map": [[7, "seven"]]},
    "tagged": {"$map": [["$bytes", "not a tag"]]},
    "big": 2**63 + 1,
    "one": 1.0,
}


async def _odd(call: Any) -> Any:
    return ODD


def fill(store: Store) -> dict[str, Any]:
    """Keys of every kind: ``done`` (a value), ``refused`` (a final error), ``odd`` (a
    value with bytes and other values JSON lacks), ``busy`` (a live claim). Returns what
    each completed call recorded, by key."""
    recorded: dict[str, Any] = {}

    async def main() -> None:
        idem = Idempotency(store)
        for key, handler in (("done", _value), ("refused", _refuse), ("odd", _odd)):
            out = await idem.run(caller="acme", key=key, request=("op", [1]), handler=handler)
            recorded[key] = out
        await store.claim("acme", "busy", FP, 600.0)

    gosim.run(main)
    return recorded


def check_json_outcomes(url: str, store: Store, recorded: dict[str, Any]) -> None:
    """``inspect --json`` gives each recorded outcome as JSON a program reads back to
    what was recorded, and the record's times as the store has them."""
    done = inspect_json(url, "acme", "done")
    assert done["ok"] is True and done["outcome"] == {"paid": [1]}
    assert done["outcome"] == recorded["done"].value
    assert done["outcome_bytes"] == len(recorded["done"].payload)
    odd = inspect_json(url, "acme", "odd")
    assert odd["ok"] is True and odd["outcome"] == ODD_JSON
    assert base64.b64decode(odd["outcome"]["receipt"]["$bytes"]) == ODD["receipt"]
    assert isinstance(odd["outcome"]["one"], float) and isinstance(odd["outcome"]["big"], int)
    refused = inspect_json(url, "acme", "refused")
    err = recorded["refused"].error
    assert refused["ok"] is False and refused["outcome"] == {
        "code": err.code,
        "message": err.message,
        "data": {"short": 5, "raw": {"$bytes": base64.b64encode(b"\x00\xfe").decode()}},
    }
    assert refused["outcome_bytes"] == len(recorded["refused"].payload)

    async def held() -> Any:
        return await store.inspect("acme", "done")

    rec = gosim.run(held)
    assert done["expires_at_unix"] == rec.record.expires_at
    iso = datetime.datetime.fromisoformat(done["expires_at"].replace("Z", "+00:00"))
    assert done["expires_at"].endswith("Z") and iso.tzinfo is not None
    assert abs(iso.timestamp() - rec.record.expires_at) < 0.001
    assert done["expires_in"] == round(done["expires_at_unix"] - done["now"], 3)
    for seen in (done, odd, refused):
        assert "payload" not in seen and "outcome_problem" not in seen


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
    assert 0 < done["expires_in"] <= 24 * 3600
    busy = inspect_json(url, "acme", "busy")
    assert busy["state"] == "IN_PROGRESS" and busy["lease"].startswith("ends in ")
    assert "ok" not in busy and "outcome" not in busy
    text = cli("inspect", url, "acme", "done")
    assert text.returncode == 0 and "state        COMPLETED" in text.stdout
    assert "outcome      value {'paid': [1]}" in text.stdout
    text = cli("inspect", url, "acme", "refused")
    assert "outcome      error [no] insufficient funds data {'short': 5" in text.stdout
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
        recorded = fill(store)
        fill_expired(lambda clock: SQLiteStore(path, clock=clock))
        check_json_outcomes(f"sqlite://{path}", store, recorded)
        exercise(f"sqlite://{path}", store)  # sqlite:///abs/path
        assert inspect_json(f"sqlite:///{path}", "acme", "refused")["state"] == "COMPLETED"
    finally:
        store.close()


def test_the_commands_on_redis(redis_server: RedisServer) -> None:
    from idempotency import RedisStore  # noqa: PLC0415 -- needs redis-py

    prefix = f"cli{time.monotonic_ns()}:idem:"
    store = RedisStore(redis_server.url, prefix=prefix)
    try:
        recorded = fill(store)
        fill_expired(lambda clock: RedisStore(redis_server.url, prefix=prefix, clock=clock))
        url = f"{redis_server.url}?prefix={prefix}"
        check_json_outcomes(url, store, recorded)
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
        ("http://127.0.0.1/", 2, ["'http://127.0.0.1/' is not one of", *ACCEPTED]),
        ("nonsense", 2, ["'nonsense' is not one of", *ACCEPTED]),
        ("postgresq://app:hunter2@db/x", 2, ["'postgresq://app:***@db/x'", *ACCEPTED]),
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
        recorded = fill(store)
        fill_expired(lambda clock: PostgresStore(postgres_server.dsn, schema=schema, clock=clock))
        check_json_outcomes(f"{postgres_server.dsn}?schema={schema}", store, recorded)
        exercise(f"{postgres_server.dsn}?schema={schema}", store)
        # Another schema holds no store, and none is made there.
        url = f"{postgres_server.dsn}?schema=nothing_here"
        one_line_error(cli("inspect", url, "acme", "refused"), 2, "not a store")
        assert postgres_server.sql("SELECT to_regnamespace('nothing_here')") == [(None,)]
        one_line_error(cli("sweep", f"{postgres_server.dsn}?bogus=1"), 2, "bogus")
    finally:
        store.close()


# What the help of every command and the error for an unknown scheme name: every
# STORE-URL form the tool takes.
ACCEPTED = [
    "sqlite:///ABSOLUTE/PATH",
    "sqlite:RELATIVE/PATH",
    "redis://",
    "?prefix=P",
    "rediss://",
    "unix://",
    "postgresql://",
    "?schema=S",
    "postgres://",
]


@pytest.mark.parametrize("command", [None, "inspect", "forget", "sweep"])
def test_the_help_lists_every_store_url_form(command: str | None) -> None:
    r = cli(*([command] if command else []), "--help")
    assert r.returncode == 0 and r.stderr == "", r
    for form in [*ACCEPTED, "sqlite:////ABSOLUTE/PATH", "sqlite://localhost/ABSOLUTE/PATH"]:
        assert form in r.stdout, (form, r.stdout)
    assert "Exit status" in r.stdout


def test_the_inspect_help_gives_the_json_shape() -> None:
    r = cli("inspect", "--help")
    assert r.returncode == 0
    for name in ("expires_at_unix", "outcome_bytes", "outcome_problem", '"code": C'):
        assert name in r.stdout, name
    for tag in ("$bytes", "$float", "$ext", "$map"):
        assert f'{{"{tag}": ' in r.stdout, tag


def _completed(store: Store) -> None:
    """``acme``/``k``: a completed call whose value is ``{"v": b"\x01"}``."""

    async def main() -> None:
        out = await Idempotency(store).run(
            caller="acme", key="k", request=("op", [1]), handler=lambda call: {"v": b"\x01"}
        )
        assert not out.replayed

    gosim.run(main)


def _reads_the_record(url: str, cwd: Path | None = None) -> None:
    r = cli("inspect", url, "acme", "k", "--json", cwd=cwd)
    assert r.returncode == 0 and r.stderr == "", (url, r)
    assert json.loads(r.stdout)["outcome"] == {"v": {"$bytes": "AQ=="}}, url


def test_every_sqlite_url_form_is_accepted(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    path = tmp_path / "sub" / "records.db"
    store = SQLiteStore(path)
    try:
        _completed(store)
        for url in (
            f"sqlite://{path}",  # sqlite:///ABSOLUTE/PATH
            f"sqlite:///{path}",  # sqlite:////ABSOLUTE/PATH
            f"sqlite://localhost{path}",
        ):
            _reads_the_record(url)
        _reads_the_record("sqlite:sub/records.db", cwd=tmp_path)
        _reads_the_record("sqlite:records.db", cwd=tmp_path / "sub")
    finally:
        store.close()


def test_every_redis_url_form_is_accepted(redis_server: RedisServer) -> None:
    from idempotency import RedisStore  # noqa: PLC0415 -- needs redis-py

    prefix = f"forms{time.monotonic_ns()}:"
    on_socket = RedisServer(unixsocket=True)
    on_socket.start()
    try:
        for url in (redis_server.url, f"unix://{on_socket.unixsocket}?db=0"):
            store = RedisStore(url, prefix=prefix)
            try:
                _completed(store)
            finally:
                store.close()
        port = redis_server.port
        _reads_the_record(f"redis://127.0.0.1:{port}/0?prefix={prefix}")
        _reads_the_record(f"redis://127.0.0.1:{port}?prefix={prefix}")  # db 0 by default
        _reads_the_record(f"redis://default:anything@127.0.0.1:{port}/0?prefix={prefix}")
        _reads_the_record(f"unix://{on_socket.unixsocket}?db=0&prefix={prefix}")
        # rediss:// is taken as a store URL: the tool connects with TLS, which this plain
        # server cannot answer (the store failed, 4; not a usage error, 2), and says so
        # without the password.
        r = cli("sweep", f"rediss://:hunter2@127.0.0.1:{port}/0?prefix={prefix}")
        one_line_error(r, 4, "rediss://:***@127.0.0.1")
        assert "hunter2" not in r.stderr
    finally:
        on_socket.stop()


def test_every_postgres_url_form_is_accepted(postgres_server: Any) -> None:
    from idempotency import PostgresStore  # noqa: PLC0415 -- needs psycopg

    schema = f"forms{time.monotonic_ns()}"
    store = PostgresStore(postgres_server.dsn, schema=schema)
    try:
        _completed(store)
    finally:
        store.close()
    port = postgres_server.port
    _reads_the_record(f"postgresql://postgres@127.0.0.1:{port}/postgres?schema={schema}")
    _reads_the_record(f"postgres://postgres@127.0.0.1:{port}/postgres?schema={schema}")
    # libpq's own query parameters, beside schema.
    _reads_the_record(
        f"postgresql:///postgres?host=127.0.0.1&port={port}&user=postgres&schema={schema}"
    )
    # A password (the test cluster trusts its local users, so any is taken): never shown.
    url = f"postgresql://postgres:hunter2@127.0.0.1:{port}/postgres?schema={schema}"
    _reads_the_record(url)
    r = cli("inspect", url.replace(schema, "nothing_here"), "acme", "k")
    one_line_error(r, 2, "not a store", f"127.0.0.1:{port}/postgres")
    assert "hunter2" not in r.stderr


def test_a_record_that_never_expires(tmp_path: Path) -> None:
    path = tmp_path / "records.db"
    store = SQLiteStore(path)

    async def main() -> None:
        idem = Idempotency(store, ttl=math.inf, lease=math.inf)
        await idem.run(caller="acme", key="kept", request=("op", [1]), handler=_value)
        await store.claim("acme", "held", FP, math.inf)

    try:
        gosim.run(main)
    finally:
        store.close()
    url = f"sqlite://{path}"
    kept = inspect_json(url, "acme", "kept")
    assert kept["state"] == "COMPLETED" and kept["retention"] == "never ends"
    assert kept["expires_at"] is None and kept["expires_at_unix"] is None
    assert kept["expires_in"] is None and kept["outcome"] == {"paid": [1]}
    held = inspect_json(url, "acme", "held")
    assert held["lease"] == "never ends" and held["expires_at"] is None
    text = cli("inspect", url, "acme", "kept")
    assert text.returncode == 0 and "expires_at   never" in text.stdout
    one_line_error(cli("forget", url, "acme", "held"), 3, "its lease never ends")


def test_an_undecodable_outcome_is_given_as_its_bytes(tmp_path: Path) -> None:
    path = tmp_path / "records.db"
    SQLiteStore(path).close()
    later = time.time() + 3600
    with sqlite3.connect(path) as conn:
        for key, ok, payload in [
            ("bad_utf8", 1, b"\xa2\xff\xfe"),  # a str of two bytes that are not UTF-8
            ("bad_error", 0, b"\x05"),  # an error that is not [code, message, data]
        ]:
            conn.execute(
                "INSERT INTO idempotency_records VALUES ('acme', ?, 2, ?, 1, ?, ?, ?)",
                (key, FP, later, ok, payload),
            )
    url = f"sqlite://{path}"
    bad = inspect_json(url, "acme", "bad_utf8")
    assert "outcome" not in bad and "UnicodeDecodeError" in bad["outcome_problem"]
    assert base64.b64decode(bad["payload"]["$bytes"]) == b"\xa2\xff\xfe"
    assert bad["outcome_bytes"] == 3
    err = inspect_json(url, "acme", "bad_error")
    assert err["ok"] is False and "outcome" not in err
    assert "not [code, message, data]" in err["outcome_problem"]
    assert base64.b64decode(err["payload"]["$bytes"]) == b"\x05"


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


# ---------------------------------------------------------- the JSON form, reversed


def from_json(j: Any) -> Any:
    """The value ``inspect --json`` describes, rebuilt by the rules its help gives (an
    independent reader: a test of the rules, not of the writer's own code)."""
    if isinstance(j, list):
        return [from_json(v) for v in j]
    if not isinstance(j, dict):
        return j
    if len(j) == 1 and next(iter(j)).startswith("$"):
        ((tag, body),) = j.items()
        if tag == "$bytes":
            return base64.b64decode(body, validate=True)
        if tag == "$float":
            return {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}[body]
        if tag == "$ext":
            code, data = body
            raw = base64.b64decode(data, validate=True)
            return msgpack.Timestamp.from_bytes(raw) if code == -1 else msgpack.ExtType(code, raw)
        assert tag == "$map", j
        return {_hashable(from_json(k)): from_json(v) for k, v in body}
    return {k: from_json(v) for k, v in j.items()}


def _hashable(key: Any) -> Any:
    return tuple(_hashable(k) for k in key) if isinstance(key, list) else key


_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False)
    | st.just(math.nan)
    | st.text(max_size=8)
    | st.binary(max_size=8)
    | st.builds(msgpack.ExtType, st.integers(0, 127), st.binary(max_size=8))
    | st.builds(msgpack.Timestamp, st.integers(0, 2**34 - 1), st.integers(0, 999_999_999))
)
_keys = _scalars.filter(lambda k: not (isinstance(k, float) and math.isnan(k))) | st.tuples(
    st.integers(-(2**63), 2**64 - 1), st.text(max_size=3)
)
_values = st.recursive(
    _scalars,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(_keys, inner, max_size=4)
        | st.dictionaries(st.text(max_size=4).map(lambda k: "$" + k), inner, max_size=2)
    ),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(_values)
def test_the_json_form_of_any_value_reads_back_exactly(value: Any) -> None:
    """Any recorded value: its JSON text (strict: no NaN literal) read back by the
    documented rules packs to the very bytes that were recorded."""
    from idempotency.__main__ import _json_outcome  # noqa: PLC0415 -- the CLI's module

    payload = encode_result(value, 1 << 20)
    shown = json.loads(json.dumps(_json_outcome(True, payload), allow_nan=False))
    assert shown["outcome_bytes"] == len(payload)
    assert encode_result(from_json(shown["outcome"]), 1 << 20) == payload
