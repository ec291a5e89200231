"""The loader of netframe's C accelerator, ``netframe._speedups``, for every module.

``speedups`` is the extension module, or None when it is not built or when
``GOSIM_PURE_PYTHON=1`` asks for the pure-Python reference (the switch gosim's own
accelerator obeys, so one variable selects the path of the whole stack). Each caller
takes the parts it needs from here, and keeps the Python twin of each:

* the sans-IO part (``cut_frames``, ``encode_fixed``: ``netframe/_speedups_codec.c.h``)
  serves ``_codec``; it does no I/O, like the codec itself;
* the I/O part (``netframe/_speedups_io.c.h``) serves ``_conn``: ``FrameWriter``, the twin
  of ``_conn.PyFrameWriter`` (encode frames and send them on a socket, one call), and
  ``FrameReader`` (receive and cut frames, one call), which has no twin: without it
  ``FramedConn`` receives on gosim.net and cuts with the codec's decoder;
* the server part (``netframe/_speedups_server.c.h``): ``handle_each`` and
  ``drop_none`` serve the server's handler loop (``_handlers``); ``Exchange`` (a connection's whole
  receive-handle-send in one C call per wake, raw or session mode or a client's reader,
  with the ``EXCHANGE_*`` reasons it stops for) and ``send_data`` (one session DATA
  frame sent at once, ``FramedConn._send_through``'s twin; ``set_closed_state`` hands
  both the session state that may not send) serve ``_conn``'s ``FramedConn``.

Importing this module imports neither gosim nor trio: the codec stays sans-IO.
"""

from __future__ import annotations

import importlib
import os
from typing import Any, Final

__all__ = ["C_ENABLED", "speedups"]

speedups: Any = None
if os.environ.get("GOSIM_PURE_PYTHON", "") in ("", "0"):
    try:
        speedups = importlib.import_module("netframe._speedups")
    except ImportError:  # not built (an sdist without a compiler): the reference serves
        speedups = None

#: Whether the C accelerator is in use in this process.
C_ENABLED: Final = speedups is not None
