"""The store contract: one suite, run unchanged against MemoryStore, SQLiteStore and
RedisStore (the ``kit`` fixture), through ``Idempotency`` and through the store API."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest

import gosim
from idempotency import (
    ApplicationError,
    Call,
    Idempotency,
    InProgress,
    InvalidResult,
    KeyReused,
    StaleClaim,
)
from idempotency._keys import fingerprint
from idempotency._record import COMPLETED, IN_PROGRESS, ClaimKind
from idempotency.stores import Completion, Store

TTL = 1000.0
LEASE = 100.0


def grun(fn: Any, *args: Any) -> Any:
    return gosim.run(fn, *args, procs=2)


class Counting:
    """A handler that counts its runs and returns what it was asked to."""

    def __init__(self, result: Any = None, sleep: float = 0.0) -> None:
        self.runs = 0
        self.result = result
        self.sleep = sleep
        self.calls: list[Call] = []

    async def __call__(self, call: Call) -> Any:
        self.runs += 1
        self.calls.append(call)
        if self.sleep:
            await gosim.sleep(self.sleep)
        return self.result if self.result is not None else {"args": call.args, "op": call.operation}


@pytest.fixture
def store(kit: Any, clock: Any) -> Any:
    s = kit.make(clock)
    yield s
    s.close()


def make_idem(store: Store, **kw: Any) -> Idempotency:
    kw.setdefault("ttl", TTL)
    kw.setdefault("lease", LEASE)
    return Idempotency(store, **kw)


def test_first_call_runs_and_a_retry_replays_the_same_bytes(store: Store) -> None:
    h = Counting()

    async def main() -> None:
        idem = make_idem(store)
        first = await idem.run(caller="c", key="k", request=("op", [1, "x"]), handler=h)
        again = await idem.run(caller="c", key="k", request=("op", [1, "x"]), handler=h)
        assert h.runs == 1
        assert not first.replayed and again.replayed
        assert first.payload == again.payload == msgpack.packb({"args": [1, "x"], "op": "op"})
        assert first.value == again.value == {"args": [1, "x"], "op": "op"}
        assert first.fence == again.fence == h.calls[0].fence

    grun(main)


def test_keys_are_scoped_per_caller(store: Store) -> None:
    h = Counting()

    async def main() -> None:
        idem = make_idem(store)
        a = await idem.run(caller="alice", key="k", request=("op", [1]), handler=h)
        b = await idem.run(caller="bob", key="k", request=("op", [1]), handler=h)
        assert h.runs == 2 and not a.replayed and not b.replayed
        assert b.fence > a.fence

    grun(main)


def test_same_key_different_request_is_refused_and_changes_nothing(store: Store) -> None:
    h = Counting()

    async def main() -> None:
        idem = make_idem(store)
        first = await idem.run(caller="c", key="k", request=("op", [1]), handler=h)
        for other in [("op", [2]), ("other", [1]), ("op", (1, 2))]:
            with pytest.raises(KeyReused, match="'k'"):
                await idem.run(caller="c", key="k", request=other, handler=h)
        again = await idem.run(caller="c", key="k", request=("op", (1,)), handler=h)
        assert again.replayed and again.payload == first.payload and h.runs == 1

    grun(main)


def test_reuse_while_in_progress_is_refused(store: Store) -> None:
    async def main() -> None:
        idem = make_idem(store)
        fp = fingerprint("op", [1])
        res = await store.claim("c", "k", fp, LEASE)
        assert res.kind is ClaimKind.CLAIMED
        with pytest.raises(KeyReused):
            await idem.run(caller="c", key="k", request=("op", [2]), handler=Counting())

    grun(main)


def test_final_application_error_is_recorded_and_replayed(store: Store) -> None:
    runs = []

    async def refuse(call: Call) -> None:
        runs.append(call)
        raise ApplicationError(42, "insufficient funds", {"need": 10})

    async def main() -> None:
        idem = make_idem(store)
        first = await idem.run(caller="c", key="k", request=("op", []), handler=refuse)
        again = await idem.run(caller="c", key="k", request=("op", []), handler=refuse)
        assert len(runs) == 1 and not first.ok and again.replayed
        assert first.payload == again.payload
        with pytest.raises(ApplicationError) as info:
            _ = again.value
        assert (info.value.code, info.value.message, info.value.data) == (
            42,
            "insufficient funds",
            {"need": 10},
        )
        assert info.value.replayed

    grun(main)


@pytest.mark.parametrize(
    "exc", [ApplicationError(1, "try later", retryable=True), RuntimeError("crash")]
)
def test_retryable_errors_release_the_claim(store: Store, exc: Exception) -> None:
    attempts = []

    async def flaky(call: Call) -> str:
        attempts.append(call.fence)
        if len(attempts) == 1:
            raise exc
        return "done"

    async def main() -> None:
        idem = make_idem(store)
        with pytest.raises(type(exc)):
            await idem.run(caller="c", key="k", request=("op", []), handler=flaky)
        assert await store.get("c", "k") is None
        out = await idem.run(caller="c", key="k", request=("op", []), handler=flaky)
        assert out.value == "done" and not out.replayed
        assert attempts[1] > attempts[0]

    grun(main)


def test_unrecordable_result_releases_the_claim(store: Store) -> None:
    async def bad(call: Call) -> Any:
        return {1, 2} if call.args == [0] else b"x" * 2000

    async def main() -> None:
        idem = make_idem(store, max_result_bytes=1000)
        with pytest.raises(InvalidResult, match="not msgpack-serialisable"):
            await idem.run(caller="c", key="k", request=("op", [0]), handler=bad)
        with pytest.raises(InvalidResult, match="limit is 1000"):
            await idem.run(caller="c", key="k2", request=("op", [1]), handler=bad)
        assert await store.get("c", "k") is None and await store.get("c", "k2") is None

    grun(main)


def test_in_progress_without_waiting(store: Store) -> None:
    async def main() -> None:
        idem = make_idem(store)
        res = await store.claim("c", "k", fingerprint("op", [1]), LEASE)
        assert res.kind is ClaimKind.CLAIMED
        with pytest.raises(InProgress, match="'k'"):
            await idem.run(caller="c", key="k", request=("op", [1]), handler=Counting(), wait=False)
        with pytest.raises(InProgress, match="after waiting"):
            await idem.run(
                caller="c", key="k", request=("op", [1]), handler=Counting(), timeout=0.05
            )

    grun(main)


def test_concurrent_duplicates_wait_for_the_first_outcome(store: Store) -> None:
    h = Counting(sleep=0.05)
    n = 12

    async def main() -> None:
        idem = make_idem(store)
        results: gosim.Chan[Any] = gosim.Chan(n)

        async def one() -> None:
            out = await idem.run(caller="c", key="k", request=("op", [7]), handler=h, timeout=10)
            await results.send(out)

        for _ in range(n):
            gosim.go(one)
        outs = [await results.recv() for _ in range(n)]
        assert h.runs == 1
        assert len({o.payload for o in outs}) == 1
        assert sorted(o.replayed for o in outs) == [False] + [True] * (n - 1)

    grun(main)


def test_a_waiter_takes_over_when_the_holder_releases(store: Store) -> None:
    async def main() -> None:
        idem = make_idem(store)
        first_started: gosim.Chan[None] = gosim.Chan(1)
        proceed: gosim.Chan[None] = gosim.Chan(1)
        done: gosim.Chan[Any] = gosim.Chan(2)

        async def failing(call: Call) -> None:
            await first_started.send(None)
            await proceed.recv()
            raise RuntimeError("first attempt fails")

        async def holder() -> None:
            try:
                await idem.run(caller="c", key="k", request=("op", []), handler=failing)
            except RuntimeError as exc:
                await done.send(exc)

        second = Counting(result="second")

        async def waiter() -> None:
            await done.send(
                await idem.run(caller="c", key="k", request=("op", []), handler=second, timeout=10)
            )

        gosim.go(holder)
        await first_started.recv()
        gosim.go(waiter)
        await gosim.sleep(0.02)  # the waiter is parked on the key
        await proceed.send(None)
        got = [await done.recv(), await done.recv()]
        outcome = next(g for g in got if not isinstance(g, Exception))
        assert outcome.value == "second" and not outcome.replayed and second.runs == 1

    grun(main)


def test_lapsed_lease_is_taken_over_and_the_stale_completion_refused(
    store: Store, clock: Any, kit: Any
) -> None:
    async def main() -> None:
        fp = fingerprint("op", [1])
        old = await store.claim("c", "k", fp, LEASE)
        assert old.kind is ClaimKind.CLAIMED and old.record.state == IN_PROGRESS
        busy = await store.claim("c", "k", fp, LEASE)
        assert busy.kind is ClaimKind.BUSY and busy.record.fence == old.record.fence
        clock.advance(LEASE + 1)
        h = Counting(result="new")
        out = await make_idem(store).run(caller="c", key="k", request=("op", [1]), handler=h)
        assert out.fence > old.record.fence and h.runs == 1
        before = await store.get("c", "k")
        with pytest.raises(StaleClaim, match="taken over"):
            await store.complete(
                "c", "k", old.record.fence, Completion(True, b"\xa3old", None, TTL, 1000)
            )
        with pytest.raises(StaleClaim):
            await store.complete(
                "c",
                "k",
                old.record.fence,
                Completion(True, None, kit.counter_effect(store, "n", 5), TTL, 1000),
            )
        assert kit.read(store, "n") == 0  # the stale holder's effect did not happen
        assert await store.get("c", "k") == before
        assert not await store.release("c", "k", old.record.fence)
        assert await store.get("c", "k") == before

    grun(main)


def test_completion_after_the_lease_lapsed_is_stale(store: Store, clock: Any) -> None:
    async def main() -> None:
        res = await store.claim("c", "k", fingerprint("op", []), LEASE)
        clock.advance(LEASE)
        with pytest.raises(StaleClaim, match="lapsed"):
            await store.complete(
                "c", "k", res.record.fence, Completion(True, b"\xc0", None, TTL, 10)
            )
        assert await store.get("c", "k") is None

    grun(main)


def test_double_completion_is_stale(store: Store) -> None:
    async def main() -> None:
        res = await store.claim("c", "k", fingerprint("op", []), LEASE)
        f = res.record.fence
        done = await store.complete("c", "k", f, Completion(True, b"\x01", None, TTL, 10))
        assert done.state == COMPLETED and done.payload == b"\x01"
        with pytest.raises(StaleClaim, match="already completed"):
            await store.complete("c", "k", f, Completion(True, b"\x02", None, TTL, 10))
        assert await store.get("c", "k") == done

    grun(main)


def test_ttl_expiry_makes_the_key_new_and_sweep_deletes(store: Store, clock: Any) -> None:
    h = Counting()

    async def main() -> None:
        idem = make_idem(store)
        await idem.run(caller="c", key="k", request=("op", [1]), handler=h)
        await idem.run(caller="c", key="other", request=("op", [1]), handler=h)
        clock.advance(TTL - 1)
        assert (await idem.run(caller="c", key="k", request=("op", [1]), handler=h)).replayed
        clock.advance(1)
        assert await store.get("c", "k") is None
        assert await store.sweep() == 2
        assert await store.sweep() == 0
        # Reused after expiry: a new request, even a different one (Stripe's rule).
        out = await idem.run(caller="c", key="k", request=("op", [2]), handler=h)
        assert not out.replayed and h.runs == 3

    grun(main)


def test_fences_rise_across_keys_and_claims(store: Store) -> None:
    async def main() -> None:
        fences = []
        for i in range(5):
            res = await store.claim("c", f"k{i}", fingerprint("op", [i]), LEASE)
            fences.append(res.record.fence)
            assert await store.release("c", f"k{i}", res.record.fence)
            res = await store.claim("c", f"k{i}", fingerprint("op", [i]), LEASE)
            fences.append(res.record.fence)
        assert fences == sorted(fences) and len(set(fences)) == len(fences)

    grun(main)


def test_exactly_once_effect_commits_with_its_record(store: Store, kit: Any) -> None:
    async def add(call: Call) -> Any:
        return kit.counter_effect(store, "balance", call.args[0])

    async def main() -> None:
        idem = make_idem(store)
        a = await idem.run(caller="c", key="t1", request=("add", [5]), handler=add)
        b = await idem.run(caller="c", key="t1", request=("add", [5]), handler=add)
        c = await idem.run(caller="c", key="t2", request=("add", [3]), handler=add)
        assert (a.value, b.value, c.value) == (5, 5, 8) and b.replayed
        assert kit.read(store, "balance") == 8

    grun(main)


def test_effect_refusal_rolls_back_and_records_the_error(store: Store, kit: Any) -> None:
    async def add(call: Call) -> Any:
        return kit.counter_effect(store, "balance", call.args[0])

    async def main() -> None:
        idem = make_idem(store)
        await idem.run(caller="c", key="t1", request=("add", [5]), handler=add)
        refused = await idem.run(caller="c", key="t2", request=("add", [-7]), handler=add)
        assert not refused.ok and refused.error is not None and refused.error.code == "negative"
        again = await idem.run(caller="c", key="t2", request=("add", [-7]), handler=add)
        assert again.replayed and again.payload == refused.payload
        assert kit.read(store, "balance") == 5

    grun(main)


def test_effect_failure_rolls_back_and_releases(store: Store, kit: Any) -> None:
    async def boom(call: Call) -> Any:
        return kit.boom_effect(store, "balance")

    async def main() -> None:
        idem = make_idem(store)
        with pytest.raises(Exception, match=r"boom|NOSUCHCOMMAND|Unknown"):
            await idem.run(caller="c", key="t", request=("boom", []), handler=boom)
        assert await store.get("c", "t") is None
        assert kit.read(store, "balance") == 0  # rolled back, or never written
        ok = await idem.run(caller="c", key="t", request=("boom", []), handler=Counting(result=1))
        assert ok.value == 1 and not ok.replayed

    grun(main)


def test_another_stores_effect_is_refused(store: Store, kit: Any) -> None:
    from idempotency import MemoryEffect, SQLiteEffect  # noqa: PLC0415

    foreign = SQLiteEffect(lambda conn: 1) if kit.kind != "sqlite" else MemoryEffect(lambda: 1)

    async def main() -> None:
        idem = make_idem(store)
        with pytest.raises(TypeError, match="cannot run"):
            await idem.run(caller="c", key="t", request=("x", []), handler=lambda call: foreign)
        assert await store.get("c", "t") is None

    grun(main)


def test_many_concurrent_calls_each_run_once(store: Store) -> None:
    h = Counting()
    n = 60

    async def main() -> None:
        idem = make_idem(store)
        done: gosim.Chan[Any] = gosim.Chan(2 * n)

        async def one(i: int) -> None:
            out = await idem.run(
                caller="c", key=f"k{i % 20}", request=("op", [i % 20]), handler=h, timeout=10
            )
            await done.send((i % 20, out))

        for i in range(n):
            gosim.go(one, i)
        outs = [await done.recv() for _ in range(n)]
        assert h.runs == 20
        by_key: dict[int, set[bytes]] = {}
        for k, o in outs:
            by_key.setdefault(k, set()).add(o.payload)
        assert all(len(v) == 1 for v in by_key.values())
        assert store.statistics().operations >= 2 * 20

    grun(main)


def test_plain_function_handlers(store: Store) -> None:
    async def main() -> None:
        out = await make_idem(store).run(
            caller="c", key="k", request=("op", [2]), handler=lambda call: call.args[0] * 21
        )
        assert out.value == 42

    grun(main)


# --------------------------------------------------------------------- one step
# run(..., one_step=True): on SQLite (a OneStepStore) the claim, the effect and the
# record commit in one transaction; on the other stores it is the usual path. The
# outcomes must be the same either way.


def test_one_step_runs_once_replays_and_refuses_a_reused_key(store: Store, kit: Any) -> None:
    seen: list[Call] = []

    def add(call: Call) -> Any:
        seen.append(call)
        return kit.counter_effect(store, "balance", call.args[0])

    async def main() -> None:
        idem = make_idem(store)
        one = {"handler": add, "one_step": True}
        a = await idem.run(caller="c", key="t1", request=("add", [5]), **one)
        b = await idem.run(caller="c", key="t1", request=("add", [5]), **one)
        c = await idem.run(caller="c", key="t2", request=("add", [3]), **one)
        assert (a.value, b.value, c.value) == (5, 5, 8)
        assert (a.replayed, b.replayed, c.replayed) == (False, True, False)
        assert kit.read(store, "balance") == 8
        with pytest.raises(KeyReused):
            await idem.run(caller="c", key="t1", request=("add", [6]), **one)
        assert kit.read(store, "balance") == 8
        # The fence the effect ran under is the record's, and it rises. (One step runs
        # the handler for the replay too, before its claim: its effect is dropped.)
        assert len(seen) == (4 if kit.kind in ("sqlite", "postgres") else 2)
        assert seen[0].fence == a.fence and c.fence > a.fence
        assert [s.fence for s in seen if s.args == [3]] == [c.fence]
        rec = await store.get("c", "t1")
        assert rec is not None and rec.state == COMPLETED and rec.fence == a.fence

    grun(main)


def test_one_step_refusals_and_failures(store: Store, kit: Any) -> None:
    def add(call: Call) -> Any:
        return kit.counter_effect(store, "balance", call.args[0])

    def refuse_early(call: Call) -> Any:
        raise ApplicationError("closed", "the account is closed")

    def busy(call: Call) -> Any:
        raise ApplicationError("busy", "try later", retryable=True)

    def boom(call: Call) -> Any:
        return kit.boom_effect(store, "balance")

    async def main() -> None:
        idem = make_idem(store)
        await idem.run(caller="c", key="t0", request=("add", [5]), handler=add, one_step=True)
        # A final refusal by the effect: its writes rolled back, the error recorded.
        refused = await idem.run(
            caller="c", key="t1", request=("add", [-7]), handler=add, one_step=True
        )
        assert not refused.ok and refused.error is not None and refused.error.code == "negative"
        again = await idem.run(
            caller="c", key="t1", request=("add", [-7]), handler=add, one_step=True
        )
        assert again.replayed and again.payload == refused.payload
        # A final refusal by the handler itself: recorded and replayed too.
        early = await idem.run(
            caller="c", key="t2", request=("x", []), handler=refuse_early, one_step=True
        )
        assert not early.ok and early.error is not None and early.error.code == "closed"
        assert (await idem.run(caller="c", key="t2", request=("x", []), handler=add)).replayed
        # A retryable refusal, an effect that fails: nothing recorded, no claim left.
        with pytest.raises(ApplicationError, match="try later"):
            await idem.run(caller="c", key="t3", request=("x", []), handler=busy, one_step=True)
        with pytest.raises(Exception, match=r"boom|NOSUCHCOMMAND|Unknown"):
            await idem.run(caller="c", key="t4", request=("b", []), handler=boom, one_step=True)
        assert await store.get("c", "t3") is None and await store.get("c", "t4") is None
        if kit.kind in ("sqlite", "postgres"):  # stores that roll an effect back
            assert kit.read(store, "balance") == 5
        # A handler that returns an awaitable breaks the one-step promise: nothing runs.
        with pytest.raises(TypeError, match="returns at once"):
            await idem.run(
                caller="c", key="t5", request=("x", []), handler=Counting(1), one_step=True
            )
        assert await store.get("c", "t5") is None
        # A plain value is recorded as the outcome.
        value = await idem.run(
            caller="c", key="t6", request=("v", []), handler=lambda call: [1, "x"], one_step=True
        )
        assert value.value == [1, "x"] and not value.replayed

    grun(main)


def test_one_step_duplicates_at_once_apply_the_effect_once(store: Store, kit: Any) -> None:
    def add(call: Call) -> Any:
        return kit.counter_effect(store, "balance", 2)

    async def main() -> None:
        idem = make_idem(store)
        out: gosim.Chan[Any] = gosim.Chan(20)

        async def one() -> None:
            await out.send(
                await idem.run(
                    caller="c", key="same", request=("add", []), handler=add, one_step=True
                )
            )

        for _ in range(20):
            gosim.go(one)
        outcomes = [await out.recv() for _ in range(20)]
        assert sum(not o.replayed for o in outcomes) == 1
        assert {o.value for o in outcomes} == {2}
        assert kit.read(store, "balance") == 2

    grun(main)


def test_one_step_waits_for_a_two_step_holder(store: Store, kit: Any) -> None:
    """A key held by a usual execution (claimed, not yet complete): a one-step call of
    it is refused at once without waiting, and waits for the holder's outcome with."""

    def add(call: Call) -> Any:
        return kit.counter_effect(store, "balance", 4)

    async def slow(call: Call) -> Any:
        await gosim.sleep(0.05)
        return kit.counter_effect(store, "balance", 4)

    async def main() -> None:
        idem = make_idem(store)
        first: gosim.Chan[Any] = gosim.Chan(1)

        async def holder() -> None:
            await first.send(await idem.run(caller="c", key="k", request=("add", []), handler=slow))

        gosim.go(holder)
        await gosim.sleep(0.01)  # the holder has claimed and sleeps in its handler
        with pytest.raises(InProgress):
            await idem.run(
                caller="c", key="k", request=("add", []), handler=add, one_step=True, wait=False
            )
        waited = await idem.run(
            caller="c", key="k", request=("add", []), handler=add, one_step=True
        )
        held = await first.recv()
        assert waited.replayed and not held.replayed and waited.value == held.value == 4
        assert kit.read(store, "balance") == 4

    grun(main)


def test_one_step_on_sqlite_is_one_operation_and_one_commit(tmp_path: Any) -> None:
    """What one_step buys on SQLite: a call is one store operation (one batch when
    alone), where the usual path is a claim and a completion."""
    from idempotency import SQLiteEffect, SQLiteStore  # noqa: PLC0415

    store = SQLiteStore(tmp_path / "one.db")

    def effect(call: Call) -> Any:
        return SQLiteEffect(lambda conn: call.fence)

    async def main() -> tuple[int, int]:
        idem = make_idem(store)
        before = store.statistics()
        out = await idem.run(caller="c", key="a", request=("e", []), handler=effect, one_step=True)
        mid = store.statistics()
        await idem.run(caller="c", key="b", request=("e", []), handler=effect)
        after = store.statistics()
        assert out.value == out.fence  # the effect read the claim's fence
        return mid.operations - before.operations, after.operations - mid.operations

    try:
        assert grun(main) == (1, 2)
    finally:
        store.close()


# --------------------------------------------------------------------- keep-alive
# A claim is renewed while its handler runs (Store.renew, fenced), so the lease bounds
# a dead holder, not a slow one.


def test_renew_extends_the_live_claim_and_refuses_a_stale_one(store: Store, clock: Any) -> None:
    async def main() -> None:
        fp = fingerprint("op", [1])
        old = await store.claim("c", "k", fp, LEASE)
        clock.advance(LEASE * 0.75)
        renewed = await store.renew("c", "k", old.record.fence, LEASE)
        assert renewed.state == IN_PROGRESS and renewed.fence == old.record.fence
        assert renewed.fingerprint == fp
        assert renewed.expires_at == pytest.approx(clock() + LEASE, abs=0.002)
        assert (await store.get("c", "k")) == renewed
        # A shorter renewal keeps the later deadline.
        assert (await store.renew("c", "k", old.record.fence, 1.0)).expires_at == pytest.approx(
            renewed.expires_at, abs=0.002
        )
        clock.advance(LEASE * 0.75)  # past the first lease, within the renewed one
        busy = await store.claim("c", "k", fp, LEASE)
        assert busy.kind is ClaimKind.BUSY
        # Once it lapses, another claim takes over, and the old holder's renewal is
        # refused by its fence and changes nothing.
        clock.advance(LEASE)
        new = await store.claim("c", "k", fp, LEASE)
        assert new.kind is ClaimKind.CLAIMED and new.record.fence > old.record.fence
        with pytest.raises(StaleClaim, match="taken over"):
            await store.renew("c", "k", old.record.fence, LEASE)
        assert (await store.get("c", "k")) == new.record
        # A completed, released or lapsed claim is not renewed either.
        await store.complete("c", "k", new.record.fence, Completion(True, b"\xc0", None, TTL, 9))
        with pytest.raises(StaleClaim, match="completed"):
            await store.renew("c", "k", new.record.fence, LEASE)
        other = await store.claim("c", "k2", fp, LEASE)
        assert await store.release("c", "k2", other.record.fence)
        with pytest.raises(StaleClaim, match="gone"):
            await store.renew("c", "k2", other.record.fence, LEASE)
        third = await store.claim("c", "k3", fp, LEASE)
        clock.advance(LEASE)
        with pytest.raises(StaleClaim, match="lapsed"):
            await store.renew("c", "k3", third.record.fence, LEASE)

    grun(main)


def test_a_handler_that_outlives_its_lease_runs_once(store: Store, clock: Any) -> None:
    """In virtual time, with the store's clock moved in step with it: a handler that
    runs three leases keeps its key (a duplicate arriving after the first lease waits
    and gets its outcome, replayed), and the keep-alive ends with it."""
    h = Counting(result="slow")
    step = LEASE / 8

    async def slow(call: Call) -> Any:
        for _ in range(24):  # three leases, in steps of an eighth
            await gosim.sleep(step)
            clock.advance(step)
        return await h(call)

    async def main() -> None:
        idem = make_idem(store)
        base = gosim.num_goroutine()
        done: gosim.Chan[Any] = gosim.Chan(2)

        async def first() -> None:
            await done.send(await idem.run(caller="c", key="k", request=("op", []), handler=slow))

        async def duplicate() -> None:
            await gosim.sleep(LEASE * 1.5)  # the first lease has long passed
            with pytest.raises(InProgress):  # held, not lapsed: no takeover
                await idem.run(caller="c", key="k", request=("op", []), handler=h, wait=False)
            await done.send(await idem.run(caller="c", key="k", request=("op", []), handler=h))

        gosim.go(first)
        gosim.go(duplicate)
        a, b = await done.recv(), await done.recv()
        assert h.runs == 1 and {a.replayed, b.replayed} == {False, True}
        assert a.payload == b.payload
        # The keep-alive ends at its first tick with nothing held, and renews nothing.
        ops = store.statistics().operations
        await gosim.sleep(LEASE)
        assert gosim.num_goroutine() == base
        assert store.statistics().operations == ops

    gosim.run(main, procs=2, seed=3, virtual_time=True)
