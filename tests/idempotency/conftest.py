"""Fixtures of the idempotency tests: a settable clock, real redis-servers, and one
factory per store kind so the contract suite runs unchanged against every store."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from idempotency import ApplicationError, MemoryEffect, MemoryStore, SQLiteEffect, SQLiteStore
from idempotency.stores import Effect, Store
from idempotency.stores.pgcluster import PG_BIN, PostgresCluster

REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"


class FakeClock:
    """A store clock the test moves by hand (Unix seconds)."""

    def __init__(self, t: float = 1_700_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, d: float) -> None:
        self.t += d


# The server gets SIGKILL when the test process dies (setpriv's --pdeathsig, util-linux),
# so a killed or aborted test run leaves no redis-server behind.
SETPRIV = shutil.which("setpriv")
DIE_WITH_PARENT = [SETPRIV, "--pdeathsig", "KILL"] if SETPRIV else []


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    """A redis-server of the test's own: 127.0.0.1, a free port, a temp dir, AOF with
    ``appendfsync always`` (an acknowledged write survives a kill), stopped by PID."""

    def __init__(self, password: str | None = None, unixsocket: bool = False) -> None:
        self.dir = tempfile.mkdtemp(prefix="idem-redis-")
        self.port = free_port()
        self.password = password  # requirepass: clients must AUTH with it
        # A Unix socket too (in the temp dir, for the owner alone), beside the port.
        self.unixsocket = os.path.join(self.dir, "redis.sock") if unixsocket else None
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        assert self.proc is None
        self.proc = subprocess.Popen(
            [
                *DIE_WITH_PARENT,
                REDIS_SERVER,
                "--bind", "127.0.0.1",
                "--port", str(self.port),
                "--dir", self.dir,
                "--save", "",
                "--appendonly", "yes",
                "--appendfsync", "always",
                "--protected-mode", "yes",
                "--loglevel", "warning",
                *(["--requirepass", self.password] if self.password else []),
                *(
                    ["--unixsocket", self.unixsocket, "--unixsocketperm", "700"]
                    if self.unixsocket
                    else []
                ),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 10
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                    auth = f"AUTH {self.password}\r\n".encode() if self.password else b""
                    s.sendall(auth + b"PING\r\n")
                    s.settimeout(0.5)
                    reply = b""
                    while b"PONG" not in reply and b"-" not in reply[:1]:
                        chunk = s.recv(64)
                        if not chunk:
                            break
                        reply += chunk
                    if b"+PONG" in reply:
                        return
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"redis-server did not start on port {self.port}")
            time.sleep(0.02)

    def kill(self) -> None:
        """SIGKILL the server by its PID and reap it."""
        if self.proc is not None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
            self.proc = None

    def stop(self) -> None:
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    if not os.path.exists(REDIS_SERVER):
        pytest.skip("redis-server is not installed (.ci/run installs it with apt)")
    server = RedisServer()
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def own_redis() -> Iterator[RedisServer]:
    """A redis-server for one test alone (it may kill and restart it)."""
    if not os.path.exists(REDIS_SERVER):
        pytest.skip("redis-server is not installed (.ci/run installs it with apt)")
    server = RedisServer()
    server.start()
    try:
        yield server
    finally:
        server.stop()


# The cluster is the library's (the demo's --store postgres starts the same one).
PostgresServer = PostgresCluster


def _postgres() -> PostgresServer:
    if PG_BIN is None:
        pytest.skip("PostgreSQL is not installed (.ci/run installs it with apt)")
    pytest.importorskip("psycopg", reason="PostgresStore needs psycopg 3 (pip install .[postgres])")
    server = PostgresServer()
    server.start()
    return server


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    server = _postgres()
    try:
        yield server
    finally:
        server.destroy()


@pytest.fixture
def own_postgres() -> Iterator[PostgresServer]:
    """A cluster for one test alone (it may stop, kill and restart it)."""
    server = _postgres()
    try:
        yield server
    finally:
        server.destroy()


class StoreKit:
    """How a test makes one kind of store and its exactly-once effects.

    ``counter_effect(name, amount)``: an Effect that adds ``amount`` to the counter
    ``name`` in the store's own data and returns the new value; with ``amount < 0`` it
    refuses with a final ApplicationError (after writing, where the store can roll back).
    ``boom_effect(name)``: fails with a plain exception, after writing where the store
    can roll back (SQLite), before it where it cannot (memory, Redis). ``read(name)``
    reads the counter outside any call.
    """

    def __init__(
        self,
        kind: str,
        make: Callable[[FakeClock], Store],
        counter_effect: Callable[[Store, str, int], Effect],
        boom_effect: Callable[[Store, str], Effect],
        read: Callable[[Store, str], int],
    ) -> None:
        self.kind = kind
        self.make = make
        self._counter = counter_effect
        self._boom = boom_effect
        self._read = read

    def counter_effect(self, store: Store, name: str, amount: int) -> Effect:
        return self._counter(store, name, amount)

    def boom_effect(self, store: Store, name: str) -> Effect:
        return self._boom(store, name)

    def read(self, store: Store, name: str) -> int:
        return self._read(store, name)


def _memory_kit() -> StoreKit:
    counters: dict[tuple[int, str], int] = {}

    def counter(store: Store, name: str, amount: int) -> Effect:
        def fn() -> int:
            if amount < 0:  # MemoryStore cannot roll back: check before changing
                raise ApplicationError("negative", "amount must not be negative", amount)
            k = (id(store), name)
            counters[k] = counters.get(k, 0) + amount
            return counters[k]

        return MemoryEffect(fn)

    def boom(store: Store, name: str) -> Effect:
        def fn() -> int:
            raise RuntimeError("boom")

        return MemoryEffect(fn)

    return StoreKit(
        "memory",
        lambda clock: MemoryStore(clock=clock),
        counter,
        boom,
        lambda store, name: counters.get((id(store), name), 0),
    )


def _sqlite_counter_fn(name: str, amount: int) -> Callable[[sqlite3.Connection], int]:
    def fn(conn: sqlite3.Connection) -> int:
        conn.execute("CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, n INTEGER)")
        conn.execute(
            "INSERT INTO counters VALUES (?, ?) ON CONFLICT(name) DO UPDATE SET n = n + ?",
            (name, amount, amount),
        )
        if amount < 0:  # written first: the refusal must roll the write back
            raise ApplicationError("negative", "amount must not be negative", amount)
        return int(conn.execute("SELECT n FROM counters WHERE name = ?", (name,)).fetchone()[0])

    return fn


def _sqlite_kit(tmp: Path, atomic: bool = False) -> StoreKit:
    """``atomic``: every effect says ``atomic`` though the refusing counter and the boom
    write before they raise, so each of their failures takes the store's redo path."""

    def make(clock: FakeClock) -> Store:
        return SQLiteStore(tmp / f"store-{time.monotonic_ns()}.db", clock=clock)

    def boom(store: Store, name: str) -> Effect:
        def fn(conn: sqlite3.Connection) -> int:
            _sqlite_counter_fn(name, 1000)(conn)
            raise RuntimeError("boom")

        return SQLiteEffect(fn, atomic=atomic)

    def read(store: Store, name: str) -> int:
        assert isinstance(store, SQLiteStore)
        with sqlite3.connect(store.path) as conn:
            try:
                row = conn.execute("SELECT n FROM counters WHERE name = ?", (name,)).fetchone()
            except sqlite3.OperationalError:  # no counters table: nothing was ever added
                return 0
        return int(row[0]) if row else 0

    return StoreKit(
        "sqlite",
        make,
        lambda store, name, amount: SQLiteEffect(_sqlite_counter_fn(name, amount), atomic=atomic),
        boom,
        read,
    )


REDIS_COUNTER = """
local amount = tonumber(ARGV[1])
if amount < 0 then
    return idempotency_fail('negative', 'amount must not be negative', amount)
end
return redis.call('INCRBY', KEYS[1], amount)
"""
# Reads, then fails before its first write: Redis cannot undo a script, so a LuaEffect
# that fails releases its key only when it wrote nothing (test_effects_once.py has the
# scripts that fail after writing).
REDIS_BOOM = """
redis.call('GET', KEYS[1])
return redis.call('NOSUCHCOMMAND')
"""


def _redis_kit(server: RedisServer) -> StoreKit:
    from idempotency import LuaEffect, RedisStore  # noqa: PLC0415 -- needs redis-py

    def make(clock: FakeClock) -> Store:
        return RedisStore(server.url, prefix=f"t{time.monotonic_ns()}:", clock=clock)

    def ckey(store: Store, name: str) -> str:
        assert isinstance(store, RedisStore)
        return f"{store.prefix}counter:{name}"

    def read(store: Store, name: str) -> int:
        assert isinstance(store, RedisStore)
        v = store.client.get(ckey(store, name))
        return int(v) if v is not None else 0

    return StoreKit(
        "redis",
        make,
        lambda store, name, amount: LuaEffect(REDIS_COUNTER, [ckey(store, name)], [amount]),
        lambda store, name: LuaEffect(REDIS_BOOM, [ckey(store, name)]),
        read,
    )


def _postgres_counter_fn(name: str, amount: int) -> Callable[[Any], Awaitable[int]]:
    async def fn(conn: Any) -> int:
        # search_path: the store's schema first, so the table is the store's own.
        await conn.execute("CREATE TABLE IF NOT EXISTS counters (name text PRIMARY KEY, n bigint)")
        cur = await conn.execute(
            "INSERT INTO counters VALUES (%s, %s) ON CONFLICT (name)"
            " DO UPDATE SET n = counters.n + excluded.n RETURNING n",
            (name, amount),
        )
        row = await cur.fetchone()
        if amount < 0:  # written first: the refusal must roll the write back
            raise ApplicationError("negative", "amount must not be negative", amount)
        return int(row[0])

    return fn


def postgres_counter(server: PostgresServer, schema: str, name: str) -> int:
    """The counter ``name`` of the store under ``schema``, read outside any call."""
    rows = server.sql("SELECT to_regclass(%s) IS NOT NULL", (f'"{schema}".counters',))
    if not rows[0][0]:  # no counters table: nothing was ever added
        return 0
    got = server.sql(f'SELECT n FROM "{schema}".counters WHERE name = %s', (name,))
    return int(got[0][0]) if got else 0


def _postgres_kit(server: PostgresServer) -> StoreKit:
    from idempotency import PostgresEffect, PostgresStore  # noqa: PLC0415 -- needs psycopg

    def make(clock: FakeClock) -> Store:
        return PostgresStore(server.dsn, schema=f"t{time.monotonic_ns()}", clock=clock)

    def boom(store: Store, name: str) -> Effect:
        async def fn(conn: Any) -> int:
            await _postgres_counter_fn(name, 1000)(conn)
            raise RuntimeError("boom")

        return PostgresEffect(fn)

    def read(store: Store, name: str) -> int:
        assert isinstance(store, PostgresStore)
        return postgres_counter(server, store.schema, name)

    return StoreKit(
        "postgres",
        make,
        lambda store, name, amount: PostgresEffect(_postgres_counter_fn(name, amount)),
        boom,
        read,
    )


@pytest.fixture(params=["memory", "sqlite", "sqlite-atomic", "redis", "postgres"])
def kit(request: pytest.FixtureRequest, tmp_path: Path) -> StoreKit:
    kind = request.param
    if kind == "memory":
        return _memory_kit()
    if kind.startswith("sqlite"):
        return _sqlite_kit(tmp_path, atomic=kind == "sqlite-atomic")
    if kind == "postgres":
        return _postgres_kit(request.getfixturevalue("postgres_server"))
    server = request.getfixturevalue("redis_server")
    return _redis_kit(server)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()
