"""gosim.net: Go's ``net`` package for goroutines, on the runtime's netpoller.

``listen("tcp", "127.0.0.1:0")`` and ``await dial("tcp", addr)`` give a
:class:`Listener` and :class:`Conn` whose operations park the goroutine (``IO wait``)
while the runtime's epoll waits, with no trio task per connection; ``"unix"`` takes a
socket path. See ``_net`` for the error taxonomy and ``_poll`` for the netpoller.
"""

from ._net import AddrError as AddrError
from ._net import BrokenError as BrokenError
from ._net import BusyError as BusyError
from ._net import ClosedError as ClosedError
from ._net import Conn as Conn
from ._net import DeadlineExceeded as DeadlineExceeded
from ._net import Listener as Listener
from ._net import dial as dial
from ._net import listen as listen

__all__ = [
    "AddrError",
    "BrokenError",
    "BusyError",
    "ClosedError",
    "Conn",
    "DeadlineExceeded",
    "Listener",
    "dial",
    "listen",
]

for _name in __all__:
    _obj = globals()[_name]
    if isinstance(_obj, type) or callable(_obj):
        try:
            _obj.__module__ = "gosim.net"
        except (AttributeError, TypeError):
            pass
