"""netframe: length-prefixed framing over byte streams, and long-connection servers.

General layout: ``_codec`` (frame formats, the decoder and encoder), ``_buffer`` (the
offset buffer under the decoder) and ``_exceptions`` (framing errors) are sans-IO: they
import neither trio nor gosim, so they can be driven by any I/O, tested byte by byte,
and reused by ``idempotency.rpc``. ``_kernels`` holds the numba frame-boundary scan.
The connection layer (``FramedConn``, ``Server``, client) builds on them and on
:mod:`gosim`. ``_accel`` loads the C accelerator (``_speedups``, whose sans-IO, I/O
and server parts are kept in separate files) for all of them, or not
(``GOSIM_PURE_PYTHON=1``). This file only re-exports.

Quick use::

    import netframe

    fmt = netframe.FrameFormat()                 # 4-byte big-endian length, 16 MiB max
    wire = fmt.encode_many([b"hello", b"world"])
    decoder = netframe.FrameDecoder(fmt)
    decoder.feed(wire[:7]); decoder.feed(wire[7:])
    assert list(decoder) == [b"hello", b"world"]
    assert decoder.next_frame() is netframe.NEED_DATA

Security
--------
A length prefix is a promise made by the peer, and a hostile peer promises a lot:

* **Every format has a maximum frame length**, ``max_frame_length``, defaulting to
  :data:`DEFAULT_MAX_FRAME_LENGTH` (16 MiB). Raise it only for peers you trust, and
  size it to the largest message your protocol really sends: one connection can make
  the process hold about that much.
* **The limit is enforced before buffering.** The decoder checks the announced length
  as soon as the header is complete, from the header alone, and raises
  :class:`FrameTooLarge` (saying the announced and the allowed length). It never
  pre-allocates an announced body and never waits for one, so a header announcing
  2 GiB (or ``2**64 - 1`` with an 8-byte prefix) costs a few bytes, not 2 GiB. Checking
  after buffering would let a peer fill memory up to the limit of its patience.
* **A uvarint prefix is at most 10 bytes** and must fit 64 bits (Go's
  ``binary.Uvarint`` rules): an endless run of continuation bytes is refused at the
  tenth byte, not read forever.
* **No input is quadratic.** The receive buffer is O(n) in the worst case whatever the
  split the peer chooses (one byte per segment included), and waiting for a body does
  not rescan the buffer (see ``netframe._buffer``).
* **Errors are final for the stream.** A :class:`RemoteFrameError` means framing is
  lost: close the connection. The decoder stays unchanged and raises the same error if
  asked again, so no retry loop can make it skip or misread bytes.
"""

import importlib
from typing import TYPE_CHECKING, Any

from ._buffer import OffsetBuffer as OffsetBuffer
from ._codec import DEFAULT_MAX_FRAME_LENGTH as DEFAULT_MAX_FRAME_LENGTH
from ._codec import NEED_DATA as NEED_DATA
from ._codec import DecoderStatistics as DecoderStatistics
from ._codec import FrameDecoder as FrameDecoder
from ._codec import FrameFormat as FrameFormat
from ._codec import NeedData as NeedData
from ._codec import load_kernel as load_kernel
from ._exceptions import FrameError as FrameError
from ._exceptions import FrameTooLarge as FrameTooLarge
from ._exceptions import LocalFrameError as LocalFrameError
from ._exceptions import PayloadTooLarge as PayloadTooLarge
from ._exceptions import RemoteFrameError as RemoteFrameError
from ._msgpack import MAX_DEPTH as MAX_MSGPACK_DEPTH
from ._msgpack import MsgpackCutter as MsgpackCutter
from ._msgpack import PyMsgpackCutter as PyMsgpackCutter
from ._session import CLOSED as CLOSED
from ._session import GOAWAY_BOTH as GOAWAY_BOTH
from ._session import GOAWAY_RECEIVED as GOAWAY_RECEIVED
from ._session import GOAWAY_SENT as GOAWAY_SENT
from ._session import OPEN as OPEN
from ._session import Data as Data
from ._session import GoAway as GoAway
from ._session import GoAwayCode as GoAwayCode
from ._session import Kind as Kind
from ._session import LocalSessionError as LocalSessionError
from ._session import Ping as Ping
from ._session import Pong as Pong
from ._session import RemoteSessionError as RemoteSessionError
from ._session import Session as Session
from ._session import SessionState as SessionState

__all__ = [
    "CLOSED",
    "DEFAULT_MAX_FRAME_LENGTH",
    "DEFAULT_MAX_OWED_BYTES",
    "DEFAULT_READ_TIMEOUT",
    "DEFAULT_WRITE_TIMEOUT",
    "GOAWAY_BOTH",
    "GOAWAY_RECEIVED",
    "GOAWAY_SENT",
    "MAX_MSGPACK_DEPTH",
    "NEED_DATA",
    "OPEN",
    "BusyError",
    "Client",
    "ClosedError",
    "ConnectionLost",
    "Data",
    "DecoderStatistics",
    "FrameDecoder",
    "FrameError",
    "FrameFormat",
    "FrameTooLarge",
    "FramedConn",
    "FramedConnStatistics",
    "GoAway",
    "GoAwayCode",
    "IncompleteFrame",
    "Kind",
    "Later",
    "Listener",
    "LocalFrameError",
    "LocalSessionError",
    "MsgpackCutter",
    "NeedData",
    "OffsetBuffer",
    "PayloadTooLarge",
    "Ping",
    "Pong",
    "PyMsgpackCutter",
    "RemoteFrameError",
    "RemoteSessionError",
    "Server",
    "ServerStatistics",
    "Session",
    "SessionState",
    "StreamConn",
    "default_max_connections",
    "load_kernel",
]


# The connection layer imports gosim (and so trio); the sans-IO codec and session must
# not. Its names load on first use, so `import netframe` stays sans-IO.
_CONN_NAMES = {
    "BusyError": "_conn",
    "ClosedError": "_conn",
    "FramedConn": "_conn",
    "FramedConnStatistics": "_conn",
    "IncompleteFrame": "_conn",
    "StreamConn": "_conn",
    "Client": "_client",
    "ConnectionLost": "_client",
    "DEFAULT_MAX_OWED_BYTES": "_server",
    "DEFAULT_READ_TIMEOUT": "_server",
    "DEFAULT_WRITE_TIMEOUT": "_server",
    "Later": "_server",
    "Listener": "_server",
    "Server": "_server",
    "ServerStatistics": "_server",
    "default_max_connections": "_server",
}

if TYPE_CHECKING:
    from ._client import Client as Client
    from ._client import ConnectionLost as ConnectionLost
    from ._conn import BusyError as BusyError
    from ._conn import ClosedError as ClosedError
    from ._conn import FramedConn as FramedConn
    from ._conn import FramedConnStatistics as FramedConnStatistics
    from ._conn import IncompleteFrame as IncompleteFrame
    from ._conn import StreamConn as StreamConn
    from ._server import DEFAULT_MAX_OWED_BYTES as DEFAULT_MAX_OWED_BYTES
    from ._server import DEFAULT_READ_TIMEOUT as DEFAULT_READ_TIMEOUT
    from ._server import DEFAULT_WRITE_TIMEOUT as DEFAULT_WRITE_TIMEOUT
    from ._server import Later as Later
    from ._server import Listener as Listener
    from ._server import Server as Server
    from ._server import ServerStatistics as ServerStatistics
    from ._server import default_max_connections as default_max_connections


def __getattr__(name: str) -> Any:
    if name in _CONN_NAMES:
        module = importlib.import_module(f"netframe.{_CONN_NAMES[name]}")
        obj = getattr(module, name)
        if isinstance(obj, type):
            obj.__module__ = "netframe"
        globals()[name] = obj
        return obj
    raise AttributeError(f"module 'netframe' has no attribute {name!r}")


_IMMUTABLE_TYPE = 1 << 8  # Py_TPFLAGS_IMMUTABLETYPE


def _fixup_module_metadata() -> None:
    # Tracebacks and reprs say netframe.FrameDecoder, not netframe._codec.FrameDecoder.
    for name in __all__:
        if name in _CONN_NAMES:
            continue
        obj = globals()[name]
        if (
            isinstance(obj, type)
            and obj.__module__.startswith("netframe._")
            and not obj.__flags__ & _IMMUTABLE_TYPE  # a C type keeps the name it was built with
        ):
            obj.__module__ = "netframe"


_fixup_module_metadata()
del _fixup_module_metadata
