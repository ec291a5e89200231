"""gosim.testing: tools for testing concurrent programs.

The linearizability checker: see :mod:`gosim.testing._linearizability` for the
algorithm and :func:`check_linearizability` for what a result guarantees.
"""

from ._linearizability import UNKNOWN as UNKNOWN
from ._linearizability import HistoryError as HistoryError
from ._linearizability import HistoryRecorder as HistoryRecorder
from ._linearizability import LinearizabilityResult as LinearizabilityResult
from ._linearizability import Model as Model
from ._linearizability import Operation as Operation
from ._linearizability import Unknown as Unknown
from ._linearizability import check_linearizability as check_linearizability

__all__ = [
    "UNKNOWN",
    "HistoryError",
    "HistoryRecorder",
    "LinearizabilityResult",
    "Model",
    "Operation",
    "Unknown",
    "check_linearizability",
]
