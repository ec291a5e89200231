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
from gosim.lowlevel import state as _gosim_state

from .._errors import StaleClaim
from .._record import ClaimKind, ClaimResult, Record, claim, complete, release, state_at
from ._contract import Completion, Effect, Store, StoreStatistics, run_effect

__all__ = ["MemoryEffect", "MemoryStore"]

_CLAIMED = ClaimKind.CLAIMED


class MemoryEffect(Effect):
    """An effect run by :class:`MemoryStore` in the step that completes the record.

    ``fn()`` returns the call's result (or raises a final ApplicationError to record a
    refusal). No other goroutine runs between it and the record's completion, and a stale
    claim's effect does not run at all. The store cannot roll back Python objects: ``fn``
    must check before it changes anything, so that raising leaves nothing half done.
    """

    __slots__ = ("fn",)

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.fn = fn


class MemoryStore(Store):
    """Records in process memory on the runtime clock (see the module docstring)."""

    def __init__(self, clock: Callable[[], float] = gosim.now) -> None:
        self._clock = clock
        # The runtime's clock is read twice a call: the default reads it without
        # gosim.now's frame (the same clock, virtual or not).
        self._runtime_clock = clock is gosim.now
        # Invariant: a key absent here reads as ABSENT; an expired record may remain
        # until swept or overwritten.
        self._records: dict[tuple[str, str], Record] = {}
        self._fence = 0  # the last fencing token handed out
        self._operations = 0

    def __repr__(self) -> str:
        return f"MemoryStore({len(self._records)} records)"

    synchronous = True  # no operation waits: Idempotency calls the *_sync methods

    def claim_sync(self, caller: str, key: str, fingerprint: bytes, lease: float) -> ClaimResult:
        self._operations += 1
        rk = (caller, key)
        rt = _gosim_state.rt
        now = rt.now() if self._runtime_clock and rt is not None else self._clock()
        res = claim(self._records.get(rk), fingerprint, now, lease, self._fence + 1)
        if res.kind is _CLAIMED:
            self._fence += 1
            self._records[rk] = res.record
        return res

    async def claim(self, caller: str, key: str, fingerprint: bytes, lease: float) -> ClaimResult:
        return self.claim_sync(caller, key, fingerprint, lease)

    def complete_sync(self, caller: str, key: str, fence: int, completion: Completion) -> Record:
        self._operations += 1
        rk = (caller, key)
        rt = _gosim_state.rt
        now = rt.now() if self._runtime_clock and rt is not None else self._clock()
        record = self._records.get(rk)
        ok, payload, effect = completion.ok, completion.payload, completion.effect
        if effect is not None:
            if not isinstance(effect, MemoryEffect):
                raise TypeError(f"MemoryStore cannot run a {type(effect).__name__}")
            # Check the claim first: a stale holder's effect must not run.
            complete(record, fence, True, b"", now, completion.ttl, caller, key)
            ok, payload = run_effect(effect.fn, completion.max_result_bytes)
        assert payload is not None
        done = complete(record, fence, ok, payload, now, completion.ttl, caller, key)
        self._records[rk] = done
        return done

    async def complete(self, caller: str, key: str, fence: int, completion: Completion) -> Record:
        return self.complete_sync(caller, key, fence, completion)

    async def release(self, caller: str, key: str, fence: int) -> bool:
        self._operations += 1
        rk = (caller, key)
        try:
            release(self._records.get(rk), fence, self._clock(), caller, key)
        except StaleClaim:
            return False
        del self._records[rk]
        return True

    async def get(self, caller: str, key: str) -> Record | None:
        self._operations += 1
        record = self._records.get((caller, key))
        return record if state_at(record, self._clock()) else None

    async def sweep(self) -> int:
        self._operations += 1
        now = self._clock()
        dead = [rk for rk, rec in self._records.items() if rec.expires_at <= now]
        for rk in dead:
            del self._records[rk]
        return len(dead)

    def now(self) -> float:
        return self._clock()

    def statistics(self) -> StoreStatistics:
        return StoreStatistics(self._operations, self._operations, 1 if self._operations else 0)
