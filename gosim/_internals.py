"""The runtime's records and traps, for gosim's own packages (not a public door).

Channels, ``select``, ``time``, ``context``, ``net``, ``signal``, ``sync`` and
``testing`` implement the runtime's own mechanisms, as Go's ``chan.go``, ``select.go``
and ``netpoll.go`` do inside the runtime package: they read the running runtime's
fields (:data:`state` ``.rt``; on it ``rt.curg`` is the running G, ``rt.goready(g,
value)`` readies a G without :func:`gosim.lowlevel.ready`'s frame and
``rt.globready(g, value)`` readies it at the tail of the global queue, for a netpoller's
``poll(to_global=True)``), yield the driver's traps (:func:`trap` with :data:`PARK`,
:data:`GOSCHED`, :data:`PREEMPT`), keep the pure-Python channels' preemption countdown
(:data:`OP_BUDGET`, :func:`set_op_budget_refill`) and pick the C accelerator
(:data:`speedups`, or None), because a function call per channel operation would cost
more than the operation. They take all of that from here, and everything else from
:mod:`gosim.lowlevel`.

This module is private to the ``gosim`` package: netframe, idempotency and user code
may not import it (``tests/gosim/test_layering.py`` checks it). What they build on the
scheduler, they build on :mod:`gosim.lowlevel`, which hands out functions and the
waiting primitives only, as ``trio.lowlevel`` hands out functions and ``ParkingLot``
and never its Runner.
"""

from __future__ import annotations

from gosim._core._accel import speedups as speedups
from gosim._core._g import G as G
from gosim._core._g import Sudog as Sudog
from gosim._core._netpoll import NetPoller as NetPoller
from gosim._core._runtime import Runtime as Runtime
from gosim._core._runtime import RuntimeHandle as RuntimeHandle
from gosim._core._signal import SignalQueue as SignalQueue
from gosim._core._state import GOSCHED as GOSCHED
from gosim._core._state import OP_BUDGET as OP_BUDGET
from gosim._core._state import PARK as PARK
from gosim._core._state import PREEMPT as PREEMPT
from gosim._core._state import _state as state
from gosim._core._state import _trap as trap
from gosim._core._state import current_runtime
from gosim._core._state import set_op_budget_refill as set_op_budget_refill
from gosim._core._stats import SchedStatistics as SchedStatistics
from gosim._core._trace import Trace as Trace


def goroutines() -> list[G]:
    """The running runtime's live goroutines (Go's ``allgs``), in goid order: a
    snapshot, for checks and dumps (``gosim.testing.check_no_leaks``)."""
    allg = current_runtime().allg
    return [allg[goid] for goid in sorted(allg)]


def signal_queue() -> SignalQueue:
    """The running runtime's signal queue (Go's ``sigqueue``: its OS handlers and the
    signals caught and not yet relayed), on which ``gosim.signal`` is built."""
    return current_runtime().signals


__all__ = [
    "GOSCHED",
    "OP_BUDGET",
    "PARK",
    "PREEMPT",
    "G",
    "NetPoller",
    "Runtime",
    "RuntimeHandle",
    "SchedStatistics",
    "SignalQueue",
    "Sudog",
    "Trace",
    "goroutines",
    "set_op_budget_refill",
    "signal_queue",
    "speedups",
    "state",
    "trap",
]
