"""The ledger service: accounts, idempotent transfers committed with their records.

Three homes for the ledger, each with the store whose transaction holds the idempotency
records, so that a transfer's balance change and its record commit together (the
exactly-once mode):

* **SQLite** (the default; one file): ``accounts(id INTEGER PRIMARY KEY, balance
  INTEGER NOT NULL CHECK (balance >= 0))`` and ``transfers(caller, key, src, dst,
  amount, fence, PRIMARY KEY (caller, key))``, one row per applied transfer. A trigger
  on ``transfers`` moves the money, so a transfer is one ``INSERT``: SQLite applies it
  whole or, refusing (an unknown account, too little money), not at all, and the
  :class:`SQLiteEffect` that makes it is ``atomic`` (no savepoint of the store's).
* **Redis** (``--store redis``): the hash ``{prefix}balances`` (account -> balance) and
  the hash ``{prefix}transfers`` (``len(caller):caller:key`` -> ``"src dst amount
  fence"``), written by a :class:`LuaEffect` inside the script that completes the record.
  Several server processes may share it.
* **PostgreSQL** (``--store postgres``): the tables ``accounts`` and ``transfers`` as
  in SQLite, under a schema of the run's own (the store's records table beside them); a
  trigger on ``transfers`` moves the money, so a transfer is one ``INSERT`` run by a
  :class:`PostgresEffect` in the transaction that completes its record. Several server
  processes may share it.
* **memory** (``--simulate``): dicts in the process, written by a :class:`MemoryEffect`;
  they outlive a simulated crash of the server as a disk would.

Methods: ``transfer(src, dst, amount)`` (idempotent, exactly once), ``balance(account)``
and ``audit()`` (sum of balances, number of accounts, applied transfers).
"""

from __future__ import annotations

import json
import os
import resource
import signal
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gosim
from gosim import go, net

from .. import (
    ApplicationError,
    Call,
    Idempotency,
    MemoryEffect,
    MemoryStore,
    SQLiteEffect,
    SQLiteStore,
    StoreUnavailable,
)
from .._secrets import masked
from ..rpc import Server
from ..stores import Effect, Store

__all__ = [
    "INITIAL_BALANCE",
    "LedgerSpec",
    "LedgerState",
    "MemoryLedger",
    "create_ledger",
    "make_server",
    "read_ledger",
    "serve",
]

INITIAL_BALANCE = 1_000
#: How long a transfer's claim holds its key (seconds).
LEASE = 3.0

#: Application error codes (gRPC's FAILED_PRECONDITION and INVALID_ARGUMENT).
INSUFFICIENT_FUNDS = 9
BAD_TRANSFER = 3

#: The SQLite ledger. Inserting a transfer applies it: the trigger refuses a missing
#: source or too little in it before it moves anything, and a missing destination after
#: (its UPDATE changed no row); a RAISE(ABORT) undoes the whole INSERT, the trigger's
#: writes included (SQLite's statement atomicity), so a refused transfer writes nothing.
#: The CHECK holds whatever writes the file. (Measured: an existence check of both
#: accounts with ``IN`` costs more than the rest of the transfer together.)
_SQLITE_SCHEMA = """
CREATE TABLE accounts (id INTEGER PRIMARY KEY, balance INTEGER NOT NULL CHECK (balance >= 0));
CREATE TABLE transfers (
    caller TEXT NOT NULL, key TEXT NOT NULL, src INTEGER NOT NULL, dst INTEGER NOT NULL,
    amount INTEGER NOT NULL CHECK (amount > 0), fence INTEGER NOT NULL,
    PRIMARY KEY (caller, key)
);
CREATE TRIGGER transfer_moves_money AFTER INSERT ON transfers BEGIN
    SELECT RAISE(ABORT, 'ledger: refused')
        WHERE coalesce((SELECT balance FROM accounts WHERE id = NEW.src), -1) < NEW.amount;
    UPDATE accounts SET balance = balance - NEW.amount WHERE id = NEW.src;
    UPDATE accounts SET balance = balance + NEW.amount WHERE id = NEW.dst;
    SELECT RAISE(ABORT, 'ledger: refused') WHERE changes() = 0;
END;
"""

#: The transfer's effect in Redis. KEYS: balances, transfers. ARGV: src, dst, amount,
#: the transfers field, the fence. Everything is checked before the first write (Redis
#: cannot roll a script back).
_TRANSFER_LUA = """
local balances, transfers = KEYS[1], KEYS[2]
local src, dst, amount = ARGV[1], ARGV[2], tonumber(ARGV[3])
local have = redis.call('HGET', balances, src)
if not have then return idempotency_fail(3, 'no account ' .. src) end
if not redis.call('HGET', balances, dst) then return idempotency_fail(3, 'no account ' .. dst) end
if tonumber(have) < amount then
    return idempotency_fail(9, 'account ' .. src .. ' has ' .. have)
end
redis.call('HINCRBY', balances, src, -amount)
redis.call('HINCRBY', balances, dst, amount)
redis.call('HSET', transfers, ARGV[4], src .. ' ' .. dst .. ' ' .. ARGV[3] .. ' ' .. ARGV[5])
return tonumber(ARGV[5])
"""


#: The PostgreSQL ledger, in the run's schema (first on the search path). A batch of
#: one server's transfers is one transaction, holding its accounts' row locks until its
#: commit; each transfer's effect names its two accounts (``PostgresEffect(locks=...)``),
#: so two servers' batches that share accounts take turns instead of deadlocking, and
#: batches on other accounts run side by side. The trigger refuses a missing account or
#: too little money by raising: the statement fails whole, and the effect's savepoint
#: undoes it. DETAIL carries the application error's code. The function keeps the
#: schema it was made in, whoever inserts.
_POSTGRES_SCHEMA = """
CREATE TABLE accounts (id bigint PRIMARY KEY, balance bigint NOT NULL CHECK (balance >= 0));
CREATE TABLE transfers (
    caller text NOT NULL, key text NOT NULL, src bigint NOT NULL, dst bigint NOT NULL,
    amount bigint NOT NULL CHECK (amount > 0), fence bigint NOT NULL,
    PRIMARY KEY (caller, key)
);
CREATE FUNCTION transfer_moves_money() RETURNS trigger LANGUAGE plpgsql
    SET search_path FROM CURRENT AS $$
DECLARE
    have bigint;
    n int;
BEGIN
    SELECT balance INTO have FROM accounts WHERE id = NEW.src;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no account %', NEW.src USING DETAIL = '3';
    END IF;
    IF have < NEW.amount THEN
        RAISE EXCEPTION 'account % has %', NEW.src, have USING DETAIL = '9';
    END IF;
    UPDATE accounts SET balance = balance + NEW.amount WHERE id = NEW.dst;
    GET DIAGNOSTICS n = ROW_COUNT;
    IF n = 0 THEN
        RAISE EXCEPTION 'no account %', NEW.dst USING DETAIL = '3';
    END IF;
    UPDATE accounts SET balance = balance - NEW.amount WHERE id = NEW.src;
    RETURN NULL;
END
$$;
CREATE TRIGGER transfer_moves_money AFTER INSERT ON transfers
    FOR EACH ROW EXECUTE FUNCTION transfer_moves_money();
"""


@dataclass(frozen=True)
class LedgerSpec:
    """Where a ledger lives: ``kind`` "sqlite" (``path``), "redis" (``url``, keys
    under ``prefix``) or "postgres" (``url`` a DSN, tables under the schema ``prefix``)."""

    kind: str
    path: Path | None = None
    url: str = ""
    prefix: str = "ledger:"

    def args(self) -> list[str]:
        """The server subcommand's options that name this ledger."""
        if self.kind == "sqlite":
            return ["--store", "sqlite", "--db", str(self.path)]
        if self.kind == "postgres":
            return ["--store", "postgres", "--postgres", self.url, "--schema", self.prefix]
        return ["--store", "redis", "--redis", self.url, "--prefix", self.prefix]


@dataclass
class LedgerState:
    """A ledger read at rest: balances by account, and the applied transfers as
    ``(caller, key, src, dst, amount)``."""

    balances: dict[int, int]
    transfers: list[tuple[str, str, int, int, int]]


def _transfer_field(caller: str, key: str) -> str:
    return f"{len(caller)}:{caller}:{key}"


def _redis_store(spec: LedgerSpec, socket_timeout: float = 5.0) -> Any:
    """The ledger's RedisStore (its redis-py client reads and writes the ledger's hashes:
    only the store imports redis-py)."""
    from .. import RedisStore  # noqa: PLC0415 -- needs redis-py

    return RedisStore(spec.url, prefix=f"{spec.prefix}idem:", socket_timeout=socket_timeout)


def postgres_application_name(schema: str) -> str:
    """What ``pg_stat_activity`` shows for the connections of the servers of the ledger
    under ``schema`` (the fault plan picks a backend to terminate by it)."""
    return f"ledger-server {schema}"[:63]  # NAMEDATALEN - 1: the server cuts the rest


def _pg_connect(dsn: str, connect_timeout: int = 10) -> Any:
    import psycopg  # noqa: PLC0415 -- the postgres extra

    return psycopg.connect(dsn, autocommit=True, connect_timeout=connect_timeout)


def postgres_deadlocks(spec: LedgerSpec) -> int:
    """How many deadlocks PostgreSQL has detected in the ledger's database so far (its
    statistics' count: a backend reports its own when its transaction ends)."""
    with _pg_connect(spec.url) as conn:
        row = conn.execute(
            "SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()
    return int(row[0]) if row and row[0] is not None else 0


def create_ledger(spec: LedgerSpec, accounts: int) -> None:
    """A new ledger with ``accounts`` accounts of INITIAL_BALANCE each."""
    if spec.kind == "postgres":
        from psycopg import sql  # noqa: PLC0415 -- the postgres extra

        with _pg_connect(spec.url) as conn, conn.transaction():
            found = conn.execute(
                "SELECT 1 FROM pg_namespace WHERE nspname = %s", (spec.prefix,)
            ).fetchone()
            if found:
                raise SystemExit(f"{masked(spec.url)} already has a schema {spec.prefix!r}")
            conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(spec.prefix)))
            conn.execute(sql.SQL("SET LOCAL search_path TO {}").format(sql.Identifier(spec.prefix)))
            conn.execute(_POSTGRES_SCHEMA)
            with conn.cursor().copy("COPY accounts (id, balance) FROM STDIN") as copy:
                for i in range(accounts):
                    copy.write_row((i, INITIAL_BALANCE))
        return
    if spec.kind == "redis":
        store = _redis_store(spec, socket_timeout=30)
        client = store.client
        try:
            if client.exists(f"{spec.prefix}balances", f"{spec.prefix}transfers"):
                raise SystemExit(f"{masked(spec.url)} already holds a ledger under {spec.prefix!r}")
            client.hset(
                f"{spec.prefix}balances", mapping=dict.fromkeys(range(accounts), INITIAL_BALANCE)
            )
        finally:
            store.close()
        return
    assert spec.path is not None
    with sqlite3.connect(spec.path) as conn:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.executescript(_SQLITE_SCHEMA)
        conn.executemany(
            "INSERT INTO accounts VALUES (?, ?)", [(i, INITIAL_BALANCE) for i in range(accounts)]
        )
    conn.close()


def read_ledger(spec: LedgerSpec) -> LedgerState:
    """The ledger's balances and applied transfers (read when no server runs)."""
    if spec.kind == "postgres":
        from psycopg import sql  # noqa: PLC0415 -- the postgres extra

        schema = sql.Identifier(spec.prefix)
        with _pg_connect(spec.url, 30) as conn:
            got = conn.execute(sql.SQL("SELECT id, balance FROM {}.accounts").format(schema))
            pg_balances = {int(i): int(b) for i, b in got.fetchall()}
            got = conn.execute(
                sql.SQL("SELECT caller, key, src, dst, amount FROM {}.transfers").format(schema)
            )
            pg_rows = [(c, k, int(s), int(d), int(a)) for c, k, s, d, a in got.fetchall()]
        return LedgerState(pg_balances, pg_rows)
    if spec.kind == "redis":
        store = _redis_store(spec, socket_timeout=30)
        client = store.client
        try:
            raw_balances = client.hgetall(f"{spec.prefix}balances")
            raw_transfers = client.hgetall(f"{spec.prefix}transfers")
        finally:
            store.close()
        rows = []
        for name, value in raw_transfers.items():
            text = name.decode()
            n, _, rest = text.partition(":")
            caller, key = rest[: int(n)], rest[int(n) + 1 :]
            src, dst, amount, _fence = (int(x) for x in value.split())
            rows.append((caller, key, src, dst, amount))
        return LedgerState({int(k): int(v) for k, v in raw_balances.items()}, rows)
    assert spec.path is not None
    conn = sqlite3.connect(spec.path)
    try:
        balances = dict(conn.execute("SELECT id, balance FROM accounts"))
        rows = conn.execute("SELECT caller, key, src, dst, amount FROM transfers").fetchall()
    finally:
        conn.close()
    return LedgerState(balances, rows)


@dataclass
class MemoryLedger:
    """The simulated ledger: its store and data outlive the server's crashes."""

    accounts: int
    store: MemoryStore = field(default_factory=MemoryStore)
    balances: dict[int, int] = field(default_factory=dict)
    transfers: dict[tuple[str, str], tuple[int, int, int, int]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.balances.update(dict.fromkeys(range(self.accounts), INITIAL_BALANCE))

    def state(self) -> LedgerState:
        rows = [(c, k, s, d, a) for (c, k), (s, d, a, _) in self.transfers.items()]
        return LedgerState(dict(self.balances), rows)


def _read(path: str, sql: str, args: tuple[Any, ...] = ()) -> list[Any]:
    """A read on a connection of its own (WAL: readers never wait for the writer)."""
    conn = sqlite3.connect(path, timeout=30)
    try:
        return conn.execute(sql, args).fetchall()
    finally:
        conn.close()


def _check(src: Any, dst: Any, amount: Any) -> None:
    if not (type(src) is int and type(dst) is int and type(amount) is int) or amount <= 0:
        raise ApplicationError(BAD_TRANSFER, "transfer needs two account ids and an amount > 0")
    if src == dst:
        raise ApplicationError(BAD_TRANSFER, "source and destination are the same account")


def _sqlite_methods(
    path: Path,
) -> tuple[Store, Callable[[Call, int, int, int], Effect], Callable[..., Any]]:
    store = SQLiteStore(path)
    db = str(path)

    def transfer(call: Call, src: int, dst: int, amount: int) -> Effect:
        def apply(conn: sqlite3.Connection) -> int:
            # One statement: the trigger moves the money or refuses, writing nothing
            # then; only a refusal reads what to say.
            try:
                conn.execute(
                    "INSERT INTO transfers VALUES (?, ?, ?, ?, ?, ?)",
                    (call.caller, call.key, src, dst, amount, call.fence),
                )
            except sqlite3.IntegrityError as exc:
                if str(exc) != "ledger: refused":
                    raise
                have = dict(
                    conn.execute("SELECT id, balance FROM accounts WHERE id IN (?, ?)", (src, dst))
                )
                for account in (src, dst):
                    if account not in have:
                        raise ApplicationError(BAD_TRANSFER, f"no account {account}") from None
                raise ApplicationError(
                    INSUFFICIENT_FUNDS, f"account {src} has {have[src]}"
                ) from None
            return call.fence

        return SQLiteEffect(apply, atomic=True)

    async def read(what: str, account: int = 0) -> Any:
        if what == "balance":
            rows = await gosim.syscall(
                _read, db, "SELECT balance FROM accounts WHERE id = ?", (account,)
            )
            return rows[0][0] if rows else None
        total = await gosim.syscall(_read, db, "SELECT SUM(balance), COUNT(*) FROM accounts")
        applied = await gosim.syscall(_read, db, "SELECT COUNT(*) FROM transfers")
        return {"sum": total[0][0], "accounts": total[0][1], "transfers": applied[0][0]}

    return store, transfer, read


def _redis_methods(
    url: str, prefix: str
) -> tuple[Store, Callable[[Call, int, int, int], Effect], Callable[..., Any]]:
    from .. import LuaEffect  # noqa: PLC0415 -- needs redis-py

    store = _redis_store(LedgerSpec("redis", url=url, prefix=prefix))
    keys = [f"{prefix}balances", f"{prefix}transfers"]

    def transfer(call: Call, src: int, dst: int, amount: int) -> Effect:
        field_name = _transfer_field(call.caller, call.key)
        return LuaEffect(_TRANSFER_LUA, keys, [src, dst, amount, field_name, call.fence])

    def _read_redis(what: str, account: int) -> Any:
        client = store.client
        if what == "balance":
            v = client.hget(keys[0], account)
            return None if v is None else int(v)
        balances = client.hvals(keys[0])
        return {
            "sum": sum(int(v) for v in balances),
            "accounts": len(balances),
            "transfers": client.hlen(keys[1]),
        }

    async def read(what: str, account: int = 0) -> Any:
        return await gosim.syscall(_read_redis, what, account)

    return store, transfer, read


def _postgres_methods(
    dsn: str, schema: str
) -> tuple[Store, Callable[[Call, int, int, int], Effect], Callable[..., Any]]:
    import psycopg  # noqa: PLC0415 -- the postgres extra

    from .. import PostgresEffect, PostgresStore  # noqa: PLC0415

    # Several server processes share the ledger: the pool lets this one's reads run
    # beside its batches; the name lets the fault plan find its connections.
    for attempt in range(10):
        try:
            store = PostgresStore(
                dsn, schema=schema, application_name=postgres_application_name(schema), pool_size=4
            )
            break
        except StoreUnavailable:
            # A server starting while its backend is terminated (the fault plan's, or a
            # database restarting) tries again, as a service's start would: briefly.
            if attempt == 9:
                raise
            time.sleep(0.2)  # before serving: nothing else runs on this runtime yet

    def transfer(call: Call, src: int, dst: int, amount: int) -> Effect:
        async def apply(conn: Any) -> int:
            # One statement: the trigger moves the money, or refuses and the statement
            # fails whole (the store's savepoint then undoes it).
            try:
                await conn.execute(
                    "INSERT INTO transfers VALUES (%s, %s, %s, %s, %s, %s)",
                    (call.caller, call.key, src, dst, amount, call.fence),
                )
            except psycopg.errors.RaiseException as exc:
                code = int(exc.diag.message_detail or BAD_TRANSFER)
                raise ApplicationError(code, exc.diag.message_primary or "refused") from None
            return call.fence

        # The rows the trigger locks, named: batches sharing an account take turns.
        return PostgresEffect(apply, locks=(src, dst))

    def _read_postgres(what: str, account: int) -> Any:
        # A connection of its own (these methods are for people, rarely called): the
        # store's pool stays the batches'.
        from psycopg import sql  # noqa: PLC0415

        where = sql.Identifier(schema)
        with _pg_connect(dsn) as conn:
            if what == "balance":
                q = sql.SQL("SELECT balance FROM {}.accounts WHERE id = %s").format(where)
                got = conn.execute(q, (account,)).fetchone()
                return None if got is None else int(got[0])
            q = sql.SQL("SELECT SUM(balance), COUNT(*) FROM {}.accounts").format(where)
            total, n = conn.execute(q).fetchone()
            q = sql.SQL("SELECT COUNT(*) FROM {}.transfers").format(where)
            (applied,) = conn.execute(q).fetchone()
            return {"sum": int(total or 0), "accounts": int(n), "transfers": int(applied)}

    async def read(what: str, account: int = 0) -> Any:
        return await gosim.syscall(_read_postgres, what, account)

    return store, transfer, read


def _memory_methods(
    ledger: MemoryLedger,
) -> tuple[Store, Callable[[Call, int, int, int], Effect], Callable[..., Any]]:
    def transfer(call: Call, src: int, dst: int, amount: int) -> Effect:
        def apply() -> int:
            b = ledger.balances
            if src not in b or dst not in b:
                raise ApplicationError(BAD_TRANSFER, f"no account {src if src not in b else dst}")
            if b[src] < amount:
                raise ApplicationError(INSUFFICIENT_FUNDS, f"account {src} has {b[src]}")
            b[src] -= amount
            b[dst] += amount
            ledger.transfers[(call.caller, call.key)] = (src, dst, amount, call.fence)
            return call.fence

        return MemoryEffect(apply)

    async def read(what: str, account: int = 0) -> Any:
        if what == "balance":
            return ledger.balances.get(account)
        b = ledger.balances
        return {"sum": sum(b.values()), "accounts": len(b), "transfers": len(ledger.transfers)}

    return ledger.store, transfer, read


def make_server(
    ledger: LedgerSpec | MemoryLedger,
    heartbeat: float,
    max_connections: int,
    store_wrapper: Callable[[Store], Store] | None = None,
    one_step: bool = True,
) -> Server:
    """The ledger's RPC server (not yet serving). ``store_wrapper`` lets the simulation
    put a crash switch between the server and its store; ``one_step=False`` commits a
    transfer's claim apart from its effect and record (the benchmarks compare both)."""
    if isinstance(ledger, MemoryLedger):
        store, make_effect, read = _memory_methods(ledger)
    elif ledger.kind == "redis":
        store, make_effect, read = _redis_methods(ledger.url, ledger.prefix)
    elif ledger.kind == "postgres":
        store, make_effect, read = _postgres_methods(ledger.url, ledger.prefix)
    else:
        assert ledger.path is not None
        store, make_effect, read = _sqlite_methods(ledger.path)
    if store_wrapper is not None:
        store = store_wrapper(store)
    srv = Server(
        # A transfer takes milliseconds: a short lease lets the keys a killed server
        # held be taken over within seconds of its restart (the default is a minute).
        idempotency=Idempotency(store, lease=LEASE),
        heartbeat_interval=heartbeat,
        max_connections=max_connections,
    )

    # one_step: the method only builds its effect, so on SQLite and PostgreSQL the
    # claim, the balance change and the record commit in one transaction (one group
    # commit, not two; Redis takes two steps).
    @srv.method(idempotent=True, pass_call=True, one_step=one_step)
    def transfer(call: Call, src: int, dst: int, amount: int) -> Effect:
        _check(src, dst, amount)
        return make_effect(call, src, dst, amount)

    @srv.method()
    async def balance(account: int) -> int | None:
        return await read("balance", account)  # type: ignore[no-any-return]

    @srv.method()
    async def audit() -> dict[str, int]:
        return await read("audit")  # type: ignore[no-any-return]

    return srv


def raise_nofile_limit() -> tuple[int, int]:
    """Raise this process's descriptor limit (soft) to its hard limit; returns both."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    return soft, hard


def process_trace(path: Path | None, role: str) -> gosim.Trace | None:
    """With ``path``, a trace of this process for the conductor to merge with the
    others' (:func:`write_trace`): named ``role (pid N)``, a Perfetto process under its
    pid, its times wall-clock times so that the processes line up."""
    if path is None:
        return None
    return gosim.Trace(f"{role} (pid {os.getpid()})", os.getpid(), wall_clock=True)


def write_trace(trace: gosim.Trace | None, path: Path | None) -> None:
    """Write ``trace`` to ``path`` whole or not at all (through a file renamed into
    place): a process killed while writing leaves no torn file to merge. Call it
    between two of the runtime's steps (after ``gosim.run``, or in a signal handler,
    which runs between two bytecodes): the event list is then whole."""
    if trace is None or path is None:
        return
    part = path.with_name(path.name + ".part")
    part.write_text(trace.to_chrome_json())
    part.replace(path)


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0


#: For the demo's own tests only: ``module:function``, a replacement for
#: :func:`make_server` (same arguments) that the server subcommand uses instead, to run
#: the conductor and the audit against a ledger broken on purpose.
TEST_SERVER_FACTORY = "LEDGER_DEMO_TEST_SERVER_FACTORY"


def _server_factory() -> Callable[[LedgerSpec, float, int], Server]:
    name = os.environ.get(TEST_SERVER_FACTORY)
    if not name:
        return make_server
    import importlib  # noqa: PLC0415 -- tests only

    module, _, function = name.partition(":")
    return getattr(importlib.import_module(module), function)  # type: ignore[no-any-return]


def serve(
    spec: LedgerSpec,
    addr: str,
    heartbeat: float,
    max_connections: int,
    reuse_port: bool,
    trace_path: Path | None = None,
) -> None:
    """Serve the ledger on ``addr`` until the process is killed; prints ``LISTEN addr``,
    then a JSON line of its counters (calls, CPU seconds, RSS, store operations and
    the batches they were committed in) every half second.

    With ``trace_path``, the runtime's trace is written there (Chrome JSON, for
    Perfetto; :func:`process_trace`) on SIGTERM; a SIGKILL leaves none."""
    raise_nofile_limit()
    trace = process_trace(trace_path, "ledger server")
    if trace is not None:

        def write_and_exit(signum: int, frame: Any) -> None:
            write_trace(trace, trace_path)
            os._exit(0)

        signal.signal(signal.SIGTERM, write_and_exit)

    async def report(srv: Server) -> None:
        while True:
            await gosim.sleep(0.5)
            line = {"calls": srv.statistics().calls, "cpu": round(time.process_time(), 3)}
            line["rss"] = _rss_bytes()
            if srv.idempotency is not None:  # the store's group commit: ops per batch
                st = srv.idempotency.store.statistics()
                line["store_ops"], line["store_batches"] = st.operations, st.batches
            print(json.dumps({"server": line}), flush=True)

    async def main() -> None:
        srv = _server_factory()(spec, heartbeat, max_connections)
        ln = net.listen("tcp", addr, reuse_port=reuse_port)
        print("LISTEN", ln.addr(), flush=True)
        go(report, srv)
        await srv.serve(ln)

    gosim.run(main, trace=trace)
