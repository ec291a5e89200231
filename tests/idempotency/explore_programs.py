"""Small gosim programs misusing the idempotency core, for schedule exploration: the
idempotency half of the catalogue of ``tests/gosim/explore_programs.py`` (module-level,
so that ``python -m gosim.testing replay tests.idempotency.explore_programs:NAME PLAN``
finds them). Each is built on the public API over a ``MemoryStore``, passes under Go's
own order and fails only under another interleaving; the invariant beside each detects
the effect run twice.
"""

from __future__ import annotations

from typing import Any

import gosim
from gosim.sync import WaitGroup
from idempotency import (
    Call,
    Idempotency,
    MemoryEffect,
    MemoryStore,
    StaleClaim,
    StoreUnavailable,
)
from idempotency.stores import Completion, Store, StoreStatistics

CALLER, KEY = "shop", "order-1"


class ProviderTimeout(Exception):
    """The payment provider did not answer: a retryable failure (it releases the claim)."""


async def released_twice() -> list[str]:
    """Two deliveries of one request (workers ``a`` and ``b``), each retrying once when
    the payment provider times out. The first execution times out; ``Idempotency``
    releases its claim, and the worker "frees the key for the retry" a second time
    (``store.forget(force=True)``). When the other worker claimed the key in between, the
    second release deletes that live claim: the retry claims the key again and both
    charge. Returns who charged; :func:`charged_once` wants at most one."""
    store = MemoryStore()
    idem = Idempotency(store)
    charges: list[str] = []
    executions = {"n": 0}

    def charge(who: str) -> Any:
        async def handler(call: Call) -> str:
            executions["n"] += 1
            first = executions["n"] == 1
            await gosim.gosched()  # the call to the payment provider
            if first:
                raise ProviderTimeout(f"{who}: no answer")
            charges.append(who)
            return "charged"

        return handler

    async def worker(who: str) -> None:
        for _ in range(2):
            try:
                await idem.run(
                    caller=CALLER, key=KEY, request=("charge", [KEY, 10]), handler=charge(who)
                )
                return
            except ProviderTimeout:
                # The bug: Idempotency has released the claim already; this second
                # release, by key, deletes whatever claim holds the key now.
                await store.forget(CALLER, KEY, force=True)
            except StaleClaim:
                return  # its claim was deleted under it; it charged all the same

    wg = WaitGroup()
    wg.go(worker, "a")
    wg.go(worker, "b")
    await wg.wait()
    return charges


def charged_once(charges: list[str]) -> bool:
    """The invariant of :func:`released_twice`: one key, at most one charge."""
    return len(charges) <= 1


class Link:
    """The connection a store wrapper writes records over; ``down`` while an outage
    lasts, when a record in flight is lost."""

    def __init__(self) -> None:
        self.down = False

    async def send(self) -> None:
        await gosim.gosched()  # the record in flight
        if self.down:
            raise StoreUnavailable("the link to the store dropped the record")


class EffectFirstStore(Store):
    """A hand-rolled store wrapper with the bug: it runs a ``MemoryEffect`` itself, then
    sends the record to the MemoryStore over a :class:`Link`. The effect is outside the
    step that writes the record, so a record lost on the way leaves the effect applied
    with no record, the claim is released, and a retry applies it again. (The right way
    is the MemoryStore's own ``complete``, which runs the effect in the record's step.)"""

    def __init__(self, inner: MemoryStore, link: Link) -> None:
        self.inner = inner
        self.link = link

    async def claim(self, caller: str, key: str, fingerprint: bytes, lease: float) -> Any:
        return await self.inner.claim(caller, key, fingerprint, lease)

    async def complete(self, caller: str, key: str, fence: int, completion: Completion) -> Any:
        effect = completion.effect
        if isinstance(effect, MemoryEffect):
            value = effect.fn()  # the bug: applied before, and apart from, the record
            await self.link.send()
            completion = completion._replace(effect=MemoryEffect(lambda: value))
        return await self.inner.complete(caller, key, fence, completion)

    async def release(self, caller: str, key: str, fence: int) -> bool:
        return await self.inner.release(caller, key, fence)

    async def renew(self, caller: str, key: str, fence: int, lease: float) -> Any:
        return await self.inner.renew(caller, key, fence, lease)

    async def get(self, caller: str, key: str) -> Any:
        return await self.inner.get(caller, key)

    async def sweep(self) -> int:
        return await self.inner.sweep()

    def now(self) -> float:
        return self.inner.now()

    def statistics(self) -> StoreStatistics:
        return self.inner.statistics()


async def effect_without_record() -> tuple[int, bool]:
    """A client debits an account once per key through :class:`EffectFirstStore`,
    retrying when the store is unavailable, while the link to the store has a short
    outage. When the outage covers the record's flight, the debit is applied without its
    record and the retry debits again. Returns the balance and whether the key has a
    record; :func:`debited_with_record` wants 90 with one, 100 without."""
    link = Link()
    store = EffectFirstStore(MemoryStore(), link)
    idem = Idempotency(store)
    balance = {"acct": 100}

    def debit(call: Call) -> MemoryEffect:
        def apply() -> int:
            balance["acct"] -= 10
            return balance["acct"]

        return MemoryEffect(apply)

    async def client() -> None:
        for _ in range(3):
            try:
                await idem.run(
                    caller=CALLER, key=KEY, request=("debit", ["acct", 10]), handler=debit
                )
                return
            except StoreUnavailable:
                await gosim.sleep(0.1)

    async def outage() -> None:
        link.down = True
        await gosim.gosched()
        link.down = False

    wg = WaitGroup()
    wg.go(client)
    wg.go(outage)
    await wg.wait()
    return balance["acct"], await store.get(CALLER, KEY) is not None


def debited_with_record(result: tuple[int, bool]) -> bool:
    """The invariant of :func:`effect_without_record`: the debit and its record, or
    neither."""
    balance, recorded = result
    return balance == (90 if recorded else 100)
