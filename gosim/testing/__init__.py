"""Testing gosim programs: find the schedule that breaks one, and replay it; check a
history for linearizability.

:func:`explore` runs a program under many schedules (PCT or a random walk over the
runnable goroutines, and simulated network faults) until one fails, shrinks that run to
a small :class:`Plan` and reports one replay line; :func:`replay` runs a plan again;
:func:`check` and :func:`explored` are the forms for tests. ``python -m gosim.testing
replay module:function PLAN`` replays from a shell. See the guide "Find the schedule
that breaks it" and the modules' docstrings (``_explore``, ``_pct``, ``_shrink``,
``_plan``). :func:`check_no_leaks` fails a test whose goroutines outlive it, with a
:class:`GoroutineLeak` that lists them (``_leaks``, Go's ``goleak``).

A linearizability checker: :func:`check_linearizability` decides whether a history of
operations (:class:`Operation`, recorded with :class:`HistoryRecorder`) fits a
sequential :class:`Model`, and shrinks a failure to a small counterexample
(:class:`LinearizabilityResult`). The algorithm is Wing and Gong's search with
P-compositionality and memoised states, as Porcupine runs it (``_linearizability``; the
guide "Checking histories for linearizability").

This file only imports.
"""

from ._explore import Exploration as Exploration
from ._explore import Failure as Failure
from ._explore import Found as Found
from ._explore import InvariantFailed as InvariantFailed
from ._explore import ScheduleFailure as ScheduleFailure
from ._explore import check as check
from ._explore import explore as explore
from ._explore import explored as explored
from ._explore import replay as replay
from ._explore import replay_line as replay_line
from ._explore import run_plan as run_plan
from ._leaks import GoroutineLeak as GoroutineLeak
from ._leaks import check_no_leaks as check_no_leaks
from ._linearizability import UNKNOWN as UNKNOWN
from ._linearizability import HistoryError as HistoryError
from ._linearizability import HistoryRecorder as HistoryRecorder
from ._linearizability import LinearizabilityResult as LinearizabilityResult
from ._linearizability import Model as Model
from ._linearizability import Operation as Operation
from ._linearizability import Unknown as Unknown
from ._linearizability import check_linearizability as check_linearizability
from ._plan import Plan as Plan

__all__ = [
    "UNKNOWN",
    "Exploration",
    "Failure",
    "Found",
    "GoroutineLeak",
    "HistoryError",
    "HistoryRecorder",
    "InvariantFailed",
    "LinearizabilityResult",
    "Model",
    "Operation",
    "Plan",
    "ScheduleFailure",
    "Unknown",
    "check",
    "check_linearizability",
    "check_no_leaks",
    "explore",
    "explored",
    "replay",
    "replay_line",
    "run_plan",
]
