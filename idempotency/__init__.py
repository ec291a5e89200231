"""idempotency: idempotency keys, durable key stores and an idempotency-keyed msgpack RPC.

Built on :mod:`netframe` and :mod:`gosim`. The keys, stores, RPC and the demo service
arrive with their issue; this package is importable so the layering is fixed from the
first commit.
"""
