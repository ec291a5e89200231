"""Idempotent RPC methods: once per key over real sockets, with a real SQLite store."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

import gosim
from gosim import Chan, go, net
from idempotency import Call, Idempotency, MemoryStore, SQLiteEffect, SQLiteStore
from idempotency.rpc import Client, RetryPolicy, RPCError, Server, Status

from .test_rpc import CuttingProxy, run_bounded


def ledger_server(idem: Idempotency, runs: dict[str, int]) -> Server:
    srv = Server(idempotency=idem, heartbeat_interval=None)

    @srv.method(idempotent=True)
    def add(a: int, b: int) -> int:
        runs["add"] = runs.get("add", 0) + 1
        return a + b

    @srv.method(idempotent=True, key_optional=True)
    def maybe(a: int) -> int:
        runs["maybe"] = runs.get("maybe", 0) + 1
        return a

    @srv.method(idempotent=True)
    async def slow(x: int) -> int:
        runs["slow"] = runs.get("slow", 0) + 1
        await gosim.sleep(0.2)
        return x

    @srv.method(idempotent=True)
    def refuse(reason: str) -> None:
        runs["refuse"] = runs.get("refuse", 0) + 1
        raise RPCError(Status.FAILED_PRECONDITION, reason, {"type": "InsufficientFunds"})

    @srv.method(idempotent=True)
    def crash(x: int) -> None:
        runs["crash"] = runs.get("crash", 0) + 1
        raise ValueError(f"bug {x}")

    @srv.method(idempotent=True, pass_call=True)
    def transfer(call: Call, src: str, dst: str, amount: int) -> SQLiteEffect:
        runs["transfer"] = runs.get("transfer", 0) + 1

        def apply(conn: sqlite3.Connection) -> int:
            conn.execute("UPDATE acct SET bal = bal - ? WHERE id = ?", (amount, src))
            conn.execute("UPDATE acct SET bal = bal + ? WHERE id = ?", (amount, dst))
            return call.fence

        return SQLiteEffect(apply)

    return srv


def test_idempotent_calls_run_once_and_replay(tmp_path: Path) -> None:
    db = tmp_path / "ledger.db"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE acct (id TEXT PRIMARY KEY, bal INTEGER)")
        conn.executemany("INSERT INTO acct VALUES (?, ?)", [("a", 100), ("b", 0)])
    runs: dict[str, int] = {}

    async def main() -> None:
        store = SQLiteStore(db)
        srv = ledger_server(Idempotency(store), runs)
        ln = net.listen("tcp", "127.0.0.1:0")
        go(srv.serve, ln)
        c = Client([ln.addr()], caller="acct-7", heartbeat_interval=None)

        # Without a key: refused, unless the method says keys are optional.
        with pytest.raises(RPCError) as info:
            await c.call("add", 1, 2)
        assert info.value.status is Status.FAILED_PRECONDITION
        assert await c.call("maybe", 5) == 5

        first = await c.call_result("add", 1, 2, idempotency_key="k1")
        again = await c.call_result("add", 1, 2, idempotency_key="k1")
        assert (first.result, first.replayed) == (3, False)
        assert (again.result, again.replayed) == (3, True)
        assert runs["add"] == 1
        # Another caller's k1 is another record.
        other = Client([ln.addr()], caller="acct-8", heartbeat_interval=None)
        assert (await other.call_result("add", 1, 2, idempotency_key="k1")).replayed is False
        assert runs["add"] == 2
        # The same key with other params: refused, nothing run.
        with pytest.raises(RPCError) as info:
            await c.call("add", 1, 3, idempotency_key="k1")
        assert info.value.status is Status.ALREADY_EXISTS
        assert info.value.type_name == "KeyReused"
        assert runs["add"] == 2

        # A chosen status is final: recorded, replayed, the method not run again.
        for _ in range(2):
            with pytest.raises(RPCError) as info:
                await c.call("refuse", "no funds", idempotency_key="r1")
            assert info.value.status is Status.FAILED_PRECONDITION
            assert info.value.type_name == "InsufficientFunds"
        assert runs["refuse"] == 1
        # Any other exception releases the key: a retry runs the method again.
        for _ in range(2):
            with pytest.raises(RPCError) as info:
                await c.call("crash", 1, idempotency_key="c1")
            assert info.value.type_name == "ValueError"
        assert runs["crash"] == 2

        # Concurrent duplicates wait for the first execution and share its outcome.
        out: Chan[tuple[Any, bool]] = Chan(5)

        async def dup() -> None:
            r = await c.call_result("slow", 9, idempotency_key="s1")
            await out.send((r.result, r.replayed))

        for _ in range(5):
            go(dup)
        got = [await out.recv() for _ in range(5)]
        assert runs["slow"] == 1
        assert sorted(r for r, _ in got if r is not None) == [9] * 5
        assert sum(1 for g in got if g is not None and not g[1]) == 1

        # Exactly-once effect: the balance change commits with the record.
        fence = await c.call("transfer", "a", "b", 30, idempotency_key="t1")
        assert await c.call("transfer", "a", "b", 30, idempotency_key="t1") == fence
        assert runs["transfer"] == 1
        assert srv.statistics().replays >= 3
        await c.close()
        await other.close()
        await srv.shutdown(1.0)
        store.close()

    run_bounded(main)
    with sqlite3.connect(db) as conn:
        assert dict(conn.execute("SELECT id, bal FROM acct")) == {"a": 70, "b": 30}


def test_a_keyed_call_whose_connection_dies_runs_once() -> None:
    """The request reaches the server, the connection is cut before the reply: the
    client resends with the same key and gets the outcome of the one execution."""
    runs: dict[str, int] = {}

    async def main() -> tuple[Any, bool, int]:
        srv = ledger_server(Idempotency(MemoryStore()), runs)
        ln = net.listen("tcp", "127.0.0.1:0")
        go(srv.serve, ln)
        proxy = CuttingProxy(ln.addr(), cut_next=True)
        c = Client(
            [proxy.addr()],
            caller="acct-1",
            heartbeat_interval=None,
            idempotent_methods={"slow"},
            retry=RetryPolicy(initial_backoff=0.01),
        )
        res = await c.call_result("slow", 4)  # a key is generated and reused
        await c.close()
        proxy.close()
        await srv.shutdown(1.0)
        return res.result, res.replayed, res.attempts

    result, replayed, attempts = run_bounded(main)
    assert (result, attempts) == (4, 2)
    assert runs["slow"] == 1
    assert replayed  # the resend waited for, then replayed, the first execution


def test_registering_an_idempotent_method_needs_a_store() -> None:
    srv = Server()
    with pytest.raises(ValueError, match="need Server\\(idempotency=Idempotency\\(store\\)\\)"):
        srv.add_method(lambda: 1, "one", idempotent=True)


def test_a_one_step_method_is_idempotent_and_plain() -> None:
    srv = Server(idempotency=Idempotency(MemoryStore()))

    async def later(call: Any) -> int:
        return 1

    with pytest.raises(ValueError, match="one_step is for idempotent methods"):
        srv.add_method(lambda: 1, "plain", one_step=True)
    with pytest.raises(TypeError, match="returns at once"):
        srv.add_method(later, "later", idempotent=True, pass_call=True, one_step=True)
    srv.add_method(lambda call: 1, "ok", idempotent=True, pass_call=True, one_step=True)


@pytest.mark.parametrize("pass_call", [False, True])
def test_a_duplicate_waits_for_the_holder_no_longer_than_its_deadline(pass_call: bool) -> None:
    # A second call with the key of a call still running is answered DEADLINE_EXCEEDED
    # at its own deadline, and its wait for the holder ends there too (by the context a
    # pass_call method gets, or by the deadline itself for the others): nothing is left
    # waiting for the holder's whole run. The holder's reply is then the one outcome.
    from idempotency.rpc._protocol import CallMeta, Response, decode, encode_request  # noqa: PLC0415

    async def main() -> tuple[Any, float, int, Any, int]:
        srv = Server(idempotency=Idempotency(MemoryStore()), heartbeat_interval=None)
        runs = [0]

        async def hold(seconds: float) -> str:
            runs[0] += 1
            await gosim.sleep(seconds)
            return "held"

        async def hold_call(call: Call, seconds: float) -> str:
            return await hold(seconds)

        srv.add_method(
            hold_call if pass_call else hold, "hold", idempotent=True, pass_call=pass_call
        )

        def request(msgid: int, timeout_ms: int) -> bytes:
            return encode_request(msgid, "hold", [1.0], CallMeta("k", "me", timeout_ms, 1))

        first: Chan[bytes] = Chan(1)

        async def holder() -> None:
            await first.send(await srv.dispatcher.handle_payload(request(1, 10_000)))

        go(holder)
        await gosim.sleep(0.01)
        start = gosim.now()
        dup = decode(await srv.dispatcher.handle_payload(request(2, 100)))
        answered = gosim.now() - start
        await gosim.sleep(0.01)
        late_by_then = srv.statistics().late_completions
        held = decode(await first.recv())
        assert isinstance(dup, Response) and isinstance(held, Response)
        return (
            dup.error[0] if dup.error else dup.result,
            answered,
            late_by_then,
            held.result,
            runs[0],
        )

    dup, answered, late, held, runs = gosim.run(main, procs=2, seed=5, virtual_time=True)
    assert dup == Status.DEADLINE_EXCEEDED
    assert answered == pytest.approx(0.1)
    assert late == 1  # the duplicate's goroutine stopped waiting at the deadline
    assert (held, runs) == ("held", 1)


def test_call_ctx_carries_the_deadline_except_for_one_step_methods() -> None:
    # A two-step pass_call method gets the call's deadline in call.ctx; a one-step one
    # cannot wait and gets no context (call.ctx is None), with or without a deadline.
    from idempotency.rpc._protocol import CallMeta, Response, decode, encode_request  # noqa: PLC0415

    async def main() -> list[Any]:
        srv = Server(idempotency=Idempotency(MemoryStore()), heartbeat_interval=None)
        seen: list[Any] = []

        def one(call: Call) -> str:
            seen.append(("one", call.ctx))
            return "one"

        async def two(call: Call) -> str:
            deadline = call.ctx.deadline() if call.ctx is not None else None
            seen.append(("two", deadline))
            return "two"

        srv.add_method(one, "one", idempotent=True, pass_call=True, one_step=True)
        srv.add_method(two, "two", idempotent=True, pass_call=True)
        now = gosim.now()
        for i, (method, timeout_ms) in enumerate([("one", 500), ("one", None), ("two", 500)]):
            payload = encode_request(i, method, [], CallMeta(f"k{i}", "me", timeout_ms, 1))
            reply = srv.dispatcher.handle_payload(payload)  # bytes when answered at once
            msg = decode(reply if type(reply) is bytes else await reply)
            assert isinstance(msg, Response) and msg.result == method
        return [(what, d if d is None else (round(d[0] - now, 6), d[1])) for what, d in seen]

    assert gosim.run(main, procs=1, seed=1, virtual_time=True) == [
        ("one", None),
        ("one", None),
        ("two", (0.5, True)),
    ]


@pytest.mark.parametrize("on_sqlite", [False, True])
def test_a_one_step_pass_context_method_takes_the_call_back_path_with_its_deadline(
    on_sqlite: bool, tmp_path: Path
) -> None:
    # Every one-step call takes the dispatcher's one path (run_later): a pass_context
    # method is handed a context carrying the call's deadline (the background context
    # without one), runs once, and its duplicate replays.
    from idempotency.rpc._protocol import CallMeta, Response, decode, encode_request  # noqa: PLC0415
    from netframe import Later  # noqa: PLC0415

    async def main() -> tuple[list[Any], list[Any]]:
        store = SQLiteStore(tmp_path / "r.db") if on_sqlite else MemoryStore()
        srv = Server(idempotency=Idempotency(store), heartbeat_interval=None)
        seen: list[Any] = []

        def stamp(ctx: Any, x: int) -> int:
            when, ok = ctx.deadline()  # Go's (deadline, ok)
            seen.append(round(when - now, 6) if ok else None)
            return x * 2

        srv.add_method(stamp, "stamp", idempotent=True, pass_context=True, one_step=True)
        now = gosim.now()
        got = []
        for i, (key, x, timeout_ms) in enumerate([("a", 1, 500), ("b", 2, None), ("a", 1, 500)]):
            payload = encode_request(i, "stamp", [x], CallMeta(key, "me", timeout_ms, 1))
            reply = srv.dispatcher.handle_payload(payload)
            # The call-back path, as every keyed call without a race: a Later that the
            # store's batch settles, or on a store that never waits the reply at once.
            if on_sqlite:
                assert isinstance(reply, Later)
                reply = await reply
            assert type(reply) is bytes
            msg = decode(reply)
            assert isinstance(msg, Response)
            got.append((msg.result, msg.replayed))
        store.close()
        return seen, got

    seen, got = gosim.run(main, procs=1, seed=1, virtual_time=not on_sqlite)
    assert got == [(2, False), (4, False), (2, True)]  # the third replays the first
    assert seen[1] is None and seen[0] == pytest.approx(0.5, abs=0.05)
    # On a OneStepStore a one-step handler runs for a replay too (its outcome dropped);
    # elsewhere a one-step call is the usual path, and a replay runs nothing.
    assert len(seen) == (3 if on_sqlite else 2)


def test_a_one_step_call_past_its_deadline_is_answered_so_and_its_commit_stands(
    tmp_path: Path,
) -> None:
    # A one-step call runs in its caller's goroutine, with no race: its commit, held up
    # here by another connection's write lock on the ledger file, goes on to its end,
    # and as the deadline passed meanwhile the answer is DEADLINE_EXCEEDED. The effect
    # is in the ledger once; the same key again replays it; a call in time gets its reply.
    import threading  # noqa: PLC0415

    from idempotency.rpc._protocol import CallMeta, Response, decode, encode_request  # noqa: PLC0415

    db = tmp_path / "ledger.db"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE acct (id TEXT PRIMARY KEY, bal INTEGER)")
        conn.executemany("INSERT INTO acct VALUES (?, ?)", [("a", 100), ("b", 0)])
    locker = sqlite3.connect(db, isolation_level=None, check_same_thread=False)

    async def main() -> tuple[list[Any], tuple[int, int]]:
        store = SQLiteStore(db)
        srv = Server(idempotency=Idempotency(store), heartbeat_interval=None)

        def move(call: Call, amount: int) -> SQLiteEffect:
            def apply(conn: sqlite3.Connection) -> int:
                conn.execute("UPDATE acct SET bal = bal - ? WHERE id = 'a'", (amount,))
                conn.execute("UPDATE acct SET bal = bal + ? WHERE id = 'b'", (amount,))
                return amount

            return SQLiteEffect(apply)

        srv.add_method(move, "move", idempotent=True, pass_call=True, one_step=True)

        async def call(msgid: int, key: str, timeout_ms: int) -> Any:
            payload = encode_request(msgid, "move", [7], CallMeta(key, "me", timeout_ms, 1))
            msg = decode(await srv.dispatcher.handle_payload(payload))
            assert isinstance(msg, Response)
            return msg.error[0] if msg.error else msg.result

        answers = [await call(1, "warm", 5000)]  # the store's tables exist from here on
        locker.execute("BEGIN IMMEDIATE")  # another process writing, for 0.5 s
        threading.Timer(0.5, lambda: locker.execute("COMMIT")).start()
        answers.append(await call(2, "k", 100))
        answers.append(await call(3, "k", 5000))  # the same key: the recorded outcome
        stats = srv.statistics()
        store.close()
        return answers, (stats.deadline_exceeded, stats.late_completions)

    answers, counts = gosim.run(main, procs=1)
    locker.close()
    assert answers == [7, Status.DEADLINE_EXCEEDED, 7]
    assert counts == (1, 1)
    with sqlite3.connect(db) as conn:
        assert dict(conn.execute("SELECT id, bal FROM acct")) == {"a": 86, "b": 14}


@pytest.mark.parametrize("on_sqlite", [False, True])
def test_a_two_step_keyed_call_takes_the_call_back_path(on_sqlite: bool, tmp_path: Path) -> None:
    # A keyed call to a plain two-step method without a timeout waits on no goroutine:
    # on a store that never waits it is answered in the dispatcher's frame (bytes), on
    # a batched store the batches' callbacks run it on and settle a Later. The handler
    # runs once per key; the same key replays; a retryable error releases the claim,
    # so the key's retry runs the handler again; a final one is recorded and replayed.
    from idempotency import ApplicationError  # noqa: PLC0415
    from idempotency.rpc._protocol import CallMeta, Response, decode, encode_request  # noqa: PLC0415
    from netframe import Later  # noqa: PLC0415

    async def main() -> tuple[list[Any], list[Any]]:
        store = SQLiteStore(tmp_path / "r.db") if on_sqlite else MemoryStore()
        srv = Server(idempotency=Idempotency(store), heartbeat_interval=None)
        ran: list[Any] = []

        def double(x: int) -> int:
            ran.append(x)
            if x == 3 and ran.count(3) == 1:
                raise ApplicationError("UNAVAILABLE", "try again", retryable=True)
            if x == 4:
                raise ApplicationError("NOPE", "four is final")
            return x * 2

        srv.add_method(double, "double", idempotent=True)
        got = []
        calls = [("a", 1), ("b", 2), ("a", 1), ("c", 3), ("c", 3), ("d", 4), ("d", 4)]
        for i, (key, x) in enumerate(calls):
            payload = encode_request(i, "double", [x], CallMeta(key, "me", None, 1))
            reply = srv.dispatcher.handle_payload(payload)
            # On memory only a release (the retryable error) needs a goroutine.
            assert isinstance(reply, Later) == (on_sqlite or i == 3)
            if isinstance(reply, Later):
                reply = await reply
            assert type(reply) is bytes
            msg = decode(reply)
            assert isinstance(msg, Response)
            got.append((msg.result, msg.error is not None, msg.replayed))
        store.close()
        return ran, got

    ran, got = gosim.run(main, procs=1, seed=1, virtual_time=not on_sqlite)
    assert ran == [1, 2, 3, 3, 4]
    assert got == [
        (2, False, False),
        (4, False, False),
        (2, False, True),
        (None, True, False),
        (6, False, False),
        (None, True, False),
        (None, True, True),
    ]
