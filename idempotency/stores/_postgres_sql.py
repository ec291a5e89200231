"""The SQL of :class:`~idempotency.stores.postgres.PostgresStore`: the schema's checks
and text, the statements a batch sends, and the literals its values are written as (the
batch's text goes in one message of the simple query protocol, so every value is an
escaped literal or a number's text, never data as it came).

Apart from the store so that its module reads as the batch's mechanism; nothing here
talks to a server.
"""

from __future__ import annotations

import binascii
import json
import zlib
from collections.abc import Callable, Iterable
from typing import Any, Final

from psycopg import sql

from ._batch import Op, OpKind

_COMPLETE: Final = OpKind.COMPLETE
_CLAIM_COMPLETE: Final = OpKind.CLAIM_COMPLETE

_SCHEMA_LOCK: Final = 0x1DE4_7051  # the advisory lock taken while creating tables
#: PostgreSQL's longest identifier, in bytes (NAMEDATALEN - 1): it truncates a longer
#: one silently, so two schemas that differ only past it would be one.
MAX_IDENTIFIER_BYTES: Final = 63
#: The longest lock_timeout, in seconds: the setting is an int of milliseconds.
_MAX_LOCK_TIMEOUT: Final = 2_147_483.647


def _check_schema(schema: object) -> None:
    """ValueError unless ``schema`` is a name PostgreSQL keeps as it is: a str of 1 to
    :data:`MAX_IDENTIFIER_BYTES` bytes in UTF-8, without NUL. Refused rather than made
    unique (a digest appended): the schema is the operator's, named in their SQL, their
    ``search_path`` and ``python -m idempotency``'s URL, so it must be the name given."""
    if not isinstance(schema, str):
        raise ValueError(f"PostgresStore: schema must be a str, not {type(schema).__name__}")
    if not schema or "\0" in schema:
        raise ValueError(
            f"PostgresStore: schema must be a non-empty name without NUL, not {schema!r}"
        )
    if len(schema.encode("utf-8", "surrogatepass")) > MAX_IDENTIFIER_BYTES:
        raise ValueError(_schema_too_long(schema))


def _schema_too_long(schema: str) -> str:
    size = len(schema.encode("utf-8", "surrogatepass"))
    return (
        f"PostgresStore: schema {schema!r:.80} is {size} bytes long in UTF-8 ({len(schema)}"
        f" characters); PostgreSQL keeps at most {MAX_IDENTIFIER_BYTES} bytes of a name and"
        " truncates the rest silently, so two schemas that differ only past them would"
        " share one records table"
    )


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _schema(
    schema: sql.Identifier, records: sql.Composed, seq: str
) -> list[sql.SQL | sql.Composed]:
    return [
        sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(schema),
        sql.SQL(
            """CREATE TABLE IF NOT EXISTS {} (
                caller      text     NOT NULL,
                key         text     NOT NULL,
                state       smallint NOT NULL,  -- _record.State: 1 in progress, 2 completed
                fingerprint bytea    NOT NULL,  -- SHA-256 of the canonical request
                fence       bigint   NOT NULL,  -- fencing token of the claim that wrote it
                expires_at  float8   NOT NULL   -- lease deadline or end of retention (Unix s)
                    CONSTRAINT expires_at_is_a_number CHECK (expires_at <> 'NaN'),
                ok          boolean  NOT NULL,  -- completed: true a value, false an error
                payload     bytea,              -- completed: msgpack outcome; NULL else
                PRIMARY KEY (caller, key)
            )"""
        ).format(records),
        # The sweep reads expired rows through this index, never the whole table.
        sql.SQL(
            "CREATE INDEX IF NOT EXISTS idempotency_records_expires_at ON {} (expires_at)"
        ).format(records),
        sql.SQL("CREATE SEQUENCE IF NOT EXISTS " + seq.replace("{", "{{").replace("}", "}}")),
    ]


def _statements(records: sql.Composed, seq: str) -> dict[str, sql.SQL | sql.Composed]:
    cols = "r.caller, r.key, r.state, r.fingerprint, r.fence, r.expires_at, r.ok, r.payload"
    # A batch's keys and rows go as one JSON parameter: json.dumps and bytes.hex are C,
    # where psycopg dumps an array element by element in Python (most of a batch's CPU
    # time when measured). Blobs go as hex; floats as their repr ('inf' included).
    keys = "(SELECT j->>0 AS caller, j->>1 AS key FROM json_array_elements(%s::json) j) AS w"
    rows = (
        "(SELECT j->>0 AS caller, j->>1 AS key, (j->>2)::int2 AS state,"
        " decode(j->>3, 'hex') AS fingerprint, (j->>4)::int8 AS fence,"
        " (j->>5)::float8 AS expires_at, (j->>6)::bool AS ok, decode(j->>7, 'hex') AS payload"
        " FROM json_array_elements(%s::json) j) AS v"
    )

    def q(text: str) -> sql.Composed:
        return sql.SQL(text).format(records)

    seq_lit = seq.replace("'", "''")
    return {
        # In key order, so that two batches lock the rows they share in the same order.
        "lock": q(
            f"SELECT {cols} FROM {{}} r JOIN {keys} USING (caller, key)"
            " ORDER BY r.caller, r.key FOR UPDATE OF r"
        ),
        "read": q(f"SELECT {cols} FROM {{}} r JOIN {keys} USING (caller, key)"),
        "now": sql.SQL(
            "SELECT extract(epoch FROM clock_timestamp())::float8,"
            f" array_to_string(ARRAY(SELECT nextval('{seq_lit}') FROM generate_series(1, %s)), ',')"
        ),
        "update": q(
            f"UPDATE {{}} r SET state = v.state, fingerprint = v.fingerprint, fence = v.fence,"
            f" expires_at = v.expires_at, ok = v.ok, payload = v.payload FROM {rows}"
            " WHERE r.caller = v.caller AND r.key = v.key"
        ),
        "insert": q(
            "INSERT INTO {} (caller, key, state, fingerprint, fence, expires_at, ok, payload)"
            f" SELECT v.* FROM {rows}"
        ),
        "delete": q(f"DELETE FROM {{}} r USING {keys} WHERE r.caller = w.caller AND r.key = w.key"),
        # Expired rows through the expires_at index; rows another transaction holds
        # are skipped, so the sweep never waits for a writer.
        "sweep": q(
            "DELETE FROM {0} WHERE ctid = ANY(ARRAY(SELECT ctid FROM {0}"
            " WHERE expires_at <= %s ORDER BY expires_at LIMIT %s FOR UPDATE SKIP LOCKED))"
        ),
    }


def _dumps(value: Any) -> bytes:
    """Compact JSON, ASCII (NUL and lone surrogates escaped: PostgreSQL then refuses
    them, and the operation that brought them fails alone)."""
    return json.dumps(value, separators=(",", ":")).encode()


def _fill(parts: tuple[bytes, ...], *literals: bytes) -> bytes:
    """A statement's text with its placeholders (where ``parts`` were split) replaced
    by ``literals``, in order: each an escaped literal or a number's text, never data
    as it came."""
    out = [parts[0]]
    for literal, part in zip(literals, parts[1:], strict=True):
        out += [literal, part]
    return b"".join(out)


def _float(value: float) -> bytes:
    """A float8 literal of ``value`` (``repr`` is exact; ``'inf'`` is one too)."""
    return b"'%s'::float8" % repr(float(value)).encode()


def _row_values(get: Callable[[int, int], bytes | None], i: int) -> tuple[Any, ...]:
    """Row ``i`` of a lock or read statement's text result, past caller and key, as
    ``decode_record`` takes it (what binary results would give; NULL as None)."""
    state, fp, fence, expires_at, ok, payload = (get(i, col) for col in range(2, 8))
    return (
        None if state is None else int(state),
        None if fp is None else _from_bytea(fp),
        None if fence is None else int(fence),
        None if expires_at is None else float(expires_at),
        None if ok is None else ok == b"t",
        None if payload is None else _from_bytea(payload),
    )


def _from_bytea(text: bytes) -> bytes:
    """A bytea's text in hex (``bytea_output = hex``: ``\\x`` and the digits)."""
    if not text.startswith(b"\\x"):
        raise ValueError(f"bytea not in hex output: {text[:20]!r}")
    return binascii.unhexlify(memoryview(text)[2:])


#: The advisory locks of effects' turns are the two-int4 kind, this first half: apart
#: from the one-bigint kind (which applications and the table creation use).
_TURN_CLASS: Final = 0x1DE4_7052
#: The second half of the turn over every effect of the database (a name's is never 0).
_TURN_ALL: Final = 0


def _lock_ids(names: Iterable[str | int]) -> tuple[int, ...]:
    """The advisory lock ids of an effect's ``locks`` names: a stable 32-bit hash of
    each name's text (the same in every process and machine), never ``_TURN_ALL``;
    sorted and distinct, the order every batch takes them in. Two names that share an
    id only take turns when they need not."""
    if isinstance(names, (str, bytes)):
        raise TypeError(f"PostgresEffect locks must be a collection of names, not {names!r}")
    ids = set()
    for name in names:
        if isinstance(name, bool) or not isinstance(name, (str, int)):
            raise TypeError(
                f"a PostgresEffect lock name is a str or an int, not {type(name).__name__}"
            )
        try:
            text = str(name).encode()
        except UnicodeEncodeError as exc:
            raise ValueError(f"PostgresEffect lock name {name!r} is not valid text") from exc
        ids.add(zlib.crc32(text) - 0x8000_0000 or 1)
    return tuple(sorted(ids))


def _turns(ops: list[Op]) -> bytes | None:
    """The statement taking the turns of ``ops``' effects (see "Hot rows" in
    ``idempotency.stores.postgres``), or None when none has an effect."""
    shared = False
    ids: set[int] = set()
    for op in ops:
        if op.kind is _COMPLETE:
            effect = op.args[3].effect
        elif op.kind is _CLAIM_COMPLETE:
            effect = op.args[5].effect
        else:
            continue
        if effect is None:
            continue
        locks = effect.locks
        if locks is None:
            return b"SELECT pg_advisory_xact_lock(%d, %d)" % (_TURN_CLASS, _TURN_ALL)
        shared = True
        ids.update(locks)
    if not shared:
        return None
    # The turn over every effect, shared; then each name's, in ascending order (unnest
    # gives the array's order).
    query = b"SELECT pg_advisory_xact_lock_shared(%d, %d)" % (_TURN_CLASS, _TURN_ALL)
    if ids:
        query += b"; SELECT pg_advisory_xact_lock(%d, k) FROM unnest('{%s}'::int4[]) AS k" % (
            _TURN_CLASS,
            b",".join(b"%d" % i for i in sorted(ids)),
        )
    return query
