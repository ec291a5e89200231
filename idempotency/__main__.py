"""``python -m idempotency``: an operator's tools for the records of a store.

::

    python -m idempotency inspect STORE-URL CALLER KEY [--json]
    python -m idempotency forget  STORE-URL CALLER KEY [--force]
    python -m idempotency sweep   STORE-URL
    python -m idempotency migrate STORE-URL

``inspect`` prints what is stored for a key (state, fingerprint, fence, lease or
retention deadline, a summary of the outcome), an expired or damaged record included,
and changes nothing. ``forget`` deletes the record, so the key is new again: a
completed, expired or damaged record (:class:`~idempotency.CorruptedRecord`) at once, a
live in-progress one only with ``--force`` (its holder may still be running: the request
may then run twice, and the holder's own completion is refused as stale). ``sweep``
deletes every expired record now. ``migrate`` moves the records of a SQLiteStore file of
the older layout (its table clustered on the key) into the current one, in one
transaction, while other processes may use the file (see ``SQLiteStore.migrate``); it
says so and changes nothing when the file has the current layout, and refuses other
stores (usage error).

STORE-URL names the store:

* ``sqlite:///abs/path/records.db`` (``sqlite:////abs/...`` too) or
  ``sqlite:relative/records.db``: an existing SQLiteStore file (never created here);
* ``redis://[user:password@]host:port/db?prefix=P`` (or ``rediss://``): a RedisStore
  under the key prefix ``P`` (default ``idempotency:``; the ledger demo's store is
  ``<its --prefix>idem:``, ``ledger:idem:`` by default). Other query parameters are
  redis-py's.
* ``postgresql://[user[:password]@]host[:port]/dbname?schema=S`` (or ``postgres://``): a
  PostgresStore whose tables are in schema ``S`` (default ``public``; never created
  here). Other query parameters are libpq's.

Exit status: 0 done; 1 nothing is stored for the key; 2 a usage error (bad arguments,
a bad STORE-URL, a file that is not a store); 3 ``forget`` refused, the key is in
progress; 4 the store failed (unreachable, locked past the busy timeout, damaged).
Errors are one line on stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sqlite3
import sys
import time
import urllib.parse
from collections.abc import Callable, Coroutine
from typing import Any, Final

import msgpack

import gosim

from ._errors import InProgress, InvalidKey, StoreError
from ._keys import validate_caller, validate_key
from ._secrets import clean_cause, masked, redact
from .stores import Store, StoredRecord

__all__ = ["main"]

EXIT_OK: Final = 0
EXIT_NO_RECORD: Final = 1
EXIT_USAGE: Final = 2
EXIT_IN_PROGRESS: Final = 3
EXIT_STORE: Final = 4

PROG: Final = "python -m idempotency"
SQLITE_BUSY_TIMEOUT: Final = 10.0  # a batch of a busy server holds the lock for ms
REDIS_TIMEOUT: Final = 5.0
SHOWN: Final = 200  # characters of an outcome's repr that are printed


class UsageError(Exception):
    """Bad arguments or STORE-URL: exit 2 with the message."""


def open_store(url: str) -> Store:
    """The store STORE-URL names (see the module docstring); UsageError says why not."""
    parts = urllib.parse.urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme == "sqlite":
        return _open_sqlite(parts)
    if scheme in ("redis", "rediss", "unix"):
        return _open_redis(parts)
    if scheme in ("postgresql", "postgres"):
        return _open_postgres(parts)
    if scheme == "memory":
        raise UsageError("a MemoryStore lives inside one process: nothing to reach from here")
    raise UsageError(
        f"STORE-URL {masked(url)!r} is not sqlite:///PATH, redis://HOST:PORT/DB[?prefix=P]"
        " or postgresql://HOST:PORT/DB[?schema=S]"
    )


def _open_sqlite(parts: urllib.parse.SplitResult) -> Store:
    from .stores.sqlite import SQLiteStore  # noqa: PLC0415 -- what the URL asks for

    if parts.netloc not in ("", "localhost") or parts.query or parts.fragment:
        raise UsageError(
            f"sqlite URL {parts.geturl()!r}: give the file as sqlite:///ABSOLUTE/PATH or "
            "sqlite:RELATIVE/PATH, with no host, query or fragment"
        )
    path = urllib.parse.unquote(parts.path)
    if path.startswith("//"):  # sqlite:////abs/path, SQLAlchemy's spelling of an absolute one
        path = "/" + path.lstrip("/")
    if not path:
        raise UsageError("sqlite URL names no file")
    if not os.path.isfile(path):
        raise UsageError(f"{path}: no such file (a store's file is never created here)")
    # Look before opening: SQLiteStore would add its tables to any database.
    try:
        uri = "file:" + urllib.parse.quote(os.path.abspath(path)) + "?mode=ro"
        with contextlib.closing(
            sqlite3.connect(uri, uri=True, timeout=SQLITE_BUSY_TIMEOUT)
        ) as conn:
            found = conn.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'idempotency_records'"
            ).fetchone()
    except sqlite3.Error as exc:
        raise StoreError(f"{path}: cannot read it as an SQLite database: {exc}") from exc
    if found is None:
        raise UsageError(f"{path}: an SQLite database without idempotency records (not a store)")
    return SQLiteStore(path, busy_timeout=SQLITE_BUSY_TIMEOUT)


def _open_redis(parts: urllib.parse.SplitResult) -> Store:
    try:
        from .stores.redis import RedisStore  # noqa: PLC0415 -- redis-py is optional
    except ImportError as exc:
        raise UsageError(f"a Redis store needs redis-py (pip install .[redis]): {exc}") from exc
    query = urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
    prefixes = [v for k, v in query if k == "prefix"]
    if len(prefixes) > 1:
        raise UsageError("redis URL gives prefix more than once")
    rest = urllib.parse.urlencode([(k, v) for k, v in query if k != "prefix"])
    url = urllib.parse.urlunsplit(parts._replace(query=rest))
    prefix = prefixes[0] if prefixes else "idempotency:"
    given = parts.geturl()
    try:
        store = RedisStore(url, prefix=prefix, socket_timeout=REDIS_TIMEOUT)
        # redis-py checks some of a URL only when it connects: connect now.
        store.client.ping()
    except (TypeError, ValueError) as exc:
        text = redact(str(exc), given)
        raise UsageError(f"redis URL {masked(given)!r}: {text}") from clean_cause(exc, given)
    except Exception as exc:  # redis-py's errors: unreachable, refused, bad password
        text = redact(str(exc), given)
        shown = masked(given)
        raise StoreError(f"{shown}: {type(exc).__name__}: {text}") from clean_cause(exc, given)
    return store


def _open_postgres(parts: urllib.parse.SplitResult) -> Store:
    try:
        from .stores.postgres import PostgresStore, find_store  # noqa: PLC0415 -- optional
    except ImportError as exc:
        raise UsageError(
            f"a Postgres store needs psycopg (pip install .[postgres]): {exc}"
        ) from exc
    query = urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
    schemas = [v for k, v in query if k == "schema"]
    if len(schemas) > 1:
        raise UsageError("postgresql URL gives schema more than once")
    schema = schemas[0] if schemas else "public"
    rest = urllib.parse.urlencode([(k, v) for k, v in query if k != "schema"])
    dsn = urllib.parse.urlunsplit(parts._replace(query=rest))
    shown = urllib.parse.urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))
    # Look before opening: PostgresStore would create its tables in any database.
    try:
        found = find_store(dsn, schema, REDIS_TIMEOUT)
    except ValueError as exc:  # libpq refused the URL itself
        raise UsageError(f"postgresql URL {shown!r}: {_one_line(exc)}") from exc
    except StoreError as exc:  # unreachable, refused, bad password
        raise StoreError(f"{shown}: {_one_line(exc)}") from exc
    if not found:
        raise UsageError(f"{shown}: schema {schema!r} holds no idempotency records (not a store)")
    return PostgresStore(dsn, schema=schema, pool_size=1, connect_timeout=REDIS_TIMEOUT)


def _one_line(exc: BaseException) -> str:
    """libpq's messages span lines: errors here are one."""
    return " ".join(str(exc).split())


def _ago(seconds: float) -> str:
    return f"in {seconds:.1f} s" if seconds >= 0 else f"{-seconds:.1f} s ago"


def _outcome(ok: bool, payload: bytes) -> str:
    """A one-line summary of a recorded outcome."""
    try:
        value = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except Exception as exc:  # a payload a Lua script wrote, not UTF-8, or damaged
        return f"undecodable payload ({len(payload)} bytes): {type(exc).__name__}: {exc}"
    size = f"({len(payload)} bytes)"
    if ok:
        return f"value {repr(value)[:SHOWN]} {size}"
    if isinstance(value, list) and len(value) == 3:
        code, message, data = value
        more = "" if data is None else f" data {repr(data)[:SHOWN]}"
        return f"error [{code}] {str(message)[:SHOWN]}{more} {size}"
    return f"error {repr(value)[:SHOWN]} {size}"


def describe(held: StoredRecord) -> dict[str, Any]:
    """``held`` as the fields ``inspect`` prints (and ``--json`` writes)."""
    out: dict[str, Any] = {"caller": held.caller, "key": held.key, "state": held.state}
    rec = held.record
    if rec is None:
        out["problem"] = held.problem
        return out
    left = rec.expires_at - held.now
    out["fingerprint"] = rec.fingerprint.hex()
    out["fence"] = rec.fence
    out["expires_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(rec.expires_at))
    out["expires_in"] = round(left, 3)
    if rec.payload is None:
        out["lease"] = f"ends {_ago(left)}" if left > 0 else f"lapsed {_ago(left)}"
    else:
        out["retention"] = f"ends {_ago(left)}" if left > 0 else f"ended {_ago(left)}"
        out["ok"] = rec.ok
        out["outcome"] = _outcome(rec.ok, rec.payload)
    if held.state == "EXPIRED":
        out["note"] = "reads as absent: a claim takes the key anew; sweep deletes it"
    return out


async def _inspect(store: Store, a: argparse.Namespace) -> int:
    held = await store.inspect(a.caller, a.key)
    if held is None:
        _error(f"nothing is stored for key {a.key!r} of caller {a.caller!r}")
        return EXIT_NO_RECORD
    fields = describe(held)
    if a.json:
        print(json.dumps(fields))
    else:
        width = max(map(len, fields))
        for name, value in fields.items():
            print(f"{name:<{width}}  {value}")
    return EXIT_OK


async def _forget(store: Store, a: argparse.Namespace) -> int:
    try:
        held = await store.forget(a.caller, a.key, force=a.force)
    except InProgress as exc:
        seen = await store.inspect(a.caller, a.key)
        lease = ""
        if seen is not None and seen.record is not None:
            lease = f" (its lease ends {_ago(seen.record.expires_at - seen.now)})"
        _error(f"{exc}{lease}; --force forgets it anyway, and the request may then run twice")
        return EXIT_IN_PROGRESS
    if held is None:
        _error(f"nothing is stored for key {a.key!r} of caller {a.caller!r}")
        return EXIT_NO_RECORD
    fence = "" if held.record is None else f", fence {held.record.fence}"
    print(f"forgot key {a.key!r} of caller {a.caller!r} ({held.state}{fence})")
    return EXIT_OK


async def _sweep(store: Store, a: argparse.Namespace) -> int:
    n = await store.sweep()
    print(f"swept {n} expired record{'' if n == 1 else 's'}")
    return EXIT_OK


async def _migrate(store: Store, a: argparse.Namespace) -> int:
    from .stores.sqlite import SQLiteStore  # noqa: PLC0415 -- a SQLite file's command

    assert isinstance(store, SQLiteStore)  # main() refuses the other stores
    n = await store.migrate()
    if n is None:
        print("the records already have the current layout: nothing to do")
    else:
        print(f"moved {n} record{'' if n == 1 else 's'} into the current layout")
    return EXIT_OK


def _error(message: str) -> None:
    print(f"{PROG}: {message}", file=sys.stderr)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Inspect, forget or sweep the idempotency records of a store, or migrate a "
        "SQLite file to the current table layout.",
        epilog="STORE-URL: sqlite:///ABSOLUTE/PATH, sqlite:RELATIVE/PATH, or "
        "redis://HOST:PORT/DB?prefix=P (default prefix 'idempotency:'). Exit status: 0 "
        "done, 1 nothing stored for the key, 2 usage error, 3 forget refused (in "
        "progress), 4 the store failed.",
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, text in [
        ("inspect", "print a key's record (state, fingerprint, fence, expiry, outcome)"),
        ("forget", "delete a key's record; one in progress only with --force"),
    ]:
        c = sub.add_parser(name, help=text, description=text)
        c.add_argument("store", metavar="STORE-URL")
        c.add_argument("caller", metavar="CALLER", help="the identity the key is scoped to")
        c.add_argument("key", metavar="KEY", help="the idempotency key")
        if name == "inspect":
            c.add_argument("--json", action="store_true", help="one JSON object")
        else:
            c.add_argument(
                "--force",
                action="store_true",
                help="forget a key in progress too (its request may then run twice)",
            )
    s = sub.add_parser("sweep", help="delete every expired record now")
    s.add_argument("store", metavar="STORE-URL")
    text = "move a SQLite file's records into the current table layout (one transaction)"
    m = sub.add_parser("migrate", help=text, description=text)
    m.add_argument("store", metavar="STORE-URL")
    return p


_COMMANDS: Final[dict[str, Callable[[Store, argparse.Namespace], Coroutine[Any, Any, int]]]] = {
    "inspect": _inspect,
    "forget": _forget,
    "sweep": _sweep,
    "migrate": _migrate,
}


def main(argv: list[str] | None = None) -> int:
    """Run one command; return the exit status (see the module docstring)."""
    a = _parser().parse_args(argv)  # exits 2 on a usage error, as argparse does
    try:
        if a.command in ("inspect", "forget"):
            a.caller = validate_caller(a.caller)
            a.key = validate_key(a.key)
        if a.command == "migrate" and urllib.parse.urlsplit(a.store).scheme.lower() != "sqlite":
            raise UsageError("migrate applies to SQLiteStore files (sqlite:///PATH) only")
        store = open_store(a.store)
    except (UsageError, InvalidKey) as exc:
        _error(str(exc))
        return EXIT_USAGE
    except StoreError as exc:
        _error(str(exc))
        return EXIT_STORE
    try:
        status: int = gosim.run(_guarded, _COMMANDS[a.command], store, a)
    finally:
        store.close()
    return status


async def _guarded(
    command: Callable[[Store, argparse.Namespace], Coroutine[Any, Any, int]],
    store: Store,
    a: argparse.Namespace,
) -> int:
    try:
        return await command(store, a)
    except StoreError as exc:
        _error(str(exc))
        return EXIT_STORE


if __name__ == "__main__":
    sys.exit(main())
