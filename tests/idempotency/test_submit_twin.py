"""The C twins of the batched stores' callback forms (``_speedups.claim_later``,
``complete_later`` and ``claim_and_complete_later``) against their Python references
(the methods of ``_batch._PyCallbackForms`` and ``_batch._PyOneStepForm`` that
BatchedStore and BatchedOneStepStore bind them over).

Each runs the same calls on a SQLiteStore of its own (a real file) in a runtime: what
``done`` is given, what the call raises, and the records left must be the same. The
common case must not reach the references.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import gosim
from idempotency import Call
from idempotency._accel import speedups
from idempotency.stores import Completion, SQLiteStore, _batch
from idempotency.stores._contract import new_completion
from idempotency.stores.sqlite import SQLiteEffect

from ._leaks import leaks

pytestmark = pytest.mark.skipif(
    speedups is None, reason="idempotency._speedups not in use (not built, or GOSIM_PURE_PYTHON=1)"
)

FP = b"\x05" * 32

# The Python references.
py_claim_later = _batch._PyCallbackForms.claim_later
py_complete_later = _batch._PyCallbackForms.complete_later
py_claim_and_complete_later = _batch._PyOneStepForm.claim_and_complete_later
REFERENCES = {
    "claim_later": py_claim_later,
    "complete_later": py_complete_later,
    "claim_and_complete_later": py_claim_and_complete_later,
}


class CompletionSubclass(Completion):
    pass


def _describe(result: Any, error: BaseException | None) -> Any:
    if error is not None:
        return ("error", type(error).__name__, str(error))
    if result is None:
        return ("none",)
    return ("ok", type(result).__name__, getattr(result, "kind", None), repr(result)[:60])


def run_calls(
    path: Path,
    claim_later: Any,
    complete_later: Any,
    lease: Any,
    completion: Any,
    caller: Any = "c",
    key: Any = "k",
) -> Any:
    """A claim of (``caller``, ``key``) with ``lease`` and, if granted, its completion
    with ``completion``; everything observable."""
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    store = SQLiteStore(path, synchronous="OFF")
    got: list[Any] = []

    over = gosim.lowlevel.Waiter()

    async def main() -> None:
        def claimed(res: Any, error: BaseException | None) -> None:
            got.append(("claim", _describe(res, error)))
            if error is None and res is not None and res.kind.name == "CLAIMED":
                try:
                    complete_later(store, caller, key, res.record.fence, completion, completed)
                except Exception as exc:
                    got.append(("complete raised", type(exc).__name__, str(exc)))
                    over.settle(None)
            else:
                over.settle(None)

        def completed(rec: Any, error: BaseException | None) -> None:
            got.append(("complete", _describe(rec, error)))
            over.settle(None)

        try:
            claim_later(store, caller, key, FP, lease, claimed)
        except Exception as exc:
            got.append(("claim raised", type(exc).__name__, str(exc)))
            return
        over.set_deadline(gosim.now() + 10, None)
        await over.wait()
        await gosim.sleep(0.001)  # anything more would come now

    gosim.run(main, procs=1)
    rows = store._conn.execute(  # type: ignore[attr-defined]
        "SELECT caller, key, state, ok, payload FROM idempotency_records"
    ).fetchall()
    store.close()
    return [tuple(str(x).replace(str(path), "PATH") for x in g) for g in got], rows


def run_one_step(
    path: Path,
    claim_and_complete_later: Any,
    lease: Any,
    completion: Any,
    caller: Any = "c",
    key: Any = "k",
) -> Any:
    """A one-step claim and completion of (``caller``, ``key``); everything observable
    (the call's fence included)."""
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    store = SQLiteStore(path, synchronous="OFF")
    got: list[Any] = []
    call = Call("c", "k", "op", [], 0, None)
    over = gosim.lowlevel.Waiter()

    async def main() -> None:
        def answered(res: Any, error: BaseException | None) -> None:
            got.append(("one step", _describe(res, error)))
            over.settle(None)

        try:
            claim_and_complete_later(store, caller, key, FP, lease, call, completion, answered)
        except Exception as exc:
            got.append(("raised", type(exc).__name__, str(exc)))
            return
        over.set_deadline(gosim.now() + 10, None)
        await over.wait()
        await gosim.sleep(0.001)  # anything more would come now

    gosim.run(main, procs=1)
    rows = store._conn.execute(  # type: ignore[attr-defined]
        "SELECT caller, key, state, ok, payload FROM idempotency_records"
    ).fetchall()
    store.close()
    return [tuple(str(x).replace(str(path), "PATH") for x in g) for g in got], rows, call.fence


def configure(claim_later: Any, complete_later: Any, claim_and_complete_later: Any) -> None:
    """Hand the C twins these references, the rest as _batch hands it."""
    speedups.configure_submit(
        claim_later=claim_later,
        complete_later=complete_later,
        claim_and_complete_later=claim_and_complete_later,
        claim=_batch._CLAIM,
        complete=_batch._COMPLETE,
        claim_complete=_batch._CLAIM_COMPLETE,
        completion=Completion,
        current_runtime=gosim.lowlevel.current_runtime,
        max_key_length=_batch.MAX_KEY_LENGTH,
        max_payload_bytes=_batch.MAX_PAYLOAD_BYTES,
    )


def completion(kind: type[Completion], ok: Any, payload: Any, effect: Any, ttl: Any) -> Any:
    return new_completion(kind, (ok, payload, effect, ttl, 1 << 20))


LEASES = [30.0, 5, 1e-9, 0, 0.0, -1.0, math.nan, math.inf, True, "5", None, 10**30, -(10**30)]
completions = st.builds(
    completion,
    st.sampled_from([Completion, Completion, CompletionSubclass]),
    st.sampled_from([True, False]),
    st.sampled_from([b"\xa2ok", bytearray(b"\xa2ok"), "str", None]),
    st.sampled_from([None, None, SQLiteEffect(lambda conn: 1), "not an effect"]),
    st.sampled_from([60.0, 1, 0, -5.0, math.nan, math.inf, True, "60", 10**30]),
)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.sampled_from(LEASES), completions)
@example(30.0, completion(Completion, True, b"\xa2ok", None, 60.0))  # the common case
@example(5, completion(Completion, True, b"\xa2ok", None, 1))
def test_the_twins_do_what_the_references_do(tmp_path: Path, lease: Any, done: Any) -> None:
    fast = run_calls(tmp_path / "a.db", speedups.claim_later, speedups.complete_later, lease, done)
    ref = run_calls(tmp_path / "b.db", py_claim_later, py_complete_later, lease, done)
    assert fast == ref
    fast = run_one_step(tmp_path / "c.db", speedups.claim_and_complete_later, lease, done)
    ref = run_one_step(tmp_path / "d.db", py_claim_and_complete_later, lease, done)
    assert fast == ref


@pytest.mark.parametrize("lease", LEASES)
def test_each_lease_as_the_reference(tmp_path: Path, lease: Any) -> None:
    done = completion(Completion, True, b"\xa2ok", None, 60.0)
    fast = run_calls(tmp_path / "a.db", speedups.claim_later, speedups.complete_later, lease, done)
    ref = run_calls(tmp_path / "b.db", py_claim_later, py_complete_later, lease, done)
    assert fast == ref
    fast = run_one_step(tmp_path / "c.db", speedups.claim_and_complete_later, lease, done)
    ref = run_one_step(tmp_path / "d.db", py_claim_and_complete_later, lease, done)
    assert fast == ref


@pytest.mark.parametrize(
    "done",
    [
        (True, b"\xa2ok", None, 60.0, 1 << 20),  # a plain tuple, not a Completion
        completion(CompletionSubclass, True, b"\xa2ok", None, 60.0),
        completion(Completion, True, b"\xa2ok", SQLiteEffect(lambda conn: 2), 60.0),
        completion(Completion, True, b"\xa2ok", "not an effect", 60.0),
        completion(Completion, True, bytearray(b"\xa2ok"), None, 60.0),
        completion(Completion, False, "not bytes", None, 60.0),
    ],
)
def test_each_odd_completion_as_the_reference(tmp_path: Path, done: Any) -> None:
    fast = run_calls(tmp_path / "a.db", speedups.claim_later, speedups.complete_later, 5.0, done)
    ref = run_calls(tmp_path / "b.db", py_claim_later, py_complete_later, 5.0, done)
    assert fast == ref
    fast = run_one_step(tmp_path / "c.db", speedups.claim_and_complete_later, 5.0, done)
    ref = run_one_step(tmp_path / "d.db", py_claim_and_complete_later, 5.0, done)
    assert fast == ref


class Name(str):
    pass


@pytest.mark.parametrize(
    ("caller", "key"),
    [
        ("c" * 255, "k" * 255),  # at the bound: the common case
        ("c", "k" * 256),
        ("c" * 256, "k"),
        ("語" * 256, "k"),
        (Name("c"), Name("k")),  # a str subclass: the reference's
        (Name("c" * 256), "k"),
        (5, "k"),
        ("c", None),
    ],
)
def test_each_caller_and_key_as_the_reference(tmp_path: Path, caller: Any, key: Any) -> None:
    """Callers and keys around the stores' bound (MAX_KEY_LENGTH characters), and not
    str: the twin claims or refuses (InvalidKey, the same words) as the reference."""
    done = completion(Completion, True, b"\xa2ok", None, 60.0)
    fast = run_calls(
        tmp_path / "a.db", speedups.claim_later, speedups.complete_later, 5.0, done, caller, key
    )
    ref = run_calls(tmp_path / "b.db", py_claim_later, py_complete_later, 5.0, done, caller, key)
    assert fast == ref
    too_long = not all(isinstance(x, str) and len(x) <= 255 for x in (caller, key))
    assert ("InvalidKey" in str(fast)) == too_long, fast
    fast = run_one_step(
        tmp_path / "c.db", speedups.claim_and_complete_later, 5.0, done, caller, key
    )
    ref = run_one_step(tmp_path / "d.db", py_claim_and_complete_later, 5.0, done, caller, key)
    assert fast == ref
    assert ("InvalidKey" in str(fast)) == too_long, fast


def test_an_outcome_past_the_bound_as_the_reference(tmp_path: Path) -> None:
    """A payload one byte past MAX_PAYLOAD_BYTES: the twin refuses it (InvalidResult) as
    the reference does; one at the bound is recorded by both."""
    for size, refused in ((_batch.MAX_PAYLOAD_BYTES + 1, True), (1000, False)):
        done = completion(Completion, True, bytes(size), None, 60.0)
        fast = run_calls(
            tmp_path / "a.db", speedups.claim_later, speedups.complete_later, 5.0, done
        )
        ref = run_calls(tmp_path / "b.db", py_claim_later, py_complete_later, 5.0, done)
        assert fast == ref
        assert ("InvalidResult" in str(fast[0])) == refused, fast[0]
        fast = run_one_step(tmp_path / "c.db", speedups.claim_and_complete_later, 5.0, done)
        ref = run_one_step(tmp_path / "d.db", py_claim_and_complete_later, 5.0, done)
        assert fast == ref
        assert ("InvalidResult" in str(fast[0])) == refused, fast[0]


def test_the_stores_calls_take_the_c_path(tmp_path: Path) -> None:
    """A store's own callback forms are the twins, bound in their classes' bodies, and
    the common case never reaches the references (spies in their place)."""
    for cls, name in (
        (_batch.BatchedStore, "claim_later"),
        (_batch.BatchedStore, "complete_later"),
        (_batch.BatchedOneStepStore, "claim_and_complete_later"),
    ):
        assert type(cls.__dict__[name]).__name__ == "instancemethod"
        assert getattr(SQLiteStore, name) is cls.__dict__[name].__func__
        assert cls.__dict__[name].__func__ is getattr(speedups, name)
    reached: list[str] = []

    def spy(name: str, ref: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            reached.append(name)
            return ref(*args, **kwargs)

        return call

    configure(
        spy("claim_later", py_claim_later),
        spy("complete_later", py_complete_later),
        spy("claim_and_complete_later", py_claim_and_complete_later),
    )
    try:
        done = completion(Completion, True, b"\xa2ok", None, 60.0)
        got, rows = run_calls(
            tmp_path / "a.db", SQLiteStore.claim_later, SQLiteStore.complete_later, 30.0, done
        )
        assert [g[0] for g in got] == ["claim", "complete"]
        assert "error" not in got[1][1]
        assert rows == [("c", "k", 2, 1, b"\xa2ok")]
        got, rows, fence = run_one_step(
            tmp_path / "c.db", SQLiteStore.claim_and_complete_later, 30.0, done
        )
        assert [g[0] for g in got] == ["one step"] and "error" not in got[0][1]
        assert rows == [("c", "k", 2, 1, b"\xa2ok")] and fence > 0
        assert reached == []
        run_calls(tmp_path / "b.db", SQLiteStore.claim_later, SQLiteStore.complete_later, 0, done)
        assert reached == ["claim_later"]  # a refused lease: the reference says why
        run_one_step(tmp_path / "d.db", SQLiteStore.claim_and_complete_later, 0, done)
        assert reached == ["claim_later", "claim_and_complete_later"]
    finally:
        configure(py_claim_later, py_complete_later, py_claim_and_complete_later)


def test_outside_a_runtime_both_raise_the_same(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "x.db")
    errors = []
    for claim_later in (speedups.claim_later, py_claim_later):
        with pytest.raises(Exception) as info:
            claim_later(store, "c", "k", FP, 30.0, lambda res, error: None)
        errors.append((type(info.value), str(info.value)))
    assert errors[0] == errors[1]
    done = completion(Completion, True, b"\xa2ok", None, 60.0)
    call = Call("c", "k", "op", [], 0, None)
    for one_step in (speedups.claim_and_complete_later, py_claim_and_complete_later):
        with pytest.raises(Exception) as info:
            one_step(store, "c", "k", FP, 30.0, call, done, lambda res, error: None)
        errors.append((type(info.value), str(info.value)))
    assert errors[2] == errors[3] == errors[0]
    store.close()


def test_calls_of_other_shapes_go_to_the_references() -> None:
    seen: list[Any] = []
    for name in ("claim_later", "complete_later", "claim_and_complete_later"):
        with pytest.raises(TypeError) as fast:
            getattr(speedups, name)(object(), "c")
        with pytest.raises(TypeError) as ref:
            REFERENCES[name](object(), "c")
        seen.append((str(fast.value), str(ref.value)))
    assert all(a == b for a, b in seen)


def test_the_twins_leak_nothing(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "leak.db", synchronous="OFF")
    done = completion(Completion, True, b"\xa2ok", None, 60.0)
    # A fingerprint of this test's own: references to FP that the earlier tests' objects
    # let go of during the traced runs (seen after the hypothesis test) are not this one's.
    fp = bytes([6]) * 32
    keys = iter(range(10**9))

    def work(n: int) -> None:
        async def main() -> None:
            answered: list[Any] = []

            def claimed(res: Any, error: BaseException | None) -> None:
                if error is None and res.kind.name == "CLAIMED":
                    fence = res.record.fence
                    speedups.complete_later(store, "c", res_key[0], fence, done, completed)

            def completed(rec: Any, error: BaseException | None) -> None:
                answered.append(error)

            for _ in range(n):
                res_key = [f"k{next(keys)}"]
                speedups.claim_later(store, "c", res_key[0], fp, 30.0, claimed)
                speedups.claim_later(store, "c", "refused", fp, 0, lambda r, e: None)
                call = Call("c", "o", "op", [], 0, None)
                one_step_key = f"o{next(keys)}"
                speedups.claim_and_complete_later(
                    store, "c", one_step_key, fp, 30.0, call, done, completed
                )
                while len(answered) < 2:
                    await gosim.sleep(0.0005)
                answered.clear()

        gosim.run(main, procs=1)

    moved, live = leaks(work, fp, done, warm=100, runs=600)
    assert moved == [0, 0]
    assert live < 512 * 1024, f"{live} bytes still live"
    store.close()
