"""SQLiteStore's claims of new keys, written without a read (``_claim_new_keys``).

A batch of claims is first inserted as if no key had a row; only when one had (a retry,
a duplicate in the batch, a record expired but not swept) is it rolled back and read and
decided as usual. The answers and the rows must be exactly those of the usual path:
each test applies the same batches to a second store that always reads first, and
compares.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from idempotency._record import ClaimKind
from idempotency.stores import SQLiteStore
from idempotency.stores._batch import Op
from idempotency.stores.sqlite import (
    _CLAIM,
    _CLAIM_NEW_ROWS,
    _GET,
    _NEW_CLAIMS_WAIT_MAX,
    _NEW_ROWS_SIZES,
    _RELEASE,
    _RENEW,
)

NOW = 1_000_000.0
FP = b"\x01" * 32
OTHER_FP = b"\x02" * 32
# Records there before the batches: (key, state, fingerprint, expires_at, ok, payload).
SEEDED = [
    ("done", 2, FP, NOW + 500, 1, b"\xa2ok"),
    ("held", 1, FP, NOW + 5, 1, None),
    ("other-fp", 2, OTHER_FP, NOW + 500, 1, b"\xa2ok"),
    ("expired", 2, FP, NOW - 1, 1, b"\xa2ok"),
    ("lapsed", 1, FP, NOW - 1, 1, None),
]
KEYS = [k for k, *_ in SEEDED] + ["new-1", "new-2", "new-3", "new-4"]


class Store:
    """A store on a file of its own, seeded, with every statement it runs written down."""

    def __init__(self, path: Path, *, reads_first: bool) -> None:
        self.store = SQLiteStore(path, clock=lambda: NOW, sweep_every=0)
        self.reads_first = reads_first
        conn = self.conn
        conn.executemany(
            "INSERT INTO idempotency_records VALUES ('c', ?, ?, ?, 7, ?, ?, ?)", SEEDED
        )
        conn.execute("UPDATE idempotency_meta SET value = 10 WHERE name = 'fence'")
        # Tokens reserved ahead, as a store that has committed durably has them (else a
        # batch of claims is applied twice, the second time durably).
        conn.execute("UPDATE idempotency_meta SET value = 5000 WHERE name = 'fence_ceiling'")
        self.statements: list[str] = []
        conn.set_trace_callback(self.statements.append)

    @property
    def conn(self) -> sqlite3.Connection:
        conn = self.store._conn  # type: ignore[attr-defined]
        assert conn is not None
        return conn

    def apply(self, batch: list[tuple[Any, ...]]) -> list[Any]:
        """Apply one batch (kind, args) and say what each operation got."""
        if self.reads_first:
            self.store._new_claims_wait = 1  # type: ignore[attr-defined]
        ops = [Op(kind, args) for kind, args in batch]
        self.statements.clear()
        self.store._apply_batch(ops)  # type: ignore[attr-defined]
        return [
            (type(op.error).__name__, str(op.error)) if op.error is not None else op.result
            for op in ops
        ]

    def unread(self) -> bool:
        """Whether the last batch was written without reading its records."""
        return any(sql.startswith("INSERT OR IGNORE") for sql in self.statements) and not any(
            sql.startswith("SELECT caller, key") for sql in self.statements
        )

    def rows(self) -> list[tuple[Any, ...]]:
        return self.conn.execute(
            "SELECT caller, key, state, fingerprint, fence, expires_at, ok, payload"
            " FROM idempotency_records ORDER BY rowid"
        ).fetchall()

    def fence(self) -> int:
        return int(
            self.conn.execute("SELECT value FROM idempotency_meta WHERE name = 'fence'").fetchone()[
                0
            ]
        )


def pair(tmp_path: Path) -> tuple[Store, Store]:
    for name in ("unread.db", "read.db"):
        for suffix in ("", "-wal", "-shm"):
            (tmp_path / (name + suffix)).unlink(missing_ok=True)
    return Store(tmp_path / "unread.db", reads_first=False), Store(
        tmp_path / "read.db", reads_first=True
    )


def claim(key: str, fp: bytes = FP, lease: float = 30.0) -> tuple[Any, ...]:
    return (_CLAIM, ("c", key, fp, lease))


def test_claims_of_new_keys_are_written_without_a_read(tmp_path: Path) -> None:
    unread, read = pair(tmp_path)
    batch = [claim("new-1"), claim("new-2", OTHER_FP, 5.0), claim("new-3")]
    got = unread.apply(batch)
    assert unread.unread()
    assert got == read.apply(batch)
    assert not read.unread()
    assert [(r.kind, r.record.fence, r.record.expires_at) for r in got] == [
        (ClaimKind.CLAIMED, 11, NOW + 30),
        (ClaimKind.CLAIMED, 12, NOW + 5),
        (ClaimKind.CLAIMED, 13, NOW + 30),
    ]
    assert unread.rows() == read.rows()
    assert unread.fence() == read.fence() == 13
    # Granted by the store itself: their completions skip the read too.
    assert unread.store._held == read.store._held  # type: ignore[attr-defined]
    assert ("c", "new-2") in unread.store._held  # type: ignore[attr-defined]


@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    batches=st.lists(
        st.lists(
            st.tuples(st.sampled_from(KEYS), st.sampled_from([FP, OTHER_FP])),
            min_size=1,
            max_size=6,
        ),
        min_size=1,
        max_size=4,
    )
)
@example(batches=[[("done", FP)]])  # a replay
@example(batches=[[("new-1", FP), ("new-1", FP)]])  # a duplicate in the batch: busy
@example(batches=[[("new-1", FP), ("expired", FP)]])  # a record expired, not swept
@example(batches=[[("lapsed", OTHER_FP)]])  # a lapsed claim taken over
@example(batches=[[("new-1", FP)], [("new-1", FP)]])  # busy, a batch later
def test_every_batch_of_claims_ends_as_the_usual_path_ends_it(
    tmp_path: Path, batches: list[list[tuple[str, bytes]]]
) -> None:
    unread, read = pair(tmp_path)
    for keys in batches:
        batch = [claim(key, fp) for key, fp in keys]
        assert unread.apply(batch) == read.apply(batch)
        assert unread.rows() == read.rows()
        assert unread.fence() == read.fence()
        assert unread.store._held == read.store._held  # type: ignore[attr-defined]
    for store in (unread, read):
        store.store.close()


def test_a_miss_reads_the_next_batches_first_for_a_while(tmp_path: Path) -> None:
    unread, _ = pair(tmp_path)
    fresh = iter(f"fresh-{i}" for i in range(1000))
    pattern = []
    # One claim a batch. K: of a stored key (a replay: a miss); N: of a new key, written
    # unread; ".": of a new key, read first. A miss reads the next batch first, a second
    # miss in a row the next 2, a third the next 4; a batch written unread ends that.
    expected = "K.K..K....NNK.N"
    for kind in expected:
        unread.apply([claim("done" if kind == "K" else next(fresh))])
        pattern.append("N" if unread.unread() else ("K" if kind == "K" else "."))
    assert "".join(pattern) == expected
    assert _NEW_CLAIMS_WAIT_MAX == 64
    unread.store._new_claims_backoff = _NEW_CLAIMS_WAIT_MAX  # type: ignore[attr-defined]
    unread.store._new_claims_wait = 0  # type: ignore[attr-defined]
    unread.apply([claim("done")])
    assert unread.store._new_claims_wait == _NEW_CLAIMS_WAIT_MAX  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "other",
    [
        (_GET, ("c", "done")),
        (_RENEW, ("c", "held", 7, 30.0)),
        (_RENEW, ("c", "new-9", 3, 30.0)),  # four arguments, as a claim has, and no row
        (_RELEASE, ("c", "new-9", 3)),
    ],
)
def test_a_batch_of_claims_and_anything_else_is_read(
    tmp_path: Path, other: tuple[Any, ...]
) -> None:
    unread, read = pair(tmp_path)
    batch = [claim("new-1"), other, claim("new-2")]
    assert unread.apply(batch) == read.apply(batch)
    assert not unread.unread()
    assert unread.rows() == read.rows()


def test_a_claim_the_table_cannot_hold_fails_as_on_the_usual_path(tmp_path: Path) -> None:
    unread, read = pair(tmp_path)
    batch = [claim("new-1"), claim("new-2", "not bytes")]  # type: ignore[arg-type]
    got = unread.apply(batch)
    assert got == read.apply(batch)
    assert got[0].kind is ClaimKind.CLAIMED and got[1][0] == "TypeError"
    assert unread.rows() == read.rows()


def test_the_insert_leaves_a_key_with_a_row_alone_and_uncounted(tmp_path: Path) -> None:
    """What the row count tells rests on the statement: a row of a key that already has
    one is neither written nor counted, and the other rows of the statement are."""
    path = tmp_path / "r.db"
    SQLiteStore(str(path)).close()  # the store's own schema
    db = sqlite3.connect(path)
    held = ("c", "k1", 2, FP, 7, NOW + 500, 1, b"\xa2ok")
    db.execute("INSERT INTO idempotency_records VALUES (?, ?, ?, ?, ?, ?, ?, ?)", held)
    rows = ["c", "k1", 1, OTHER_FP, 8, NOW + 5, 1, "c", "k2", 1, FP, 9, NOW + 5, 1]  # two rows
    assert db.execute(_CLAIM_NEW_ROWS[2], rows).rowcount == 1
    got = db.execute("SELECT * FROM idempotency_records ORDER BY key").fetchall()
    assert got == [held, ("c", "k2", 1, FP, 9, NOW + 5, 1, None)]
    db.close()


@pytest.mark.parametrize("n", [1, 2, 3, 7, 63, 64, 65, 127, 129, 200])
def test_batches_of_every_size_are_written_whole(tmp_path: Path, n: int) -> None:
    """Runs of rows a statement, of a few sizes: every claim written, in order, with a
    statement of one of the sizes (kept prepared), however many there are."""
    unread, read = pair(tmp_path)
    batch = [claim(f"n-{i}", FP if i % 3 else OTHER_FP, 10.0 + i) for i in range(n)]
    assert unread.apply(batch) == read.apply(batch)
    assert unread.unread()
    assert unread.rows() == read.rows()
    assert unread.fence() == read.fence() == 10 + n
    inserts = [sql for sql in unread.statements if sql.startswith("INSERT OR IGNORE")]
    sizes = [sql.count("NULL)") for sql in inserts]
    assert sum(sizes) == n
    assert set(sizes) <= set(_NEW_ROWS_SIZES)
    assert sizes == sorted(sizes, reverse=True)  # largest first: few statements
    if n in (129, 200):
        assert sizes == {129: [64, 64, 1], 200: [64, 64, 64, 8]}[n]


def test_a_miss_in_a_large_batch_deletes_every_row_it_inserted(tmp_path: Path) -> None:
    unread, read = pair(tmp_path)
    batch = [claim(f"n-{i}") for i in range(70)] + [claim("done")]
    assert unread.apply(batch) == read.apply(batch)
    assert not unread.unread()
    assert unread.rows() == read.rows()
