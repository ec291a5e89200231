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

STORE-URL names the store (``--help`` lists the same forms; any other is a usage
error naming them):

* ``sqlite:///abs/path/records.db`` (``sqlite:////abs/...`` and
  ``sqlite://localhost/abs/...`` too) or ``sqlite:relative/records.db``: an existing
  SQLiteStore file (never created here);
* ``redis://[[user]:password@]host[:port][/db][?prefix=P]``, ``rediss://`` (TLS) or
  ``unix://[[user]:password@]/path/redis.sock[?db=N&prefix=P]`` (a Unix socket): a
  RedisStore under the key prefix ``P`` (default ``idempotency:``; the ledger demo's
  store is ``<its --prefix>idem:``, ``ledger:idem:`` by default). Other query
  parameters are redis-py's.
* ``postgresql://[user[:password]@][host][:port]/dbname[?schema=S]`` (or
  ``postgres://``): a PostgresStore whose tables are in schema ``S`` (default
  ``public``; never created here). Other query parameters are libpq's (``host=/socket/dir``,
  ``port``, ``user``, ``sslmode``, ...).

``inspect --json`` writes one JSON object (see ``JSON_SHAPE`` below, also in
``inspect --help``): a program reads the recorded outcome as a JSON value, a recorded
error as an object, bytes and the other values JSON lacks as reversible tagged objects.

Exit status: 0 done; 1 nothing is stored for the key; 2 a usage error (bad arguments,
a bad STORE-URL, a file that is not a store); 3 ``forget`` refused, the key is in
progress; 4 the store failed (unreachable, locked past the busy timeout, damaged).
Errors are one line on stderr.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import datetime
import json
import math
import os
import sqlite3
import sys
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


# Every STORE-URL form open_store accepts: the help of each command lists them, and the
# error for any other URL names them (one list, so neither can drift from the code).
STORE_URL_FORMS: Final = """\
STORE-URL, one of:
  sqlite:///ABSOLUTE/PATH  (or sqlite:////ABSOLUTE/PATH, sqlite://localhost/ABSOLUTE/PATH)
  sqlite:RELATIVE/PATH
      an existing SQLiteStore file (never created here)
  redis://[[USER]:PASSWORD@]HOST[:PORT][/DB][?prefix=P]
  rediss://...  (the same over TLS)
  unix://[[USER]:PASSWORD@]/SOCKET/PATH[?db=DB&prefix=P]  (Redis on a Unix socket)
      a RedisStore under key prefix P (default 'idempotency:'; the ledger demo's is
      'ledger:idem:'); other query parameters are redis-py's
  postgresql://[USER[:PASSWORD]@][HOST][:PORT]/DBNAME[?schema=S]  (or postgres://)
      a PostgresStore whose tables are in schema S (default 'public'; never created
      here); other query parameters are libpq's (host=/SOCKET/DIR, port, sslmode, ...)
A password in a URL is never printed."""

EXIT_STATUS: Final = (
    "Exit status: 0 done, 1 nothing stored for the key, 2 usage error, 3 forget refused (in "
    "progress), 4 the store failed."
)

# What ``inspect --json`` writes: its help shows this, and docs/guides/idempotency.md
# documents the same shape.
JSON_SHAPE: Final = """\
--json writes one JSON object:
  caller, key       strings
  state             "IN_PROGRESS", "COMPLETED", "EXPIRED" (reads as absent) or "CORRUPTED"
  problem           CORRUPTED only, why the record cannot be read (nothing else follows)
  fingerprint       the request's SHA-256, hex
  fence             the fencing token, an integer
  now               the store's clock when read, Unix seconds (a number)
  expires_at        the lease's or retention's end, ISO 8601 UTC ("...T12:00:00.000Z"),
                    null when it never ends (or ends past the year 9999)
  expires_at_unix   the same, Unix seconds (a number), null when it never ends
  expires_in        seconds from now to expires_at (negative once passed), null: never
  lease             in progress: a sentence ("ends in 42.0 s", "lapsed 3.0 s ago",
                    "never ends")
  retention         completed: a sentence ("ends in 86399.0 s", "ended 2.0 s ago")
  ok                completed: true for a recorded value, false for a recorded error
  outcome           completed, ok: the recorded value as JSON;
                    completed, not ok: {"code": C, "message": M, "data": D}
  outcome_bytes     completed: the size of the recorded (msgpack) outcome
  outcome_problem   instead of outcome, when the recorded bytes do not decode (then
                    "payload" holds them, as {"$bytes": BASE64})
  note              EXPIRED only, what that means
Values JSON lacks are objects of one "$" key: {"$bytes": BASE64} (msgpack bin, standard
base64), {"$float": "NaN" | "Infinity" | "-Infinity"}, {"$ext": [TYPE, BASE64]} (a
msgpack extension, its timestamps (type -1) included), {"$map": [[K, V], ...]} (a map
with a key that is not a string, a key twice, or one key alone that starts with "$";
K and V in these forms too). Every other
map is an object, an array an array, nil null; integers are exact and a float always has
a fraction or an exponent (1.0), so the recorded value can be rebuilt exactly."""


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
        f"STORE-URL {masked(url)!r} is not one of sqlite:///ABSOLUTE/PATH, "
        "sqlite:RELATIVE/PATH, redis://HOST[:PORT][/DB][?prefix=P] (or rediss://, "
        "unix:///SOCKET/PATH), postgresql://HOST[:PORT]/DBNAME[?schema=S] (or postgres://)"
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


def _unsplit(parts: urllib.parse.SplitResult) -> str:
    """``parts`` as a URL again, ``//`` kept with an empty host (``unix:///path``,
    ``postgresql:///db?host=...``), which ``urlunsplit`` drops for schemes it does not
    know (the drivers then refuse the URL)."""
    url = f"{parts.scheme}://{parts.netloc}{parts.path}"
    if parts.query:
        url += f"?{parts.query}"
    if parts.fragment:
        url += f"#{parts.fragment}"
    return url


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
    url = _unsplit(parts._replace(query=rest))
    prefix = prefixes[0] if prefixes else "idempotency:"
    given = _unsplit(parts)
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
    dsn = _unsplit(parts._replace(query=rest))
    shown = _unsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))
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


def _ends(left: float, past: str) -> str:
    """When a lease or a retention ends, ``left`` seconds from now."""
    if math.isinf(left):  # math.inf: it never expires
        return "never ends"
    return f"ends {_ago(left)}" if left > 0 else f"{past} {_ago(left)}"


class _Map(list):  # type: ignore[type-arg]
    """A decoded msgpack map, as its (key, value) pairs: keys need not be hashable (an
    array), and a key given twice is kept twice."""


def _decode(payload: bytes) -> Any:
    """A recorded payload decoded for showing: maps as :class:`_Map`, so that every
    msgpack value decodes (msgpack-python would refuse an array as a map key)."""
    return msgpack.unpackb(payload, raw=False, strict_map_key=False, object_pairs_hook=_Map)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def to_json(value: Any) -> Any:
    """A decoded msgpack value as JSON (see ``JSON_SHAPE``): reversibly, the values JSON
    lacks as objects of one ``$`` key."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        return {
            "$float": "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
        }
    if isinstance(value, bytes):
        return {"$bytes": _b64(value)}
    if isinstance(value, _Map):
        keys = [k for k, _ in value]
        if (
            all(type(k) is str for k in keys)
            and len(set(keys)) == len(keys)
            and not (len(keys) == 1 and keys[0].startswith("$"))
        ):
            return {k: to_json(v) for k, v in value}
        return {"$map": [[to_json(k), to_json(v)] for k, v in value]}
    if isinstance(value, list):
        return [to_json(v) for v in value]
    if isinstance(value, msgpack.Timestamp):
        return {"$ext": [-1, _b64(value.to_bytes())]}
    if isinstance(value, msgpack.ExtType):
        return {"$ext": [value.code, _b64(value.data)]}
    raise TypeError(f"no JSON form for a decoded {type(value).__name__}")  # msgpack has no more


def _as_python(value: Any) -> Any:
    """A value of :func:`_decode` as msgpack-python decodes it by default (for the text
    summary): maps as dicts where their keys allow."""
    if isinstance(value, _Map):
        pairs = [(_as_python(k), _as_python(v)) for k, v in value]
        try:
            return dict(pairs)
        except TypeError:  # a key that is an array or a map
            return pairs
    if isinstance(value, list):
        return [_as_python(v) for v in value]
    return value


def _error_parts(value: Any) -> list[Any] | None:
    """``[code, message, data]`` of a recorded error (a Lua array with no data ends
    after the message), or None when ``value`` is not one."""
    if isinstance(value, list) and not isinstance(value, _Map) and len(value) in (2, 3):
        return [*value, None][:3]
    return None


def _outcome(ok: bool, payload: bytes) -> str:
    """A one-line summary of a recorded outcome."""
    try:
        value = _as_python(_decode(payload))
    except Exception as exc:  # a payload a Lua script wrote, not UTF-8, or damaged
        return f"undecodable payload ({len(payload)} bytes): {type(exc).__name__}: {exc}"
    size = f"({len(payload)} bytes)"
    if ok:
        return f"value {repr(value)[:SHOWN]} {size}"
    parts = _error_parts(value)
    if parts is not None:
        code, message, data = parts
        more = "" if data is None else f" data {repr(data)[:SHOWN]}"
        return f"error [{code}] {str(message)[:SHOWN]}{more} {size}"
    return f"error {repr(value)[:SHOWN]} {size}"


def _json_outcome(ok: bool, payload: bytes) -> dict[str, Any]:
    """The ``outcome`` fields of ``inspect --json`` (see ``JSON_SHAPE``)."""
    out: dict[str, Any] = {"outcome_bytes": len(payload)}
    try:
        value = _decode(payload)
    except Exception as exc:  # a payload a Lua script wrote, not UTF-8, or damaged
        out["outcome_problem"] = f"undecodable payload: {type(exc).__name__}: {exc}"
        out["payload"] = {"$bytes": _b64(payload)}
        return out
    if ok:
        out["outcome"] = to_json(value)
        return out
    parts = _error_parts(value)
    if parts is None:
        out["outcome_problem"] = "a recorded error that is not [code, message, data]"
        out["payload"] = {"$bytes": _b64(payload)}
        return out
    code, message, data = parts
    out["outcome"] = {"code": to_json(code), "message": to_json(message), "data": to_json(data)}
    return out


def _iso(t: float) -> str | None:
    """Unix time ``t`` in ISO 8601 UTC to the millisecond; None past what it can say."""
    try:
        when = datetime.datetime.fromtimestamp(t, datetime.UTC)
    except (OverflowError, OSError, ValueError):  # infinite, or past the year 9999
        return None
    return when.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def describe(held: StoredRecord, as_json: bool = False) -> dict[str, Any]:
    """``held`` as the fields ``inspect`` prints, or with ``as_json`` those ``--json``
    writes (see ``JSON_SHAPE``: JSON values only, the outcome decoded)."""
    out: dict[str, Any] = {"caller": held.caller, "key": held.key, "state": held.state}
    rec = held.record
    if rec is None:
        out["problem"] = held.problem
        return out
    left = rec.expires_at - held.now
    never = math.isinf(rec.expires_at)
    out["fingerprint"] = rec.fingerprint.hex()
    out["fence"] = rec.fence
    if as_json:
        out["now"] = held.now
        out["expires_at"] = None if never else _iso(rec.expires_at)
        out["expires_at_unix"] = None if never else rec.expires_at
        out["expires_in"] = None if never else round(left, 3)
    else:
        out["expires_at"] = "never" if never else (_iso(rec.expires_at) or rec.expires_at)
        out["expires_in"] = "never" if never else round(left, 3)
    if rec.payload is None:
        out["lease"] = _ends(left, "lapsed")
    else:
        out["retention"] = _ends(left, "ended")
        out["ok"] = rec.ok
        if as_json:
            out.update(_json_outcome(rec.ok, rec.payload))
        else:
            out["outcome"] = _outcome(rec.ok, rec.payload)
    if held.state == "EXPIRED":
        out["note"] = "reads as absent: a claim takes the key anew; sweep deletes it"
    return out


async def _inspect(store: Store, a: argparse.Namespace) -> int:
    held = await store.inspect(a.caller, a.key)
    if held is None:
        _error(f"nothing is stored for key {a.key!r} of caller {a.caller!r}")
        return EXIT_NO_RECORD
    fields = describe(held, as_json=a.json)
    if a.json:
        print(json.dumps(fields, allow_nan=False))
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
            lease = f" (its lease {_ends(seen.record.expires_at - seen.now, 'lapsed')})"
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
    raw = argparse.RawDescriptionHelpFormatter  # the epilogs' lists keep their lines
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Inspect, forget or sweep the idempotency records of a store, or migrate\n"
        "a SQLite file to the current table layout.",
        epilog=f"{STORE_URL_FORMS}\n\n{EXIT_STATUS}",
        formatter_class=raw,
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    url_help = "the store (the forms are listed below)"
    for name, text in [
        ("inspect", "print a key's record (state, fingerprint, fence, expiry, outcome)"),
        ("forget", "delete a key's record; one in progress only with --force"),
    ]:
        more = f"\n\n{JSON_SHAPE}" if name == "inspect" else ""
        c = sub.add_parser(
            name,
            help=text,
            description=text,
            epilog=f"{STORE_URL_FORMS}{more}\n\n{EXIT_STATUS}",
            formatter_class=raw,
        )
        c.add_argument("store", metavar="STORE-URL", help=url_help)
        c.add_argument("caller", metavar="CALLER", help="the identity the key is scoped to")
        c.add_argument("key", metavar="KEY", help="the idempotency key")
        if name == "inspect":
            c.add_argument(
                "--json", action="store_true", help="one JSON object (its shape is below)"
            )
        else:
            c.add_argument(
                "--force",
                action="store_true",
                help="forget a key in progress too (its request may then run twice)",
            )
    text = "delete every expired record now"
    s = sub.add_parser(
        "sweep",
        help=text,
        description=text,
        epilog=f"{STORE_URL_FORMS}\n\n{EXIT_STATUS}",
        formatter_class=raw,
    )
    s.add_argument("store", metavar="STORE-URL", help=url_help)
    text = "move a SQLite file's records into the current table layout (one transaction)"
    m = sub.add_parser(
        "migrate",
        help=text,
        description=text,
        epilog="STORE-URL: sqlite:///ABSOLUTE/PATH or sqlite:RELATIVE/PATH (a SQLiteStore "
        f"file; the other stores have one layout).\n\n{EXIT_STATUS}",
        formatter_class=raw,
    )
    m.add_argument("store", metavar="STORE-URL", help="the SQLiteStore file")
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
