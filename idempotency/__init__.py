"""idempotency: idempotency keys, durable key stores and exactly-once effects.

General layout: ``_errors``, ``_keys`` (key and caller validation, request fingerprints),
``_record`` (the life of a record, as a table) and ``_outcome`` (recorded outcomes) are
pure: they import neither trio nor gosim. ``stores`` keeps records (memory, SQLite,
Redis) behind one contract; ``_idempotency`` runs requests over a store. The package sits
on :mod:`gosim` (and, for its RPC, :mod:`netframe`); neither imports it. This file only
re-exports.

Quick use, inside a gosim goroutine::

    from idempotency import Idempotency, SQLiteStore

    idem = Idempotency(SQLiteStore("ledger.db"))      # embedded, durable default
    outcome = await idem.run(caller="acct-7", key="8e03978e-...",
                             request=("transfer", [src, dst, 10]), handler=do_transfer)
    outcome.replayed   # True when the stored outcome was returned without running it
    outcome.value      # the recorded result (or the recorded ApplicationError, raised)

A transfer whose balance change commits with its record (the exactly-once mode)::

    def transfer(call):
        src, dst, amount = call.args

        def apply(conn):  # runs in the transaction that completes the record
            (balance,) = conn.execute("SELECT balance FROM accounts WHERE id = ?",
                                      (src,)).fetchone()
            if balance < amount:  # recorded and replayed; its writes (none) roll back
                raise ApplicationError("insufficient_funds", f"{src} has {balance}")
            conn.execute("UPDATE accounts SET balance = balance - ? WHERE id = ?",
                         (amount, src))
            conn.execute("UPDATE accounts SET balance = balance + ? WHERE id = ?",
                         (amount, dst))
            return balance - amount

        return SQLiteEffect(apply)

Two guarantees, named apart:

* **Exactly-once effects**: a handler that returns the store's kind of
  :class:`~idempotency.stores.Effect` (``SQLiteEffect``, ``LuaEffect``,
  ``MemoryEffect``) has that effect committed in the same store transaction that
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
