"""The long-connection demo: a ledger whose transfers are idempotent RPC calls.

``python -m idempotency.demo`` starts a ledger server (SQLite, durable), a fault
injector and client processes holding long connections, runs transfers among the
accounts while the injector drops connections mid-call, loses replies after the server
committed, duplicates requests and stalls connections past their heartbeats, kills the
server with SIGKILL and restarts it on the same file, then audits the ledger: balances
conserved, every acknowledged transfer applied exactly once, nothing applied that no
client asked for, and no more refusals than the workload explains. It exits 0 only when
every check holds; ``audit DIR`` audits a kept run's directory again.

``--store redis`` keeps the ledger in Redis (a redis-server started for the run unless
``--redis URL``), ``--store postgres`` in PostgreSQL (a cluster made for the run unless
``--postgres DSN``; the fault plan also terminates a server's backend mid-transaction),
``--servers N`` runs N servers on one port (SO_REUSEPORT) sharing either, and
``--simulate`` runs the whole system in one process on gosim's simulated network in
virtual time, one seed giving one report byte for byte.

Modules: ``_ledger`` (the service, in SQLite, Redis, PostgreSQL or memory), ``_proxy`` (the fault
injector), ``_clients`` (a client process), ``_run`` (the conductor), ``_audit`` (the
audit), ``_sim`` (the simulated run).
"""
