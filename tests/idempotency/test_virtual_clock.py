"""A store whose leases are judged by a real-world clock refuses a runtime on a virtual
clock, which that clock does not follow (a caller waiting simulated seconds for a dead
holder's lease would never see it lapse); given a clock that follows the runtime's, it
serves it and the lease lapses in simulated time. SQLiteStore (Unix time by default)
and RedisStore (the server's clock by default) here; PostgresStore's twin of this test
is in test_postgres.py."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import gosim
from idempotency import Call, Idempotency, SQLiteStore, Store
from idempotency._keys import fingerprint

FP = fingerprint("op", [])
WHY = r"refused on a virtual clock: leases and retention are judged by "


def _handler(call: Call) -> str:
    return "ran"


async def _take_over(store: Store) -> tuple[Any, float]:
    """A holder claims and dies; a call of the same key waits for its lease to lapse."""
    await store.claim("c", "k", FP, 1.0)
    start = gosim.now()
    out = await Idempotency(store, lease=1.0).run(
        caller="c", key="k", request=("op", []), handler=_handler, timeout=30
    )
    return out, gosim.now() - start


def _sqlite(tmp_path: Path, request: Any) -> Callable[..., Store]:
    path = tmp_path / "r.db"
    return lambda **kw: SQLiteStore(path, **kw)


def _redis(tmp_path: Path, request: Any) -> Callable[..., Store]:
    pytest.importorskip("redis", reason="RedisStore needs redis-py")
    from idempotency import RedisStore  # noqa: PLC0415

    server = request.getfixturevalue("redis_server")
    prefix = f"v{time.monotonic_ns()}:"
    return lambda **kw: RedisStore(server.url, prefix=prefix, **kw)


@pytest.mark.parametrize(
    ("make", "judge"),
    [(_sqlite, "Unix time"), (_redis, r"the Redis server's clock \(TIME\)")],
    ids=["sqlite", "redis"],
)
def test_a_virtual_clock_needs_the_stores_clock(
    tmp_path: Path, request: Any, make: Any, judge: str
) -> None:
    new = make(tmp_path, request)
    plain = new()
    name = type(plain).__name__

    async def refused() -> None:
        with pytest.raises(RuntimeError, match=name + r"\(.*" + WHY + judge):
            await _take_over(plain)
        for tool in (plain.inspect("c", "k"), plain.forget("c", "k"), plain.sweep()):
            with pytest.raises(RuntimeError, match=WHY + judge):
                await tool

    gosim.run(refused, virtual_time=True)

    async def nothing_written() -> Any:
        return await plain.get("c", "k")

    assert gosim.run(nothing_written) is None  # on a real clock it serves: no record
    plain.close()
    timed = new(clock=lambda: 1_700_000_000.0 + gosim.now())
    out, waited = gosim.run(_take_over, timed, seed=2, virtual_time=True)
    assert out.value == "ran" and not out.replayed
    assert 1.0 <= waited < 30  # simulated seconds: the lease lapsed in virtual time
    timed.close()
