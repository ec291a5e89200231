"""psycopg 3 on gosim's netpoller: a query parks the goroutine, not an OS thread.

psycopg does its protocol work in generators that never block: each yields what it
waits for (``Wait.R``, ``Wait.W``, ``Wait.RW``) and resumes with what became ready.
Every wait of an ``AsyncConnection`` (its cursors, its pipeline, its transactions and
savepoints) goes through one method, ``wait(gen)``, which psycopg drives with asyncio;
:class:`NetpollConnection` replaces that one method and nothing else, so psycopg's
whole async API runs in a goroutine: the goroutine waits for the libpq socket on the
runtime's netpoller, through the ``RawConn`` of a :func:`gosim.net.file_conn` over it
(libpq keeps its own buffers and reads and writes its own descriptor: the netpoller
only waits). psycopg's asyncio lock is taken only uncontended (one goroutine uses a
connection at a time), which needs no event loop.

The netpoller is edge-triggered and libpq need not read its socket dry, so before
parking the goroutine checks the socket's readiness with a zero-timeout ``poll``: it
parks only when nothing is ready, and an edge arriving after that check wakes it.

Blocking paths, through ``gosim.syscall``: connecting (libpq's connect with its TLS and
authentication steps, and psycopg's wait for it). On a reproducible runtime (seeded, or
on a virtual clock: ``gosim.lowlevel.reproducible``) every wait goes through
``gosim.syscall`` too (psycopg's blocking ``wait``, inline on the driver there), since
the netpoller's timing would make a run depend on the server's; the connection's
deadline then bounds that wait as its timeout.
"""

from __future__ import annotations

import select
from collections.abc import Generator
from typing import Any, Final

import psycopg
from psycopg import waiting
from psycopg.conninfo import conninfo_to_dict, make_conninfo, timeout_from_conninfo

import gosim
from gosim import lowlevel, net

__all__ = ["NetpollConnection", "ServerStalled"]

_R: Final = 1  # psycopg.waiting.Wait.R / Ready.R
_W: Final = 2
_RW: Final = 3
#: While libpq waits for both (sending a large query while results may arrive), the
#: goroutine parks for output and looks at the input this often (seconds).
_RW_LOOK: Final = 0.05
_POLL_IN: Final = select.POLLIN | select.POLLHUP | select.POLLERR | select.POLLNVAL
_POLL_OUT: Final = select.POLLOUT | select.POLLHUP | select.POLLERR | select.POLLNVAL
_BAD: Final = psycopg.pq.ConnStatus.BAD


class ServerStalled(psycopg.OperationalError):
    """The server did not answer before the connection's :attr:`~NetpollConnection.deadline`
    (a backend stopped or wedged, a link that drops packets): the connection was closed
    mid-protocol and is never used again. What was sent on it may still take effect
    (the server may read a ``COMMIT`` after the connection ended)."""


class NetpollConnection(psycopg.AsyncConnection[Any]):
    """A ``psycopg.AsyncConnection`` whose waits park the calling goroutine on gosim's
    netpoller (see the module docstring): use psycopg's async API from a goroutine
    (``await conn.execute(...)``, ``async with conn.pipeline()``,
    ``async with conn.transaction()``).

    One goroutine uses it at a time. It serves the runtime it last waited in: used from
    a later runtime it registers its socket with that one's netpoller. A lost
    connection raises psycopg's ``OperationalError``, as psycopg's own calls do. A
    server that stays connected but does not answer is bounded by :attr:`deadline`
    (a netpoller deadline, which is a runtime timer): a wait still parked then closes
    the connection and raises :class:`ServerStalled`.
    """

    _gconn: net.Conn | None = None
    _raw: Any = None
    _rt: Any = None
    _blocking = False
    _poll: Any = None
    #: A time of the runtime's clock (``gosim.now()``) bounding every wait of the
    #: connection, or None; its user sets it (a store: per transaction).
    deadline: float | None = None
    #: Whether a wait outlived :attr:`deadline` (the connection is then closed).
    timed_out = False

    @classmethod
    async def connect(
        cls, conninfo: str = "", *, autocommit: bool = True, **kwargs: Any
    ) -> NetpollConnection:
        """Connect (blocking, through ``gosim.syscall``); ``kwargs`` are libpq's
        connection parameters (``connect_timeout``, ``application_name``, ...).
        Autocommit unless told otherwise."""
        conn = await gosim.syscall(_connect, cls, make_conninfo(conninfo, **kwargs))
        if autocommit:
            await conn.set_autocommit(True)
        return conn

    async def wait(
        self, gen: Generator[Any, Any, Any], interval: float = 0.0, timeout: float | None = None
    ) -> Any:
        """Drive psycopg's generator ``gen`` to its end (see the module docstring).

        ``timeout`` is psycopg's own, for this wait (``psycopg.errors._WaitTimeout``
        when it passes, the connection left as it is). :attr:`deadline` bounds every
        wait of the connection: when it passes the connection is closed mid-protocol
        (see :class:`ServerStalled`)."""
        if self._rt is not lowlevel.current_runtime():
            self._attach()
        own = self.deadline
        deadline = None if timeout is None else gosim.now() + timeout
        mine = own is not None and (deadline is None or own <= deadline)
        if mine:
            deadline = own
        try:
            if self._blocking:
                left = None if deadline is None else max(0.0, deadline - gosim.now())
                return await gosim.syscall(waiting.wait, gen, self.pgconn.socket, 0.1, left)
            w = next(gen)
            while True:
                w = gen.send(await self._ready(int(w), deadline))
        except StopIteration as stop:
            return stop.value
        except (net.DeadlineExceeded, psycopg.errors._WaitTimeout):
            if mine:
                self._abandon(gen)
                raise ServerStalled(
                    "no answer from the server before the connection's deadline"
                ) from None
            raise psycopg.errors._WaitTimeout("timed out waiting for the server") from None

    def _abandon(self, gen: Generator[Any, Any, Any]) -> None:
        """Give the connection up mid-protocol: close it (so it can never be used
        again, and the server sees it end) and stop psycopg's generator."""
        self.timed_out = True
        self.detach()
        self.pgconn.finish()
        try:
            # Its cleanup may try to talk to the closed connection (a pipeline's
            # ``finally`` fetches results): whatever it raises is moot now.
            gen.close()
        except Exception:
            pass

    async def close(self) -> None:
        """Forget the socket on the netpoller, then close the connection (libpq's
        socket is non-blocking: its goodbye to the server is sent if it fits)."""
        self.detach()
        await super().close()

    def detach(self) -> None:
        """Take the socket's copy off the netpoller (the connection stays open)."""
        if self._gconn is not None:
            try:
                self._gconn.close()
            except Exception:
                pass
        self._gconn = self._raw = self._rt = None

    def _attach(self) -> None:
        """Serve the running runtime: its netpoller, or gosim.syscall if reproducible."""
        self.detach()
        self._rt = lowlevel.current_runtime()
        self._blocking = lowlevel.reproducible()
        if self._blocking:
            return
        fd = self.pgconn.socket
        self.pgconn.nonblocking = 1
        # A duplicate of libpq's descriptor on the netpoller: closing it leaves libpq's.
        self._gconn = net.file_conn(fd)
        self._raw = self._gconn.syscall_conn()
        self._poll = select.poll()
        self._poll.register(fd, select.POLLIN | select.POLLOUT)

    def _ready_now(self, wait: int) -> int:
        """What of ``wait`` the socket is ready for now (no waiting). A connection libpq
        found lost (and closed its socket: nothing more will come on the netpoller) is
        ready for all: psycopg's generator then reports the loss."""
        if self.pgconn.status == _BAD:
            return wait
        ready = 0
        for _, events in self._poll.poll(0):
            if events & _POLL_IN:
                ready |= _R
            if events & _POLL_OUT:
                ready |= _W
        return ready & wait

    async def _ready(self, wait: int, deadline: float | None) -> int:
        """Park until the socket is ready for some of ``wait``; what it is ready for.
        ``net.DeadlineExceeded`` once ``deadline`` (the runtime's clock) passes."""
        if ready := self._ready_now(wait):
            return ready
        gconn = self._gconn
        assert gconn is not None
        try:
            if wait == _R:
                if deadline is not None:
                    gconn.set_read_deadline(deadline)
                await self._raw.read(lambda fd: bool(self._ready_now(_R)))
                return _R
            if wait == _W:
                if deadline is not None:
                    gconn.set_write_deadline(deadline)
                await self._raw.write(lambda fd: bool(self._ready_now(_W)))
                return _W
            while True:  # both: park for output, looking at the input now and then
                look = gosim.now() + _RW_LOOK
                gconn.set_write_deadline(look if deadline is None else min(look, deadline))
                try:
                    await self._raw.write(lambda fd: bool(self._ready_now(_RW)))
                except net.DeadlineExceeded:
                    if deadline is not None and gosim.now() >= deadline:
                        raise
                if ready := self._ready_now(_RW):
                    return ready
        finally:
            # Only the deadline set above (a park arms at most one timer).
            if wait == _R:
                if deadline is not None:
                    gconn.set_read_deadline(None)
            elif deadline is not None or wait == _RW:
                gconn.set_write_deadline(None)


def _connect(cls: type[NetpollConnection], conninfo: str) -> NetpollConnection:
    """psycopg's connection steps, waited for blocking (on a syscall thread)."""
    timeout = timeout_from_conninfo(conninfo_to_dict(conninfo))
    conn: NetpollConnection = waiting.wait_conn(
        cls._connect_gen(conninfo), interval=0.1, timeout=timeout
    )
    return conn
