"""PostgresStore: records in PostgreSQL, shared by processes and machines (psycopg 3).

Where it fits
-------------
SQLite serves the processes of one machine; PostgreSQL serves many machines, and is
where the effects the keys guard (balances, orders) usually live. The layout follows
Stripe's published design: one row per (caller, key), the effect committed in the
transaction that completes the row.

Layout: ``{schema}.idempotency_records`` (primary key ``(caller, key)``, an index on
``expires_at`` for the sweep) and the sequence ``{schema}.idempotency_fence``. They
are created when missing (under an advisory lock, so processes starting together do
not race). A ``schema`` other than ``public`` is also put first on the store's
connections' ``search_path``, so an effect's unqualified table names resolve there.
The schema is at most 63 bytes (``MAX_IDENTIFIER_BYTES``: PostgreSQL truncates a longer
name silently, and two stores whose schemas differ only past it would share one
table), not empty and without NUL: anything else is refused at construction with a
ValueError, not made unique (it is the operator's name, used in their SQL). The names
built from it (``idempotency_records``, its index and constraints, the sequence) are
fixed and short. Callers, keys and outcomes are bounded as for every store (see
"Limits" in ``_contract``): a key past PostgreSQL's btree entry limit (2,704 bytes)
would otherwise fail its whole batch.

Durability and group commit
---------------------------
Every batch is one transaction committed with ``synchronous_commit = on`` (set on each
of the store's connections whatever the server's default): the commit returns once its
WAL is flushed, and replies leave only after it. Operations of concurrent calls of one
process -- claims, completions with their effects, releases, renewals, reads -- go
through one :class:`~._batch.GroupCommitter`, so those that arrive while a batch is
being written share the next transaction and its one WAL flush.

A batch takes ``SELECT ... FOR UPDATE`` row locks on the records it touches (in key
order, so two processes' batches cannot deadlock on them), decides every operation with
the pure functions of ``idempotency._record`` against what it read, and writes the
changes back with one statement per kind (``UPDATE``, ``INSERT``, ``DELETE`` of the
rows of one JSON parameter: ``json_array_elements``). A key it read as absent may be
inserted by another process meanwhile: the insert waits for that transaction and, once
it has committed, fails on the primary key; the batch is then rolled back and applied
again (the row now exists and is locked like the others). So
several processes and machines write at once, each waiting only for the rows it shares
with another; no table lock is taken. Serialization failures and deadlocks (SQLSTATE
``40001``, ``40P01``, which an effect's own SQL can meet) are retried the same way,
inside the store, up to ``retries`` times.

A batch costs two round trips besides its effects' own statements, each one message of
the simple query protocol sent on libpq's connection directly: ``BEGIN``, the locks and
the clock in one; the writes and ``COMMIT`` in the other. The server runs the
statements of a message in order and skips the rest of it after one fails (so a failed
write never reaches ``COMMIT``). A batch's keys and rows go as one JSON literal a
statement, escaped by libpq (``PQescapeLiteral``); the rows come back as text, blobs in
hex (``bytea_output`` is set on the store's connections, with ``extra_float_digits``,
so a float comes back as the value written). psycopg's cursors and pipeline mode would
spend more CPU a batch than the batch's own work (twice the whole batch's, measured).
Every statement the store sends on a runtime goes this way (the sweep's and the tools'
too, and an effect's savepoints), and every record it reads is decoded from that text
by one function; only an effect's SQL uses psycopg's API, which is the effect's to use.

Time and fencing come from the database, not from the servers: ``now`` is the server's
``clock_timestamp()`` read after the row locks are held (so it is never before the
commit of the claim it judges), and fencing tokens are ``nextval`` of the sequence,
taken after the locks too, so every claim's token is higher than that of every claim
committed before it, on this key and any other, whichever machine made it. (A
``clock`` given to the store replaces the server's clock: tests move time by hand.)

An operation's failure is its own: a stale completion, a corrupted row, an effect that
raises (its savepoint is rolled back) fails that call alone. A batch refused by the
database in a way one operation may have caused (a constraint checked at ``COMMIT``, a
value the table refuses) is applied again one operation per transaction, so that only
the bad one fails; a caller or key the database cannot hold as text (a NUL; a character
a database's encoding lacks, in ``SQL_ASCII`` or ``LATIN1``) fails its call with
:class:`InvalidRequest` naming it. Only a failure of the database itself (a lost
connection, a server shutting down, an error at ``COMMIT`` on a lost link, a row held
by another transaction past ``lock_timeout``) fails the whole batch, with
:class:`StoreUnavailable` naming the server and the SQLSTATE; nothing of a batch whose
``COMMIT`` was not acknowledged is promised (it may have committed: a retry then meets
the claim, which lapses with its lease, or replays the completion).

I/O: through gosim's netpoller. The batch is applied by the goroutine that leads it
(the committer's async mode), on a :class:`._pgnet.NetpollConnection`: each wait of
psycopg's protocol generators (its C ones, for the store's own messages) parks that
goroutine on the libpq socket, so a query holds no OS thread, and a batch's two round
trips are two parks. Connecting blocks and goes through ``gosim.syscall``;
so does every wait on a reproducible runtime (seeded or on a virtual clock). Only the
constructor's one-off setup (the tables) uses a plain blocking connection, before any
runtime. Connections come from a bounded pool (``pool_size``; a goroutine waiting for
one parks, and gives up after ``pool_timeout`` with :class:`StoreUnavailable`) shared
by the batches, :meth:`sweep` and the operator's tools; a connection that failed is
dropped, and one found dead before a batch was sent on it (it died while idle: a
restart) is replaced at once. A connection's settings (``synchronous_commit``,
``lock_timeout``, ``search_path``, ``bytea_output``, ``extra_float_digits``) go in its
startup packet.

A server that stays connected but does not answer -- its backend stopped or wedged, a
link that drops packets -- must not hold the calls forever (TCP keep-alives are
answered by the server's kernel, and ``tcp_user_timeout`` covers only a machine that
vanished). So each transaction of the store (a batch with its effects, a sweep's
chunk, an operator's read) has a deadline, ``batch_timeout`` seconds after it starts,
on its connection: a netpoller deadline, which is a runtime timer. A wait still parked
when it passes closes the connection mid-protocol (psycopg's state is then cut short,
so it is never used again; the pool makes another), and the calls of the batch fail
with :class:`StoreUnavailable` naming the server and ``batch_timeout``. The batch is
not applied again: its ``COMMIT``, if it was sent, may still commit once the server
moves. Its calls were not acknowledged, and the row locks keep each effect once: a
retry of one of its keys waits for the row the stalled transaction holds (until that
ends, or ``lock_timeout``), then replays the completion it committed, or meets the
claim it left (which lapses with its lease) and claims anew.

Runtimes
--------
On an ordinary runtime the store's waits park goroutines on the netpoller. On a seeded
runtime (``gosim.run(seed=...)``) each wait goes through ``gosim.syscall``, which runs
inline on the driver: the server's timing cannot reorder goroutines, so a seed gives
the same schedule (the server's answers -- fencing tokens, its clock -- are its own).
On a virtual clock (``virtual_time=True``) the waits go through ``gosim.syscall`` too,
which holds the clock: a batch takes no virtual time. The server's clock, which judges
leases and retention by default, does not follow the virtual one, though: a caller
that sleeps virtual seconds for a lease to lapse would see it never lapse, and the
same program would decide differently under real and virtual time. So on a virtual
clock the store refuses every operation (``RuntimeError``, saying why) unless it was
given a ``clock``, which then judges time: a function of the runtime's clock
(``clock=lambda: base + gosim.now()``) makes leases lapse in simulated time.
``batch_timeout`` stays real time: each wait is bounded by what is left of it on the
runtime's clock, which a virtual clock holds still while the server is waited for (so
there each wait may take all of it).

Exactly-once effects
--------------------
A handler returns ``PostgresEffect(fn)``; ``await fn(conn)`` runs on the batch's
connection (a ``psycopg.AsyncConnection``) inside its transaction and a savepoint of
its own, after the fencing token is checked, and returns the call's result. The
record is written in the same transaction: a crash at any instant leaves both or
neither. A final ApplicationError raised by ``fn`` rolls
its writes back and records the error. ``claim_and_complete`` (``one_step=True``)
takes the claim in the same transaction too: one batch (two round trips, one WAL
flush) instead of two, and no claim is ever committed apart from its record, so a
process killed mid-call leaves the key free (the server rolls its transaction back),
not held until a lease lapses; a failed effect leaves no claim either.

Retention: every ``sweep_every`` batches a batch also deletes up to 512 expired records
(``expires_at`` index, ``FOR UPDATE SKIP LOCKED``: rows another transaction holds are
left for later, so the sweep never waits for a writer). :meth:`sweep` deletes every
expired record in transactions of 1,000 rows, each as short, with the same rule.

Hot rows
--------
A batch holds the row locks of its effects until its commit. Two processes' batches
whose effects update the same rows (a hot account) in different orders would deadlock:
PostgreSQL finds the cycle only after ``deadlock_timeout`` (1 s by default), fails one
transaction, and every call of that batch waits the second and runs again. Measured
before this rule: two processes, 3,000 charges on 20 accounts, 83 deadlocks and 88 s;
with it, none and 3 s. So a batch whose operations carry effects first takes *turns*,
in the ``BEGIN`` round trip and before any row lock: transaction-level advisory locks
(the two-int4 kind, apart from an application's one-bigint kind) in one global order.
An effect that names its rows (``PostgresEffect(fn, locks=["account:42"])``) makes its
batch take the turn over every effect shared, then one turn per name, in ascending
order; an effect that names none (``locks=None``, the default) makes its batch take the
turn over every effect exclusively. Batches whose effects share a name, or one of which
names none, take turns; others run side by side; batches without effects take none.
Every lock a batch waits for is thus taken in one order -- the turns, then the records'
row locks in key order, then its effects' rows, which no other batch holding a turn of
theirs can hold -- and the records a batch inserts go in key order too, so two batches
never wait for each other in a cycle. What an effect must respect: it locks only the
rows its names cover (any, without names) that other processes' effects also lock; a
row other code updates too (outside the store) is locked in one fixed order by both.
Rejected: moving a conflicting call out of its batch after a short lock wait (every
conflict costs the wait and a transaction of its own, and hot rows conflict in most
batches); lowering ``deadlock_timeout`` (a superuser's server-wide setting, and a
deadlock still runs a batch again); retrying alone, which deadlocks the same way.
"""

from __future__ import annotations

import collections
import functools
import math
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Final

import psycopg
import psycopg.errors
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict
from psycopg.generators import execute
from psycopg.pq import TransactionStatus

import gosim
from gosim.lowlevel import Waiter, WaitReason, WaitTimeout

from .._errors import (
    ApplicationError,
    CorruptedRecord,
    IdempotencyError,
    InProgress,
    InvalidRequest,
    StoreUnavailable,
)
from .._record import (
    ClaimKind,
    Record,
    claim,
    complete,
    decode_record,
)
from .._secrets import clean_cause, masked, redact
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
from ._pgnet import NetpollConnection
from ._postgres_sql import (
    _MAX_LOCK_TIMEOUT,
    _SCHEMA_LOCK,
    _check_schema,
    _dumps,
    _fill,
    _float,
    _lock_ids,
    _quote,
    _row_values,
    _schema,
    _schema_too_long,
    _statements,
    _turns,
)

__all__ = ["PostgresEffect", "PostgresStore", "find_store"]

_CLAIM: Final = OpKind.CLAIM
_COMPLETE: Final = OpKind.COMPLETE
_RELEASE: Final = OpKind.RELEASE
_GET: Final = OpKind.GET
_CLAIM_COMPLETE: Final = OpKind.CLAIM_COMPLETE
_RENEW: Final = OpKind.RENEW
_WRITES: Final = frozenset({_CLAIM, _COMPLETE, _RELEASE, _CLAIM_COMPLETE, _RENEW})

# SQLSTATEs of a transaction that failed through no fault of its own: run it again.
_RETRY_STATES: Final = frozenset({"40001", "40P01"})  # serialization failure, deadlock
_SWEEP_STEP: Final = 512
# An effect's savepoint (several statements: one round trip, the simple protocol).
_SP_OPEN: Final = b"SAVEPOINT idempotency_effect"
_SP_NEXT: Final = b"RELEASE SAVEPOINT idempotency_effect; SAVEPOINT idempotency_effect"
_SP_BACK: Final = b"ROLLBACK TO SAVEPOINT idempotency_effect"
_SP_UNDO: Final = _SP_BACK + b"; RELEASE SAVEPOINT idempotency_effect"
_POOL_WAIT: Final = WaitReason.SEMACQUIRE  # a goroutine waiting for a pool connection
_SWEEP_CHUNK: Final = 1000

# What _apply did with a batch (compared by identity).
_APPLIED: Final = "applied"
_RETRY: Final = "rolled back: run it again (a key inserted meanwhile, a deadlock)"
_NEEDS_ALONE: Final = "rolled back: one operation may have failed the transaction"
_DEAD_CONN: Final = "nothing sent: the connection was found dead at BEGIN"
_FATAL_ERROR: Final = psycopg.pq.ExecStatus.FATAL_ERROR
# What the server answers when one operation's value is refused: a constraint, a value
# of the wrong kind, a character the database's encoding lacks (22P05; 0A000 for a
# non-ASCII escape in an SQL_ASCII database).
_VALUE_REFUSED: Final = (psycopg.IntegrityError, psycopg.DataError, psycopg.NotSupportedError)


#: How long data the store sent may stay unacknowledged by the server's machine before
#: the connection fails (libpq's ``tcp_user_timeout``, in milliseconds).
_TCP_USER_TIMEOUT_MS: Final = 30_000


class PostgresEffect(Effect):
    """An effect committed with its record: ``await fn(conn)`` runs on the store's
    connection (a ``psycopg.AsyncConnection``: ``await conn.execute(...)``), inside the
    transaction and a savepoint of its own that complete the record, and returns the
    call's result. It runs in the goroutine that leads the batch; its queries park that
    goroutine on gosim's netpoller, and the batch's other calls wait for it.

    ``fn`` must not commit, roll back or begin transactions, and must not keep
    ``conn``. It must not write the store's own table (a batch's records are written at its end).
    It must act only through ``conn``: it may run more than once for one record, since
    a transaction rolled back and applied again (a key inserted by another process
    meanwhile, a deadlock, a serialization failure) runs its effects again, and only the
    run whose transaction commits counts. An error raised by ``fn`` (its SQL's too)
    rolls back its savepoint: its writes are undone and its call alone fails.

    ``locks`` names the rows ``fn`` may lock that other processes' effects lock too
    (an account's id, say, as ``"account:42"`` or ``42``: a name is its text, so ``42``
    and ``"42"`` are one name). A batch of effects holds its rows until its commit, so
    two processes' batches that lock the same rows in different orders would deadlock;
    instead, each batch first takes a lock per name of its effects (transaction-level
    advisory locks, in one global order), and two batches whose effects share a name
    take turns. Without ``locks`` (None) an effect may lock anything: its batch then
    takes the turn over every effect of the database, so such batches take turns with
    all others that run effects (correct whatever ``fn`` locks; batches without effects
    never wait for it). ``locks=()`` declares that ``fn`` locks no row another effect
    does (an insert of rows of its own). See "Hot rows" in the module docstring.
    """

    __slots__ = ("fn", "locks")

    def __init__(
        self,
        fn: Callable[[psycopg.AsyncConnection[Any]], Awaitable[Any]],
        *,
        locks: Iterable[str | int] | None = None,
    ) -> None:
        self.fn = fn
        self.locks: tuple[int, ...] | None = None if locks is None else _lock_ids(locks)


class _Retry(Exception):
    """The transaction must be rolled back and the batch applied again."""


class _Pool:
    """At most ``size`` connections, made on demand; :meth:`get` parks the goroutine
    up to ``timeout`` seconds for one to come back (a gosim Waiter with a deadline)."""

    def __init__(self, connect: Callable[[], Awaitable[NetpollConnection]], size: int) -> None:
        if size < 1:
            raise ValueError(f"pool_size must be at least 1, not {size}")
        self._connect = connect
        self._size = size
        self._idle: list[NetpollConnection] = []
        self._open = 0
        # Goroutines waiting for a connection, oldest first: each Waiter is settled
        # with a connection, or with None (a place freed: it connects).
        self._waiters: collections.deque[Waiter] = collections.deque()
        self.closed = False

    async def get(self, timeout: float, name: str) -> NetpollConnection:
        if self.closed:
            raise StoreUnavailable(f"{name}: the store is closed")
        if self._idle:
            return self._idle.pop()
        if self._open < self._size:
            self._open += 1
        else:
            w = Waiter()
            w.set_deadline(gosim.now() + timeout)
            self._waiters.append(w)
            try:
                conn = await w.wait(_POOL_WAIT)
            except WaitTimeout:
                raise StoreUnavailable(
                    f"{name}: no connection of the pool ({self._size}) came free within {timeout} s"
                ) from None
            finally:
                if not w.done() or w in self._waiters:
                    self._waiters.remove(w)
            if conn is not None:
                return conn  # type: ignore[no-any-return]
            # None: a place freed for this goroutine (close fails the waiters instead)
        try:
            return await self._connect()
        except BaseException:
            self._open -= 1
            self._hand_on(None)
            raise

    def put(self, conn: NetpollConnection, broken: bool = False) -> None:
        conn.deadline = None  # its user's: an idle connection waits for nothing
        if broken or self.closed or conn.closed:
            self._open -= 1
            _close_now(conn)
            if not self.closed:
                self._hand_on(None)
        elif not self._hand_on(conn):
            self._idle.append(conn)

    def _hand_on(self, conn: NetpollConnection | None) -> bool:
        """Give ``conn`` (None: a free place, which the waiter fills by connecting) to
        the oldest goroutine still waiting; False when none waits."""
        while self._waiters:
            w = self._waiters.popleft()
            if conn is None:
                self._open += 1
            if w.settle(conn):
                return True
            if conn is None:
                self._open -= 1
        return False

    def close(self) -> None:
        self.closed = True
        for conn in self._idle:
            _close_now(conn)
            self._open -= 1
        self._idle.clear()
        while self._waiters:
            self._waiters.popleft().fail(StoreUnavailable("the store is closed"))


def _close_now(conn: NetpollConnection) -> None:
    """Close ``conn`` without waiting (libpq's socket is non-blocking)."""
    conn.detach()
    conn.pgconn.finish()


class _Transaction:
    """One batch's transaction after its BEGIN round trip: its connection, the time
    and the fencing tokens the server gave it (``fence_at``: the next unused), the
    records as read (``ws``) and as changed (``dirty``), and whether an effect's
    savepoint is open (COMMIT releases the last one)."""

    __slots__ = ("conn", "dirty", "fence_at", "fences", "now", "savepoint", "ws")

    def __init__(
        self, conn: NetpollConnection, now: float, fences: list[int], ws: WorkingSet
    ) -> None:
        self.conn = conn
        self.now = now
        self.fences = fences
        self.fence_at = 0
        self.ws = ws
        self.dirty: dict[tuple[str, str], Record | None] = {}
        self.savepoint = False


class PostgresStore(BatchedOneStepStore):
    """Records in PostgreSQL at ``dsn`` (a ``postgresql://`` URL or a libpq conninfo
    string), under ``schema`` (see the module docstring).

    ``group_commit=False`` gives every operation its own transaction (for comparison).
    ``max_batch`` bounds a transaction. ``pool_size`` bounds the store's connections;
    ``pool_timeout`` how long an operation waits for one; ``connect_timeout`` how long
    a connection attempt may take. ``retries``: how many times a batch is applied again
    after a deadlock, a serialization failure or a key inserted by another process
    meanwhile, before :class:`StoreUnavailable`. ``lock_timeout``: how long a batch
    waits for a row another transaction holds (a slow effect of another process)
    before its calls fail with :class:`StoreUnavailable` (SQLSTATE ``55P03``).
    ``batch_timeout``: how long one transaction of the store (a batch with its
    effects' SQL, a sweep's chunk, an operator's read) may wait for the server in all
    before its connection is given up (see the module docstring); it should exceed
    ``lock_timeout`` plus the longest effect's SQL, which it includes.
    ``application_name``: what the server's ``pg_stat_activity`` shows for the store's
    connections (name the service; the server keeps its first 63 bytes).
    ``schema``: 1 to 63 bytes of UTF-8, without NUL (ValueError else: see the module
    docstring); ``lock_timeout`` at most 2,147,483.647 s (the server's int of ms).
    ``clock``: None for the server's clock (the right choice with several processes); a
    function replaces it (tests; a runtime on a virtual clock needs one: see "Runtimes"
    in the module docstring, and :class:`RuntimeError` without it).
    ``sweep_every``: every that many batches (0: never) a batch also deletes up to 512
    expired records.

    The constructor connects and creates the tables when missing, blocking (call it
    before the runtime starts, or through ``gosim.syscall``); it raises
    :class:`StoreUnavailable` when the server cannot be reached. One store object
    serves one gosim runtime at a time.
    """

    _effect_type = PostgresEffect

    def __init__(
        self,
        dsn: str,
        *,
        schema: str = "public",
        group_commit: bool = True,
        max_batch: int = 512,
        pool_size: int = 4,
        pool_timeout: float = 30.0,
        connect_timeout: float = 10.0,
        retries: int = 8,
        lock_timeout: float = 30.0,
        batch_timeout: float = 60.0,
        application_name: str = "idempotency",
        clock: Callable[[], float] | None = None,
        sweep_every: int = 64,
    ) -> None:
        self.dsn = dsn
        _check_schema(schema)
        self.schema = schema
        try:
            info = conninfo_to_dict(dsn)
        except psycopg.Error as exc:
            raise ValueError(
                f"PostgresStore: {masked(dsn)!r} is not a connection string: "
                f"{redact(str(exc), dsn)}"
            ) from clean_cause(exc, dsn)
        # The server as errors name it (never the password).
        self.server = (
            f"{info.get('host') or 'localhost'}:{info.get('port') or 5432}"
            f"/{info.get('dbname') or info.get('user') or ''}"
        )
        self._name = f"PostgresStore({self.server!r}, schema={schema!r})"
        self._clock = clock
        self._pool_timeout = pool_timeout
        self._retries = retries
        if not 0 < lock_timeout <= _MAX_LOCK_TIMEOUT:
            raise ValueError(
                f"lock_timeout must be a positive number of seconds of at most"
                f" {_MAX_LOCK_TIMEOUT} (PostgreSQL's lock_timeout is an int of"
                f" milliseconds), not {lock_timeout!r}"
            )
        self._lock_timeout_ms = max(1, round(lock_timeout * 1000))
        if (
            isinstance(batch_timeout, bool)
            or not isinstance(batch_timeout, (int, float))
            or not 0 < batch_timeout < math.inf
        ):
            raise ValueError(
                f"batch_timeout must be a positive, finite number of seconds, not {batch_timeout!r}"
            )
        self._batch_timeout = float(batch_timeout)
        schema_id = sql.Identifier(schema)
        self._records = sql.SQL("{}.idempotency_records").format(schema_id)
        self._fence_seq = f"{_quote(schema)}.idempotency_fence"
        # The store's statements as text split at their placeholders (see _fill).
        self._text = {
            name: tuple(q.as_string().encode().split(b"%s"))
            for name, q in _statements(self._records, self._fence_seq).items()
        }
        self._pool = _Pool(self._connect, pool_size)
        # Every connection's settings, in its startup packet: no round trip of their own.
        self._params = _connection_params(
            info, connect_timeout, application_name, self._lock_timeout_ms, schema
        )
        self._create_tables(dsn, schema, schema_id)
        self._committer = GroupCommitter(
            None,
            max_batch if group_commit else 1,
            apply_async=self._apply_batch,
            refused=None if clock is not None else self._refused,
        )
        self._sweep_every = sweep_every
        self._batches_to_sweep = sweep_every

    def _create_tables(self, dsn: str, schema: str, schema_id: sql.Identifier) -> None:
        """The store's schema, tables and sequence, created where missing under the
        schema lock, over a blocking connection of its own; raises ValueError when the
        server's encoding truncates the schema's name, the store's error when the server
        fails."""
        # Blocking, once, before any runtime: a plain psycopg connection of its own.
        doing = "connecting"
        try:
            with psycopg.connect(dsn, autocommit=True, **self._params) as conn:
                doing = "creating the tables"
                with conn.transaction():
                    # The server's own truncation, in its encoding (where a name's
                    # length may differ from UTF-8's): the name must survive it.
                    row = conn.execute("SELECT %s::text::name::text", (schema,)).fetchone()
                    kept = None if row is None else row[0]
                    if isinstance(kept, bytes):  # SQL_ASCII: psycopg gives text as bytes
                        kept = kept.decode(conn.info.encoding, errors="replace")
                    if kept != schema:
                        raise ValueError(
                            _schema_too_long(schema)
                            + f" (in the server's encoding it keeps {kept!r})"
                        )
                    conn.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
                    for stmt in _schema(schema_id, self._records, self._fence_seq):
                        conn.execute(stmt)
        except psycopg.Error as exc:
            raise self._store_error(exc, doing) from clean_cause(exc, dsn)

    def __repr__(self) -> str:
        return self._name

    def _close(self) -> None:
        self._pool.close()

    # ------------------------------------------------ in the batch's leading goroutine

    async def _connect(self) -> NetpollConnection:
        """A new connection of the pool: autocommit, so that the store's BEGIN and
        COMMIT are its own, and the settings of ``_params`` (``synchronous_commit =
        on`` whatever the server's default). Connecting blocks: ``gosim.syscall``."""
        try:
            return await NetpollConnection.connect(self.dsn, **self._params)
        except psycopg.Error as exc:
            raise self._store_error(exc, "connecting") from clean_cause(exc, self.dsn)

    def _refused(self) -> RuntimeError | None:
        """Why the running runtime cannot use the store (see "Runtimes" in the module
        docstring), or None: the batches' check (the committer asks it before each) and
        the tools'."""
        if self._clock is not None:
            return None
        return refused_on_virtual_clock(self._name, "the database server's clock")

    def _store_error(
        self, exc: BaseException, doing: str, conn: NetpollConnection | None = None
    ) -> StoreUnavailable:
        """The StoreUnavailable for ``exc``, met while ``doing``, its text without the
        DSN's password (raise it ``from clean_cause(exc, self.dsn)``)."""
        if conn is not None and conn.timed_out:
            return StoreUnavailable(
                f"{self._name}: {doing}: no answer from the server within batch_timeout ="
                f" {self._batch_timeout:g} s (a backend stopped or wedged, a link dropping"
                " packets); the connection was closed, and what it had sent may still commit"
            )
        state = getattr(exc, "sqlstate", None)
        code = f"SQLSTATE {state}" if state else type(exc).__name__
        text = redact(str(exc).strip().replace("\n", " "), self.dsn)
        return StoreUnavailable(f"{self._name}: {doing}: {code}: {text}")

    async def _begin(
        self,
        conn: NetpollConnection,
        statement: bytes | None,
        claims: int = 0,
        turns: bytes | None = None,
    ) -> tuple[psycopg.pq.abc.PGresult | None, float, list[int]]:
        """One round trip: ``BEGIN``, ``turns`` (the effects' advisory locks, taken
        before any row lock), ``statement`` (a read, whose result is returned), then the
        time and ``claims`` fencing tokens (ascending), which the server reads after the
        statement, so after its row locks. The time is the store's clock when it has one
        (the server is then asked only for tokens)."""
        clock = self._clock
        query = [b"BEGIN"]
        read_at = 1  # the statement's result, past BEGIN's and the turns' statements'
        if turns is not None:
            query.append(turns)
            read_at += turns.count(b";") + 1
        if statement is not None:
            query.append(statement)
        timed = clock is None or claims > 0
        if timed:
            query.append(_fill(self._text["now"], b"%d" % claims))
        results = await _query(conn, b";".join(query))
        read = None if statement is None else results[read_at]
        if not timed:
            assert clock is not None
            return read, clock(), []
        server_now, tokens = results[-1].get_value(0, 0), results[-1].get_value(0, 1)
        if server_now is None or tokens is None:  # the statement never gives NULL
            raise psycopg.DataError(f"{self._name}: the server gave no time or tokens")
        now = clock() if clock is not None else float(server_now)
        fences = sorted(map(int, tokens.split(b","))) if claims else []
        return read, now, fences

    async def _apply_batch(self, ops: list[Op]) -> None:
        """Apply ``ops`` in one transaction, again after a deadlock or a key inserted
        meanwhile, or one transaction each when one of them may have failed it."""
        for attempt in range(self._retries + 1):
            try:
                conn = await self._pool.get(self._pool_timeout, self._name)
            except StoreUnavailable as exc:
                for op in ops:
                    op.result, op.error = None, exc
                return
            broken = False
            conn.deadline = gosim.now() + self._batch_timeout
            try:
                outcome = await self._apply(conn, ops)
            except BaseException:
                broken = True
                raise
            finally:
                broken = (
                    broken
                    or conn.closed
                    or conn.info.transaction_status != (TransactionStatus.IDLE)
                )
                self._pool.put(conn, broken)
            if outcome is _APPLIED:
                return
            if outcome is _DEAD_CONN:
                if attempt < self._retries:
                    continue
                err = StoreUnavailable(
                    f"{self._name}: no live connection after {attempt + 1} attempts"
                )
                for op in ops:
                    op.error = err
                return
            for op in ops:
                op.result = op.error = None
            if outcome is _NEEDS_ALONE:
                for op in ops:
                    await self._apply_batch([op])
                return
            # _RETRY: again, with the row inserted meanwhile now there to lock
            if attempt == self._retries:
                err = StoreUnavailable(
                    f"{self._name}: a batch was rolled back {attempt + 1} times"
                    " (deadlocks, serialization failures or keys inserted meanwhile)"
                )
                for op in ops:
                    op.error = err

    async def _apply(self, conn: NetpollConnection, ops: list[Op]) -> str:
        """Apply ``ops`` in order in one transaction; see the module docstring."""
        keys = sorted({(op.args[0], op.args[1]) for op in ops})
        writes = any(op.kind in _WRITES for op in ops)
        claims = sum(1 for op in ops if op.kind in (_CLAIM, _CLAIM_COMPLETE))
        reading = True  # nothing of the batch written yet
        try:
            # One round trip: BEGIN, the row locks, then the time and the tokens.
            escape = psycopg.pq.Escaping(conn.pgconn).escape_literal
            lock = _fill(self._text["lock" if writes else "read"], escape(_dumps(keys)))
            rows, now, fences = await self._begin(conn, lock, claims, _turns(ops))
            reading = False
            ws: WorkingSet = dict.fromkeys(keys)
            ws.update(self._read_records(conn, rows))
            await self._write_batch(_Transaction(conn, now, fences, ws), ops, writes, escape)
        except _Retry:
            await _rollback(conn)
            return _RETRY
        except psycopg.Error as exc:
            return await self._batch_failed(conn, ops, exc, reading)
        except Exception as exc:
            # Not an operation's own error (those are caught in _apply_one): an argument
            # that broke the batch's shared code (one psycopg cannot send). Alone, it
            # fails by itself.
            await _rollback(conn)
            if len(ops) > 1:
                return _NEEDS_ALONE
            ops[0].result, ops[0].error = None, exc
        except BaseException:
            # An interrupt raised in an effect: nothing of the batch may be committed.
            await _rollback(conn)
            for op in ops:
                op.result = None
            raise
        return _APPLIED

    async def _write_batch(
        self,
        tx: _Transaction,
        ops: list[Op],
        writes: bool,
        escape: Callable[[bytes], bytes],
    ) -> None:
        """The batch's work after its BEGIN round trip (which locked its keys and read
        their records into ``tx.ws``): every operation decided against the records,
        then one round trip with the writes, a sweep step and COMMIT (skipped by the
        server if a write failed: ``_apply`` then rolls the transaction back)."""
        existed = {rk for rk, rec in tx.ws.items() if rec is not None}
        for op in ops:
            await self._apply_one(tx, op)
        dirty, now = tx.dirty, tx.now
        query = self._writes(dirty, existed, escape) if dirty else []
        if self._sweep_every > 0 and writes:
            self._batches_to_sweep -= 1
            if self._batches_to_sweep <= 0:
                self._batches_to_sweep = self._sweep_every
                query.append(_fill(self._text["sweep"], _float(now), b"%d" % _SWEEP_STEP))
        query.append(b"COMMIT")
        await _query(tx.conn, b";".join(query))

    async def _apply_one(self, tx: _Transaction, op: Op) -> None:
        """Decide one operation against the working set (an effect runs in its
        savepoint), taking the next of its fencing tokens for a claim. An error of its
        own is set on it (it changed nothing, and its batch-mates go on); the batch's
        (``_Retry``, ``psycopg.Error``) is raised."""
        kind = op.kind
        ws, dirty, now, fences = tx.ws, tx.dirty, tx.now, tx.fences
        try:
            if kind == _CLAIM:
                caller, key, fp, lease = op.args
                rk = (caller, key)
                res = claim(current(ws, rk), fp, now, lease, fences[tx.fence_at])
                if res.kind is ClaimKind.CLAIMED:
                    tx.fence_at += 1
                    ws[rk] = dirty[rk] = res.record
                op.result = res
            elif kind == _COMPLETE:
                caller, key, f, c = op.args
                rk = (caller, key)
                rec = current(ws, rk)
                if c.effect is None:
                    done = complete(rec, f, c.ok, c.payload, now, c.ttl, caller, key)
                    ws[rk] = dirty[rk] = done
                    op.result = done
                else:
                    applied = await self._effect_and_record(tx, op, f, rec, False)
                    if applied is not None:
                        ws[rk] = dirty[rk] = applied
            elif kind == _CLAIM_COMPLETE:
                caller, key, fp, lease, call, c = op.args
                rk = (caller, key)
                fence = fences[tx.fence_at]
                res = claim(current(ws, rk), fp, now, lease, fence)
                if res.kind is not ClaimKind.CLAIMED:
                    op.result = res  # a replay, a mismatch, busy: nothing written
                else:
                    tx.fence_at += 1
                    call.fence = fence
                    if c.effect is None:
                        done = complete(res.record, fence, c.ok, c.payload, now, c.ttl, caller, key)
                        ws[rk] = dirty[rk] = done
                        op.result = done
                    else:
                        applied = await self._effect_and_record(tx, op, fence, res.record, True)
                        if applied is not None:
                            ws[rk] = dirty[rk] = applied
            else:  # RELEASE, GET, RENEW
                apply_plain(op, ws, dirty, now)
        except (_Retry, psycopg.Error):
            raise  # the batch's, not this operation's
        except Exception as exc:
            op.error = exc  # this operation's alone: it changed nothing

    async def _batch_failed(
        self, conn: NetpollConnection, ops: list[Op], exc: psycopg.Error, reading: bool
    ) -> str:
        """The batch's transaction failed with ``exc`` (``reading``: before anything of
        it was written): what that makes of the batch."""
        if conn.timed_out:
            # The server did not answer in time: the connection is closed, and the
            # batch is not applied again (its COMMIT, if sent, may yet commit; the calls
            # were not acknowledged, so a retry replays it or claims anew).
            err = self._store_error(exc, "applying a batch", conn)
            for op in ops:
                op.result, op.error = None, err
            return _APPLIED
        if reading and (conn.closed or conn.broken):
            # A connection of the pool that died while idle (the server restarted, the
            # backend was terminated), or that died now: nothing of the batch has been
            # written, let alone committed. Another connection.
            _close_now(conn)
            return _DEAD_CONN
        await _rollback(conn)
        if getattr(exc, "sqlstate", None) in _RETRY_STATES or _inserted_meanwhile(exc):
            return _RETRY
        if isinstance(exc, _VALUE_REFUSED) and not conn.closed:
            # A value or a constraint refused: one operation's doing, not the store's.
            # Alone, each fails (or not) by itself.
            if len(ops) > 1:
                return _NEEDS_ALONE
            ops[0].result, ops[0].error = None, self._unstorable(ops[0], exc, conn)
            return _APPLIED
        err = self._store_error(exc, "applying a batch")
        for op in ops:
            op.result, op.error = None, err
        return _APPLIED

    def _unstorable(self, op: Op, exc: psycopg.Error, conn: NetpollConnection) -> Exception:
        """The error of an operation that failed its transaction alone: a caller or
        key the database cannot hold as text (a character its encoding lacks, a NUL) is
        the call's :class:`InvalidRequest`, naming it; a constraint's refusal stays the
        database's own error."""
        if not isinstance(exc, (psycopg.DataError, psycopg.NotSupportedError)):
            return exc
        caller, key = op.args[0], op.args[1]
        text = redact(str(exc).strip().replace("\n", " "), self.dsn)
        err = InvalidRequest(
            f"{self._name}: caller {caller!r}, key {key!r} cannot be stored in this database"
            f" (server encoding {conn.info.parameter_status('server_encoding') or '?'}"
            f"): SQLSTATE {exc.sqlstate}: {text}"
        )
        err.__cause__ = clean_cause(exc, self.dsn)
        return err

    def _writes(
        self,
        dirty: dict[tuple[str, str], Record | None],
        existed: set[tuple[str, str]],
        escape: Callable[[bytes], bytes],
    ) -> list[bytes]:
        """The statements writing the changed records back: one per kind of write. A
        key read as absent that another transaction inserted meanwhile fails the insert
        with a unique violation on the records' key (the batch is then applied again)."""
        updates: list[tuple[Any, ...]] = []
        inserts: list[tuple[Any, ...]] = []
        deleted: list[tuple[str, str]] = []
        for rk, rec in dirty.items():
            if rec is None:
                if rk in existed:
                    deleted.append(rk)
                continue
            payload = rec.payload
            (updates if rk in existed else inserts).append(
                (rk[0], rk[1], rec.state, rec.fingerprint.hex(), rec.fence,
                 repr(rec.expires_at), rec.ok, None if payload is None else payload.hex())
            )  # fmt: skip
        text = self._text
        query = []
        if deleted:
            query.append(_fill(text["delete"], escape(_dumps(deleted))))
        if updates:
            query.append(_fill(text["update"], escape(_dumps(updates))))
        if inserts:
            # In key order: two batches inserting the same new keys (a call sent to two
            # servers at once) wait for each other in one order, never in a cycle.
            inserts.sort()
            query.append(_fill(text["insert"], escape(_dumps(inserts))))
        return query

    async def _effect_and_record(
        self, tx: _Transaction, op: Op, fence: int, rec: Record | None, just_claimed: bool
    ) -> Record | None:
        """Run claim ``fence``'s effect (of ``op``'s completion, its last argument) in a
        savepoint; return its completed record, or None when it failed (nothing of it
        stays and ``op`` carries the error).

        Each statement here is a round trip that parks the batch's goroutine while the
        transaction holds its row locks, so the savepoint of an effect that succeeded
        is left open (``tx.savepoint``): the next effect's one statement releases it
        and opens its own, and COMMIT releases the last."""
        conn, now = tx.conn, tx.now
        caller, key, c = op.args[0], op.args[1], op.args[-1]
        effect = c.effect
        assert isinstance(effect, PostgresEffect)  # checked before the batch
        if not just_claimed:
            # A stale holder's effect must not run: check the claim first.
            complete(rec, fence, True, b"", now, c.ttl, caller, key)
        await _query(conn, _SP_NEXT if tx.savepoint else _SP_OPEN)
        tx.savepoint = True
        try:
            # The effect is awaited here; run_effect then judges its outcome (a final
            # ApplicationError asks for the savepoint's rollback: ``undone``).
            outcome: list[Any] = [None, None]
            try:
                outcome[0] = await _checked(conn, effect.fn)
            except Exception as exc:
                outcome[1] = exc
            undone: list[bool] = []
            ok, payload = run_effect(
                functools.partial(_outcome, outcome),
                c.max_result_bytes,
                lambda: undone.append(True),
            )
            if undone:
                await _query(conn, _SP_BACK)
            done = complete(rec, fence, ok, payload, now, c.ttl, caller, key)
        except Exception as exc:
            if conn.closed or conn.info.transaction_status == TransactionStatus.UNKNOWN:
                raise  # the connection is gone: the batch's failure
            await _query(conn, _SP_UNDO)
            tx.savepoint = False
            if getattr(exc, "sqlstate", None) in _RETRY_STATES:
                raise _Retry from exc  # a deadlock, not the effect's fault: again
            if isinstance(exc, (IdempotencyError, ApplicationError)):
                raise
            op.error = exc  # the effect's own failure: this call only
            return None
        op.result = done
        return done

    def _read_records(
        self, conn: NetpollConnection, rows: psycopg.pq.abc.PGresult | None
    ) -> dict[tuple[str, str], Record | CorruptedRecord]:
        """The records of a lock or read statement's text result, by (caller, key); a
        row no store writes as the CorruptedRecord that says why."""
        found: dict[tuple[str, str], Record | CorruptedRecord] = {}
        if rows is None:
            return found
        encoding = conn.info.encoding
        get = rows.get_value
        for i in range(rows.ntuples):
            caller = (get(i, 0) or b"").decode(encoding)  # the primary key: never NULL
            key = (get(i, 1) or b"").decode(encoding)
            try:
                found[caller, key] = decode_record(_row_values(get, i), self._name, caller, key)
            except CorruptedRecord as exc:
                found[caller, key] = exc
        return found

    async def _live_connection(self) -> NetpollConnection:
        """A connection of the pool checked with a round trip (for the sweep and the
        operator's tools, which have no batch to retry), its deadline set for the
        caller's transaction: one that died while idle is dropped and another taken."""
        if refused := self._refused():
            raise refused
        for _ in range(self._pool._size + 1):
            conn = await self._pool.get(self._pool_timeout, self._name)
            conn.deadline = gosim.now() + self._batch_timeout
            try:
                await _query(conn, b"SELECT 1")
            except psycopg.Error as exc:
                self._pool.put(conn, broken=True)
                if (conn.closed or conn.broken) and not conn.timed_out:
                    continue  # died while idle
                err = self._store_error(exc, "checking a connection", conn)
                raise err from clean_cause(exc, self.dsn)
            except BaseException:
                self._pool.put(conn, broken=True)
                raise
            return conn
        raise StoreUnavailable(f"{self._name}: no live connection")

    async def sweep(self) -> int:
        """Delete every expired record, 1,000 at a time, each chunk its own short
        transaction; rows a writer holds are skipped (they are being written)."""
        deleted = 0
        conn = await self._live_connection()
        broken = True
        try:
            while True:
                conn.deadline = gosim.now() + self._batch_timeout  # a chunk's transaction
                _, now, _ = await self._begin(conn, None)
                sweep = _fill(self._text["sweep"], _float(now), b"%d" % _SWEEP_CHUNK)
                n = (await _query(conn, sweep + b";COMMIT"))[0].command_tuples or 0
                deleted += n
                if n < _SWEEP_CHUNK:
                    broken = False
                    return deleted
        except psycopg.Error as exc:
            raise self._store_error(exc, "sweeping", conn) from clean_cause(exc, self.dsn)
        finally:
            self._pool.put(conn, broken)

    # ------------------------------------------------------------ operator's tools

    async def inspect(self, caller: str, key: str) -> StoredRecord | None:
        return await self._inspect_or_forget_async(caller, key, False, False)

    async def forget(self, caller: str, key: str, *, force: bool = False) -> StoredRecord | None:
        return await self._inspect_or_forget_async(caller, key, True, force)

    async def _inspect_or_forget_async(
        self, caller: str, key: str, delete: bool, force: bool
    ) -> StoredRecord | None:
        """``inspect`` (a plain read) or ``forget`` (the row locked, checked and deleted
        in one transaction, committed durably), on a connection of the pool."""
        doing = "forgetting a record" if delete else "reading a record"
        conn = await self._live_connection()
        broken = True
        try:
            escape = psycopg.pq.Escaping(conn.pgconn).escape_literal
            the_key = escape(_dumps([(caller, key)]))
            read = _fill(self._text["lock" if delete else "read"], the_key)
            rows, now, _ = await self._begin(conn, read)
            found = self._read_records(conn, rows)
            held = None
            if (caller, key) in found:
                rec = found[caller, key]
                if isinstance(rec, CorruptedRecord):
                    held = StoredRecord(caller, key, None, str(rec), now)
                else:
                    held = StoredRecord(caller, key, rec, None, now)
                if delete:
                    if not force and held.state == "IN_PROGRESS":
                        await _query(conn, b"ROLLBACK")  # the row's lock, let go
                        broken = False
                        raise InProgress(caller, key)
                    await _query(conn, _fill(self._text["delete"], the_key))
            await _query(conn, b"COMMIT")
            broken = False
            return held
        except psycopg.Error as exc:
            raise self._store_error(exc, doing, conn) from clean_cause(exc, self.dsn)
        finally:
            self._pool.put(conn, broken)


def find_store(dsn: str, schema: str, connect_timeout: float = 10.0) -> bool:
    """Whether ``schema`` of the database at ``dsn`` holds a store's records table,
    looked up without creating anything (``python -m idempotency`` asks before opening
    a store, which would create its tables). Blocking. ValueError for a connection
    string libpq refuses or a schema no store can have (as :class:`PostgresStore`
    says); StoreUnavailable when the server cannot be reached."""
    _check_schema(schema)
    try:
        with psycopg.connect(
            dsn, connect_timeout=max(1, math.ceil(connect_timeout)), autocommit=True
        ) as conn:
            row = conn.execute(
                "SELECT to_regclass(format('%%I.idempotency_records', %s::text))", (schema,)
            ).fetchone()
    except psycopg.ProgrammingError as exc:
        raise ValueError(redact(str(exc), dsn)) from clean_cause(exc, dsn)
    except psycopg.Error as exc:
        text = redact(str(exc), dsn)
        raise StoreUnavailable(f"{type(exc).__name__}: {text}") from clean_cause(exc, dsn)
    return row is not None and row[0] is not None


async def _checked(
    conn: NetpollConnection, fn: Callable[[psycopg.AsyncConnection[Any]], Awaitable[Any]]
) -> Any:
    """``await fn(conn)``, refusing a result when ``fn`` swallowed an error of its own
    SQL: its transaction is then failed, and only rolling its savepoint back saves the
    batch."""
    value = await fn(conn)
    if conn.info.transaction_status == TransactionStatus.INERROR:
        raise RuntimeError(
            "PostgresEffect returned with its transaction failed (it caught an error of"
            " its own SQL): its writes are rolled back"
        )
    return value


async def _query(conn: NetpollConnection, query: bytes) -> list[psycopg.pq.abc.PGresult]:
    """Send ``query`` (statements separated by ``;``) as one message of the simple
    query protocol on ``conn``'s libpq connection, and wait for all its results. The
    server stops at the first statement that fails: its error is raised, as psycopg
    raises it (the class of its SQLSTATE, with its diagnostics)."""
    pgconn = conn.pgconn
    pgconn.send_query(query)
    results: list[psycopg.pq.abc.PGresult] = await conn.wait(execute(pgconn))
    for result in results:
        if result.status == _FATAL_ERROR:
            raise psycopg.errors.error_from_result(result, encoding=conn.info.encoding)
    return results


def _inserted_meanwhile(exc: psycopg.Error) -> bool:
    """Whether ``exc`` is the batch's insert meeting a record another transaction
    inserted (and committed) after this batch read the key as absent."""
    return (
        isinstance(exc, psycopg.errors.UniqueViolation)
        and exc.diag.table_name == "idempotency_records"
    )


async def _rollback(conn: NetpollConnection) -> None:
    """End the batch's transaction, if any, writing nothing; a connection this fails on
    is closed (the pool drops it)."""
    if conn.closed:
        return
    try:
        if conn.info.transaction_status != TransactionStatus.IDLE:
            await _query(conn, b"ROLLBACK")
    except psycopg.Error:
        _close_now(conn)


def _outcome(outcome: list[Any]) -> Any:
    """An awaited effect's outcome, given back to ``run_effect``: ``[value, error]``."""
    if outcome[1] is not None:
        raise outcome[1]
    return outcome[0]


def _connection_params(
    info: dict[str, Any],
    connect_timeout: float,
    application_name: str,
    lock_timeout_ms: int,
    schema: str,
) -> dict[str, Any]:
    """Every connection's settings, as psycopg.connect's keywords: the timeouts, the
    keep-alives, and the session's settings in libpq's ``options`` after the connection
    string's own."""
    return {
        "connect_timeout": max(1, math.ceil(connect_timeout)),
        "application_name": application_name,
        # A server whose machine is gone or cut off must not hold a batch's wait
        # forever: TCP keep-alives find a silent peer, and unacknowledged data
        # fails the connection after 30 s (StoreUnavailable, the pool replaces it).
        "keepalives": 1,
        "keepalives_idle": 10,
        "keepalives_interval": 5,
        "keepalives_count": 3,
        "tcp_user_timeout": _TCP_USER_TIMEOUT_MS,
        "options": _options(
            str(info.get("options") or ""),
            {
                "synchronous_commit": "on",
                "lock_timeout": str(lock_timeout_ms),
                # How a batch's rows come back as text: blobs in hex, floats exact.
                "bytea_output": "hex",
                "extra_float_digits": "3",
                **({} if schema == "public" else {"search_path": f"{_quote(schema)},public"}),
            },
        ),
    }


def _options(given: str | None, settings: dict[str, str]) -> str:
    """libpq's ``options`` (``-c name=value`` each; spaces and backslashes escaped),
    after those of the connection string."""
    ours = " ".join(
        "-c " + f"{k}={v}".replace("\\", "\\\\").replace(" ", "\\ ") for k, v in settings.items()
    )
    return f"{given} {ours}" if given else ours
