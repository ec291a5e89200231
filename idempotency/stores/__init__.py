"""Stores of idempotency records: one contract (``_contract``), four homes.

``MemoryStore`` (one process, runtime clock), ``SQLiteStore`` (one file, durable, group
commit; the default), ``RedisStore`` and ``PostgresStore`` (shared by processes and
machines). The Redis and Postgres stores are imported on first use, so redis-py and
psycopg are needed only by those who use them.

For ``Idempotency`` and for authors of a store, the contract's two helpers are here too:
``deliver`` (the callback APIs' fallback: await a step, then call back) and
``new_completion`` (a :class:`Completion` built in one C call). ``MAX_KEY_LENGTH`` and
``MAX_PAYLOAD_BYTES`` are the limits every store enforces (see ``_contract``).
"""

from typing import TYPE_CHECKING, Any

from ._contract import MAX_KEY_LENGTH as MAX_KEY_LENGTH
from ._contract import MAX_PAYLOAD_BYTES as MAX_PAYLOAD_BYTES
from ._contract import CallbackStore as CallbackStore
from ._contract import Completion as Completion
from ._contract import Effect as Effect
from ._contract import OneStepStore as OneStepStore
from ._contract import Store as Store
from ._contract import StoredRecord as StoredRecord
from ._contract import StoreStatistics as StoreStatistics
from ._contract import SynchronousStore as SynchronousStore
from ._contract import deliver as deliver
from ._contract import new_completion as new_completion
from .memory import MemoryEffect as MemoryEffect
from .memory import MemoryStore as MemoryStore
from .sqlite import SQLiteEffect as SQLiteEffect
from .sqlite import SQLiteStore as SQLiteStore

if TYPE_CHECKING:
    from .postgres import PostgresEffect as PostgresEffect
    from .postgres import PostgresStore as PostgresStore
    from .redis import LuaEffect as LuaEffect
    from .redis import RedisStore as RedisStore

__all__ = [
    "MAX_KEY_LENGTH",
    "MAX_PAYLOAD_BYTES",
    "CallbackStore",
    "Completion",
    "Effect",
    "LuaEffect",
    "MemoryEffect",
    "MemoryStore",
    "OneStepStore",
    "PostgresEffect",
    "PostgresStore",
    "RedisStore",
    "SQLiteEffect",
    "SQLiteStore",
    "Store",
    "StoreStatistics",
    "StoredRecord",
    "SynchronousStore",
    "deliver",
    "new_completion",
]


def __getattr__(name: str) -> Any:
    if name in ("RedisStore", "LuaEffect"):
        from . import redis  # noqa: PLC0415 -- redis-py is an optional dependency

        return getattr(redis, name)
    if name in ("PostgresStore", "PostgresEffect"):
        from . import postgres  # noqa: PLC0415 -- psycopg is an optional dependency

        return getattr(postgres, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
