"""MemoryStore: records in a dict, for tests, the simulator and single-process use.

Every operation completes without yielding to the scheduler, so it is atomic with
respect to other goroutines (they run on one driver thread and switch only at gosim
operations). Time is the runtime clock (``gosim.now``), virtual under
``virtual_time=True``: leases and TTLs expire in simulated time. Nothing survives the
process; use :class:`~idempotency.SQLiteStore` for durability.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gosim

from .._accel import speedups as _speedups
from .._errors import InProgress, StaleClaim
from .._record import ClaimKind, ClaimResult, Record, claim, complete, release, renew, state_at
from ._contract import (
    MAX_KEY_LENGTH,
    MAX_PAYLOAD_BYTES,
    Completion,
    Effect,
    StoredRecord,
    StoreStatistics,
    SynchronousStore,
    bad_caller_or_key,
    bad_outcome_size,
    run_effect,
)

__all__ = ["MemoryEffect", "MemoryStore"]

_CLAIMED = ClaimKind.CLAIMED


class _StoreName:
    """How the table's errors name the store (the store's own repr counts records)."""

    def __repr__(self) -> str:
        return "MemoryStore"


_NAME = _StoreName()


class MemoryEffect(Effect):
    """An effect run by :class:`MemoryStore` in the step that completes the record.

    ``fn()`` returns the call's result (or raises a final ApplicationError to record a
    refusal). No other goroutine runs between it and the record's completion, and a stale
    claim's effect does not run at all. The store cannot roll back Python objects: ``fn``
    must check before it changes anything, so that raising leaves nothing half done (the
    claim is then released, or the refusal recorded). Once ``fn`` has returned, its
    changes stand: a result that cannot be recorded completes the key with the final
    ``UNRECORDED_RESULT`` error instead of releasing it, so a retry does not apply the
    effect again.
    """

    __slots__ = ("fn",)

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.fn = fn


class _MemoryTable:
    """MemoryStore's records, fence counter and its two per-call steps (the reference;
    ``idempotency._speedups.MemoryTable`` is its C twin, with the same attributes).

    Invariant: a key absent from ``records`` reads as ABSENT; an expired record may
    remain until swept or overwritten. ``fence`` is the last token handed out.
    """

    __slots__ = ("clock", "fence", "operations", "records")

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.records: dict[tuple[str, str], Record] = {}
        self.fence = 0
        self.operations = 0

    def claim(self, caller: str, key: str, fingerprint: bytes, lease: float) -> ClaimResult:
        return _claim_step(self, caller, key, fingerprint, lease)

    def complete(self, caller: str, key: str, fence: int, completion: Completion) -> Record:
        return _complete_step(self, caller, key, fence, completion)


def _claim_step(
    table: _MemoryTable, caller: str, key: str, fingerprint: bytes, lease: float
) -> ClaimResult:
    """Answer a claim; write the record when it is CLAIMED. (Also the C twin's fallback:
    ``table`` may be either kind.) A caller or key past the stores' limit is refused
    with InvalidKey, as every store refuses it."""
    if (bad := bad_caller_or_key(_NAME, "claim", caller, key)) is not None:
        raise bad
    table.operations += 1
    rk = (caller, key)
    res = claim(table.records.get(rk), fingerprint, table.clock(), lease, table.fence + 1)
    if res.kind is _CLAIMED:
        table.fence += 1
        table.records[rk] = res.record
    return res


def _complete_step(
    table: _MemoryTable, caller: str, key: str, fence: int, completion: Completion
) -> Record:
    """Record the outcome of claim ``fence``, running a MemoryEffect first. An outcome
    past the stores' limit is refused, as every store refuses it."""
    if (bad := bad_outcome_size(_NAME, caller, key, completion)) is not None:
        raise bad
    table.operations += 1
    rk = (caller, key)
    now = table.clock()
    record = table.records.get(rk)
    ok, payload, effect = completion.ok, completion.payload, completion.effect
    if effect is not None:
        if not isinstance(effect, MemoryEffect):
            raise TypeError(f"MemoryStore cannot run a {type(effect).__name__}")
        # Check the claim first: a stale holder's effect must not run.
        complete(record, fence, True, b"", now, completion.ttl, caller, key)
        ok, payload = run_effect(effect.fn, completion.max_result_bytes)
    assert payload is not None
    done = complete(record, fence, ok, payload, now, completion.ttl, caller, key)
    table.records[rk] = done
    return done


if _speedups is not None:
    _speedups.configure_memory(
        claim_step=_claim_step,
        complete_step=_complete_step,
        max_key_length=MAX_KEY_LENGTH,
        max_payload_bytes=MAX_PAYLOAD_BYTES,
    )
    _Table: Any = _speedups.MemoryTable
else:
    _Table = _MemoryTable


class MemoryStore(SynchronousStore):
    """Records in process memory on the runtime clock (see the module docstring)."""

    def __init__(self, clock: Callable[[], float] = gosim.now) -> None:
        # The table calls the clock (gosim.now: the running runtime's clock) itself.
        self._table = _Table(clock)
        # The per-call steps are the table's own methods, bound here over the class's
        # (which say the same): no frame of ours around them on every call.
        self.claim_sync = self._table.claim  # type: ignore[method-assign]
        self.complete_sync = self._table.complete  # type: ignore[method-assign]

    def claim_sync(self, caller: str, key: str, fingerprint: bytes, lease: float) -> ClaimResult:
        res: ClaimResult = self._table.claim(caller, key, fingerprint, lease)
        return res

    def complete_sync(self, caller: str, key: str, fence: int, completion: Completion) -> Record:
        rec: Record = self._table.complete(caller, key, fence, completion)
        return rec

    @property
    def _records(self) -> dict[tuple[str, str], Record]:
        records: dict[tuple[str, str], Record] = self._table.records
        return records

    def __repr__(self) -> str:
        return f"MemoryStore({len(self._records)} records)"

    async def claim(self, caller: str, key: str, fingerprint: bytes, lease: float) -> ClaimResult:
        res: ClaimResult = self._table.claim(caller, key, fingerprint, lease)
        return res

    async def complete(self, caller: str, key: str, fence: int, completion: Completion) -> Record:
        rec: Record = self._table.complete(caller, key, fence, completion)
        return rec

    async def release(self, caller: str, key: str, fence: int) -> bool:
        self._table.operations += 1
        rk = (caller, key)
        try:
            release(self._records.get(rk), fence, self._table.clock(), caller, key)
        except StaleClaim:
            return False
        del self._records[rk]
        return True

    async def renew(self, caller: str, key: str, fence: int, lease: float) -> Record:
        self._table.operations += 1
        rk = (caller, key)
        rec = renew(self._records.get(rk), fence, self._table.clock(), lease, caller, key)
        self._records[rk] = rec
        return rec

    async def get(self, caller: str, key: str) -> Record | None:
        self._table.operations += 1
        record = self._records.get((caller, key))
        return record if state_at(record, self._table.clock()) else None

    async def sweep(self) -> int:
        self._table.operations += 1
        now = self._table.clock()
        dead = [rk for rk, rec in self._records.items() if rec.expires_at <= now]
        for rk in dead:
            del self._records[rk]
        return len(dead)

    def now(self) -> float:
        now: float = self._table.clock()
        return now

    def statistics(self) -> StoreStatistics:
        ops = self._table.operations
        return StoreStatistics(ops, ops, 1 if ops else 0)

    # ------------------------------------------------------------ operator's tools

    async def inspect(self, caller: str, key: str) -> StoredRecord | None:
        record = self._records.get((caller, key))
        if record is None:
            return None
        return StoredRecord(caller, key, record, None, self._table.clock())

    async def forget(self, caller: str, key: str, *, force: bool = False) -> StoredRecord | None:
        # One step, with no other goroutine in between: the check and the delete are atomic.
        rk = (caller, key)
        record = self._records.get(rk)
        if record is None:
            return None
        held = StoredRecord(caller, key, record, None, self._table.clock())
        if not force and held.state == "IN_PROGRESS":
            raise InProgress(caller, key)
        del self._records[rk]
        return held
