"""gosim.testing: tools for testing concurrent programs.

A linearizability checker: :func:`check_linearizability` decides whether a history of
operations (:class:`Operation`, recorded with :class:`HistoryRecorder`) fits a
sequential :class:`Model`, and shrinks a failure to a small counterexample
(:class:`LinearizabilityResult`). The algorithm is Wing and Gong's search with
P-compositionality and memoised states, as Porcupine runs it.
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
