"""The SQL of :class:`~idempotency.stores.sqlite.SQLiteStore`: its schema, the layout
migration, and the statements its batches prepare, each text written once.

The texts live apart from the store so that the store's module reads as the batch's
mechanism; nothing here runs anything.
"""

from __future__ import annotations

from typing import Final

from .._record import COMPLETED, IN_PROGRESS

# The records are a rowid table, its primary key a unique index on (caller, key): rows
# are appended in the order their keys were first claimed, so a batch's claims and, a
# batch later, their completions rewrite a few of the table's newest pages, and only the
# claim touches a page of the index (a random one: keys are random). In a table
# clustered on the key (WITHOUT ROWID, the layout of files made before this one) the
# claim and the completion each rewrite a random leaf, so every call put two pages into
# the WAL. Measured with 50 claims and 50 completions a transaction over 100,000 rows:
# 12.4 -> 11.7 us of user and 14.1 -> 8.3 us of system CPU a call (WAL writes, fsync).
# Files of the older layout keep working as they are; SQLiteStore.migrate (``python -m
# idempotency migrate``) moves one into this layout.
_RECORDS_TABLE: Final = """
CREATE TABLE IF NOT EXISTS idempotency_records (
    caller      TEXT    NOT NULL,
    key         TEXT    NOT NULL,
    state       INTEGER NOT NULL,  -- _record.State: 1 in progress, 2 completed
    fingerprint BLOB    NOT NULL,  -- SHA-256 of the canonical request
    fence       INTEGER NOT NULL,  -- fencing token of the claim that wrote it
    expires_at  REAL    NOT NULL,  -- lease deadline, or end of retention (Unix time)
    ok          INTEGER NOT NULL,  -- completed: 1 value, 0 final error
    payload     BLOB,              -- completed: msgpack outcome; NULL in progress
    PRIMARY KEY (caller, key)
);
"""
_SCHEMA: Final = (
    _RECORDS_TABLE
    + """
CREATE TABLE IF NOT EXISTS idempotency_meta (
    name  TEXT PRIMARY KEY,
    value INTEGER NOT NULL
) WITHOUT ROWID;
INSERT OR IGNORE INTO idempotency_meta (name, value) VALUES ('fence', 0);
INSERT OR IGNORE INTO idempotency_meta (name, value) VALUES ('fence_ceiling', 0);
"""
)
# SQLiteStore.migrate: the records copied as they are into a table of the current layout,
# which then takes the old one's place (in one transaction). Copied in order of expiry, so
# that the automatic sweep, which walks the new table in rowid order, finds the records
# that expire together side by side.
_MIGRATING: Final = "idempotency_records_migrating"
_MIGRATE: Final = (
    _RECORDS_TABLE.replace("IF NOT EXISTS idempotency_records", _MIGRATING),
    f"INSERT INTO {_MIGRATING} (caller, key, state, fingerprint, fence, expires_at, ok, payload)"
    " SELECT caller, key, state, fingerprint, fence, expires_at, ok, payload"
    " FROM idempotency_records ORDER BY expires_at",
    "DROP TABLE idempotency_records",
    f"ALTER TABLE {_MIGRATING} RENAME TO idempotency_records",
)

_SELECT_MANY: Final = (
    "SELECT caller, key, state, fingerprint, fence, expires_at, ok, payload"
    " FROM idempotency_records WHERE "
)
_ONE_KEY: Final = "(caller = ? AND key = ?)"
# The sizes of the working set's reads (see SQLiteStore._load), each a prepared statement.
_LOAD_SIZES: Final = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128)
_LOAD_SQL: Final = {n: _SELECT_MANY + " OR ".join([_ONE_KEY] * n) for n in _LOAD_SIZES}
_LOAD_SIZE_OF: Final = tuple(
    next(size for size in _LOAD_SIZES if size >= n) if n else 0 for n in range(_LOAD_SIZES[-1] + 1)
)
# Columns in the order of Record's fields, after (caller, key).
_UPSERT: Final = (
    "INSERT INTO idempotency_records"
    " (caller, key, state, fingerprint, fence, expires_at, ok, payload)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
    " ON CONFLICT (caller, key) DO UPDATE SET state = excluded.state,"
    " fingerprint = excluded.fingerprint, fence = excluded.fence,"
    " expires_at = excluded.expires_at, ok = excluded.ok, payload = excluded.payload"
)
# An in-progress record (no payload yet): the NULL is written in the statement, since a
# None parameter costs sqlite3 a failed adapter lookup (an AttributeError built and
# cleared, about 2,000 instructions) where an int, float, str or bytearray costs none.
_UPSERT_IN_PROGRESS: Final = _UPSERT.replace("?, ?)", "?, NULL)", 1)
_DELETE: Final = "DELETE FROM idempotency_records WHERE caller = ? AND key = ?"
# A completion of a claim this store granted, without reading its row first: the row is
# written only where it is still what complete() accepts and decode_record() reads (the
# live in-progress record of that fence and fingerprint). The updated row count tells
# whether every one was; if not, they are rolled back and read and decided as usual.
_COMPLETE_HELD: Final = (
    f"UPDATE idempotency_records SET state = {int(COMPLETED)}, expires_at = ?, ok = ?,"
    " payload = ? WHERE caller = ? AND key = ? AND fence = ? AND fingerprint = ?"
    f" AND state = {int(IN_PROGRESS)} AND typeof(expires_at) IN ('real', 'integer')"
    " AND expires_at > ? AND ok IN (0, 1) AND payload IS NULL"
)
# Claims of keys that have no row (every first call of a key), written without reading
# them first: OR IGNORE leaves a key that has a row as it is, and the row count then tells
# whether every claim of the batch found its key new (SQLiteStore._claim_new_keys). Many
# rows a statement, of a few sizes (each kept prepared): one step, and one release of
# the GIL, for a run of claims, where a statement a row took one each. OR IGNORE never
# stops a statement halfway, so SQLite keeps no statement journal for it.
_CLAIM_NEW: Final = (
    "INSERT OR IGNORE INTO idempotency_records"
    " (caller, key, state, fingerprint, fence, expires_at, ok, payload) VALUES "
)
_NEW_ROW: Final = 7  # parameters a row
_NEW_ROWS_SIZES: Final = (64, 32, 16, 8, 4, 2, 1)
_CLAIM_NEW_ROWS: Final = {
    n: _CLAIM_NEW + ", ".join(["(?, ?, ?, ?, ?, ?, ?, NULL)"] * n) for n in _NEW_ROWS_SIZES
}
_DELETE_NEW: Final = "DELETE FROM idempotency_records WHERE caller = ? AND key = ? AND fence = ?"
_NEW_CLAIMS_WAIT_MAX: Final = 64  # batches read first after misses in a row, at most
_HELD_MAX: Final = 65536  # claims remembered (an optimisation only: forgotten past it)
_SWEEP_SQL: Final = "DELETE FROM idempotency_records WHERE expires_at <= ?"
_SWEEP_STEP: Final = 512  # rows an automatic sweep looks at
# The automatic sweep's walk: in rowid order (the table's own, no index), or in key order
# in a file of the older layout, which has no rowid.
_SWEEP_SCAN: Final = (
    "SELECT caller, key, expires_at, rowid FROM idempotency_records"
    " WHERE rowid > ? ORDER BY rowid LIMIT ?"
)
_SWEEP_SCAN_BY_KEY: Final = (
    "SELECT caller, key, expires_at FROM idempotency_records"
    " WHERE (caller, key) > (?, ?) ORDER BY caller, key LIMIT ?"
)
_CLUSTERED_ON_KEY: Final = (
    "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'idempotency_records'"
    " AND upper(sql) LIKE '%WITHOUT ROWID%'"
)
_READ_FENCE: Final = (
    "SELECT (SELECT value FROM idempotency_meta WHERE name = 'fence'),"
    " (SELECT value FROM idempotency_meta WHERE name = 'fence_ceiling')"
)
_WRITE_FENCE: Final = "UPDATE idempotency_meta SET value = ? WHERE name = 'fence'"
_WRITE_CEILING: Final = "UPDATE idempotency_meta SET value = ? WHERE name = 'fence_ceiling'"
# After a restart, tokens resume above every token a claim may have handed out before
# its commit reached the disk (see "Durability" above).
_SKIP_TO_CEILING: Final = (
    "UPDATE idempotency_meta SET value = max(value,"
    " (SELECT value FROM idempotency_meta WHERE name = 'fence_ceiling')) WHERE name = 'fence'"
)
