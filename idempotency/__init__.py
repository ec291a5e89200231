"""idempotency: idempotency keys, durable key stores and exactly-once effects.

General layout: ``_errors``, ``_keys`` (key and caller validation, request fingerprints),
``_record`` (the life of a record, as a table) and ``_outcome`` (recorded outcomes) are
pure: they import neither trio nor gosim. ``stores`` keeps records (memory, SQLite,
PostgreSQL, Redis) behind one contract; ``_idempotency`` runs requests over a store. The
package sits on :mod:`gosim` (and, for its RPC, :mod:`netframe`); neither imports it.
This file only re-exports.

Quick use: a handler run once per key, its outcome replayed to a retry::

    import gosim
    from idempotency import Idempotency, SQLiteStore

    runs = []


    async def greet(call):
        runs.append(call.key)
        return f"hello, {call.args[0]}"


    async def main():
        idem = Idempotency(SQLiteStore("greetings.db"))  # embedded, durable default
        request = ("greet", ["ada"])
        first = await idem.run(caller="web", key="k-1", request=request, handler=greet)
        again = await idem.run(caller="web", key="k-1", request=request, handler=greet)
        assert (first.value, first.replayed) == ("hello, ada", False)
        assert (again.value, again.replayed) == ("hello, ada", True)  # not run again
        assert runs == ["k-1"]
        idem.store.close()


    gosim.run(main)

A transfer whose balance change commits with its record (the exactly-once mode)::

    import sqlite3

    import gosim
    from idempotency import ApplicationError, Idempotency, SQLiteEffect, SQLiteStore

    app = sqlite3.connect("ledger.db", isolation_level=None)  # the application's table
    app.execute("PRAGMA journal_mode=WAL")
    app.execute("CREATE TABLE accounts (id TEXT PRIMARY KEY, balance INTEGER)")
    app.execute("INSERT INTO accounts VALUES ('alice', 100), ('bob', 0)")


    def transfer(call):
        src, dst, amount = call.args

        def apply(conn):  # runs in the transaction that completes the record
            sql = "SELECT balance FROM accounts WHERE id = ?"
            (balance,) = conn.execute(sql, (src,)).fetchone()
            if balance < amount:  # recorded and replayed; its writes (none) roll back
                raise ApplicationError("insufficient_funds", f"{src} has {balance}")
            sql = "UPDATE accounts SET balance = balance + ? WHERE id = ?"
            conn.execute(sql, (-amount, src))
            conn.execute(sql, (amount, dst))
            return balance - amount

        return SQLiteEffect(apply)


    async def main():
        idem = Idempotency(SQLiteStore("ledger.db"))
        request = ("transfer", ["alice", "bob", 30])
        for _ in range(3):  # a client retrying: the money moves once
            out = await idem.run(caller="teller", key="t-1", request=request,
                                 handler=transfer)
            assert out.value == 70
        idem.store.close()


    gosim.run(main)
    balances = dict(app.execute("SELECT id, balance FROM accounts"))
    assert balances == {"alice": 70, "bob": 30}

Two guarantees, named apart:

* **Exactly-once effects**: a handler that returns the store's kind of
  :class:`~idempotency.stores.Effect` (``SQLiteEffect``, ``PostgresEffect``,
  ``LuaEffect``, ``MemoryEffect``) has that effect committed in the same store transaction that
  completes its record: after a crash at any instant there is both or neither, and a
  retry replays instead of repeating.
* **At-least-once effects with fencing**: anything the handler does outside the store
  happens once per execution, and an execution repeats when its claim is released (a
  retryable error) or lapses (a crash). ``call.fence`` rises with every claim; give it to
  the external system so it refuses the older execution.
"""

from typing import TYPE_CHECKING, Any

from ._errors import ApplicationError as ApplicationError
from ._errors import CorruptedRecord as CorruptedRecord
from ._errors import IdempotencyError as IdempotencyError
from ._errors import InProgress as InProgress
from ._errors import InvalidKey as InvalidKey
from ._errors import InvalidRequest as InvalidRequest
from ._errors import InvalidResult as InvalidResult
from ._errors import KeyReused as KeyReused
from ._errors import StaleClaim as StaleClaim
from ._errors import StoreError as StoreError
from ._errors import StoreUnavailable as StoreUnavailable
from ._idempotency import DEFAULT_LEASE as DEFAULT_LEASE
from ._idempotency import DEFAULT_TTL as DEFAULT_TTL
from ._idempotency import Call as Call
from ._idempotency import Handler as Handler
from ._idempotency import Idempotency as Idempotency
from ._keys import fingerprint as fingerprint
from ._keys import validate_caller as validate_caller
from ._keys import validate_key as validate_key
from ._outcome import UNRECORDED_RESULT as UNRECORDED_RESULT
from ._outcome import Outcome as Outcome
from .stores import Effect as Effect
from .stores import MemoryEffect as MemoryEffect
from .stores import MemoryStore as MemoryStore
from .stores import SQLiteEffect as SQLiteEffect
from .stores import SQLiteStore as SQLiteStore
from .stores import Store as Store
from .stores import StoreStatistics as StoreStatistics

if TYPE_CHECKING:
    from .stores.postgres import PostgresEffect as PostgresEffect
    from .stores.postgres import PostgresStore as PostgresStore
    from .stores.redis import LuaEffect as LuaEffect
    from .stores.redis import RedisStore as RedisStore

__all__ = [
    "DEFAULT_LEASE",
    "DEFAULT_TTL",
    "UNRECORDED_RESULT",
    "ApplicationError",
    "Call",
    "CorruptedRecord",
    "Effect",
    "Handler",
    "Idempotency",
    "IdempotencyError",
    "InProgress",
    "InvalidKey",
    "InvalidRequest",
    "InvalidResult",
    "KeyReused",
    "LuaEffect",
    "MemoryEffect",
    "MemoryStore",
    "Outcome",
    "PostgresEffect",
    "PostgresStore",
    "RedisStore",
    "SQLiteEffect",
    "SQLiteStore",
    "StaleClaim",
    "Store",
    "StoreError",
    "StoreStatistics",
    "StoreUnavailable",
    "fingerprint",
    "validate_caller",
    "validate_key",
]


def __getattr__(name: str) -> Any:
    # RedisStore needs redis-py (the ``redis`` extra), PostgresStore psycopg 3 (the
    # ``postgres`` extra): idempotency.stores imports each only when asked for.
    if name in ("RedisStore", "LuaEffect", "PostgresStore", "PostgresEffect"):
        from . import stores  # noqa: PLC0415

        return getattr(stores, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _fixup_module_metadata() -> None:
    # Tracebacks and reprs say idempotency.KeyReused, not idempotency._errors.KeyReused.
    for name in __all__:
        obj = globals().get(name)
        if obj is not None and getattr(obj, "__module__", "").startswith("idempotency."):
            try:
                obj.__module__ = "idempotency"
            except (AttributeError, TypeError):
                pass


_fixup_module_metadata()
