"""Go's ``net`` package on the netpoller: ``listen``, ``dial``, ``Listener``, ``Conn``.

Each operation tries the non-blocking system call first and parks the goroutine on the
socket's poll descriptor only on ``EAGAIN`` (see ``_poll``). Reads return what the
kernel has (up to ``n`` bytes), as Go's ``Read`` does; ``write`` writes everything or
raises, as Go's ``Write`` does.

Errors, in trio's taxonomy and Go's words:

* :class:`ClosedError` (``use of closed network connection``): *you* closed it, or
  another goroutine of yours did while this one waited.
* :class:`BrokenError` (a ``ConnectionError``): the peer or the network failed (reset,
  broken pipe, early end of stream in ``read_exactly``).
* :class:`BusyError`: two goroutines read (or write) one connection at once.
* :class:`DeadlineExceeded` (``i/o timeout``, a ``TimeoutError`` with ``timeout()``
  returning True, like Go's ``net.Error``): a deadline set on the connection passed.
  Deadlines are absolute times on the runtime clock (``gosim.now()``); 0 or None clears.
  A write that times out may have sent part of its data: ``written`` says how many
  bytes went out (Go's ``Write`` returns that count with the error), so a caller
  knows where the stream stands.
* :class:`AddrError` (a ``ValueError``): an address that cannot be parsed.
"""

from __future__ import annotations

import errno
import os
import socket
from collections.abc import Callable, Sequence
from typing import Any, NoReturn, Protocol

from gosim import lowlevel

from ._poll import CLOSED, TIMEOUT, PollDesc, netpoller

__all__ = [
    "AddrError",
    "BrokenError",
    "BusyError",
    "ClosedError",
    "Conn",
    "DeadlineExceeded",
    "Listener",
    "RawConn",
    "dial",
    "file_conn",
    "listen",
]

_BACKLOG = 4096
try:
    _IOV_MAX = max(16, min(os.sysconf("SC_IOV_MAX"), 1024))
except (ValueError, OSError):  # not reported: POSIX's minimum guarantee
    _IOV_MAX = 16


class ClosedError(OSError):
    """``use of closed network connection``: the socket was closed by this side.

    The base of every "this side closed it" error of the layers above (netframe's
    ``ClosedError``), which may say what was closed in ``message``; ``errno`` is EBADF.
    """

    def __init__(self, message: str = "use of closed network connection") -> None:
        super().__init__(errno.EBADF, message)


class BrokenError(ConnectionError):
    """The peer or the network broke the connection (reset, broken pipe, early EOF)."""


class BusyError(RuntimeError):
    """Two goroutines used one side of a connection (or one listener) at once."""


class DeadlineExceeded(TimeoutError):
    """``i/o timeout``: the operation's deadline passed. ``timeout()`` is True (Go's net.Error).

    ``written``: for a write (``Conn.write``, ``Conn.write_buffers``), the bytes sent
    before the deadline passed, 0 to all but one less than asked; 0 for other operations.
    """

    def __init__(self, written: int = 0) -> None:
        super().__init__(errno.ETIMEDOUT, "i/o timeout")
        self.written = written

    def timeout(self) -> bool:
        """True: Go's ``net.Error.Timeout()`` for a deadline that passed."""
        return True


class AddrError(ValueError):
    """An address that does not parse for the network (Go's ``net.AddrError``)."""


def _family_and_address(network: str, address: str) -> tuple[socket.AddressFamily, Any]:
    if network == "unix":
        if not address:
            raise AddrError("unix: missing socket path")
        return socket.AF_UNIX, address
    if network not in ("tcp", "tcp4", "tcp6"):
        raise AddrError(f"unknown network {network!r} (use tcp, tcp4, tcp6 or unix)")
    host, sep, port_s = address.rpartition(":")
    if not sep:
        raise AddrError(f"address {address}: missing port in address")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        port = int(port_s)
    except ValueError:
        raise AddrError(f"address {address}: invalid port") from None
    if not 0 <= port <= 65535:
        raise AddrError(f"address {address}: invalid port")
    if network == "tcp6" or (":" in host and network == "tcp"):
        return socket.AF_INET6, (host or "::", port)
    return socket.AF_INET, (host or "0.0.0.0", port)


def _format_addr(addr: Any) -> str:
    if isinstance(addr, tuple):
        host, port = addr[0], addr[1]
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return str(addr)


class _Reader(Protocol):
    async def read(self, n: int) -> bytes: ...


async def read_full(conn: _Reader, n: int) -> bytes:
    """Go's ``io.ReadFull``: exactly ``n`` bytes from ``conn``, reading as often as needed.

    Raises :class:`BrokenError` if the stream ends first (shared by every gosim.net
    connection type).
    """
    parts: list[bytes] = []
    got = 0
    while got < n:
        chunk = await conn.read(n - got)
        if not chunk:
            raise BrokenError(f"unexpected EOF: {got} of {n} bytes read")
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)


class Conn:
    """A connected stream socket owned by the runtime; see the module docstring."""

    __slots__ = ("_closed", "_drained", "_pd", "_reading", "_sock", "_writing", "network")

    def __init__(self, sock: socket.socket, network: str) -> None:
        sock.setblocking(False)
        self._sock = sock
        self.network = network
        self._pd: PollDesc = netpoller().register(sock.fileno())
        self._pd.owner = sock
        self._closed = False
        self._drained = False
        self._reading = False
        self._writing = False

    def __repr__(self) -> str:
        state = " closed" if self._closed else ""
        return f"<gosim.net.Conn {self.network}{state}>"

    def fileno(self) -> int:
        """The socket's file descriptor (the runtime owns it: do not close it)."""
        return self._sock.fileno()

    def syscall_conn(self) -> RawConn:
        """Go's ``SyscallConn``: raw access to the socket, with the netpoller's waits."""
        if self._closed:
            raise ClosedError()
        return RawConn(self)

    async def read(self, n: int = 65536) -> bytes:
        """Up to ``n`` bytes as soon as some are available; ``b""`` at end of stream."""
        data: bytes = await self._read(self._sock.recv, n, n)
        return data

    async def read_into(self, buffer: bytearray | memoryview) -> int:
        """Go's ``Read(p)``: receive into ``buffer`` as soon as bytes are available;
        return how many (0 at end of stream, or for an empty buffer). No copy: for
        readers that know where a large message must end up."""
        with memoryview(buffer) as view:
            size = view.nbytes
            if not size:
                if self._closed:
                    raise ClosedError()
                return 0
            count: int = await self._read(self._sock.recv_into, view, size)
        return count

    async def _read(self, receive: Any, arg: Any, size: int) -> Any:
        if self._closed:
            raise ClosedError()
        if self._reading:
            raise BusyError("another goroutine is already reading this connection")
        self._reading = True
        try:
            if self._drained:
                # The last read came back short: the kernel's queue was empty then, and
                # any byte that arrived since has raised an edge (READY, or it will
                # wake the park). Wait first instead of a recv doomed to EAGAIN, unless
                # the peer's end of stream (or an error) was seen: it may have come in
                # the same edge as the data, and waiting for another would hang.
                self._drained = False
                if not self._pd.hangup:
                    await self._wait("r")
            while True:
                try:
                    result = receive(arg)
                    got = result if type(result) is int else len(result)
                    if 0 < got < size:
                        self._drained = True
                    return result
                except BlockingIOError:
                    pass
                except OSError as exc:
                    raise self._failed("read", exc) from None
                await self._wait("r")
        finally:
            self._reading = False

    async def read_exactly(self, n: int) -> bytes:
        """Exactly ``n`` bytes; :class:`BrokenError` if the stream ends first (``io.ReadFull``)."""
        return await read_full(self, n)

    async def write(self, data: bytes | bytearray | memoryview) -> int:
        """Write all of ``data``; return its length. Raises rather than returning a short
        count; a :class:`DeadlineExceeded` says in ``written`` how much went out first."""
        if self._closed:
            raise ClosedError()
        if self._writing:
            raise BusyError("another goroutine is already writing this connection")
        self._writing = True
        try:
            sent = 0
            if type(data) is bytes:
                # The common case first: one send of the whole object, no view.
                sent = self._send_once(self._sock.send, data)
                if sent == len(data):
                    return sent
            view = memoryview(data).cast("B")
            try:
                total = len(view)
                while sent < total:
                    n = self._send_once(self._sock.send, view[sent:])
                    if n:
                        sent += n
                    else:
                        await self._wait("w")
                return total
            except DeadlineExceeded as exc:
                exc.written = sent
                raise
            finally:
                view.release()
        finally:
            self._writing = False

    async def write_buffers(self, buffers: Sequence[bytes | bytearray | memoryview]) -> int:
        """Write every buffer, in order, with as few system calls as the kernel allows
        (``sendmsg``, gathering up to IOV_MAX buffers a call: Go's ``net.Buffers``);
        return the bytes written. Nothing is copied in user space, which is what large
        payloads want. Raises rather than returning a short count, as :meth:`write`
        does (with ``written`` on a :class:`DeadlineExceeded`).
        """
        if self._closed:
            raise ClosedError()
        if self._writing:
            raise BusyError("another goroutine is already writing this connection")
        self._writing = True
        views = [memoryview(b).cast("B") for b in buffers]
        try:
            pending = [v for v in views if v.nbytes]
            total = sum(v.nbytes for v in pending)
            first = 0
            sent = 0
            while first < len(pending):
                n = self._send_once(self._sock.sendmsg, pending[first : first + _IOV_MAX])
                if not n:
                    try:
                        await self._wait("w")
                    except DeadlineExceeded as exc:
                        exc.written = sent
                        raise
                    continue
                sent += n
                while n:  # drop what went out; the partly sent buffer keeps its tail
                    head = pending[first]
                    if n >= head.nbytes:
                        n -= head.nbytes
                        first += 1
                    else:
                        pending[first] = head[n:]
                        n = 0
            return total
        finally:
            self._writing = False
            for v in views:
                v.release()

    def _send_once(self, send: Any, data: Any) -> int:
        """One ``send`` or ``sendmsg``: bytes sent, 0 when the socket buffer is full."""
        try:
            sent: int = send(data)
        except BlockingIOError:
            return 0
        except OSError as exc:
            raise self._failed("write", exc) from None
        return sent

    def _failed(self, op: str, exc: OSError) -> OSError:
        """What a failed read or write raises: the peer's doing (reset, broken pipe) is
        a BrokenError, a socket this side closed meanwhile a ClosedError, the rest as is."""
        if isinstance(exc, (ConnectionResetError, ConnectionAbortedError, BrokenPipeError)):
            return BrokenError(exc.errno, f"{op}: {exc.strerror}")
        if self._closed:
            return ClosedError()
        return exc

    async def _wait(self, mode: str) -> None:
        why = await self._pd.wait(mode)
        if why is not None or self._closed:
            self._raise_wait(why)

    def _raise_wait(self, why: str | None) -> NoReturn:
        """A wait ended by a deadline (``i/o timeout``) or by close."""
        if why is TIMEOUT:
            raise DeadlineExceeded()
        raise ClosedError()

    def close(self) -> None:
        """Close the connection; goroutines waiting on it get :class:`ClosedError`."""
        if self._closed:
            return
        self._closed = True
        self._pd.close()
        self._sock.close()

    def close_write(self) -> None:
        """Half-close: the peer reads end of stream; this side can still read."""
        if self._closed:
            raise ClosedError()
        try:
            self._sock.shutdown(socket.SHUT_WR)
        except OSError as exc:
            raise BrokenError(exc.errno, f"shutdown: {exc.strerror}") from None

    def set_deadline(self, t: float | None) -> None:
        """Deadline for reads and writes: an absolute ``gosim.now()`` time; 0/None clears."""
        self._pd.set_deadline("rw", t or 0.0)

    def set_read_deadline(self, t: float | None) -> None:
        """Deadline for reads only: an absolute ``gosim.now()`` time; 0/None clears."""
        self._pd.set_deadline("r", t or 0.0)

    def set_write_deadline(self, t: float | None) -> None:
        """Deadline for writes only: an absolute ``gosim.now()`` time; 0/None clears."""
        self._pd.set_deadline("w", t or 0.0)

    def set_no_delay(self, on: bool = True) -> None:
        """TCP_NODELAY (on by default for TCP connections, as in Go)."""
        if self._sock.family in (socket.AF_INET, socket.AF_INET6):
            self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, int(on))

    def set_keepalive(self, on: bool = True) -> None:
        """SO_KEEPALIVE on a TCP connection (a Unix socket ignores it)."""
        if self._sock.family in (socket.AF_INET, socket.AF_INET6):
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, int(on))

    def local_addr(self) -> str:
        """This end's address, as ``host:port`` (a path for a Unix socket)."""
        return _format_addr(self._sock.getsockname())

    def remote_addr(self) -> str:
        """The peer's address, as ``host:port`` (a path for a Unix socket)."""
        return _format_addr(self._sock.getpeername())


class RawConn:
    """Go's ``syscall.RawConn`` for a :class:`Conn`: run your own non-blocking system
    calls on the socket and let the netpoller do the waiting.

    ``read(f)`` and ``write(f)`` call ``f(fd)`` until it returns True; each time it
    returns False (it met ``EAGAIN``) the goroutine parks in ``IO wait`` until the
    socket is readable (writable) again, under the connection's deadlines, and tries
    again. An ``OSError`` from ``f`` ends the call, mapped as the connection's own
    operations map it (:class:`BrokenError`, :class:`ClosedError`). The connection's
    rules hold: one reader and one writer at a time (:class:`BusyError`), and none
    after close. This is how a protocol implemented in C (netframe's frame reader)
    receives and sends without a Python frame per system call.
    """

    __slots__ = ("_conn", "_fd")

    def __init__(self, conn: Conn) -> None:
        self._conn = conn
        self._fd = conn._sock.fileno()

    def control(self, f: Callable[[int], Any]) -> None:
        """Call ``f(fd)`` once, with no waiting (socket options and the like)."""
        if self._conn._closed:
            raise ClosedError()
        f(self._fd)

    async def read(self, f: Callable[[int], bool]) -> None:
        """Call ``f(fd)`` until it returns True, waiting for input between calls.

        After the peer's hang-up has been seen, one False is retried at once instead
        of waiting: the edge that carried the hang-up may have been consumed by an
        earlier wait, and a receive no longer blocks then.
        """
        conn = self._conn
        if conn._closed:
            raise ClosedError()
        if conn._reading:
            raise BusyError("another goroutine is already reading this connection")
        conn._reading = True
        # Reads the Conn does not see: its "drained" hint no longer holds.
        conn._drained = False
        pd = conn._pd
        fd = self._fd
        retried = False
        try:
            while True:
                try:
                    if f(fd):
                        return
                except OSError as exc:
                    raise conn._failed("read", exc) from None
                if pd.hangup and not retried:
                    retried = True
                    continue
                why = await pd.wait("r")
                if why is not None or conn._closed:
                    conn._raise_wait(why)
        finally:
            conn._reading = False

    async def write(self, f: Callable[[int], bool]) -> None:
        """Call ``f(fd)`` until it returns True, waiting for buffer space between calls."""
        conn = self._conn
        if conn._closed:
            raise ClosedError()
        if conn._writing:
            raise BusyError("another goroutine is already writing this connection")
        conn._writing = True
        pd = conn._pd
        fd = self._fd
        try:
            while True:
                try:
                    if f(fd):
                        return
                except OSError as exc:
                    raise conn._failed("write", exc) from None
                why = await pd.wait("w")
                if why is not None or conn._closed:
                    conn._raise_wait(why)
        finally:
            conn._writing = False


class Listener:
    """A listening socket; ``accept`` parks until a connection arrives."""

    __slots__ = ("_accepting", "_addr", "_closed", "_pd", "_sock", "network")

    def __init__(self, sock: socket.socket, network: str) -> None:
        sock.setblocking(False)
        self._sock = sock
        self._addr = _format_addr(sock.getsockname())  # kept after close, as Go's Addr()
        self.network = network
        self._pd = netpoller().register(sock.fileno())
        self._pd.owner = sock
        self._closed = False
        self._accepting = False

    def addr(self) -> str:
        """The bound address (with the port the kernel chose for ``:0``), even after close."""
        return self._addr

    async def accept(self) -> Conn:
        """Wait for the next connection and return it; :class:`ClosedError` once closed,
        :class:`BusyError` while another goroutine is accepting."""
        if self._closed:
            raise ClosedError()
        if self._accepting:
            raise BusyError("another goroutine is already accepting on this listener")
        self._accepting = True
        try:
            while True:
                try:
                    sock, _ = self._sock.accept()
                except BlockingIOError:
                    why = await self._pd.wait("r")
                    if why is CLOSED or self._closed:
                        raise ClosedError() from None
                    if why is TIMEOUT:
                        raise DeadlineExceeded() from None
                    continue
                except OSError:
                    if self._closed:
                        raise ClosedError() from None
                    raise
                conn = Conn(sock, self.network)
                if self.network.startswith("tcp"):
                    conn.set_no_delay(True)
                return conn
        finally:
            self._accepting = False

    def close(self) -> None:
        """Stop listening; a goroutine blocked in ``accept`` gets :class:`ClosedError`."""
        if self._closed:
            return
        self._closed = True
        self._pd.close()
        path = self._addr if self.network == "unix" else None
        self._sock.close()
        if isinstance(path, str) and path and not path.startswith("\0"):
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass


def listen(network: str, address: str, *, reuse_port: bool = False) -> Listener:
    """Listen on ``address`` (``"127.0.0.1:0"`` picks a free port; ``"unix"`` takes a path).

    ``reuse_port`` sets ``SO_REUSEPORT`` before binding (what Go does in a
    ``ListenConfig.Control``): several processes, each with its own listener on the same
    TCP port, share its connections, the kernel spreading them over the listeners."""
    lowlevel.current_runtime()  # sockets belong to a runtime: fail early outside one
    family, addr = _family_and_address(network, address)
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        if family != socket.AF_UNIX:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if reuse_port:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(addr)
        sock.listen(_BACKLOG)
    except BaseException:
        sock.close()
        raise
    return Listener(sock, network)


async def dial(network: str, address: str, timeout: float | None = None) -> Conn:
    """Connect to ``address``; ``timeout`` seconds bound the attempt (DeadlineExceeded)."""
    rt = lowlevel.current_runtime()
    family, addr = _family_and_address(network, address)
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setblocking(False)
    conn: Conn | None = None
    try:
        err = sock.connect_ex(addr)
        conn = Conn(sock, network)
        if err not in (0, errno.EINPROGRESS, errno.EAGAIN):
            raise OSError(err, f"dial {network} {address}: {os.strerror(err)}")
        if err != 0:
            if timeout is not None:
                conn._pd.set_deadline("w", rt.now() + timeout)
            while True:
                err = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if err not in (0, errno.EINPROGRESS, errno.EALREADY):
                    raise OSError(err, f"dial {network} {address}: {os.strerror(err)}")
                try:
                    sock.getpeername()
                    break
                except OSError:
                    pass
                await conn._wait("w")
            conn._pd.set_deadline("w", 0.0)
        if family != socket.AF_UNIX:
            conn.set_no_delay(True)
        return conn
    except BaseException:
        if conn is not None:
            conn.close()
        else:
            sock.close()
        raise


class _HasFileno(Protocol):
    def fileno(self) -> int: ...


def file_conn(f: int | _HasFileno, network: str = "") -> Conn:
    """Go's ``net.FileConn``: a :class:`Conn` on the netpoller over a copy of an open
    stream socket's descriptor ``f`` (an int, or anything with ``fileno()``: a
    ``socket.socket``, a file, a database driver's connection socket).

    Ownership, as in Go: the Conn owns a duplicate (``dup``) of ``f`` and closes only
    that; ``f`` stays open and stays the caller's to close. Both name one open socket,
    so the socket is set non-blocking for both (``O_NONBLOCK`` is the socket's, not
    the descriptor's), and bytes the Conn reads are gone for the other user, and the
    other way round. A library that keeps its own buffered protocol state on ``f``
    (libpq) should do its own reads and writes and use :meth:`Conn.syscall_conn` only
    for the waits. Close the Conn before the caller closes ``f``: a Conn whose socket
    was shut down under it reports that, as any Conn does.

    ``network`` names the Conn's network ("tcp", "unix"; "" infers it from the
    socket's family). ``OSError`` if ``f`` is not an open stream socket.
    """
    lowlevel.current_runtime()  # sockets belong to a runtime: fail early outside one
    fd = f if isinstance(f, int) else f.fileno()
    dup = os.dup(fd)
    try:
        sock = socket.socket(fileno=dup)
    except BaseException:
        os.close(dup)
        raise
    try:
        if sock.type != socket.SOCK_STREAM:
            raise OSError(errno.ENOTSOCK, f"file_conn: descriptor {fd} is not a stream socket")
        if not network:
            network = "unix" if sock.family == socket.AF_UNIX else "tcp"
        return Conn(sock, network)
    except BaseException:
        sock.close()
        raise
