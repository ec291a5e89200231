"""Idempotency's public surface: exports, layering, the error taxonomy, argument
errors, contexts, and virtual time in the deterministic mode."""

from __future__ import annotations

import ast
import sys
from pathlib import Path
from typing import Any

import pytest

import gosim
import idempotency
from gosim import context
from idempotency import (
    ApplicationError,
    Call,
    CorruptedRecord,
    Idempotency,
    IdempotencyError,
    InProgress,
    InvalidKey,
    InvalidRequest,
    InvalidResult,
    KeyReused,
    MemoryStore,
    StaleClaim,
    StoreError,
    StoreUnavailable,
)

REPO = Path(__file__).resolve().parents[2]
PURE = ("_errors.py", "_keys.py", "_record.py", "_outcome.py")


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found


def test_pure_modules_import_neither_trio_nor_gosim() -> None:
    for name in PURE:
        mods = _imports(REPO / "idempotency" / name)
        assert not mods & {"trio", "gosim", "netframe", "sqlite3", "redis"}, (name, mods)
        assert mods <= set(sys.stdlib_module_names) | {"msgpack"}, (name, mods)


def test_redis_py_is_imported_only_by_the_redis_store() -> None:
    for path in (REPO / "idempotency").rglob("*.py"):
        if path.name != "redis.py":
            assert "redis" not in _imports(path), path


def _module_level_imports(path: Path) -> set[str]:
    """The top-level packages ``path`` imports when it is imported (not in functions)."""
    found: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            found.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found


def test_psycopg_is_imported_only_by_the_postgres_store() -> None:
    # The Postgres store's modules: the store, its SQL (imported by the store alone), its
    # connection on gosim's netpoller and the throwaway cluster (tests, the demo's --store
    # postgres). The demo's own Postgres ledger speaks SQL as any application does,
    # importing psycopg only on that path.
    store_modules = ("postgres.py", "_postgres_sql.py", "_pgnet.py", "pgcluster.py")
    for path in (REPO / "idempotency").rglob("*.py"):
        if path.name in store_modules:
            continue
        if "demo" in path.parts:
            assert "psycopg" not in _module_level_imports(path), path
        else:
            assert "psycopg" not in _imports(path), path


def test_every_exported_name_exists_and_reads_as_idempotency() -> None:
    for name in idempotency.__all__:
        obj = getattr(idempotency, name)
        lazy = ("RedisStore", "LuaEffect", "PostgresStore", "PostgresEffect")
        if isinstance(obj, type) and name not in lazy:
            assert obj.__module__ == "idempotency", name


def test_errors_subclass_the_matching_builtins() -> None:
    assert issubclass(InvalidKey, ValueError) and issubclass(KeyReused, ValueError)
    assert issubclass(InvalidRequest, TypeError) and issubclass(InvalidResult, TypeError)
    assert issubclass(StoreUnavailable, OSError) and issubclass(CorruptedRecord, ValueError)
    for err in (InvalidKey, KeyReused, InProgress, StaleClaim, StoreUnavailable, CorruptedRecord):
        assert issubclass(err, IdempotencyError)
    assert issubclass(StoreUnavailable, StoreError) and issubclass(CorruptedRecord, StoreError)
    assert not issubclass(ApplicationError, IdempotencyError)  # the handler's, not ours


def grun(fn: Any, *args: Any, **kw: Any) -> Any:
    return gosim.run(fn, *args, procs=2, **kw)


@pytest.mark.parametrize(
    ("kw", "err", "match"),
    [
        ({"key": ""}, InvalidKey, "empty"),
        ({"key": "k" * 256}, InvalidKey, "256 characters"),
        ({"key": "naïve"}, InvalidKey, "at index 2"),
        ({"caller": ""}, InvalidKey, "caller is empty"),
        ({"request": "op"}, InvalidRequest, "must be a pair"),
        ({"request": ("op", [object()])}, InvalidRequest, "not msgpack-serialisable"),
        ({"request": (b"op", [])}, InvalidRequest, "operation must be"),
    ],
)
def test_bad_input_is_refused_before_anything_is_stored(
    kw: dict[str, Any], err: type, match: str
) -> None:
    store = MemoryStore()
    ran = []

    async def main() -> None:
        args: dict[str, Any] = {"caller": "c", "key": "k", "request": ("op", [])}
        args.update(kw)
        with pytest.raises(err, match=match):
            await Idempotency(store).run(handler=ran.append, **args)

    grun(main)
    assert ran == [] and store.statistics().operations == 0


def test_constructor_refuses_nonpositive_ttl_and_lease() -> None:
    with pytest.raises(ValueError, match="positive"):
        Idempotency(MemoryStore(), ttl=0)
    with pytest.raises(ValueError, match="positive"):
        Idempotency(MemoryStore(), lease=-1)


def test_a_waiting_duplicate_stops_when_its_context_ends() -> None:
    async def main() -> None:
        idem = Idempotency(MemoryStore())
        started: gosim.Chan[None] = gosim.Chan(1)
        release: gosim.Chan[None] = gosim.Chan(1)

        async def slow(call: Call) -> str:
            await started.send(None)
            await release.recv()
            return "first"

        async def first() -> None:
            await idem.run(caller="c", key="k", request=("op", []), handler=slow)

        gosim.go(first)
        await started.recv()
        ctx, cancel = context.with_timeout(context.background(), 0.05)
        with pytest.raises(context.DeadlineExceeded):
            await idem.run(caller="c", key="k", request=("op", []), handler=slow, ctx=ctx)
        cancel()
        await release.send(None)
        out = await idem.run(caller="c", key="k", request=("op", []), handler=slow, timeout=5)
        assert out.replayed and out.value == "first"

    grun(main)


def test_the_handler_gets_the_call() -> None:
    seen: list[Call] = []

    async def main() -> None:
        ctx = context.background()
        await Idempotency(MemoryStore()).run(
            caller="acct-7", key="t-1", request=("transfer", ["a", "b", 10]),
            handler=seen.append, ctx=ctx,
        )  # fmt: skip
        call = seen[0]
        assert (call.caller, call.key, call.operation, call.args) == (
            "acct-7", "t-1", "transfer", ["a", "b", 10],
        )  # fmt: skip
        assert call.ctx is ctx and call.fence == 1

    grun(main)


class _CutOffStore(MemoryStore):
    """A MemoryStore whose renewals fail as if the store could not be reached: what a
    holder cut off from its store (or a dead one, which sends none) looks like."""

    async def renew(self, caller: str, key: str, fence: int, lease: float) -> Any:
        raise StoreUnavailable("cut off")


def _lease_story(store: MemoryStore) -> list[Any]:
    """A holder that runs two hours under a one-hour lease, in virtual time, and a
    duplicate that arrives a second after it started."""
    events: list[Any] = []

    async def main() -> None:
        idem = Idempotency(store, lease=3600.0, ttl=86400.0)
        done: gosim.Chan[None] = gosim.Chan(2)

        async def sleepy(call: Call) -> str:
            events.append(("start", call.fence, gosim.now()))
            await gosim.sleep(7200.0)  # two hours: past its lease
            return "late"

        async def holder() -> None:
            try:
                out = await idem.run(caller="c", key="k", request=("op", []), handler=sleepy)
                events.append(("holder", out.value, out.replayed, gosim.now()))
            except StaleClaim as exc:
                events.append(("stale", exc.fence, gosim.now()))
            await done.send(None)

        async def quick(call: Call) -> str:
            events.append(("start", call.fence, gosim.now()))
            return "new"

        async def waiter() -> None:
            await gosim.sleep(1.0)
            out = await idem.run(caller="c", key="k", request=("op", []), handler=quick)
            events.append(("outcome", out.value, out.replayed, gosim.now()))
            await done.send(None)

        gosim.go(holder)
        gosim.go(waiter)
        await done.recv()
        await done.recv()

    gosim.run(main, procs=2, seed=7, virtual_time=True)
    return events


def test_a_slow_holder_keeps_its_key_and_runs_once() -> None:
    """The holder renews its claim while its handler runs: the duplicate waits the two
    hours and gets the holder's outcome; the handler ran once."""
    events = _lease_story(MemoryStore())
    assert [e[1] for e in events if e[0] == "start"] == [1]
    outcome = next(e for e in events if e[0] == "outcome")
    assert outcome[1:3] == ("late", True) and outcome[3] == pytest.approx(7200.0, abs=1.0)
    assert next(e for e in events if e[0] == "holder")[1:3] == ("late", False)
    assert _lease_story(MemoryStore()) == events  # the same seed tells the same story


def test_a_holder_cut_off_from_the_store_loses_its_key_after_a_lease() -> None:
    """Renewals that fail (a dead or cut-off holder): the duplicate takes the key over
    as the lease lapses, and the old holder's completion is refused by its fence."""
    events = _lease_story(_CutOffStore())
    starts = [e for e in events if e[0] == "start"]
    assert [s[1] for s in starts] == [1, 2]
    assert 3600.0 <= starts[1][2] < 3601.0  # taken over as the lease lapsed, not later
    outcome = next(e for e in events if e[0] == "outcome")
    assert outcome[1:3] == ("new", False)
    stale = next(e for e in events if e[0] == "stale")
    assert stale[1] == 1 and stale[2] == pytest.approx(7200.0)
    assert _lease_story(_CutOffStore()) == events


def test_a_synchronous_store_must_have_both_plain_calls() -> None:
    """``SynchronousStore`` is the contract for stores whose operations never wait: a
    subclass without its plain-call twins cannot be made, and ``Idempotency`` keeps the
    store it was given."""
    from idempotency import MemoryStore  # noqa: PLC0415
    from idempotency.stores import SynchronousStore  # noqa: PLC0415

    class Half(SynchronousStore):
        async def claim(self, *a: Any) -> Any: ...
        async def complete(self, *a: Any) -> Any: ...
        async def release(self, *a: Any) -> Any: ...
        async def get(self, *a: Any) -> Any: ...
        async def sweep(self) -> int:
            return 0

        def now(self) -> float:
            return 0.0

        def statistics(self) -> Any: ...
        def claim_sync(self, *a: Any) -> Any: ...

    with pytest.raises(TypeError, match="complete_sync"):
        Half()  # type: ignore[abstract]
    store = MemoryStore()
    assert isinstance(store, SynchronousStore)
    assert Idempotency(store).store is store
