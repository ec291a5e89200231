"""Idempotency.run_later: run(...) with a callback instead of a waiting
goroutine. Whatever path a call takes (a commit, a replay, a reused key, a key busy with
a two-step holder, a store that cannot do one step), ``done`` gets what ``run`` would
have returned or raised, exactly once; what the key, request and handler raise at once
is raised by run_later itself, and ``done`` is never called then."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gosim
from gosim import Chan, go
from idempotency import (
    ApplicationError,
    Call,
    Idempotency,
    InvalidKey,
    KeyReused,
    MemoryStore,
    Outcome,
    SQLiteEffect,
    SQLiteStore,
)


def _counter_table(path: Path) -> None:
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE counters (name TEXT PRIMARY KEY, n INTEGER NOT NULL)")


def _add(call: Call) -> SQLiteEffect:
    name, amount = call.args

    def fn(conn: sqlite3.Connection) -> int:
        if amount < 0:
            raise ApplicationError("negative", "amount must not be negative")
        conn.execute(
            "INSERT INTO counters VALUES (?, ?) ON CONFLICT(name) DO UPDATE SET n = n + ?",
            (name, amount, amount),
        )
        return int(conn.execute("SELECT n FROM counters WHERE name = ?", (name,)).fetchone()[0])

    return SQLiteEffect(fn, atomic=amount >= 0)


class Results:
    """Collects done(outcome, error) calls by tag, and wakes whoever waits for them."""

    def __init__(self) -> None:
        self.calls: dict[str, list[tuple[Outcome | None, BaseException | None]]] = {}
        self.arrived: Chan[str] = Chan(1000)

    def done(self, tag: str) -> Any:
        def callback(outcome: Outcome | None, error: BaseException | None) -> None:
            self.calls.setdefault(tag, []).append((outcome, error))
            self.arrived.try_send(tag)

        return callback

    async def wait(self, n: int) -> None:
        for _ in range(n):
            await self.arrived.recv()
        await gosim.sleep(0.05)  # a second call of any callback would show up now


def test_run_later_commits_replays_and_refuses(tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    _counter_table(path)
    store = SQLiteStore(path)
    res = Results()

    async def main() -> None:
        idem = Idempotency(store)

        def later(tag: str, key: str, args: list[Any]) -> None:
            idem.run_later(
                res.done(tag), caller="c", key=key, request=("add", args), handler=_add,
                one_step=True,
            )  # fmt: skip

        later("first", "k1", ["a", 5])
        await res.wait(1)
        later("replay", "k1", ["a", 5])
        later("reused", "k1", ["a", 6])
        later("refused", "k2", ["a", -1])
        await res.wait(3)
        # Raised at once, done never called: a bad key, a handler's retryable refusal.
        with pytest.raises(InvalidKey):
            later("bad-key", "", ["a", 1])

        def busy(call: Call) -> Any:
            raise ApplicationError("busy", "later", retryable=True)

        with pytest.raises(ApplicationError, match="later"):
            idem.run_later(
                res.done("busy"), caller="c", key="k3", request=("x", []), handler=busy,
                one_step=True,
            )  # fmt: skip
        await gosim.sleep(0.05)

    gosim.run(main, procs=2)
    store.close()
    (first, e1), (replay, e2) = res.calls["first"][0], res.calls["replay"][0]
    assert e1 is None and e2 is None and first is not None and replay is not None
    assert first.ok and first.value == 5 and not first.replayed
    assert replay.replayed and replay.payload == first.payload
    [(none, reused)] = res.calls["reused"]
    assert none is None and isinstance(reused, KeyReused)
    [(refused, e3)] = res.calls["refused"]
    assert e3 is None and refused is not None and not refused.ok
    assert refused.error is not None and refused.error.code == "negative"
    assert set(res.calls) == {"first", "replay", "reused", "refused"}  # once each
    assert all(len(v) == 1 for v in res.calls.values())
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT n FROM counters").fetchall() == [(5,)]


def test_run_later_waits_for_a_two_step_holder_then_replays(tmp_path: Path) -> None:
    """The key is held by a two-step execution that is still running: the one-step call
    finds it busy, waits in a goroutine of its own, and gets the holder's outcome."""
    path = tmp_path / "w.db"
    _counter_table(path)
    store = SQLiteStore(path)
    res = Results()

    async def main() -> tuple[Any, list[Any]]:
        idem = Idempotency(store)
        go_on: Chan[None] = Chan()

        async def slow(call: Call) -> SQLiteEffect:
            await go_on.recv()
            return _add(call)

        holder: Chan[Outcome] = Chan(1)

        async def hold() -> None:
            out = await idem.run(caller="c", key="k", request=("add", ["b", 3]), handler=slow)
            await holder.send(out)

        go(hold)
        await gosim.sleep(0.05)  # the holder has claimed the key
        idem.run_later(
            res.done("dup"), caller="c", key="k", request=("add", ["b", 3]), handler=_add,
            one_step=True,
        )  # fmt: skip
        await gosim.sleep(0.1)
        early = list(res.calls.get("dup", []))  # nothing yet: the key is busy
        await go_on.send(None)
        first = await holder.recv()
        await res.wait(1)
        return first, early

    first, early = gosim.run(main, procs=2)
    store.close()
    assert early == []
    [(dup, error)] = res.calls["dup"]
    assert error is None and dup is not None
    assert dup.replayed and dup.payload == first.payload and first.value == 3
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT n FROM counters").fetchall() == [(3,)]


def test_run_later_on_a_store_without_one_step_runs_run_in_a_goroutine() -> None:
    res = Results()

    async def main() -> None:
        idem = Idempotency(MemoryStore())
        idem.run_later(
            res.done("one"), caller="c", key="k", request=("x", [1]), handler=lambda c: 7,
            one_step=True,
        )  # fmt: skip
        await res.wait(1)
        idem.run_later(
            res.done("two"), caller="c", key="k", request=("x", [1]), handler=lambda c: 8,
            one_step=True,
        )  # fmt: skip
        await res.wait(1)

        def busy(call: Call) -> Any:
            raise ApplicationError("busy", "later", retryable=True)

        # Here the handler runs in the goroutine, with run: what it raises goes to done.
        idem.run_later(
            res.done("busy"), caller="c", key="k2", request=("x", []), handler=busy,
            one_step=True,
        )  # fmt: skip
        await res.wait(1)

    gosim.run(main, procs=2)
    [(one, _)], [(two, _)] = res.calls["one"], res.calls["two"]
    assert one is not None and two is not None
    assert (one.value, one.replayed, two.value, two.replayed) == (7, False, 7, True)
    [(none, busy)] = res.calls["busy"]
    assert none is None and isinstance(busy, ApplicationError) and busy.retryable


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(keys=st.lists(st.integers(0, 5), min_size=1, max_size=40))
def test_concurrent_run_later_applies_each_key_once(
    tmp_path_factory: pytest.TempPathFactory, keys: list[int]
) -> None:
    """Calls started at once from several goroutines, duplicates among them: each key's
    effect is applied once, every call hears once, and duplicates get its outcome."""
    path = tmp_path_factory.mktemp("c") / "c.db"
    _counter_table(path)
    store = SQLiteStore(path, synchronous="NORMAL")
    res = Results()

    async def main() -> None:
        idem = Idempotency(store)

        async def start(i: int, k: int) -> None:
            idem.run_later(
                res.done(str(i)), caller="c", key=f"k{k}", request=("add", [f"n{k}", 1]),
                handler=_add, one_step=True,
            )  # fmt: skip

        for i, k in enumerate(keys):
            go(start, i, k)
        await res.wait(len(keys))

    gosim.run(main, procs=2)
    store.close()
    assert sorted(int(t) for t in res.calls) == list(range(len(keys)))
    by_key: dict[int, set[bytes]] = {}
    for i, k in enumerate(keys):
        [(out, error)] = res.calls[str(i)]
        assert error is None and out is not None and out.ok
        by_key.setdefault(k, set()).add(out.payload)
    assert all(len(payloads) == 1 for payloads in by_key.values())  # one outcome a key
    with sqlite3.connect(path) as conn:
        counts = dict(conn.execute("SELECT name, n FROM counters"))
    assert counts == {f"n{k}": 1 for k in set(keys)}


def test_claim_and_complete_is_a_wait_on_the_call_back_form(tmp_path: Path) -> None:
    """The store contract's one mechanism: a store implements claim_and_complete_later
    alone, and claim_and_complete (the contract's own, not overridden) awaits it, its
    record, its ClaimResult, or its error raised."""
    from idempotency.stores import Completion, OneStepStore  # noqa: PLC0415

    assert "claim_and_complete" not in vars(SQLiteStore)
    store = SQLiteStore(tmp_path / "d.db")
    call = Call("c", "k", "x", [], 0, None)
    heard: list[Any] = []

    async def main() -> None:
        ok = Completion(True, b"\xa1v", None, 60.0, 1000)
        heard.append(await store.claim_and_complete("c", "k", b"f" * 32, 5.0, call, ok))
        # The same key with another fingerprint: a mismatch, as claim_and_complete says.
        heard.append(await store.claim_and_complete("c", "k", b"g" * 32, 5.0, call, ok))
        with pytest.raises(ValueError, match="lease"):  # refused before its batch
            await store.claim_and_complete("c", "k2", b"f" * 32, -1.0, call, ok)

    assert isinstance(store, OneStepStore)
    gosim.run(main, procs=2)
    store.close()
    first, second = heard
    assert first.payload == b"\xa1v" and first.fence == call.fence > 0
    assert second.kind.name == "MISMATCH"


def test_claim_and_complete_later_refuses_what_claim_and_complete_refuses(
    tmp_path: Path,
) -> None:
    """Each argument the one-step operation cannot take is refused at once through
    ``done``, with the error the awaiting form raises (both ask ``_bad_step``; the C
    twin of the callback form hands every case but the common one to it); what it can
    take, an effect of its own store's kind included, is applied."""
    from idempotency.stores import Completion, MemoryEffect, SQLiteEffect  # noqa: PLC0415

    store = SQLiteStore(tmp_path / "d.db")
    ok = Completion(True, b"\xa1v", None, 60.0, 1000)
    cases: list[tuple[float, Completion]] = [
        (-1.0, ok),
        (float("nan"), ok),
        ("5", ok),  # type: ignore[list-item]
        (5.0, ok._replace(ttl=0.0)),
        (5.0, ok._replace(ttl="60")),
        (5.0, ok._replace(payload="v")),
        (5.0, ok._replace(payload=None, effect=MemoryEffect(lambda: 1))),
        (5.0, ok),
        (5, ok._replace(payload=None, effect=SQLiteEffect(lambda conn: 7))),
    ]
    later: list[Any] = []
    awaited: list[Any] = []

    async def main() -> None:
        for i, (lease, c) in enumerate(cases):
            call = Call("c", f"k{i}", "x", [], 0, None)
            got: list[Any] = []
            store.claim_and_complete_later(
                "c", f"k{i}", b"f" * 32, lease, call, c, lambda r, e, got=got: got.append((r, e))
            )
            for _ in range(1000):  # a refusal answers now, an applied one after its batch
                if got:
                    break
                await gosim.sleep(0.005)
            [(r, e)] = got
            later.append(("error", type(e), str(e)) if e is not None else ("ok", r.payload))
            try:
                rec = await store.claim_and_complete("c", f"j{i}", b"f" * 32, lease, call, c)
            except Exception as exc:
                awaited.append(("error", type(exc), str(exc).replace(f"'j{i}'", f"'k{i}'")))
            else:
                awaited.append(("ok", rec.payload))

    gosim.run(main, procs=2)
    store.close()
    assert later == awaited
    assert [x[0] for x in later] == ["error"] * 7 + ["ok"] * 2
    assert later[-1] == ("ok", b"\x07")


def test_run_later_takes_two_steps_unless_told_otherwise(tmp_path: Path) -> None:
    """As ``run``: without ``one_step=True`` the claim comes first, so a handler may
    await (a one-step call refuses an awaitable), and a duplicate started while the
    handler runs waits for its outcome instead of running the handler again."""
    store = SQLiteStore(tmp_path / "d.db")
    res = Results()
    runs: list[str] = []

    async def main() -> None:
        idem = Idempotency(store)
        go_on: Chan[None] = Chan()

        async def awaits(call: Call) -> str:
            runs.append(call.key)
            await go_on.recv()
            return "done"

        for tag in ("first", "duplicate"):
            idem.run_later(res.done(tag), caller="c", key="k", request=("x", []), handler=awaits)
            await gosim.sleep(0.05)
        await go_on.send(None)
        await res.wait(2)

    gosim.run(main, procs=2)
    store.close()
    assert runs == ["k"]
    [(first, e1)], [(dup, e2)] = res.calls["first"], res.calls["duplicate"]
    assert e1 is None and e2 is None and first is not None and dup is not None
    assert (first.value, first.replayed, dup.value, dup.replayed) == ("done", False, "done", True)
