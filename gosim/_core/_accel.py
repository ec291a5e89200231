"""The optional C accelerator, ``gosim._speedups``, or None.

The C module implements the hot paths (channel operations, the driver's inner loop,
the arming and disarming of runtime timers, the G, P, timer and runtime records) with
the same behaviour as the pure-Python code, which is
the reference and the fallback, as msgpack ships ``fallback.py``. It is None when the
extension was not built (no compiler at install time) or when the environment sets
``GOSIM_PURE_PYTHON=1``; the test suite runs both ways in CI.
"""

from __future__ import annotations

import importlib
import os
from typing import Any

speedups: Any = None
if os.environ.get("GOSIM_PURE_PYTHON", "") in ("", "0"):
    try:
        speedups = importlib.import_module("gosim._speedups")
    except ImportError:  # not built: the pure-Python code runs
        speedups = None

__all__ = ["speedups"]
