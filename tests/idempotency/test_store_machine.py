"""Each store against a model: a hypothesis RuleBasedStateMachine drives claims,
completions (current and stale), releases, reads, sweeps, waiting duplicates through
``Idempotency`` and a clock moved by hand (leases lapse, TTLs pass), and checks every
answer against a dict that knows nothing of ``idempotency._record``."""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from typing import Any

import msgpack
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    invariant,
    rule,
    run_state_machine_as_test,
)

import gosim
from idempotency import Call, Idempotency, InProgress, KeyReused, StaleClaim
from idempotency._keys import fingerprint
from idempotency._record import ClaimKind
from idempotency.stores import Completion, MemoryStore, SQLiteStore, Store

# Leases and TTLs far longer than a test runs in real time: RedisStore's key TTL runs
# on the server's clock and must never remove a record the model still holds live.
LEASE = 1000.0
TTL = 5000.0
CALLERS = ("alice", "bob")
KEYS = ("k1", "k2", "k3")
REQUESTS = (("op", [1]), ("op", [2]))


@dataclass
class ModelRecord:
    completed: bool
    request: int
    fence: int
    expires_at: float
    payload: bytes | None = None


@dataclass(frozen=True)
class Held:
    caller: str
    key: str
    fence: int


class Clock:
    def __init__(self) -> None:
        self.t = 1_700_000_000.0

    def __call__(self) -> float:
        return self.t


def grun(fn: Any, *args: Any) -> Any:
    """Run ``fn(*args)`` in a fresh runtime; its exception is raised here (caught in the
    goroutine, so the runtime goes on to stop cleanly and notes no crash report)."""

    async def main() -> Any:
        try:
            return (True, await fn(*args))
        except Exception as exc:
            return (False, exc)

    ok, value = gosim.run(main, procs=2)
    if not ok:
        raise value
    return value


class StoreMachine(RuleBasedStateMachine):
    claims = Bundle("claims")

    def __init__(self, make_store: Any, gaps: bool = False) -> None:
        """``gaps``: the store's fencing tokens rise but may skip values (a Postgres
        sequence: a token taken by a batch that then did not use it is not reused)."""
        super().__init__()
        self.gaps = gaps
        self.clock = Clock()
        self.store: Store = make_store(self.clock)
        self.model: dict[tuple[str, str], ModelRecord] = {}
        self.fence = 0
        self.seq = 0

    def teardown(self) -> None:
        self.store.close()

    def next_fence(self, got: int) -> None:
        """A new claim's token: the next one, or with ``gaps`` any higher one."""
        if self.gaps:
            assert got > self.fence
            self.fence = got
        else:
            self.fence += 1
            assert got == self.fence

    def live(self, caller: str, key: str) -> ModelRecord | None:
        rec = self.model.get((caller, key))
        return rec if rec is not None and rec.expires_at > self.clock.t else None

    @rule(
        target=claims,
        caller=st.sampled_from(CALLERS),
        key=st.sampled_from(KEYS),
        req=st.integers(0, len(REQUESTS) - 1),
    )
    def claim(self, caller: str, key: str, req: int) -> Any:
        res = grun(self.store.claim, caller, key, fingerprint(*REQUESTS[req]), LEASE)
        rec = self.live(caller, key)
        if rec is None:
            assert res.kind is ClaimKind.CLAIMED
            self.next_fence(res.record.fence)
            self.model[caller, key] = ModelRecord(False, req, self.fence, self.clock.t + LEASE)
            return Held(caller, key, self.fence)
        if rec.request != req:
            assert res.kind is ClaimKind.MISMATCH
        elif rec.completed:
            assert res.kind is ClaimKind.REPLAY
            assert res.record.payload == rec.payload and res.record.fence == rec.fence
        else:
            assert res.kind is ClaimKind.BUSY and res.record.fence == rec.fence
        return Held(caller, key, -1)  # not a claim: completing it must be stale

    @rule(held=consumes(claims), ok=st.booleans())
    def complete(self, held: Held, ok: bool) -> None:
        self.seq += 1
        payload = msgpack.packb(["result", self.seq])
        rec = self.live(held.caller, held.key)
        current = rec is not None and not rec.completed and rec.fence == held.fence
        try:
            done = grun(
                self.store.complete,
                held.caller,
                held.key,
                held.fence,
                Completion(ok, payload, None, TTL, 1 << 20),
            )
        except StaleClaim:
            assert not current
            return
        assert current and rec is not None
        assert done.payload == payload and done.ok == ok and done.fence == held.fence
        rec.completed, rec.payload, rec.expires_at = True, payload, self.clock.t + TTL

    @rule(held=consumes(claims))
    def release(self, held: Held) -> None:
        rec = self.live(held.caller, held.key)
        current = rec is not None and not rec.completed and rec.fence == held.fence
        assert grun(self.store.release, held.caller, held.key, held.fence) == current
        if current:
            del self.model[held.caller, held.key]

    @rule(dt=st.sampled_from([1.0, 100.0, LEASE - 1, LEASE, TTL]))
    def advance(self, dt: float) -> None:
        self.clock.t += dt

    @rule()
    def sweep(self) -> None:
        expired = [rk for rk, rec in self.model.items() if rec.expires_at <= self.clock.t]
        assert grun(self.store.sweep) == len(expired)
        for rk in expired:
            del self.model[rk]

    @rule(
        caller=st.sampled_from(CALLERS),
        key=st.sampled_from(KEYS),
        req=st.integers(0, len(REQUESTS) - 1),
        n=st.integers(1, 4),
        wait=st.booleans(),
    )
    def duplicates(self, caller: str, key: str, req: int, n: int, wait: bool) -> None:
        """``n`` concurrent calls of one key through Idempotency: one runs, all agree."""
        runs: list[int] = []
        before = self.live(caller, key)
        # Waiting on a claim held by the bundle can only time out: keep that short, and
        # give a free key's duplicates all the time its holder may need.
        timeout = 0.05 if before is not None and not before.completed else 30.0
        self.seq += 1
        seq = self.seq

        async def handler(call: Call) -> Any:
            runs.append(call.fence)
            await gosim.sleep(0.002)
            return ["dup", seq]

        async def main() -> list[Any]:
            idem = Idempotency(self.store, ttl=TTL, lease=LEASE)
            out: gosim.Chan[Any] = gosim.Chan(n)

            async def one() -> None:
                try:
                    r: Any = await idem.run(
                        caller=caller, key=key, request=REQUESTS[req], handler=handler,
                        wait=wait, timeout=timeout,
                    )  # fmt: skip
                except (KeyReused, InProgress) as exc:
                    r = exc
                await out.send(r)

            for _ in range(n):
                gosim.go(one)
            return [await out.recv() for _ in range(n)]

        results = grun(main)
        rec = self.live(caller, key)
        if rec is not None and rec.request != req:
            assert runs == [] and all(isinstance(r, KeyReused) for r in results)
        elif rec is not None and rec.completed:
            assert runs == [] and all(r.replayed and r.payload == rec.payload for r in results)
        elif rec is not None:  # held by a claim of the bundle: nobody can finish it here
            assert runs == [] and all(isinstance(r, InProgress) for r in results)
        else:
            assert len(runs) == 1
            self.next_fence(runs[0])
            if wait:
                assert len({r.payload for r in results}) == 1
                assert sorted(r.replayed for r in results) == [False] + [True] * (n - 1)
            else:  # duplicates that would not wait were refused while it ran
                firsts = [r for r in results if not isinstance(r, InProgress)]
                assert len(firsts) >= 1 and all(r.payload == firsts[0].payload for r in firsts)
            payload = msgpack.packb(["dup", seq])
            self.model[caller, key] = ModelRecord(
                True, req, self.fence, self.clock.t + TTL, payload
            )

    @rule(
        caller=st.sampled_from(CALLERS),
        key=st.sampled_from(KEYS),
        req=st.integers(0, len(REQUESTS) - 1),
        n=st.integers(1, 4),
    )
    def one_step_duplicates(self, caller: str, key: str, req: int, n: int) -> None:
        """``n`` concurrent calls of one key through ``run(..., one_step=True)`` (one
        transaction per call on SQLite, the usual path elsewhere): one outcome is
        recorded under the next fence, and every caller gets it."""
        before = self.live(caller, key)
        timeout = 0.05 if before is not None and not before.completed else 30.0
        self.seq += 1
        seq = self.seq

        def handler(call: Call) -> Any:
            return ["one", seq]

        async def main() -> list[Any]:
            idem = Idempotency(self.store, ttl=TTL, lease=LEASE)
            out: gosim.Chan[Any] = gosim.Chan(n)

            async def one() -> None:
                try:
                    r: Any = await idem.run(
                        caller=caller, key=key, request=REQUESTS[req], handler=handler,
                        timeout=timeout, one_step=True,
                    )  # fmt: skip
                except (KeyReused, InProgress) as exc:
                    r = exc
                await out.send(r)

            for _ in range(n):
                gosim.go(one)
            return [await out.recv() for _ in range(n)]

        results = grun(main)
        rec = self.live(caller, key)
        if rec is not None and rec.request != req:
            assert all(isinstance(r, KeyReused) for r in results)
        elif rec is not None and rec.completed:
            assert all(r.replayed and r.payload == rec.payload for r in results)
        elif rec is not None:  # held by a claim of the bundle: nobody can finish it here
            assert all(isinstance(r, InProgress) for r in results)
        else:
            payload = msgpack.packb(["one", seq])
            assert all(r.payload == payload for r in results)
            fresh = [r.fence for r in results if not r.replayed]
            assert len(fresh) == 1
            self.next_fence(fresh[0])
            self.model[caller, key] = ModelRecord(
                True, req, self.fence, self.clock.t + TTL, payload
            )

    @invariant()
    def reads_agree(self) -> None:
        async def read_all() -> dict[tuple[str, str], Any]:
            return {(c, k): await self.store.get(c, k) for c in CALLERS for k in KEYS}

        everything = grun(read_all)
        for caller in CALLERS:
            for key in KEYS:
                got = everything[caller, key]
                rec = self.live(caller, key)
                if rec is None:
                    assert got is None
                else:
                    assert got is not None and got.fence == rec.fence
                    assert (got.payload is not None) == rec.completed
                    assert got.fingerprint == fingerprint(*REQUESTS[rec.request])
                    if rec.completed:
                        assert got.payload == rec.payload


MACHINE_SETTINGS = settings(max_examples=25, stateful_step_count=25, deadline=None)


def test_memory_store_machine() -> None:
    run_state_machine_as_test(
        lambda: StoreMachine(lambda clock: MemoryStore(clock=clock)), settings=MACHINE_SETTINGS
    )


def test_sqlite_store_machine() -> None:
    tmp = tempfile.mkdtemp(prefix="idem-machine-")
    counter = iter(range(10**9))
    try:
        run_state_machine_as_test(
            lambda: StoreMachine(
                # No automatic sweeping: the sweep rule counts what an explicit one finds.
                lambda clock: SQLiteStore(
                    os.path.join(tmp, f"{next(counter)}.db"), clock=clock, sweep_every=0
                )
            ),
            settings=MACHINE_SETTINGS,
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def test_redis_store_machine(redis_server: Any) -> None:
    redis_store = pytest.importorskip("idempotency.stores.redis", reason="needs redis-py")
    counter = iter(range(10**9))
    run_state_machine_as_test(
        lambda: StoreMachine(
            lambda clock: redis_store.RedisStore(
                redis_server.url, prefix=f"m{os.getpid()}-{next(counter)}:", clock=clock
            )
        ),
        settings=MACHINE_SETTINGS,
    )


def test_postgres_store_machine(postgres_server: Any) -> None:
    pg_store = pytest.importorskip("idempotency.stores.postgres", reason="needs psycopg")
    counter = iter(range(10**9))
    run_state_machine_as_test(
        lambda: StoreMachine(
            # No automatic sweeping: the sweep rule counts what an explicit one finds.
            lambda clock: pg_store.PostgresStore(
                postgres_server.dsn,
                schema=f"m{os.getpid()}_{next(counter)}",
                clock=clock,
                sweep_every=0,
                pool_size=2,
            ),
            gaps=True,
        ),
        settings=MACHINE_SETTINGS,
    )
