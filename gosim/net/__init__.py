"""gosim.net: Go's ``net`` package for goroutines, on the runtime's netpoller.

``listen("tcp", "127.0.0.1:0")`` and ``await dial("tcp", addr)`` give a
:class:`Listener` and :class:`Conn` whose operations park the goroutine (``IO wait``)
while the runtime's epoll waits, with no trio task per connection; ``"unix"`` takes a
socket path; ``"sim"`` is the seeded in-memory network of deterministic mode
(``_sim``). ``Conn.syscall_conn()`` gives a :class:`RawConn` (Go's ``syscall.RawConn``)
for your own non-blocking system calls with the netpoller's waits between them;
``file_conn(fd)`` (Go's ``net.FileConn``) puts a socket opened elsewhere (a database
driver's) on the netpoller, over a duplicate of its descriptor. See
``_net`` for the error taxonomy and ``_poll`` for the netpoller.
"""

from ._net import AddrError as AddrError
from ._net import BrokenError as BrokenError
from ._net import BusyError as BusyError
from ._net import ClosedError as ClosedError
from ._net import Conn as Conn
from ._net import DeadlineExceeded as DeadlineExceeded
from ._net import Listener as Listener
from ._net import RawConn as RawConn
from ._net import dial as _dial_socket
from ._net import file_conn as file_conn
from ._net import listen as _listen_socket
from ._sim import SimConn as SimConn
from ._sim import SimListener as SimListener
from ._sim import SimNetwork as SimNetwork
from ._sim import sim_dial as _sim_dial
from ._sim import sim_listen as _sim_listen
from ._sim import sim_network as sim_network
from ._sim import use_sim_network as use_sim_network


def listen(network: str, address: str, *, reuse_port: bool = False) -> Listener | SimListener:
    """Listen on ``address``: ``"tcp"`` (``"127.0.0.1:0"`` picks a port), ``"unix"``
    (a path) or ``"sim"`` (``"host:port"`` on the runtime's simulated network).
    ``reuse_port``: ``SO_REUSEPORT`` on a TCP listener (processes share the port)."""
    if network == "sim":
        return _sim_listen(address)
    return _listen_socket(network, address, reuse_port=reuse_port)


async def dial(
    network: str, address: str, timeout: float | None = None, *, local_host: str = "client"
) -> Conn | SimConn:
    """Connect to ``address``; ``local_host`` names the dialing host on the ``"sim"`` network."""
    if network == "sim":
        return await _sim_dial(address, timeout, local_host)
    return await _dial_socket(network, address, timeout)


__all__ = [
    "AddrError",
    "BrokenError",
    "BusyError",
    "ClosedError",
    "Conn",
    "DeadlineExceeded",
    "Listener",
    "RawConn",
    "SimConn",
    "SimListener",
    "SimNetwork",
    "dial",
    "file_conn",
    "listen",
    "sim_network",
    "use_sim_network",
]

for _name in __all__:
    _obj = globals()[_name]
    if isinstance(_obj, type) or callable(_obj):
        try:
            _obj.__module__ = "gosim.net"
        except (AttributeError, TypeError):
            pass
