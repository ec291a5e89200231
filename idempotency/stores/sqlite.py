"""SQLiteStore: the embedded, durable default -- one file, WAL, group commit.

Durability
----------
The database runs in WAL mode with ``synchronous=FULL`` by default: every commit that
records an outcome (a completion, its effect, a release, ``transact``) is fsynced before
its reply leaves, so an acknowledged record survives a power loss. A batch of claims
and reads alone commits without an fsync (``NORMAL``): a claim is no answer to anyone,
a process crash keeps it (WAL), and the next durable commit makes it durable. A power
loss may lose it -- and with it every process of the machine, the claim's holder
included -- so the key is free again on restart, as after a lapsed lease. Fencing
tokens stay monotonic through that: a durable batch reserves tokens ahead
(``fence_ceiling``, 4096 more once half are used), a claim batch hands out tokens only
below the durable reservation (else it is redone durably), and a store opening skips
the counter to the reservation. Measured here: an fsynced commit took 5 ms on the
loaded disk, a ``NORMAL`` one 0.1 ms; claims are half of all batches. Several
processes on one machine may share the file: each batch is a ``BEGIN IMMEDIATE``
transaction (SQLite's write lock, waited for up to ``busy_timeout``), and fencing tokens
come from a counter row updated in the same transaction, so they rise across processes.

The write-ahead log stays bounded
---------------------------------
The store checkpoints the WAL itself once it holds ``wal_limit`` bytes (1 MiB by
default, where SQLite's own 1,000 pages are about 4 MiB, more than a small disk has):
``PRAGMA wal_autocheckpoint`` at that many pages, so the commit that passes the bound
runs SQLite's automatic checkpoint, on the store's connection and the committer's
thread, once that commit is durable. It is ``PASSIVE``: it copies into the database file
what no reader still needs and waits for nobody, and its failure (another process's
checkpoint, a full disk) is SQLite's to ignore, never a call's. Once the whole log is
copied the next commit writes the log again from its start, and the file is cut back to
``wal_limit`` if it grew past it (``PRAGMA journal_size_limit``: a reader in another
process held the log, a batch was large). A batch that fails for want of room
(``SQLITE_FULL``, a disk I/O error) is followed by a ``TRUNCATE`` checkpoint that waits
for nobody (busy timeout 0): the automatic one runs only after a commit, and a log that
holds the disk's last room lets none through. :meth:`SQLiteStore.close` ends with the
same checkpoint: SQLite checkpoints at close only as the file's last connection.

So a store whose disk filled up works again once room is freed, without a restart,
and keeps its log within the bound (a log that only grew would fill the room freed
again, and a checkpoint needs room to grow the database file). A checkpoint never loses
or damages a committed record: it copies pages the log holds, and the log is written
again only once they are in the database file and synced; one that cannot finish leaves
the log to the next. The trigger costs nothing a commit (SQLite counts the log's frames
at every commit anyway); checkpoints four times as often cost, measured over 5,000 to
20,000 calls, 3 to 7% more fsyncs and 2% more bytes written. ``wal_limit=4 << 20``
keeps the old cost, for a disk with room.

Group commit
------------
sqlite3 calls block, so they run off the scheduler (on the committer's own thread, which
wakes the runtime through its netpoller) and never stall other goroutines. Operations
of concurrent calls -- claims, completions with their effects, releases, reads -- go
through one :class:`~._batch.GroupCommitter`: those that arrive while a batch is being
written are applied together in the next transaction, and one fsync makes them all
durable. Replies are released only after that commit returns.

Within a batch, an operation's failure is its own: a stale completion, a corrupted row or
an argument the table cannot hold (refused before it joins the batch) writes nothing and
fails that call alone, and an operation that runs user code (an effect, :meth:`transact`) runs
inside its own ``SAVEPOINT``, so an exception rolls back only that operation. (An
``atomic`` effect runs without one; should it fail after writing, the batch is rolled
back and applied again with savepoints: see :class:`SQLiteEffect`.) Only a
failure of the transaction itself (disk error, lock timeout, failed commit) fails the
whole batch, and then nothing of it was committed: every operation gets
:class:`StoreUnavailable` and every caller may retry.

Exactly-once effects
--------------------
A handler returns ``SQLiteEffect(fn)``; ``fn(conn)`` runs on the store's connection
inside the transaction and savepoint that complete the record, after the fencing token
is checked, and returns the call's result. A crash at any point leaves both the effect
and the record or neither (SQLite's atomic commit). A final ApplicationError raised by
``fn`` rolls back its writes and records the error. ``claim_and_complete`` (the
``OneStepStore`` step, ``Idempotency.run(..., one_step=True)``) does the claim in the
same transaction too: the record is written once, completed, and a failed effect leaves
no claim behind.
"""

from __future__ import annotations

import functools
import operator
import os
import sqlite3
import time
from collections.abc import Callable
from typing import Any, Final

import gosim

from .._accel import speedups as _speedups
from .._errors import (
    ApplicationError,
    CorruptedRecord,
    IdempotencyError,
    InProgress,
    StoreUnavailable,
)
from .._record import (
    COMPLETED,
    ClaimKind,
    ClaimResult,
    Record,
    _new_record,
    claim,
    complete,
    decode_record,
)
from ._batch import (
    BatchedOneStepStore,
    GroupCommitter,
    Op,
    OpKind,
    WorkingSet,
    apply_plain,
    current,
)
from ._contract import (
    Effect,
    StoredRecord,
    refused_on_virtual_clock,
    run_effect,
)
from ._sqlite_sql import (
    _CLAIM_NEW_ROWS,
    _CLUSTERED_ON_KEY,
    _COMPLETE_HELD,
    _DELETE,
    _DELETE_NEW,
    _HELD_MAX,
    _LOAD_SIZE_OF,
    _LOAD_SIZES,
    _LOAD_SQL,
    _MIGRATE,
    _NEW_CLAIMS_WAIT_MAX,
    _NEW_ROW,
    _NEW_ROWS_SIZES,
    _ONE_KEY,
    _READ_FENCE,
    _SCHEMA,
    _SELECT_MANY,
    _SKIP_TO_CEILING,
    _SWEEP_SCAN,
    _SWEEP_SCAN_BY_KEY,
    _SWEEP_SQL,
    _SWEEP_STEP,
    _UPSERT,
    _UPSERT_IN_PROGRESS,
    _WRITE_CEILING,
    _WRITE_FENCE,
)

__all__ = ["SQLiteEffect", "SQLiteStore"]

_CLAIM: Final = OpKind.CLAIM
_COMPLETE: Final = OpKind.COMPLETE
_RELEASE: Final = OpKind.RELEASE
_GET: Final = OpKind.GET
_SWEEP: Final = OpKind.SWEEP
_TRANSACT: Final = OpKind.TRANSACT
_CLAIM_COMPLETE: Final = OpKind.CLAIM_COMPLETE
_RENEW: Final = OpKind.RENEW
_KEYED: Final = frozenset({_CLAIM, _COMPLETE, _RELEASE, _GET, _CLAIM_COMPLETE, _RENEW})
_PLAIN: Final = frozenset({_RELEASE, _GET, _RENEW})  # apply_plain's

FENCE_RESERVE: Final = 4096  # tokens a durable batch reserves ahead for claim batches
# Batches of these only commit without fsync (a renewal, like a claim, answers no one).
_LIGHT: Final = frozenset({_CLAIM, _GET, _RENEW})
_ONLY_CLAIMS: Final = frozenset({_CLAIM})
_kind_of: Final = operator.attrgetter("kind")
# What _apply did with a batch (compared by identity).
_APPLIED: Final = "applied"
_NEEDS_DURABLE: Final = "rolled back: needs tokens past the ceiling"
_NEEDS_CAREFUL: Final = "rolled back: an atomic effect failed after writing"
_NEEDS_ALONE: Final = "rolled back: one operation failed the batch's transaction"

_SYNCHRONOUS: Final = ("OFF", "NORMAL", "FULL", "EXTRA")
_WAL_LIMIT: Final = 1 << 20  # bytes of WAL frames before the store checkpoints (see above)
# Errors after which the log is checkpointed and truncated (primary result codes).
_OUT_OF_ROOM: Final = frozenset({sqlite3.SQLITE_FULL, sqlite3.SQLITE_IOERR})
_TRUNCATE: Final = "PRAGMA wal_checkpoint(TRUNCATE)"
# Errors meaning the file itself is damaged, not that it is busy or unreachable.
_CORRUPT_MARKERS: Final = ("malformed", "not a database", "corrupt")


class SQLiteEffect(Effect):
    """An effect committed with its record: ``fn(conn)`` runs on the store's connection,
    inside the transaction (and a savepoint) that completes the record, and returns the
    call's result.

    ``fn`` must not commit, roll back or begin transactions itself, and must not keep
    ``conn``. It runs on an OS thread (off the scheduler), so it must not call gosim. It
    must not read or write the store's own tables (``idempotency_records``,
    ``idempotency_meta``: a batch's records are written at its end). It must act only
    through ``conn``: it may run more than once for one record, since a
    transaction that is rolled back (a failed commit, or the redo below) is run again,
    and only the run whose transaction commits counts.

    ``atomic=True`` promises that ``fn`` has written nothing when it raises: its writes
    are one statement (SQLite undoes a failed statement whole, its triggers included),
    or it raises only before its first write. The store then runs it without a
    savepoint of its own, two statements fewer a call. Should it raise after writing
    all the same, or return a result that cannot be recorded, the store sees the
    connection's change count moved, rolls the whole batch back and applies it again
    with a savepoint around every effect, so nothing of the failed effect is kept.
    Writes SQLite does not count as changes (schema statements) are not seen: an effect
    that makes them must not say ``atomic``.
    """

    __slots__ = ("atomic", "fn")

    def __init__(self, fn: Callable[[sqlite3.Connection], Any], *, atomic: bool = False) -> None:
        self.fn = fn
        self.atomic = atomic


class _RedoCarefully(Exception):
    """An atomic effect failed after writing: the batch is rolled back and applied
    again with a savepoint around every effect."""


def _rollback(conn: sqlite3.Connection) -> None:
    """Roll back the open transaction; a failure to (the connection gone) leaves it to
    the next BEGIN to say why."""
    try:
        conn.execute("ROLLBACK")
    except sqlite3.Error:
        pass


class SQLiteStore(BatchedOneStepStore):
    """Records in one SQLite file, durable and shared by the processes of one machine.

    ``synchronous``: SQLite's setting; ``"FULL"`` (default) fsyncs every commit,
    ``"NORMAL"`` survives a process crash but may lose the last commits on power loss.
    ``group_commit=False`` gives every operation its own transaction (for comparison:
    it is several times slower under concurrency). ``max_batch`` bounds a transaction.
    ``busy_timeout``: how long to wait for another process's write lock before
    :class:`StoreUnavailable`. ``clock``: the time leases and retention are judged by,
    stored in the file; None (the default) is Unix time (``time.time``), which a
    runtime on a virtual clock does not move, so there every operation fails with
    :class:`RuntimeError` saying why (give the store a clock that follows the
    runtime's: ``clock=lambda: base + gosim.now()``). Every
    ``sweep_every`` batches (0: never) the next 512 records in table order are checked
    and the expired ones deleted, in the batch's transaction; :meth:`sweep` deletes all
    of them at once (a scan of the table). ``wal_limit``: the bytes of write-ahead log
    past which the store checkpoints it (1 MiB; at least one page), and the size its
    file is cut back to; a lower bound costs more checkpoints (see "The write-ahead
    log stays bounded" in the module's documentation). After a full disk the same store
    works again once room is freed, without a restart.

    One store object serves one gosim runtime at a time. The connection is opened at
    construction; :meth:`close` closes it.
    """

    _effect_type = SQLiteEffect
    _clock: Callable[[], float]

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        synchronous: str = "FULL",
        group_commit: bool = True,
        max_batch: int = 512,
        busy_timeout: float = 30.0,
        clock: Callable[[], float] | None = None,
        sweep_every: int = 64,
        wal_limit: int = _WAL_LIMIT,
    ) -> None:
        if synchronous.upper() not in _SYNCHRONOUS:
            raise ValueError(f"synchronous must be one of {_SYNCHRONOUS}, not {synchronous!r}")
        if type(wal_limit) is not int or wal_limit < 1:
            raise ValueError(f"wal_limit must be a positive int (bytes), not {wal_limit!r}")
        self.path = os.fspath(path)
        self._clock = time.time if clock is None else clock
        self._clock_given = clock is not None
        self._name = f"SQLiteStore({self.path!r})"
        try:
            conn = sqlite3.connect(
                self.path, timeout=busy_timeout, isolation_level=None, check_same_thread=False
            )
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"{self._name}: cannot open the database: {exc}") from exc
        try:
            mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            conn.execute(f"PRAGMA synchronous={synchronous.upper()}")
            # The WAL's bound (see "The write-ahead log stays bounded" above): SQLite's
            # automatic checkpoint at that many pages, and the file cut back to it.
            page_size = conn.execute("PRAGMA page_size").fetchone()[0]
            conn.execute(f"PRAGMA wal_autocheckpoint={max(1, wal_limit // page_size)}")
            conn.execute(f"PRAGMA journal_size_limit={wal_limit}")
            conn.executescript(_SCHEMA)
            clustered_on_key = conn.execute(_CLUSTERED_ON_KEY).fetchone() is not None
            conn.execute("BEGIN IMMEDIATE")
            conn.execute(_SKIP_TO_CEILING)
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            conn.close()
            raise self._store_error(exc, "opening") from exc
        self.journal_mode = mode
        self.wal_limit = wal_limit
        # The busy timeout in force, as sqlite3.connect set it (ms), put back after a
        # checkpoint that waits for nobody (_checkpoint_truncate).
        self._busy_ms = int(busy_timeout * 1000)
        self._sync_durable = synchronous.upper()
        # Claims need no fsync of their own: "NORMAL" unless the caller chose less.
        self._sync_light = (
            "NORMAL" if self._sync_durable in ("FULL", "EXTRA") else self._sync_durable
        )
        self._sync_now = self._sync_durable
        self._conn: sqlite3.Connection | None = conn
        # The store's own per-call statements (an effect's savepoint, its record) go
        # through one cursor: Connection.execute makes and drops a cursor every call.
        self._cursor = conn.cursor()
        self._committer = GroupCommitter(
            self._apply_batch,
            max_batch if group_commit else 1,
            refused=None if self._clock_given else self._refused,
        )
        self._sweep_every = sweep_every
        self._batches_to_sweep = sweep_every
        # A file of the older layout (see _SCHEMA) has no rowid to walk: its sweep walks
        # the key.
        self._clustered_on_key = clustered_on_key
        # The claims this store granted and has not seen completed: (caller, key) ->
        # (fence, fingerprint). Their completion needs no read of the row
        # (_COMPLETE_HELD); on the committer's thread only.
        self._held: dict[tuple[str, str], tuple[int, bytes]] = {}
        # Batches left to read before claims are tried unread again (_claim_new_keys),
        # and the wait after the next miss; on the committer's thread only.
        self._new_claims_wait = 0
        self._new_claims_backoff = 0
        # The automatic sweep resumes after this rowid (or key).
        self._sweep_cursor: Any = ("", "") if clustered_on_key else 0

    def __repr__(self) -> str:
        return self._name

    # ------------------------------------------------------------------ public API

    async def sweep(self) -> int:
        """Delete every expired record, in a batch of its own (a scan of the table)."""
        return await self._committer.submit(Op(_SWEEP, ()))  # type: ignore[no-any-return]

    async def transact(self, fn: Callable[[sqlite3.Connection], Any]) -> Any:
        """Run ``fn(conn)`` in the next group-committed transaction; return its result.

        For the application's own tables (a ledger's accounts and balances): reads see
        every committed effect, and writes commit durably with the batch. ``fn`` runs in
        a savepoint, so its exception rolls back only its own writes and is raised here.
        The rules of :class:`SQLiteEffect` apply to ``fn``.
        """
        return await self._committer.submit(Op(_TRANSACT, (fn,)))

    async def migrate(self) -> int | None:
        """Move the records of a file of the older layout (the table clustered on the
        key, ``WITHOUT ROWID``) into the current one, as they are, in one durable
        transaction; return how many were moved, or None (and change nothing) when the
        file has the current layout already.

        Safe while other processes use the file: the transaction takes SQLite's write
        lock (waiting up to the busy timeout), readers go on reading the old table until
        it commits, and a process killed meanwhile leaves the file as it was. Stores
        open elsewhere go on working on the new table (their automatic sweep walks it
        in key order until they are reopened)."""
        return await gosim.syscall(self._migrate)

    def _migrate(self) -> int | None:
        """``migrate``, on the syscall thread, between two batches (the committer's
        lock) on the store's connection."""
        with self._committer._thread_lock:
            conn = self._conn
            if conn is None:
                raise StoreUnavailable(f"{self._name}: the store is closed")
            try:
                if self._sync_now != self._sync_durable:  # only between transactions
                    conn.execute(f"PRAGMA synchronous={self._sync_durable}")
                    self._sync_now = self._sync_durable
                conn.execute("BEGIN IMMEDIATE")
                try:
                    moved = None
                    if conn.execute(_CLUSTERED_ON_KEY).fetchone() is not None:
                        create, copy, drop, rename = _MIGRATE
                        conn.execute(create)
                        moved = conn.execute(copy).rowcount
                        conn.execute(drop)
                        conn.execute(rename)
                    conn.execute("COMMIT")
                except BaseException:
                    if conn.in_transaction:
                        try:
                            conn.execute("ROLLBACK")
                        except sqlite3.Error:
                            pass  # the next transaction's BEGIN says what is wrong
                    raise
            except sqlite3.Error as exc:
                raise self._store_error(exc, "moving the records into the current layout") from exc
            self._clustered_on_key = False
            self._sweep_cursor = 0
            return moved

    def _close(self) -> None:
        conn = self._conn
        if conn is not None:
            self._conn = None
            # SQLite checkpoints at close only as the file's last connection; beside
            # others (processes sharing the file) the log would stay as it was.
            self._checkpoint_truncate(conn)
            conn.close()

    def _checkpoint_truncate(self, conn: sqlite3.Connection) -> None:
        """Copy the whole log into the database file and cut the log's file to nothing,
        waiting for nobody: where another connection writes, checkpoints or reads a part
        of the log, SQLite does what it can now (or nothing) and the rest waits for the
        automatic checkpoint. Never raises: its failure is no caller's."""
        if conn.in_transaction:
            return  # a transaction a failed ROLLBACK left: its next BEGIN says why
        try:
            conn.execute("PRAGMA busy_timeout=0")
            try:
                conn.execute(_TRUNCATE).fetchone()
            finally:
                conn.execute(f"PRAGMA busy_timeout={self._busy_ms}")
        except sqlite3.Error:
            pass  # a full disk, a damaged file: the next batch's error says so

    # ------------------------------------------------------- on the syscall thread

    def _store_error(self, exc: sqlite3.Error, doing: str) -> IdempotencyError:
        text = str(exc)
        if isinstance(exc, sqlite3.DatabaseError) and any(m in text for m in _CORRUPT_MARKERS):
            return CorruptedRecord(f"{self._name}: {doing}: the database is damaged: {text}")
        return StoreUnavailable(f"{self._name}: {doing}: {text}")

    def _decode(self, row: tuple[Any, ...] | None, caller: str, key: str) -> Record | None:
        return None if row is None else decode_record(row, self._name, caller, key)

    def _load(
        self, conn: sqlite3.Connection, ops: list[Op]
    ) -> dict[tuple[str, str], Record | CorruptedRecord | None]:
        """The working set: the stored record of every key the batch touches, read with
        one statement per 128 keys (a corrupted row is kept as its error).

        The statement is an OR of primary-key equalities, which SQLite answers with one
        index search per key (``MULTI-INDEX OR``); a row-value ``IN (VALUES ...)``
        scans the table instead.
        """
        wanted = _batch_keys(ops)
        ws: WorkingSet = dict.fromkeys(wanted)
        for i in range(0, len(wanted), _LOAD_SIZES[-1]):
            chunk = wanted[i : i + _LOAD_SIZES[-1]]
            # One of a few fixed sizes, the last key repeated to fill it (a row is read
            # once whatever the OR repeats): sqlite3's statement cache then keeps every
            # statement prepared, where a size per batch prepared one per batch (about a
            # tenth of a batch's instructions).
            size = _LOAD_SIZE_OF[len(chunk)]
            params = [part for rk in chunk for part in rk]
            params += chunk[-1] * (size - len(chunk))
            _decode_into(conn.execute(_LOAD_SQL[size], params), ws, self._decode_row)
        return ws

    def _decode_row(self, row: tuple[Any, ...]) -> Record | CorruptedRecord:
        """A read row's record, or the error saying how it is damaged."""
        try:
            return self._decode(row[2:], row[0], row[1])  # type: ignore[return-value]
        except CorruptedRecord as exc:
            return exc

    def _apply_batch(self, ops: list[Op]) -> None:
        """Apply ``ops`` in one transaction: without an fsync when they are all claims
        and reads, unless their tokens would pass the reserved ceiling (then again,
        durably)."""
        # Whether any operation is not light, without a Python frame per operation.
        durable = not _LIGHT.issuperset(map(_kind_of, ops))
        careful = False
        while True:
            outcome = self._apply(ops, durable, careful)
            if outcome is _APPLIED:
                return
            # Rolled back, nothing applied: again, durably or with savepoints. At most
            # twice: a light batch has no effects, and a careful one is never redone.
            for op in ops:
                op.result = op.error = None
            if outcome is _NEEDS_ALONE:
                # Something in the batch failed its commit (a constraint an effect broke
                # that SQLite checks at COMMIT, a row the table refuses): each operation
                # again in a transaction of its own, so that only the bad one fails.
                for op in ops:
                    self._apply_batch([op])
                return
            if outcome is _NEEDS_DURABLE:
                durable = True
            else:
                careful = True

    def _apply(self, ops: list[Op], durable: bool, careful: bool) -> str:
        """Apply ``ops`` in order in one transaction (on the syscall thread).

        Returns ``_APPLIED``; or, rolled back with nothing applied, ``_NEEDS_DURABLE``
        when a light batch needs tokens past the ceiling, ``_NEEDS_CAREFUL`` when an
        atomic effect failed after writing (``careful``: every effect in a savepoint),
        ``_NEEDS_ALONE`` when a batch of several failed in a way one operation may have
        caused (a constraint, a bug) rather than the store (busy, I/O).

        Records are read up front into a working set, every operation is decided by the
        pure functions of ``_record`` against it (the record-only ones by ``_decide``,
        a C call for a whole run of them), and the changed records are written
        back with one ``executemany`` per kind of write at the end (before a sweep,
        which deletes by SQL): a few statements per batch rather than two per
        operation. User SQL (effects, ``transact``) never touches these tables, so it
        needs no flush before it. Two kinds of operation skip the read when their rows
        are as expected: completions of claims this store granted (``_complete_held``)
        and, in a batch of nothing but claims, claims of keys that have no row
        (``_claim_new_keys``); a row not as expected sends them down the usual path.
        """
        conn = self._conn
        if conn is None:
            closed = StoreUnavailable(f"{self._name}: the store is closed")
            for op in ops:
                op.error = closed
            return _APPLIED
        now = self._clock()
        try:
            level = self._sync_durable if durable else self._sync_light
            if level != self._sync_now:  # only between transactions
                conn.execute(f"PRAGMA synchronous={level}")
                self._sync_now = level
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            err = self._store_error(exc, "beginning a transaction")
            for op in ops:
                op.error = err
            self._after_failure(conn, exc)
            return _APPLIED
        try:
            return self._write_batch(conn, ops, now, durable, careful)
        except _RedoCarefully:
            _rollback(conn)  # should it fail, the redo's BEGIN says why to every operation
            return _NEEDS_CAREFUL
        except BaseException as exc:
            # Nothing of the batch may stay in an open transaction, where the next
            # batch's commit would take it.
            _rollback(conn)
            if not isinstance(exc, Exception):  # an interrupt raised in an effect
                for op in ops:
                    op.result = None
                raise
            return self._batch_failed(conn, ops, exc)

    def _write_batch(
        self, conn: sqlite3.Connection, ops: list[Op], now: float, durable: bool, careful: bool
    ) -> str:
        """The body of :meth:`_apply`'s transaction, from the fence's read to the
        commit: ``_APPLIED``, or ``_NEEDS_DURABLE`` rolled back. What it raises,
        ``_apply`` rolls back and judges (``_batch_failed``)."""
        fence0, ceiling0 = conn.execute(_READ_FENCE).fetchone()
        fence, ceiling = fence0, ceiling0
        # Completions of claims this store holds skip the read (_complete_held).
        held = _split_held(ops, self._held) if self._held else None
        work = ops if held is None else held[1]
        if self._new_claims_wait:
            self._new_claims_wait -= 1
        elif _ONLY_CLAIMS.issuperset(map(_kind_of, work)) and work:
            after = self._claim_new_keys(conn, work, now, fence)
            if after is not None:
                fence = after
                work = []
        ws = self._load(conn, work)
        dirty: dict[tuple[str, str], Record | None] = {}
        i, n = 0, len(work)
        while True:
            # The record-only operations (claims, completions without an effect) a run
            # at a time; _decide stops at any other.
            i, fence = _decide(work, i, ws, dirty, now, fence)
            if i == n:
                break
            fence = self._apply_one(conn, work[i], ws, dirty, now, fence, careful)
            i += 1
        self._flush(conn, dirty)
        if held is not None:
            self._complete_held(conn, held[0], now, fence)
        if self._sweep_every > 0:
            self._batches_to_sweep -= 1
            if self._batches_to_sweep <= 0:
                self._batches_to_sweep = self._sweep_every
                self._sweep_step(conn, now)
        if fence > ceiling and not durable:
            conn.execute("ROLLBACK")
            return _NEEDS_DURABLE
        if durable and ceiling - fence < FENCE_RESERVE // 2:
            ceiling = fence + FENCE_RESERVE
        if fence != fence0:
            conn.execute(_WRITE_FENCE, (fence,))
        if ceiling != ceiling0:
            conn.execute(_WRITE_CEILING, (ceiling,))
        conn.execute("COMMIT")
        _note_held(ops, self._held)
        return _APPLIED

    def _apply_one(
        self,
        conn: sqlite3.Connection,
        op: Op,
        ws: dict[tuple[str, str], Any],
        dirty: dict[tuple[str, str], Record | None],
        now: float,
        fence: int,
        careful: bool,
    ) -> int:
        """Apply one operation that is not record-only (an effect's completion, a
        one-step claim and completion, a plain read or write, a sweep, a ``transact``)
        against the working set; return the fence after it. An error of its own is
        set on it (it changed nothing of the working set, and its batch-mates go on);
        the batch's (``_RedoCarefully``, ``sqlite3.Error``) is raised."""
        kind = op.kind
        try:
            if kind == _COMPLETE:
                caller, key, f, _ = op.args
                rk = (caller, key)
                rec = current(ws, rk)
                applied = self._effect_and_record(conn, op, f, rec, now, careful=careful)
                if applied is not None:
                    ws[rk] = dirty[rk] = applied
            elif kind == _CLAIM_COMPLETE:
                caller, key, fp, lease, call, _ = op.args
                rk = (caller, key)
                res = claim(current(ws, rk), fp, now, lease, fence + 1)
                if res.kind is not ClaimKind.CLAIMED:
                    op.result = res  # a replay, a mismatch, busy: nothing written
                else:
                    # The claim is written only as the completed record (or not at all
                    # when the effect fails): no in-progress row, ever.
                    fence += 1
                    call.fence = fence
                    applied = self._effect_and_record(
                        conn, op, fence, res.record, now, careful=careful, just_claimed=True
                    )
                    if applied is not None:
                        ws[rk] = dirty[rk] = applied
            elif kind in _PLAIN:
                apply_plain(op, ws, dirty, now)
            elif kind == _SWEEP:
                self._flush(conn, dirty)
                op.result = conn.execute(_SWEEP_SQL, (now,)).rowcount
            else:
                self._transact(conn, op)
        except (_RedoCarefully, sqlite3.Error):
            raise  # the batch's, not this operation's
        except Exception as exc:
            # This operation's alone (a stale claim, a corrupted row, an argument a
            # store caller got wrong).
            op.error = exc
        return fence

    def _batch_failed(self, conn: sqlite3.Connection, ops: list[Op], exc: Exception) -> str:
        """The batch's transaction failed with ``exc`` and was rolled back: nothing of
        it is committed. ``_NEEDS_ALONE`` when one operation of several may have caused
        it, else every operation gets its error and ``_APPLIED``."""
        if isinstance(exc, sqlite3.Error) and not isinstance(
            exc, (sqlite3.IntegrityError, sqlite3.ProgrammingError, sqlite3.InterfaceError)
        ):
            # The transaction as a whole failed (busy, I/O, full): the store's.
            err = self._store_error(exc, "committing a batch")
            for op in ops:
                op.result = None
                op.error = err
            self._after_failure(conn, exc)
            return _APPLIED
        # A statement refused what an operation gave it, or an argument broke the
        # batch's shared code: that operation's, not the store's. Alone, it fails by
        # itself.
        if len(ops) > 1:
            return _NEEDS_ALONE
        ops[0].result = None
        ops[0].error = exc
        return _APPLIED

    def _after_failure(self, conn: sqlite3.Connection, exc: sqlite3.Error) -> None:
        """After a batch failed for want of room (``SQLITE_FULL``, a disk I/O error):
        give the log's file back if it can be had now (_checkpoint_truncate). The
        automatic checkpoint runs only after a commit, and a log that holds the disk's
        last room lets no commit through: a checkpoint that copies pages the database
        file already has frees that room without one."""
        code = getattr(exc, "sqlite_errorcode", None)
        if code is not None and code & 0xFF in _OUT_OF_ROOM:
            self._checkpoint_truncate(conn)

    def _claim_new_keys(
        self, conn: sqlite3.Connection, ops: list[Op], now: float, fence: int
    ) -> int | None:
        """Claims (``ops``, nothing else) of keys that have no row, written without
        a read: each claim is decided as it would be against no record, and the rows
        are inserted where the key still has none (``_CLAIM_NEW``). If every one was,
        the claims are granted and the store's last fencing token is returned; if not
        (a retry, a duplicate in the batch, a record expired but not swept), the rows
        inserted are deleted and None is returned: the batch is read and decided as
        usual, and the next few batches read first (a backoff doubling to
        ``_NEW_CLAIMS_WAIT_MAX``)."""
        try:
            params, results = _new_claim_rows(ops, now, fence)
        except Exception:
            return None  # an argument the usual path says what is wrong with
        # Not in a savepoint: SQLite copies every page a savepoint's statements change
        # into a statement journal, which for a batch's random index pages spills to a
        # temporary file (a third more writes a call). The rows inserted are told apart
        # by their tokens instead, which no other row can have.
        inserted = 0
        for start, size in _chunks(len(ops)):
            rows = params[start * _NEW_ROW : (start + size) * _NEW_ROW]
            inserted += conn.execute(_CLAIM_NEW_ROWS[size], rows).rowcount
        if inserted == len(ops):
            for op, res in zip(ops, results, strict=True):
                op.result = res
            self._new_claims_backoff = 0
            return fence + len(ops)
        r = _NEW_ROW
        conn.executemany(
            _DELETE_NEW,
            [(params[i], params[i + 1], params[i + 4]) for i in range(0, len(params), r)],
        )
        self._new_claims_backoff = min(2 * self._new_claims_backoff or 1, _NEW_CLAIMS_WAIT_MAX)
        self._new_claims_wait = self._new_claims_backoff
        return None

    def _complete_held(
        self, conn: sqlite3.Connection, ops: list[Op], now: float, fence: int
    ) -> None:
        """Complete claims this store holds with one conditional write each, no read;
        if any row is no longer the live claim, none is written this way and all are
        read and decided as usual (so a stale claim fails as complete() says)."""
        held = self._held
        conn.execute("SAVEPOINT idempotency_held")
        if conn.executemany(_COMPLETE_HELD, _held_params(ops, held, now)).rowcount == len(ops):
            conn.execute("RELEASE idempotency_held")
            _held_records(ops, held, now)
            return
        conn.execute("ROLLBACK TO idempotency_held")
        conn.execute("RELEASE idempotency_held")
        ws = self._load(conn, ops)
        dirty: dict[tuple[str, str], Record | None] = {}
        _decide(ops, 0, ws, dirty, now, fence)
        self._flush(conn, dirty)

    def _sweep_step(self, conn: sqlite3.Connection, now: float) -> None:
        """Retention without a sweeper: look at the next 512 records in rowid order (key
        order in a file of the older layout) and delete the expired ones, wrapping
        around at the end of the table. Walking the table's own order costs no index
        on ``expires_at``, which would cost every write (measured: a third of a call's
        SQLite time); the whole table is visited once per ``rows / 512 * sweep_every``
        batches."""
        if self._clustered_on_key:
            rows = conn.execute(_SWEEP_SCAN_BY_KEY, (*self._sweep_cursor, _SWEEP_STEP)).fetchall()
            resume: Any = rows[-1][:2] if len(rows) == _SWEEP_STEP else ("", "")
        else:
            rows = conn.execute(_SWEEP_SCAN, (self._sweep_cursor, _SWEEP_STEP)).fetchall()
            resume = rows[-1][3] if len(rows) == _SWEEP_STEP else 0
        expired = [(row[0], row[1]) for row in rows if row[2] <= now]
        if expired:
            conn.executemany(_DELETE, expired)
        self._sweep_cursor = resume

    @staticmethod
    def _flush(conn: sqlite3.Connection, dirty: dict[tuple[str, str], Record | None]) -> None:
        """Write the changed records of the working set back."""
        if not dirty:
            return
        completed, in_progress, deleted = _rows(dirty)
        if completed:
            conn.executemany(_UPSERT, completed)
        if in_progress:
            conn.executemany(_UPSERT_IN_PROGRESS, in_progress)
        if deleted:
            conn.executemany(_DELETE, deleted)
        dirty.clear()

    def _effect_and_record(
        self,
        conn: sqlite3.Connection,
        op: Op,
        fence: int,
        rec: Record | None,
        now: float,
        *,
        careful: bool,
        just_claimed: bool = False,
    ) -> Record | None:
        """Run claim ``fence``'s effect (of ``op``'s completion, its last argument) in a
        savepoint; return its completed record (for the caller to write with the batch's
        others), or None when it failed: nothing of it stays and ``op`` carries the
        error. ``just_claimed``: ``rec`` is the claim this transaction has just made
        (claim_and_complete). An atomic effect runs without the savepoint unless
        ``careful``, and raises _RedoCarefully if it fails after writing."""
        caller, key, c = op.args[0], op.args[1], op.args[-1]
        effect = c.effect
        assert isinstance(effect, SQLiteEffect)  # checked by complete/claim_and_complete
        cur = self._cursor
        if not just_claimed:
            # Check the claim before the effect runs: a stale holder's effect must not
            # run. (A claim made a moment ago in this very transaction is live.)
            complete(rec, fence, True, b"", now, c.ttl, caller, key)
        if effect.atomic and not careful:
            changes = conn.total_changes
            try:
                ok, payload = run_effect(
                    functools.partial(effect.fn, conn),
                    c.max_result_bytes,
                    functools.partial(_nothing_written, conn, changes),
                )
                done = complete(rec, fence, ok, payload, now, c.ttl, caller, key)
            except _RedoCarefully:
                raise
            except Exception as exc:
                _nothing_written(conn, changes)
                if isinstance(exc, (IdempotencyError, ApplicationError)):
                    raise
                op.error = exc  # the effect's own failure, nothing written: this call only
                return None
            op.result = done
            return done
        cur.execute("SAVEPOINT idempotency_effect")
        try:
            # partial, not lambda: the effect is called without a frame of ours around it
            ok, payload = run_effect(
                functools.partial(effect.fn, conn),
                c.max_result_bytes,
                functools.partial(_rollback_to, cur),
            )
            done = complete(rec, fence, ok, payload, now, c.ttl, caller, key)
        except Exception as exc:
            _rollback_to(cur)
            cur.execute("RELEASE idempotency_effect")
            if isinstance(exc, (IdempotencyError, ApplicationError)):
                raise
            op.error = exc  # the effect's own failure (a bug, a constraint): this call only
            return None
        cur.execute("RELEASE idempotency_effect")
        op.result = done
        return done

    def _transact(self, conn: sqlite3.Connection, op: Op) -> None:
        conn.execute("SAVEPOINT idempotency_effect")
        try:
            value = op.args[0](conn)
        except Exception as exc:
            _rollback_to(conn)
            conn.execute("RELEASE idempotency_effect")
            op.error = exc  # the function's own failure: this call only
            return
        conn.execute("RELEASE idempotency_effect")
        op.result = value

    # ------------------------------------------------------------ operator's tools

    async def inspect(self, caller: str, key: str) -> StoredRecord | None:
        if refused := self._refused():
            raise refused
        return await gosim.syscall(self._inspect_or_forget, caller, key, False, False)

    async def forget(self, caller: str, key: str, *, force: bool = False) -> StoredRecord | None:
        if refused := self._refused():
            raise refused
        return await gosim.syscall(self._inspect_or_forget, caller, key, True, force)

    def _refused(self) -> RuntimeError | None:
        """Why the running runtime cannot use the store (its default clock on a
        virtual one), or None: the batches' check and the tools'."""
        if self._clock_given:
            return None
        return refused_on_virtual_clock(self._name, "Unix time (the default clock)")

    def _inspect_or_forget(
        self, caller: str, key: str, delete: bool, force: bool
    ) -> StoredRecord | None:
        """``inspect`` (``delete`` False) or ``forget``, on the syscall thread, between two
        batches (the committer's lock) on the store's connection. ``forget`` reads and
        deletes in one ``BEGIN IMMEDIATE`` transaction (SQLite's write lock: no other
        process's batch comes in between) and commits it durably."""
        doing = "forgetting a record" if delete else "reading a record"
        with self._committer._thread_lock:
            conn = self._conn
            if conn is None:
                raise StoreUnavailable(f"{self._name}: the store is closed")
            now = self._clock()
            try:
                if delete:
                    if self._sync_now != self._sync_durable:  # only between transactions
                        conn.execute(f"PRAGMA synchronous={self._sync_durable}")
                        self._sync_now = self._sync_durable
                    conn.execute("BEGIN IMMEDIATE")
                try:
                    row = conn.execute(_SELECT_MANY + _ONE_KEY, (caller, key)).fetchone()
                    held = None if row is None else self._stored(row[2:], caller, key, now)
                    if delete and held is not None:
                        if not force and held.state == "IN_PROGRESS":
                            raise InProgress(caller, key)
                        conn.execute(_DELETE, (caller, key))
                    if delete:
                        conn.execute("COMMIT")
                except BaseException:
                    if delete and conn.in_transaction:
                        try:
                            conn.execute("ROLLBACK")
                        except sqlite3.Error:
                            pass  # the next transaction's BEGIN says what is wrong
                    raise
            except sqlite3.Error as exc:
                raise self._store_error(exc, doing) from exc
        return held

    def _stored(self, row: tuple[Any, ...], caller: str, key: str, now: float) -> StoredRecord:
        try:
            return StoredRecord(caller, key, self._decode(row, caller, key), None, now)
        except CorruptedRecord as exc:
            return StoredRecord(caller, key, None, str(exc), now)


# ------------------------------------------------- a batch's record work, per operation
#
# The pure-Python reference of what the committer thread does per operation of a batch,
# apart from SQL: the keys it reads, the rows read back as records, the decisions of the
# record-only operations, the rows written back. With idempotency._speedups built these
# names are rebound to its C twins (at the end of this module), which answer the common
# cases and hand every other to the functions here, so behaviour is defined here;
# tests/idempotency/test_speedups.py compares the two.


# The claims this store granted and has not seen end, by key: (fence, fingerprint).
HeldClaims = dict[tuple[str, str], tuple[int, bytes]]


def _split_held(ops: list[Op], held: HeldClaims) -> tuple[list[Op], list[Op]] | None:
    """The batch's completions of claims this store holds whose key no other operation
    of the batch touches (their order among the rest cannot matter), and the rest; None
    when there are none."""
    mine: list[Op] = []
    rest: list[Op] = []
    others: set[tuple[str, str]] = set()
    for op in ops:
        if op.kind == _COMPLETE:
            caller, key, f, c = op.args
            h = held.get((caller, key))
            if h is not None and h[0] == f and c.effect is None:
                mine.append(op)
                continue
        if op.kind in _KEYED:
            others.add((op.args[0], op.args[1]))
        rest.append(op)
    if not mine:
        return None
    seen: set[tuple[str, str]] = set()
    for op in mine:
        rk = (op.args[0], op.args[1])
        if rk in others or rk in seen:
            return None  # rare: the usual path keeps the batch's order for all
        seen.add(rk)
    return mine, rest


def _held_params(ops: list[Op], held: HeldClaims, now: float) -> list[tuple[Any, ...]]:
    """The parameters of _COMPLETE_HELD for each of ``ops`` (completions of held
    claims, as _split_held picked them)."""
    params = []
    for op in ops:
        caller, key, f, c = op.args
        params.append(
            (
                now + c.ttl, 1 if c.ok else 0, bytearray(c.payload), caller, key, f,
                bytearray(held[caller, key][1]), now,
            )
        )  # fmt: skip
    return params


def _held_records(ops: list[Op], held: HeldClaims, now: float) -> None:
    """Each of ``ops``'s result: the completed record _COMPLETE_HELD wrote for it."""
    for op in ops:
        caller, key, f, c = op.args
        op.result = _new_record(
            Record, (COMPLETED, held[caller, key][1], f, now + c.ttl, c.ok, c.payload)
        )


def _new_claim_rows(ops: list[Op], now: float, fence: int) -> tuple[list[Any], list[ClaimResult]]:
    """For claims (``ops``) of keys that have no record: the parameters of their
    ``_CLAIM_NEW`` rows, one after the other, and each claim's result, each decided
    against no record with the store's next fencing tokens in order (as _decide_one
    would decide them)."""
    params: list[Any] = []
    results: list[ClaimResult] = []
    for op in ops:
        caller, key, fp, lease = op.args
        fence += 1
        res = claim(None, fp, now, lease, fence)
        rec = res.record
        params += (caller, key, rec.state, bytearray(rec.fingerprint), fence, rec.expires_at, 1)
        results.append(res)
    return params, results


def _chunks(n: int) -> list[tuple[int, int]]:
    """``n`` rows as (start, size) runs of the sizes of ``_CLAIM_NEW_ROWS``, largest
    first."""
    runs = []
    start = 0
    for size in _NEW_ROWS_SIZES:
        while n - start >= size:
            runs.append((start, size))
            start += size
    return runs


def _note_held(ops: list[Op], held: HeldClaims) -> None:
    """After a commit: remember the claims it granted, forget the ones it ended."""
    for op in ops:
        kind = op.kind
        if kind == _CLAIM:
            res = op.result
            if op.error is None and res is not None and res.kind is ClaimKind.CLAIMED:
                if len(held) >= _HELD_MAX:
                    held.clear()
                held[op.args[0], op.args[1]] = (res.record.fence, res.record.fingerprint)
        elif held and kind in (_COMPLETE, _RELEASE):
            held.pop((op.args[0], op.args[1]), None)


def _batch_keys(ops: list[Op]) -> list[tuple[str, str]]:
    """The distinct keys the keyed operations of ``ops`` touch, first seen first."""
    return list(dict.fromkeys([(op.args[0], op.args[1]) for op in ops if op.kind in _KEYED]))


def _decode_into(
    rows: Any,
    ws: WorkingSet,
    decode_row: Callable[[tuple[Any, ...]], Record | CorruptedRecord],
) -> None:
    """Put every row read (``(caller, key, *record columns)``) into the working set as
    ``decode_row`` makes it: its record, or the error saying how it is damaged."""
    for row in rows:
        ws[row[0], row[1]] = decode_row(row)


def _decide_one(
    op: Op,
    ws: WorkingSet,
    dirty: dict[tuple[str, str], Record | None],
    now: float,
    fence: int,
) -> int | None:
    """Apply ``op`` to the working set if it is a record-only operation (a claim, or a
    completion or claim_and_complete without an effect): set its result or its own
    error, note the records it changed in ``dirty``, and return the store's last fencing
    token after it. None, with nothing done, for any other operation."""
    kind = op.kind
    try:
        if (kind == _COMPLETE and op.args[3].effect is not None) or (
            kind == _CLAIM_COMPLETE and op.args[5].effect is not None
        ):
            return None
    except Exception:
        return None  # not a completion: the batch's loop says what is wrong with it
    if kind not in (_CLAIM, _COMPLETE, _CLAIM_COMPLETE):
        return None
    try:
        if kind == _CLAIM:
            caller, key, fp, lease = op.args
            rk = (caller, key)
            res = claim(current(ws, rk), fp, now, lease, fence + 1)
            if res.kind is ClaimKind.CLAIMED:
                fence += 1
                ws[rk] = dirty[rk] = res.record
            op.result = res
        elif kind == _COMPLETE:
            caller, key, f, c = op.args
            rk = (caller, key)
            done = complete(current(ws, rk), f, c.ok, c.payload, now, c.ttl, caller, key)
            ws[rk] = dirty[rk] = done
            op.result = done
        else:
            caller, key, fp, lease, call, c = op.args
            rk = (caller, key)
            res = claim(current(ws, rk), fp, now, lease, fence + 1)
            if res.kind is not ClaimKind.CLAIMED:
                op.result = res  # a replay, a mismatch, busy: nothing written
            else:
                # The claim is written only as the completed record: no in-progress
                # row, ever.
                fence += 1
                call.fence = fence
                done = complete(res.record, fence, c.ok, c.payload, now, c.ttl, caller, key)
                ws[rk] = dirty[rk] = done
                op.result = done
    except Exception as exc:
        # This operation's alone (a stale completion, a corrupted row, an argument a
        # store caller got wrong): it changed nothing of the working set.
        op.error = exc
    return fence


def _decide(
    ops: list[Op],
    start: int,
    ws: WorkingSet,
    dirty: dict[tuple[str, str], Record | None],
    now: float,
    fence: int,
) -> tuple[int, int]:
    """Apply the operations of ``ops`` from ``start`` on, in order, while they are
    record-only (:func:`_decide_one`); return the index of the first that is not (or
    ``len(ops)``) and the store's last fencing token."""
    n = len(ops)
    while start < n:
        after = _decide_one(ops[start], ws, dirty, now, fence)
        if after is None:
            break
        fence = after
        start += 1
    return start, fence


# Parameters are given as types sqlite3 binds without adapting (see _UPSERT_IN_PROGRESS):
# blobs as bytearray (a copy of a few dozen bytes costs far less than the failed lookup
# that exact bytes pay) and the ok flag as an int (bool is not exactly int).
def _rows(
    dirty: dict[tuple[str, str], Record | None],
) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]], list[tuple[str, str]]]:
    """The parameters of the working set's writes: completed records' rows (for
    ``_UPSERT``), in-progress records' rows (``_UPSERT_IN_PROGRESS``) and the keys of
    deleted records (``_DELETE``), each in the order of ``dirty``."""
    completed: list[tuple[Any, ...]] = []
    in_progress: list[tuple[Any, ...]] = []
    deleted: list[tuple[str, str]] = []
    for rk, rec in dirty.items():
        if rec is None:
            deleted.append(rk)
            continue
        fp, ok = bytearray(rec.fingerprint), 1 if rec.ok else 0
        if rec.payload is None:
            in_progress.append((rk[0], rk[1], rec.state, fp, rec.fence, rec.expires_at, ok))
        else:
            payload = bytearray(rec.payload)
            completed.append((rk[0], rk[1], rec.state, fp, rec.fence, rec.expires_at, ok, payload))
    return completed, in_progress, deleted


def _nothing_written(conn: sqlite3.Connection, changes: int) -> None:
    """An atomic effect's undo: nothing to do if the connection's change count has not
    moved since ``changes``; else the batch must be redone with savepoints."""
    if conn.total_changes != changes:
        raise _RedoCarefully


def _rollback_to(conn: sqlite3.Connection | sqlite3.Cursor) -> None:
    conn.execute("ROLLBACK TO idempotency_effect")


# The C twins of the batch's record work (idempotency/_speedups_batch.c.h), when built: they
# answer the common cases and call the functions above, kept as the reference, for the
# rest.
_py_batch_keys: Final = _batch_keys
_py_decode_into: Final = _decode_into
_py_decide: Final = _decide
_py_rows: Final = _rows
_py_split_held: Final = _split_held
_py_held_params: Final = _held_params
_py_held_records: Final = _held_records
_py_note_held: Final = _note_held
if _speedups is not None:
    _speedups.configure_sqlite(
        decide_one=_decide_one,
        keyed=_KEYED,
        claim=_CLAIM,
        complete=_COMPLETE,
        claim_complete=_CLAIM_COMPLETE,
    )
    _batch_keys = _speedups.batch_keys
    _decode_into = _speedups.decode_into
    _decide = _speedups.decide
    _rows = _speedups.rows
    _speedups.configure_held(
        split_held=_split_held,
        held_params=_held_params,
        held_records=_held_records,
        note_held=_note_held,
        release=_RELEASE,
        held_max=_HELD_MAX,
    )
    _split_held = _speedups.split_held
    _held_params = _speedups.held_params
    _held_records = _speedups.held_records
    _note_held = _speedups.note_held
