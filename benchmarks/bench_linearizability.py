"""gosim.testing's linearizability checker on histories of simulated servers (issue 45).

The histories come from simulated servers run on gosim (virtual time, a fixed seed):
one server goroutine owns the data and serves ``CLIENTS`` client goroutines over a
channel; each client, in a loop, waits a random think time and sends a random request,
with random network delays on the way to the server and back. Each operation is
recorded (``HistoryRecorder`` on ``gosim.now``) from the client's side: the call before
the request leaves, the return after the answer arrives, so operations overlap as in a
real deployment and the server's order is one linearization.

* The ledger holds ``ACCOUNTS`` balances (100 each at the start); a request transfers a
  random amount between two accounts (always granted: a balance may go negative) or
  reads one balance. The ledger cannot be partitioned per account: a transfer touches
  two accounts, and per-account parts can each be linearizable while the whole is not
  (a read of the source sees the transfer, a later read of the destination does not).
  The search runs over the whole history; the memo and the bounded overlap (at most
  ``CLIENTS`` operations in flight) keep it tractable.
* The key-value store holds ``KEYS`` keys; a request puts a fresh value or gets one
  key's value. It is checked per key (P-compositionality).

Groups:

* ``linz-ledger`` (figure: ``seconds``, one check of the whole history): a correct
  ledger's 10,000-operation history. The goal is under 10 s.
* ``linz-bug`` (figures: ``seconds`` for the check and shrink together,
  ``counterexample_ops``, ``minimal``): a buggy server caught. ``kv-stale-read``
  answers some gets from a replica copied every ``REFRESH`` puts; its counterexample
  (at most 10 operations: the put whose value the get returned, the put that
  overwrote it, the get) is asserted. ``ledger-double-apply`` applies some transfers
  twice (a retry that was not deduplicated); its counterexample is reported, not
  bounded: every balance depends on all the transfers before it, so a minimal
  counterexample holds every transfer of the account up to the wrong read, and
  shrinking one of 16 clients' interleavings runs out of its step budget first.

Reproduce::

    .venv/bin/python -m pytest benchmarks/bench_linearizability.py --benchmark-json=linz.json

``--benchmark-disable`` runs each case once on a 2,000-operation history.
"""

from __future__ import annotations

import random
import time
from typing import Any

import pytest

import gosim
from gosim import Chan
from gosim.testing import HistoryRecorder, Model, Operation, check_linearizability

ACCOUNTS = 5
KEYS = 50
CLIENTS = 16
START = 100  # every balance, at the start of a run
REFRESH = 20  # the stale replica is copied every REFRESH puts
BUG_RATE = 0.02  # the share of gets (stale read) or transfers (double apply) gone wrong
SEED = 45

Input = tuple[Any, ...]
Ledger = tuple[int, ...]
History = list[Operation[Input, Any]]


def _ledger(state: Ledger, inp: Input) -> tuple[int | None, Ledger]:
    if inp[0] == "read":
        return state[inp[1]], state
    _, src, dst, amount = inp
    new = list(state)
    new[src] -= amount
    new[dst] += amount
    return None, tuple(new)


def _register(state: int | None, inp: Input) -> tuple[int | None, int | None]:
    return (state, state) if inp[0] == "get" else (None, inp[2])


def _describe(inp: Input, out: Any) -> str:
    if inp[0] == "transfer":
        return f"transfer({inp[1]} -> {inp[2]}, {inp[3]})"
    if inp[0] == "put":
        return f"put({inp[1]!r}, {inp[2]})"
    return f"{inp[0]}({inp[1]!r}) -> {out}"


LEDGER: Model[Ledger, Input, Any] = Model(
    init=(START,) * ACCOUNTS, apply=_ledger, describe=_describe
)
# One key is one register: the store is checked key by key.
KV: Model[int | None, Input, Any] = Model(
    init=None, apply=_register, partition=lambda inp: inp[1], describe=_describe
)


def simulate(n: int, kind: str, bug: str | None = None, seed: int = SEED) -> History:
    """The history of ``n`` operations against the simulated ``kind`` server ("ledger"
    or "kv"); ``bug``: None, "stale-read" (kv) or "double-apply" (ledger)."""
    rng = random.Random(seed)
    rec: HistoryRecorder[Input, Any] = HistoryRecorder(clock=gosim.now)
    requests: Chan[tuple[Input, Chan[Any]]] = Chan(CLIENTS)
    balances = [START] * ACCOUNTS
    store: dict[str, int] = {}
    replica: dict[str, int] = {}
    puts = 0

    def serve(inp: Input) -> Any:
        nonlocal puts, replica
        if inp[0] == "read":
            return balances[inp[1]]
        if inp[0] == "transfer":
            _, src, dst, amount = inp
            for _ in range(2 if bug == "double-apply" and rng.random() < BUG_RATE else 1):
                balances[src] -= amount
                balances[dst] += amount
            return None
        if inp[0] == "get":
            stale = bug == "stale-read" and rng.random() < BUG_RATE
            return (replica if stale else store).get(inp[1])
        store[inp[1]] = inp[2]
        puts += 1
        if puts % REFRESH == 0:
            replica = dict(store)
        return None

    def request(c: int, k: int) -> Input:
        if kind == "ledger":
            if rng.random() < 0.5:
                src, dst = rng.sample(range(ACCOUNTS), 2)
                return ("transfer", src, dst, rng.randint(1, 50))
            return ("read", rng.randrange(ACCOUNTS))
        key = f"k{rng.randrange(KEYS)}"
        return ("put", key, c * n + k) if rng.random() < 0.5 else ("get", key)

    async def server() -> None:
        async for inp, reply in requests:
            await reply.send(serve(inp))

    async def client(c: int, count: int, done: Chan[None]) -> None:
        reply: Chan[Any] = Chan(1)
        for k in range(count):
            await gosim.sleep(rng.random() * 2e-3)  # think time
            inp = request(c, k)
            i = rec.call(inp, c)
            await gosim.sleep(rng.random() * 1e-3)  # to the server
            await requests.send((inp, reply))
            out = await reply.recv()
            await gosim.sleep(rng.random() * 1e-3)  # and back
            rec.ret(i, out)
        await done.send(None)

    async def main() -> None:
        gosim.go(server)
        done: Chan[None] = Chan(CLIENTS)
        for c in range(CLIENTS):
            gosim.go(client, c, n // CLIENTS + (c < n % CLIENTS), done)
        for _ in range(CLIENTS):
            await done.recv()
        requests.close()

    gosim.run(main, seed=seed, virtual_time=True, procs=2)
    return rec.history()


def _n(benchmark: Any) -> int:
    return 2_000 if benchmark.disabled else 10_000


def check_seconds(history: History) -> float:
    """One check of a correct ledger's ``history``, which must pass: its seconds."""
    t0 = time.perf_counter()
    result = check_linearizability(LEDGER, history)
    elapsed = time.perf_counter() - t0
    assert result.linearizable, result.describe()
    return elapsed


def bench_ledger_check(benchmark: Any) -> None:
    history = simulate(_n(benchmark), "ledger")
    assert len(history) == _n(benchmark)
    benchmark.group = "linz-ledger"
    elapsed: list[float] = []
    benchmark.pedantic(
        lambda: elapsed.append(check_seconds(history)),
        rounds=1 if benchmark.disabled else 3,
        iterations=1,
    )
    benchmark.extra_info["operations"] = len(history)
    benchmark.extra_info["seconds"] = sorted(elapsed)[len(elapsed) // 2]


BUGS: dict[str, tuple[str, str, Model[Any, Input, Any]]] = {
    "kv-stale-read": ("kv", "stale-read", KV),
    "ledger-double-apply": ("ledger", "double-apply", LEDGER),
}


def caught(case: str, n: int) -> tuple[float, Any]:
    """Buggy server ``case``'s ``n``-operation history checked (after the same server
    without its bug passes): the check's seconds (search and shrink) and its result,
    which must say not linearizable; the stale read's counterexample is minimal and at
    most 10 operations."""
    kind, bug, model = BUGS[case]
    assert check_linearizability(model, simulate(n, kind)), "the bug-free run"
    history = simulate(n, kind, bug)
    t0 = time.perf_counter()
    result = check_linearizability(model, history)
    elapsed = time.perf_counter() - t0
    assert not result.linearizable
    if kind == "kv":
        assert result.minimal and len(result.counterexample) <= 10, result.describe()
    return elapsed, result


@pytest.mark.parametrize("case", list(BUGS))
def bench_buggy_server(benchmark: Any, case: str) -> None:
    benchmark.group = "linz-bug"
    found: list[tuple[float, Any]] = []
    benchmark.pedantic(lambda: found.append(caught(case, _n(benchmark))), rounds=1, iterations=1)
    elapsed, result = found[0]
    shown = result.describe() if len(result.counterexample) <= 20 else "(too long to show)"
    print(f"\n{case}: {len(result.counterexample)} operations, minimal={result.minimal}\n{shown}")
    benchmark.extra_info["seconds"] = elapsed
    benchmark.extra_info["counterexample_ops"] = len(result.counterexample)
    benchmark.extra_info["minimal"] = result.minimal
