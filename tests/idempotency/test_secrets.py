"""No password in any text the stores and the operator tools produce: names (``repr``),
error messages, the exceptions they chain to, a command's output.

Every store and tool is driven through its failures with a known password (a typo in the
URL, a refused connection, a server that went away, a wrong password), and every text
produced is searched for it: the exception's message, its whole formatted traceback
(causes and contexts included), a subprocess's stdout and stderr.
"""

from __future__ import annotations

import os
import traceback
import urllib.parse
from typing import Any

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

import gosim
from idempotency import Idempotency, StoreUnavailable
from idempotency._secrets import masked, passwords_in, redact

from .conftest import REDIS_SERVER, RedisServer, free_port
from .test_cli import cli

SECRET = "hunter2-S3cret"


def every_text(exc: BaseException) -> str:
    """The message and the whole traceback as Python would print it, chains included."""
    return str(exc) + "\n" + "".join(traceback.format_exception(exc))


def assert_no_secret(text: str, secret: str = SECRET) -> None:
    assert secret not in text, text
    assert secret.replace("-", "%2D") not in text, text


# ------------------------------------------------------------------- the helper itself

# Passwords of printable characters a URL's userinfo or a conninfo may carry, at least
# four long (a shorter one would be found inside unrelated words too: it is masked
# wherever it appears, which is safe, but the tests below compare whole texts).
passwords = st.text(
    st.characters(min_codepoint=0x21, max_codepoint=0x7E, exclude_characters="@/?#'\\ "),
    min_size=4,
    max_size=20,
)


@given(passwords)
def test_every_form_of_the_connection_string_is_masked(pw: str) -> None:
    quoted = urllib.parse.quote(pw, safe="")  # in a URL, as a URL must carry it
    forms = [
        f"postgresql://app:{quoted}@db.example:5432/payments",
        f"postgresq://app:{quoted}@db.example/payments",  # a typo: what libpq refuses
        f"redis://:{quoted}@127.0.0.1:6379/0",
        f"rediss://user:{quoted}@cache.example/1",
        f"postgresql://db.example/payments?sslmode=require&password={quoted}",
        f"host=db.example user=app password={pw} dbname=payments",
        f"host=db.example password='{pw}' dbname=payments",
    ]
    # A password that is a piece of the forms' own text (say "127.", of the host) would
    # be found in what is rightly shown: such a case says nothing about the masking.
    assume(not any(s in f.replace(quoted, "").replace(pw, "") for f in forms for s in (pw, quoted)))
    for conninfo in forms:
        shown = masked(conninfo)
        assert pw not in shown and quoted not in shown, (conninfo, shown)
        assert "***" in shown
        # a driver's message that quotes the string, or the password alone, decoded
        text = f'invalid "{conninfo}": near {pw!r}'
        assert pw not in redact(text, conninfo)


def test_what_is_not_a_password_is_kept() -> None:
    assert masked("redis://127.0.0.1:6379/0") == "redis://127.0.0.1:6379/0"
    assert masked("postgresql://app@db/x") == "postgresql://app@db/x"
    assert masked("postgresql://app:pw12@db/x?sslmode=require") == (
        "postgresql://app:***@db/x?sslmode=require"
    )
    assert masked("host=db password='a b\\' c' dbname=x") == "host=db password=*** dbname=x"
    assert passwords_in("host=db dbname=x") == []


# ------------------------------------------------------------------------ PostgresStore


def test_postgres_store_refusing_its_dsn_shows_no_password() -> None:
    pytest.importorskip("psycopg", reason="PostgresStore needs psycopg")
    from idempotency.stores.postgres import PostgresStore  # noqa: PLC0415

    for dsn in (
        f"postgresq://app:{SECRET}@db.example/payments",  # the typo of the issue
        f"host=db.example password={SECRET} dbname=payments =oops",
    ):
        with pytest.raises(ValueError, match="is not a connection string") as info:
            PostgresStore(dsn)
        assert_no_secret(every_text(info.value))
        assert "***" in str(info.value)


@pytest.mark.parametrize("form", ["url", "keywords"], ids=["postgresql-url", "libpq-keywords"])
def test_postgres_store_that_cannot_connect_shows_no_password(form: str) -> None:
    pytest.importorskip("psycopg", reason="PostgresStore needs psycopg")
    from idempotency.stores.postgres import PostgresStore  # noqa: PLC0415

    port = free_port()  # nothing listens there: the connection is refused
    dsn = (
        f"postgresql://app:{SECRET}@127.0.0.1:{port}/payments"
        if form == "url"
        else f"host=127.0.0.1 port={port} user=app password={SECRET} dbname=payments"
    )
    with pytest.raises(StoreUnavailable) as info:
        PostgresStore(dsn, connect_timeout=2)
    assert_no_secret(every_text(info.value))


# --------------------------------------------------------------------------- RedisStore


async def failed_call(store: Any, key: str) -> StoreUnavailable:
    """A keyed call through ``store`` that must fail: the StoreUnavailable it raised."""
    try:
        await Idempotency(store).run(caller="c", key=key, request=("op", []), handler=lambda c: 1)
    except StoreUnavailable as exc:
        return exc
    raise AssertionError("the call did not fail")


def test_redis_store_name_and_outage_show_no_password() -> None:
    redis_store = pytest.importorskip("idempotency.stores.redis", reason="needs redis-py")
    url = f"redis://:{SECRET}@127.0.0.1:{free_port()}/0"
    store = redis_store.RedisStore(url, socket_timeout=1.0)
    assert_no_secret(repr(store))

    assert_no_secret(every_text(gosim.run(failed_call, store, "k", procs=1)))
    with pytest.raises(StoreUnavailable) as reach:
        redis_store.check_reachable(url, timeout=1.0)
    assert_no_secret(every_text(reach.value))
    store.close()


@pytest.fixture
def redis_with_password() -> Any:
    if not os.path.exists(REDIS_SERVER):
        pytest.skip("redis-server is not installed (.ci/run installs it with apt)")
    server = RedisServer(password=SECRET)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def test_redis_store_with_the_right_password_then_an_outage(redis_with_password: Any) -> None:
    """The correct password, in use: a call works; the server dies; the errors of the
    calls during the outage name the store without its password."""
    redis_store = pytest.importorskip("idempotency.stores.redis", reason="needs redis-py")
    store = redis_store.RedisStore(redis_with_password.url, socket_timeout=1.0)
    assert_no_secret(repr(store))

    async def call(key: str) -> Any:
        return await Idempotency(store).run(
            caller="c", key=key, request=("op", []), handler=lambda c: "ok"
        )

    assert gosim.run(call, "before", procs=1).value == "ok"
    redis_with_password.kill()
    assert_no_secret(every_text(gosim.run(failed_call, store, "during", procs=1)))
    store.close()


def test_redis_store_with_a_wrong_password(redis_with_password: Any) -> None:
    redis_store = pytest.importorskip("idempotency.stores.redis", reason="needs redis-py")
    wrong = "not-" + SECRET
    url = f"redis://:{wrong}@127.0.0.1:{redis_with_password.port}/0"
    store = redis_store.RedisStore(url, socket_timeout=1.0)

    assert_no_secret(every_text(gosim.run(failed_call, store, "k", procs=1)), wrong)
    store.close()


# ------------------------------------------------------------------ the operator tools


@pytest.mark.parametrize(
    ("url", "code"),
    [
        (f"redis://:{SECRET}@127.0.0.1:{{port}}/0", 4),  # refused
        (f"postgresql://app:{SECRET}@127.0.0.1:{{port}}/payments", 4),  # refused
        (f"postgresq://app:{SECRET}@127.0.0.1:{{port}}/payments", 2),  # an unknown scheme
    ],
    ids=["redis-refused", "postgresql-refused", "scheme-typo"],
)
def test_the_tools_show_no_password(url: str, code: int) -> None:
    if url.startswith("redis"):
        pytest.importorskip("redis", reason="the redis store needs redis-py")
    if url.startswith("postgresql"):
        pytest.importorskip("psycopg", reason="the postgres store needs psycopg")
    for args in (("inspect", "c", "k"), ("sweep",)):
        r = cli(args[0], url.format(port=free_port()), *args[1:])
        assert r.returncode == code, (r.returncode, r.stdout, r.stderr)
        assert_no_secret(r.stdout + r.stderr)


# ------------------------------------------------- a live server refusing the password


@pytest.fixture
def postgres_with_password(own_postgres: Any) -> Any:
    """The test's own cluster with a role ``app`` whose logins over TCP are checked with
    SCRAM (the cluster's other users keep trust): ``app``'s password is SECRET."""
    own_postgres.sql(f"CREATE ROLE app LOGIN PASSWORD '{SECRET}'")
    own_postgres.sql("GRANT CREATE ON DATABASE postgres TO app")  # its store's schema
    hba = os.path.join(own_postgres.data, "pg_hba.conf")
    with open(hba) as f:
        rules = f.read()
    with open(hba, "w") as f:  # first match wins: app's rule goes first
        f.write("host all app 127.0.0.1/32 scram-sha-256\n" + rules)
    own_postgres.sql("SELECT pg_reload_conf()")
    return own_postgres


def test_postgres_refusing_a_wrong_password_shows_neither(postgres_with_password: Any) -> None:
    """A live server refuses the login: the store's error, the tools' output and the
    store's name show neither the wrong password nor (with the right one) the right."""
    pytest.importorskip("psycopg", reason="PostgresStore needs psycopg")
    from idempotency.stores.postgres import PostgresStore  # noqa: PLC0415

    port = postgres_with_password.port
    wrong = SECRET[::-1]
    with pytest.raises(StoreUnavailable, match="authentication failed") as info:
        PostgresStore(f"postgresql://app:{wrong}@127.0.0.1:{port}/postgres", connect_timeout=5)
    assert_no_secret(every_text(info.value), wrong)
    r = cli("inspect", f"postgresql://app:{wrong}@127.0.0.1:{port}/postgres", "c", "k")
    assert r.returncode != 0 and "authentication failed" in r.stdout + r.stderr, r
    assert_no_secret(r.stdout + r.stderr, wrong)
    # The right password: the store works, and its name still hides it.
    store = PostgresStore(f"postgresql://app:{SECRET}@127.0.0.1:{port}/postgres", schema="app")
    try:
        assert_no_secret(repr(store))
    finally:
        store.close()


def test_the_demo_on_a_postgres_url_with_a_password_prints_none(own_postgres: Any) -> None:
    """``python -m idempotency.demo --store postgres --postgres URL`` whose URL carries a
    password (the cluster trusts the address, so any password logs in): none of the
    demo's output, its servers' and clients' included, shows it."""
    pytest.importorskip("psycopg", reason="--store postgres needs psycopg 3")
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415

    url = own_postgres.dsn.replace("postgresql://postgres@", f"postgresql://postgres:{SECRET}@")
    demo = [sys.executable, "-m", "idempotency.demo", "--store", "postgres", "--postgres", url]
    small = ["--connections", "20", "--accounts", "10"]
    out = subprocess.run(
        [*demo, "--seconds", "4", "--seed", "3", "--plain", *small],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "all checks hold" in out.stdout
    assert "postgresql://postgres:***@" in out.stdout, out.stdout[-2000:]
    assert_no_secret(out.stdout + out.stderr)
