"""psycopg 3 on gosim's netpoller: a query parks the goroutine, not an OS thread.

psycopg does its protocol work in generators that never block: each yields what it
waits for (``Wait.R``, ``Wait.W``, ``Wait.RW``) and resumes with what became ready.
Its own ``Connection`` waits for them with a blocking ``select``; here a goroutine
waits for them on the runtime's netpoller instead, through the ``RawConn`` of a
:func:`gosim.net.file_conn` over the libpq socket (libpq keeps its own buffers and
reads and writes its own descriptor: the netpoller only waits).

The netpoller is edge-triggered and libpq need not read its socket dry, so before
parking the goroutine checks the socket's readiness with a zero-timeout ``poll``: it
parks only when nothing is ready, and an edge arriving after that check wakes it.

Connecting blocks (libpq's connect and its TLS and authentication steps): it runs off
the scheduler through ``gosim.syscall``. So does ``close``.

Not yet used by :class:`~.postgres.PostgresStore`, whose batches run on a syscall
thread; see that module's docstring.
"""

from __future__ import annotations

import select
from collections.abc import Generator
from typing import Any, Final

import psycopg
from psycopg.abc import Query

import gosim
from gosim import net

__all__ = ["NetpollConnection"]

_R: Final = 1  # psycopg.waiting.Wait.R / Ready.R
_W: Final = 2
_RW: Final = 3
#: While libpq waits for both (sending a large query while results may arrive), the
#: goroutine parks for output and looks at the input this often (seconds).
_RW_LOOK: Final = 0.05


class NetpollConnection:
    """A psycopg connection driven from a goroutine. :meth:`execute` sends a query and
    parks the goroutine until its results are in; the cursor it returns holds them
    (``fetchall`` and the like do no I/O then).

    One goroutine uses it at a time (a second one meets :class:`gosim.net.BusyError`).
    It owns ``conn`` (a connection in autocommit mode, ``conn.pgconn`` non-blocking):
    nothing else may use ``conn`` while it is open. A lost connection raises psycopg's
    ``OperationalError``, as psycopg's own calls do.
    """

    __slots__ = ("_fd", "_gconn", "_poll", "_raw", "conn")

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn
        conn.pgconn.nonblocking = 1
        self._fd = conn.pgconn.socket
        # A duplicate of libpq's descriptor on the netpoller: closing it leaves libpq's.
        self._gconn = net.file_conn(self._fd)
        self._raw = self._gconn.syscall_conn()
        self._poll = select.poll()
        self._poll.register(self._fd, select.POLLIN | select.POLLOUT)

    @classmethod
    async def connect(cls, dsn: str, **kwargs: Any) -> NetpollConnection:
        """Connect (blocking, through ``gosim.syscall``) in autocommit mode; ``kwargs``
        go to ``psycopg.connect``."""
        conn = await gosim.syscall(_connect, dsn, kwargs)
        try:
            return cls(conn)
        except BaseException:
            conn.close()
            raise

    async def execute(
        self, query: Query, params: Any = None, *, binary: bool | None = None
    ) -> psycopg.Cursor[Any]:
        """Run ``query`` with ``params``; the cursor holding its results. Errors as
        ``psycopg.Cursor.execute`` raises them."""
        cur = self.conn.cursor()
        # The generator behind Cursor.execute (psycopg's own; prepare=False: a server
        # restart would leave a prepared name dangling).
        await self._drive(cur._execute_gen(query, params, prepare=False, binary=binary))
        return cur

    async def close(self) -> None:
        """Close the descriptor's copy on the netpoller, then the connection."""
        self._gconn.close()
        await gosim.syscall(self.conn.close)

    async def _drive(self, gen: Generator[Any, Any, Any]) -> Any:
        try:
            wait = next(gen)
            while True:
                wait = gen.send(await self._ready(int(wait)))
        except StopIteration as stop:
            return stop.value

    def _ready_now(self, wait: int) -> int:
        """What of ``wait`` the socket is ready for now (no waiting)."""
        ready = 0
        for _, events in self._poll.poll(0):
            if events & (select.POLLIN | select.POLLHUP | select.POLLERR):
                ready |= _R
            if events & (select.POLLOUT | select.POLLHUP | select.POLLERR):
                ready |= _W
        return ready & wait

    async def _ready(self, wait: int) -> int:
        """Park until the socket is ready for some of ``wait``; what it is ready for."""
        if ready := self._ready_now(wait):
            return ready
        if wait == _R:
            await self._raw.read(lambda fd: bool(self._ready_now(_R)))
            return _R
        if wait == _W:
            await self._raw.write(lambda fd: bool(self._ready_now(_W)))
            return _W
        while True:  # both: park for output, looking at the input now and then
            self._gconn.set_write_deadline(gosim.now() + _RW_LOOK)
            try:
                await self._raw.write(lambda fd: bool(self._ready_now(_RW)))
            except net.DeadlineExceeded:
                pass
            finally:
                self._gconn.set_write_deadline(None)
            if ready := self._ready_now(_RW):
                return ready


def _connect(dsn: str, kwargs: dict[str, Any]) -> psycopg.Connection[Any]:
    return psycopg.connect(dsn, autocommit=True, **kwargs)
