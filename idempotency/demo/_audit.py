"""The demo's audit: a ledger read at rest against the clients' logs and the workload.

A check is ``(name, holds, detail)``; ``holds`` is True or False, or None when the
check could not be made (a client died before writing its log, the run ended before
the clients reconciled). A run passes only when every check was made and holds.

The checks:

1. **balances conserved**: their sum is what the ledger started with.
2. **every acknowledged transfer in the ledger once**, as issued.
3. **nothing applied twice or unasked**: replaying the applied transfers from the
   opening balances gives every account's balance exactly, no applied transfer is one
   no client issued, none a client was told was refused.
4. **every outcome known after reconciliation** (acknowledged or refused).
5. **the clients ran the workload**: every connection issued transfers, every transfer
   has the workload's shape (two distinct accounts of the ledger, an amount in
   ``1..MAX_AMOUNT``), and some were acknowledged. A client that issues nothing, or a
   log that says nothing, does not pass.
6. **refusals the workload explains**: a correct ledger refuses a transfer of the
   workload only for want of funds (``INSUFFICIENT_FUNDS``), and only so often; see
   :func:`refusal_bound`. A ledger that refuses everything, or a share of transfers it
   had the money for, does not pass.
7. **transfers and balance reads linearizable**: the clients' history (each transfer
   from its first send to its outcome, pending when the outcome never came; each
   answered balance read), seen from each account, fits one order of that account
   (:func:`ledger_model`), checked with :func:`gosim.testing.check_linearizability`;
   when it does not, the detail is a minimal counterexample. Per account, not the
   whole ledger: a projection that is not linearizable proves the ledger's history is
   not, and the search stays small; a violation only two accounts show together
   passes (see :func:`ledger_model`). Over the first :data:`LINEARIZABILITY_WINDOW`
   operations by call time at most (see :func:`ledger_history`). Not made when a
   client's log is missing (its transfers' effects are in the balances the others
   read) or the log has no times.

A run directory holds ``run.json`` (:func:`write_manifest`): where the ledger is, the
workload, and how the run ended, so that ``python -m idempotency.demo audit DIR`` makes
the same checks again later (:func:`reaudit`).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from gosim.testing import Model, Operation, Unknown, check_linearizability

from .._secrets import masked, passwords_in
from ._ledger import (
    BAD_TRANSFER,
    INITIAL_BALANCE,
    INSUFFICIENT_FUNDS,
    LedgerSpec,
    LedgerState,
    read_ledger,
)

__all__ = [
    "LINEARIZABILITY_WINDOW",
    "MAX_AMOUNT",
    "Check",
    "audit",
    "caller_name",
    "ledger_history",
    "ledger_model",
    "log_name",
    "read_logs",
    "reaudit",
    "refusal_bound",
    "report_tables",
    "write_manifest",
]

#: A transfer of the workload moves 1 to MAX_AMOUNT (uniform) between two distinct
#: accounts drawn uniformly.
MAX_AMOUNT = 50
#: The refusal bound's share and slack (see :func:`refusal_bound`).
REFUSAL_SHARE = 2 * MAX_AMOUNT / INITIAL_BALANCE
REFUSAL_SLACK = 20

Check = tuple[str, bool | None, str]

#: The most operations of the clients' history (a transfer counts once for each of its
#: accounts) the audit checks for linearizability: the first ones by call time. Checked
#: per account, 9,000 operations of a simulated run of 200 connections take a tenth of
#: a second, and 100,000 some seconds; the window keeps a long run's audit short.
LINEARIZABILITY_WINDOW = 100_000

MANIFEST = "run.json"


def log_name(client: int) -> str:
    """The file, in the run's directory, of a client process's log."""
    return f"client{client}.jsonl"


def caller_name(client: int, connection: int) -> str:
    """The caller name of a client process's connection (its idempotency keys' owner)."""
    return f"c{client}-{connection}"


_CALLER = re.compile(r"c(\d+)-\d+\Z")


def refusal_bound(issued: int) -> int:
    """The most refusals a correct ledger gives ``issued`` transfers of the workload.

    How it is derived. A refusal needs a source holding less than the amount. The
    balances move as a Markov chain: each transfer picks a pair of accounts and an amount
    independently of the balances and applies when the source can pay, so the move
    ``x -> x'`` and its reverse (same amount, accounts swapped) are equally likely, the
    chain is symmetric, and its stationary distribution is uniform over the ways to share
    the total ``N * INITIAL_BALANCE`` among ``N`` accounts. One account's balance is
    then Beta(1, N-1) times the total, and a transfer of ``a`` is refused with
    probability ``1 - (1 - a / (N * INITIAL_BALANCE)) ** (N - 1) < a / INITIAL_BALANCE``,
    under ``MAX_AMOUNT / INITIAL_BALANCE`` (5%) for every amount. The ledger opens at
    equal balances, the state farthest from a refusal, and approaches that share from
    below. Concurrency changes nothing: the applied transfers are one sequence of the
    same chain (retries and replays issue no new transfer). The bound doubles the
    share for the clumping of refusals while an account sits near zero and adds
    REFUSAL_SLACK for short runs; simulated runs of the chain (2 to 100 accounts, 100 to
    300,000 transfers, 30 seeds) stayed under 4.4%.
    """
    return math.floor(REFUSAL_SHARE * issued) + REFUSAL_SLACK


def read_logs(logs: Iterable[Path]) -> list[dict[str, Any]]:
    """The clients' logs: one dict per issued transfer or (``kind`` ``"balance"``)
    answered balance read."""
    entries = []
    for path in logs:
        with open(path) as f:
            entries += [json.loads(text) for text in f]
    return entries


def _client_of(caller: str) -> int | None:
    m = _CALLER.match(caller)
    return int(m.group(1)) if m else None


def audit(
    state: LedgerState,
    accounts: int,
    entries: list[dict[str, Any]],
    callers: Collection[str] | None = None,
    unlogged: Collection[int] = (),
    reconciled: bool = True,
) -> list[Check]:
    """The checks of the module docstring. ``callers``: every connection expected to
    have issued transfers (None: not checked); ``unlogged``: client processes whose log
    is missing (they died), whose transfers in the ledger cannot be matched to what they
    issued; ``reconciled``: False when the run ended before the clients' reconciliation
    (no outcome check, and connections that issued nothing are not held against it)."""
    reads = [e for e in entries if e.get("kind") == "balance"]
    entries = [e for e in entries if e.get("kind", "transfer") == "transfer"]
    issued: dict[tuple[str, str], dict[str, Any]] = {}
    for e in entries:
        issued[(e["caller"], e["key"])] = e
    balances, rows = state.balances, state.transfers
    checks: list[Check] = []
    total = sum(balances.values())
    want = accounts * INITIAL_BALANCE
    checks.append(("balances conserved", total == want, f"sum {total}, started with {want}"))
    applied = {(c, k): (s, d, a) for c, k, s, d, a in rows}
    acked = [e for e in issued.values() if e["status"] == "acked"]
    missing = [
        e
        for e in acked
        if applied.get((e["caller"], e["key"])) != (e["src"], e["dst"], e["amount"])
    ]
    checks.append(
        (
            "every acknowledged transfer in the ledger once",
            not missing and len(applied) == len(rows),
            f"{len(acked)} acknowledged, {len(missing)} missing or altered",
        )
    )
    dead = set(unlogged)
    stray = [k for k in applied if k not in issued and _client_of(k[0]) not in dead]
    refused_applied = [k for k, e in issued.items() if e["status"] == "refused" and k in applied]
    # Every account the ledger opened with, at its opening balance: an account gone
    # from the ledger, or one it never had, makes the replay differ.
    replayed = {i: INITIAL_BALANCE for i in range(accounts)}
    for s, d, a in applied.values():
        replayed[s] = replayed.get(s, 0) - a
        replayed[d] = replayed.get(d, 0) + a
    exact = replayed == balances
    checks.append(
        (
            "nothing applied twice or unasked",
            exact and not stray and not refused_applied,
            f"{len(rows)} applied; {len(stray)} not issued; {len(refused_applied)} refused yet "
            f"applied; balances {'match' if exact else 'differ from'} the transfers",
        )
    )
    for client in sorted(dead):
        mine = sum(1 for c, _ in applied if _client_of(c) == client)
        checks.append(
            (
                f"client{client}'s transfers",
                None,
                f"its log is missing (it died before writing it): its {mine} applied "
                "transfers cannot be matched to what it issued or was told",
            )
        )
    unknown = [e for e in issued.values() if e["status"] not in ("acked", "refused")]
    if reconciled:
        checks.append(
            (
                "every outcome known after reconciliation",
                not unknown,
                f"{len(issued)} issued, {len(unknown)} unknown",
            )
        )
    else:
        checks.append(
            (
                "every outcome known after reconciliation",
                None,
                f"the run ended before the clients reconciled: {len(unknown)} of "
                f"{len(issued)} outcomes unknown",
            )
        )
    if not entries and dead:
        why = "no client's log to check against"
        checks.append(("the clients ran the workload", None, why))
        checks.append(("refusals the workload explains", None, why))
    else:
        checks.append(_workload(issued, accounts, callers, reconciled))
        checks.append(_refusals(issued))
    checks.append(_linearizable(accounts, [*issued.values(), *reads], dead))
    return checks


def ledger_model(accounts: int) -> Model[int, Any, Any]:
    """One account of a ledger of ``accounts`` as a sequential object, for
    :func:`check_linearizability`, partitioned by account: its state is the account's
    balance (``INITIAL_BALANCE`` at the start). An operation is the account's view of
    one: ``("balance", account)`` gives the balance; ``("transfer", src, dst, amount,
    account)`` is a transfer seen from ``account``, its source or its destination.

    From the source it is exact: ``"acked"`` and the amount leaves, or ``("refused",
    INSUFFICIENT_FUNDS)`` when the balance is short (``("refused", BAD_TRANSFER)`` for
    a transfer of no valid shape: an account the ledger has not, the same account
    twice, an amount under 1), and nothing moves. A balance read gives the balance
    (None for an account the ledger has not). From the destination, whose
    balance does not decide it, ``"acked"`` brings the amount in and a refusal for
    want of funds is accepted as it comes.

    Checked so, each account's history is a projection of the ledger's: a ledger
    history that is linearizable has linearizable projections, so a projection that is
    not proves a violation (a read that misses or doubles a transfer, a refusal with
    the money there, an acknowledged transfer never applied). The converse does not
    hold: a violation only two accounts show together (a read of the source sees a
    transfer, a later read of the destination does not) passes. The whole ledger is
    not searched: with a few hundred calls in flight the search backtracks over
    transfers of unrelated accounts, and histories of five hundred operations already
    run for minutes."""

    def valid(a: Any) -> bool:
        return type(a) is int and 0 <= a < accounts

    def step(state: int, op: Any, out: Any) -> tuple[bool, int]:
        if op[0] == "balance":
            return (isinstance(out, Unknown) or out == (state if valid(op[1]) else None)), state
        _, src, dst, amount, account = op
        if not (valid(src) and valid(dst)) or src == dst or amount < 1:
            return (isinstance(out, Unknown) or out == ("refused", BAD_TRANSFER)), state
        if account == src:
            if state < amount:
                return (isinstance(out, Unknown) or out == ("refused", INSUFFICIENT_FUNDS)), state
            return (isinstance(out, Unknown) or out == "acked"), state - amount
        if out == ("refused", INSUFFICIENT_FUNDS):
            return True, state
        # Acknowledged, or pending and (if it is linearized at all) applied.
        return (isinstance(out, Unknown) or out == "acked"), state + amount

    def account(op: Any) -> Any:
        return op[-1] if op[0] == "transfer" else op[1]

    def describe(op: Any, output: Any) -> str:
        got = "?" if isinstance(output, Unknown) else output
        if op[0] == "balance":
            return f"balance({op[1]}) -> {got}"
        if isinstance(got, (tuple, list)):
            got = f"refused (code {got[1]})"
        return f"transfer {op[3]} from {op[1]} to {op[2]} -> {got}"

    return Model(init=INITIAL_BALANCE, step=step, partition=account, describe=describe)


def ledger_history(
    entries: Iterable[dict[str, Any]], window: int = LINEARIZABILITY_WINDOW
) -> tuple[list[Operation[Any, Any]], int]:
    """The history of the log's ``entries`` (transfers and balance reads, with their
    ``call`` and ``ret`` times) for :func:`ledger_model`, a transfer once for each of
    its accounts, its times counted from the first call, cut to its first ``window``
    operations by call time; and how many operations the whole history has. A transfer
    whose outcome never came (``ret`` missing) is pending.

    The cut is sound: it keeps every operation called up to the window's last call
    and makes pending those that returned after it, so a linearizable history's cut is
    linearizable (its order, stopped there) and a cut that is not proves the whole is
    not. Raises KeyError for an entry without a ``call`` time."""
    ops: list[Operation[Any, Any]] = []
    for e in entries:
        ret = e.get("ret")
        if e.get("kind") == "balance":
            ops.append(Operation(("balance", e["account"]), e["call"], e["balance"], ret))
            continue
        status = e["status"]
        done = ret is not None and status in ("acked", "refused")
        out = "acked" if status == "acked" else ("refused", e.get("code", INSUFFICIENT_FUNDS))
        for account in dict.fromkeys((e["src"], e["dst"])):  # each end's view
            inp = ("transfer", e["src"], e["dst"], e["amount"], account)
            if done:
                ops.append(Operation(inp, e["call"], out, ret, e["caller"]))
            else:
                ops.append(Operation(inp, e["call"], client=e["caller"]))
    total = len(ops)
    if not ops:
        return ops, 0
    ops.sort(key=lambda op: op.call)
    t0 = ops[0].call
    if total > window:
        last = ops[window - 1].call
        ops = [op for op in ops if op.call <= last]
        ops = [op if op.ret is not None and op.ret <= last else _pending(op) for op in ops]
    return [_shifted(op, t0) for op in ops], total


def _pending(op: Operation[Any, Any]) -> Operation[Any, Any]:
    return Operation(op.input, op.call, client=op.client)


def _shifted(op: Operation[Any, Any], t0: float) -> Operation[Any, Any]:
    ret = None if op.ret is None else round(op.ret - t0, 6)
    return Operation(op.input, round(op.call - t0, 6), op.output, ret, op.client)


def _linearizable(accounts: int, entries: list[dict[str, Any]], dead: Collection[int]) -> Check:
    name = "transfers and balance reads linearizable"
    if dead:
        return (
            name,
            None,
            "a client's log is missing: the balances the others read hold its transfers",
        )
    if not entries:
        return name, None, "no operation logged"
    try:
        history, total = ledger_history(entries)
    except KeyError:
        return name, None, "the log has no call and return times"
    reads = sum(1 for op in history if op.input[0] == "balance")
    scope = (
        f"each account's history: {len(history)} operations ({reads} balance reads)"
        if len(history) == total
        else f"each account's history, the first {len(history)} of {total} operations by "
        f"call time ({reads} balance reads; to {history[-1].call:.3f} s; the rest not "
        "checked)"
    )
    result = check_linearizability(ledger_model(accounts), history)
    if result:
        return name, True, scope
    scope += f", account {result.partition}"
    ops = "; ".join(op.describe(result.model) for op in result.counterexample)
    shrunk = "" if result.minimal else " (not the smallest: shrinking ran out of its budget)"
    return (
        name,
        False,
        f"{scope}: these {len(result.counterexample)} cannot be put in one order{shrunk}: {ops}",
    )


def _workload(
    issued: dict[tuple[str, str], dict[str, Any]],
    accounts: int,
    callers: Collection[str] | None,
    reconciled: bool,
) -> Check:
    bad = [
        e
        for e in issued.values()
        if not (
            type(e["src"]) is int
            and type(e["dst"]) is int
            and type(e["amount"]) is int
            and 0 <= e["src"] < accounts
            and 0 <= e["dst"] < accounts
            and e["src"] != e["dst"]
            and 1 <= e["amount"] <= MAX_AMOUNT
        )
    ]
    acked = sum(1 for e in issued.values() if e["status"] == "acked")
    problems = []
    if bad:
        problems.append(f"{len(bad)} not of its shape")
    idle: list[str] = []
    if callers is not None:
        busy = {c for c, _ in issued}
        idle = sorted(set(callers) - busy)
        if idle and reconciled:
            problems.append(f"{len(idle)} connection(s) issued nothing (e.g. {idle[0]})")
    if not acked and (reconciled or not issued):
        problems.append("none acknowledged")
    of = f" by {len(callers) - len(idle)} of {len(callers)} connections" if callers else ""
    detail = f"{len(issued)} issued{of}, {acked} acknowledged"
    return (
        "the clients ran the workload",
        not problems,
        detail + (f": {'; '.join(problems)}" if problems else ""),
    )


def _refusals(issued: dict[tuple[str, str], dict[str, Any]]) -> Check:
    refused = [e for e in issued.values() if e["status"] == "refused"]
    # Entries from before the clients logged the refusal's code count as the ledger's.
    odd = [e for e in refused if e.get("code", INSUFFICIENT_FUNDS) != INSUFFICIENT_FUNDS]
    bound = refusal_bound(len(issued))
    detail = (
        f"{len(refused)} refused of {len(issued)} (a correct ledger: at most {bound}, "
        f"{REFUSAL_SHARE:.0%} + {REFUSAL_SLACK}, for want of funds)"
    )
    if odd:
        detail += f"; {len(odd)} for another reason (code {odd[0].get('code')})"
    return ("refusals the workload explains", len(refused) <= bound and not odd, detail)


def verdict(checks: list[Check]) -> int:
    """0 when every check was made and holds, else 1."""
    return 0 if all(ok is True for _, ok, _ in checks) else 1


def report_tables(console: Console, checks: list[Check], counts: list[tuple[str, Any]]) -> int:
    """Print the audit and the counts; 0 when every check was made and holds."""
    result = Table(title="audit")
    result.add_column("check")
    result.add_column("holds")
    result.add_column("detail")
    for name, ok, detail in checks:
        result.add_row(name, {True: "yes", False: "NO", None: "not checked"}[ok], detail)
    console.print(result)
    if counts:
        table = Table(title="counts")
        table.add_column("what")
        table.add_column("how many", justify="right")
        for k, v in counts:
            table.add_row(k.replace("_", " "), str(v))
        console.print(table)
    failed = [name for name, ok, _ in checks if ok is False]
    unchecked = [name for name, ok, _ in checks if ok is None]
    if failed:
        console.print(f"[bold red]FAILED[/]: {', '.join(failed)}")
    if unchecked:
        console.print(f"[bold yellow]NOT CHECKED[/]: {', '.join(unchecked)}")
    if failed or unchecked:
        return 1
    console.print("[bold green]all checks hold[/]")
    return 0


@dataclass
class Ending:
    """How a run ended: ``died`` (name, exit status, seconds into the run) for each
    process that ended unbidden; ``reconciled`` when the clients ran to their end;
    ``interrupted`` the signal that stopped the conductor, if one did."""

    died: list[tuple[str, int | None, float]]
    reconciled: bool
    interrupted: int | None = None


def write_manifest(
    workdir: Path,
    spec: LedgerSpec,
    accounts: int,
    connections: list[int],
    own_server: bool,
    ending: Ending | None = None,
) -> None:
    """``run.json``: what :func:`reaudit` needs (written at the start, and again with
    the ending). ``own_server``: the ledger is in a database server the run started on
    files in ``workdir`` (a redis-server's, a PostgreSQL cluster's ``postgres/``).
    A Redis URL or PostgreSQL DSN is kept with its password masked: the file outlives
    the run (``--keep``, a failed run), and :func:`reaudit` is given the password
    again by whoever audits."""
    pg = spec.kind == "postgres"
    doc: dict[str, Any] = {
        "store": spec.kind,
        "db": str(Path(spec.path).resolve()) if spec.path is not None else None,
        "redis": masked(spec.url) or None if spec.kind == "redis" else None,
        "prefix": spec.prefix,
        "own_redis": own_server and spec.kind == "redis",
        "postgres": masked(spec.url) if pg and not own_server else None,
        "own_postgres": own_server and pg,
        "accounts": accounts,
        "clients": [
            {"log": log_name(i), "connections": n} for i, n in enumerate(connections)
        ],
        "ending": None if ending is None else {
            "died": ending.died,
            "reconciled": ending.reconciled,
            "interrupted": ending.interrupted,
        },
    }  # fmt: skip
    tmp = workdir / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    tmp.replace(workdir / MANIFEST)


def audit_run(
    workdir: Path,
    state: LedgerState,
    accounts: int,
    connections: list[int],
    ending: Ending,
) -> list[Check]:
    """The checks of a run from its directory's logs, the ledger ``state`` and how it
    ended; a client that died, or whose log is missing or torn, is audited as unlogged."""
    entries: list[dict[str, Any]] = []
    callers: list[str] = []
    unlogged: list[int] = []
    dead = {name for name, _, _ in ending.died}
    for i, n in enumerate(connections):
        path = workdir / log_name(i)
        try:
            if f"client{i}" in dead:
                raise FileNotFoundError(path)
            entries += read_logs([path])
        except (OSError, ValueError):  # gone, or torn by the process's death
            unlogged.append(i)
            continue
        callers += [caller_name(i, j) for j in range(n)]
    checks = audit(state, accounts, entries, callers, unlogged, ending.reconciled)
    if ending.died:
        what = "; ".join(
            f"{name} exited with status {code} at {at:.1f} s"
            if code is not None
            else f"{name} died: how the run ended was never written"
            for name, code, at in ending.died
        )
        checks.append(("every process ran until stopped", False, what))
    elif ending.interrupted is not None:
        why = f"the run was interrupted (signal {ending.interrupted})"
        checks.append(("every process ran until stopped", None, why))
    else:
        who = f"{len(connections)} client process(es)"
        checks.append(("every process ran until stopped", True, who))
    return checks


def reaudit(
    workdir: Path,
    console: Console | None = None,
    *,
    redis: str | None = None,
    postgres: str | None = None,
) -> int:
    """``python -m idempotency.demo audit DIR``: audit the ledger a run left in
    ``workdir`` (its SQLite file, its own redis-server's or PostgreSQL cluster's files,
    or the Redis or PostgreSQL it named); the run's checks and exit status.

    ``redis``/``postgres``: the URL or DSN of the server a run named, given again; it
    is needed when that one carries a password, which ``run.json`` keeps masked
    (SystemExit, saying so, without it)."""
    from ._run import RedisServer, own_postgres  # noqa: PLC0415 -- the conductor's servers

    console = console or Console()
    try:
        doc = json.loads((workdir / MANIFEST).read_text())
    except (OSError, ValueError) as exc:
        raise SystemExit(
            f"{workdir} is not a demo run's directory (no readable {MANIFEST}: {exc})"
        ) from None
    ending_doc = doc.get("ending")
    if ending_doc is None:  # the conductor itself died: nothing says how the run went
        ending = Ending([("the conductor", None, 0.0)], reconciled=False)
    else:
        died = [(str(n), c, float(a)) for n, c, a in ending_doc["died"]]
        ending = Ending(died, bool(ending_doc["reconciled"]), ending_doc["interrupted"])
    connections = [int(c["connections"]) for c in doc["clients"]]
    server: RedisServer | None = None
    cluster: Any = None
    store = doc["store"]
    if (redis is not None and store != "redis") or (postgres is not None and store != "postgres"):
        given = "--redis" if redis is not None else "--postgres"
        raise SystemExit(f"{given} given, but the run in {workdir} kept its ledger in {store}")
    if store == "postgres":
        dsn = _named_server(doc.get("postgres"), postgres, "--postgres DSN", workdir)
        if doc.get("own_postgres"):  # the run's cluster, started again on its files
            cluster = own_postgres(workdir, existing=True)
            dsn = cluster.dsn
        spec = LedgerSpec("postgres", url=dsn, prefix=doc["prefix"])
        where = f"PostgreSQL {masked(dsn)}, schema {spec.prefix}"
    elif doc["store"] == "sqlite":
        spec = LedgerSpec("sqlite", path=Path(doc["db"]))
        if not spec.path or not spec.path.exists():
            raise SystemExit(f"the run's ledger {doc['db']} is gone")
        where = str(spec.path)
    else:
        url = _named_server(doc["redis"], redis, "--redis URL", workdir)
        if doc["own_redis"]:  # the run's redis-server, restarted on its files
            server = RedisServer(workdir)
            url = server.url
        spec = LedgerSpec("redis", url=url, prefix=doc["prefix"])
        where = f"Redis {masked(url)}, keys {spec.prefix}*"
    try:
        state = read_ledger(spec)
    finally:
        if server is not None:
            server.stop()
        if cluster is not None:
            cluster.stop()
    checks = audit_run(workdir, state, int(doc["accounts"]), connections, ending)
    code = report_tables(console, checks, [])
    console.print(f"ledger: {where}")
    return code


def _named_server(kept: str | None, given: str | None, option: str, workdir: Path) -> str:
    """The URL or DSN to read a run's ledger from: the one given again, else the one
    ``run.json`` kept, unless that one's password was masked (SystemExit, naming the
    option that gives it)."""
    if given is not None:
        return given
    if kept and passwords_in(kept):
        raise SystemExit(
            f"{workdir / MANIFEST} keeps the ledger's server as {kept}, its password masked:"
            f" give it again with {option}"
        )
    return kept or ""
