"""netframe's door for a transport built above it on its C loop, as ``gosim.lowlevel``
is gosim's: the frameless mode of the C ``Exchange`` (receive, cut, call the handler,
send the replies, in one C call per wake) and the states in which it hands a
connection back to its Python reader.

The one user is ``idempotency.rpc``'s plain msgpack stream (``StreamLink``), whose
Python reader is the loop's twin and its general path; netframe/_speedups_server.c.h
says what the loop does in each state.
"""

from __future__ import annotations

from typing import Any

from netframe._conn import (
    EXCHANGE_CLOSED,
    EXCHANGE_OWED,
    EXCHANGE_PENDING,
    EXCHANGE_READER,
    EXCHANGE_WRITE_GENERAL,
    EXCHANGE_WRITE_HANDOFF,
    _Exchange,
)

__all__ = [
    "EXCHANGE_CLOSED",
    "EXCHANGE_OWED",
    "EXCHANGE_PENDING",
    "EXCHANGE_READER",
    "EXCHANGE_WRITE_GENERAL",
    "EXCHANGE_WRITE_HANDOFF",
    "message_exchange",
]


def message_exchange(cutter: Any, handler: Any, owner: Any, max_owed: int | None) -> Any:
    """The C loop for a stream of whole messages cut by ``cutter`` (a C
    :class:`~netframe.MsgpackCutter`), or None where netframe's accelerator is not in
    use (the caller's Python reader then serves the connection alone).

    Each message goes to ``handler(message)`` in order; results that are bytes are the
    replies, sent as they are (no frame header), those of one receive with one send.
    ``owner`` is the connection's reader state: ``owner._owed`` (bytes owed and not yet
    written) and ``owner._handed`` (items queued for its writer; no send from the loop
    while it is not 0). With ``max_owed`` no message is taken while more is owed. Run it
    with ``gosim.net.RawConn.read(exchange)``; it stops with ``exchange.state`` one of
    this module's states, and the caller deals with it and runs it again (or reads on
    in Python after :data:`EXCHANGE_READER`).
    """
    if _Exchange is None:
        return None
    return _Exchange(cutter, None, handler, owner, -1 if max_owed is None else max_owed)
