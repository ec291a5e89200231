"""The loader of idempotency's C accelerator, ``idempotency._speedups``, or None.

It holds twins of the per-call steps of ``Idempotency.run``: the record table's
``claim`` and ``complete`` (``_record``), ``fingerprint`` (``_keys``), MemoryStore's
table (``stores.memory``), the group commit's ``Op`` and the batched stores'
``claim_later``, ``complete_later`` and ``claim_and_complete_later`` (``stores._batch``),
SQLiteStore's record work of a batch and its held claims (``stores.sqlite``), the RPC
server's parse of a request (``rpc._protocol``), and the twins of a keyed call
(``_idempotency.KeyedCall``) and of the RPC server's keyed call
(``rpc._dispatch.RPCCall``): subclasses with their common case in C.

Each module chooses once, when it imports, whether its twins stand in, hands them what
they need and binds them where its Python definitions are (never by patching a class
afterwards); the Python code stays the reference, which the C code calls for every case
it does not cover. The choices cannot move here: they need each module's own classes and
functions, whose modules import this one.
``GOSIM_PURE_PYTHON=1`` (the switch gosim's and netframe's accelerators obey) leaves it
out, as does a build without a compiler.
"""

from __future__ import annotations

import importlib
import os
from typing import Any, Final

__all__ = ["C_ENABLED", "speedups"]

speedups: Any = None
if os.environ.get("GOSIM_PURE_PYTHON", "") in ("", "0"):
    try:
        speedups = importlib.import_module("idempotency._speedups")
    except ImportError:  # not built: the Python reference runs
        speedups = None

#: Whether the C accelerator is in use in this process.
C_ENABLED: Final = speedups is not None
