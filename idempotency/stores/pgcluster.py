"""A throwaway PostgreSQL cluster: ``initdb`` into a directory, a free port on
127.0.0.1 only (no Unix socket), ``pg_ctl`` to start and stop it, run as a non-root
user (PostgreSQL refuses to run as root). The tests' clusters and the ledger demo's
``--store postgres`` are both made here.

Defaults kept where they matter: ``fsync`` and ``synchronous_commit`` on, so an
acknowledged commit is on disk.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
from typing import Any

__all__ = ["PG_BIN", "PG_USER", "PostgresCluster", "as_pg_user", "free_port"]

_BINS = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), reverse=True)
#: The newest installed PostgreSQL's binaries (Debian's layout), or None.
PG_BIN: str | None = os.path.dirname(_BINS[0]) if _BINS else None
#: When running as root, the clusters run as this system user (made on first use).
PG_USER = "gosimpg"


# The watchdog (``python -c``, argv: owner pid, postmaster pid): it waits on both
# processes' pidfds (no polling, no pid reuse) and stops the postmaster if the owner
# goes first.
_WATCHDOG = r"""
import os, select, signal, sys

def pidfd(pid):
    try:
        return os.pidfd_open(pid)
    except ProcessLookupError:
        return None

owner, postmaster = pidfd(int(sys.argv[1])), pidfd(int(sys.argv[2]))
if postmaster is None:
    sys.exit(0)
if owner is not None:
    poll = select.poll()
    poll.register(owner, select.POLLIN)
    poll.register(postmaster, select.POLLIN)
    if any(fd == postmaster for fd, _ in poll.poll()):
        sys.exit(0)  # the server stopped first: its owner stopped it
for sig, wait in ((signal.SIGINT, 10), (signal.SIGQUIT, 10), (signal.SIGKILL, 10)):
    try:
        signal.pidfd_send_signal(postmaster, sig)
    except ProcessLookupError:
        sys.exit(0)
    if select.select([postmaster], [], [], wait)[0]:
        sys.exit(0)
"""


def free_port() -> int:
    """A TCP port free on 127.0.0.1 at the time of the call."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def as_pg_user() -> list[str]:
    """The command prefix that runs a PostgreSQL binary as a user it accepts: nothing
    when not root, else ``runuser -u gosimpg --`` (the system user is made on first use)."""
    if os.geteuid() != 0:
        return []
    try:
        pwd.getpwnam(PG_USER)
    except KeyError:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", PG_USER],
            check=True,
            capture_output=True,
        )
    return ["runuser", "-u", PG_USER, "--"]


class PostgresCluster:
    """A cluster whose files are in ``directory`` (``data/`` and ``log``).

    ``PostgresCluster()`` makes a temp directory; ``PostgresCluster(d)`` uses ``d``,
    which must be new or empty, or, with ``existing=True``, hold a cluster made here
    before (it gets a new free port: the old one may be taken). As root, ``d`` is
    handed to the cluster's user, and its parent must let that user through (mode
    ``o+x``). Nothing runs until :meth:`start`; :meth:`stop` or :meth:`destroy` end it.
    ``pg_ctl`` detaches the server from the process that starts it, so :meth:`start`
    also starts a watchdog process that stops the server when its owner (the starting
    process, unless told otherwise) ends without stopping it: killed, crashed.
    """

    def __init__(self, directory: str | None = None, *, existing: bool = False) -> None:
        if PG_BIN is None:
            raise RuntimeError("PostgreSQL is not installed (no /usr/lib/postgresql/*/bin)")
        self.prefix = as_pg_user()
        self.dir = directory or tempfile.mkdtemp(prefix="idem-pg-")
        self.data = os.path.join(self.dir, "data")
        self.port = free_port()
        self.running = False
        self._watchdog: subprocess.Popen[bytes] | None = None
        if existing:
            if not os.path.isfile(os.path.join(self.data, "PG_VERSION")):
                raise FileNotFoundError(f"{self.dir} holds no PostgreSQL cluster")
            self._conf(f"port = {self.port}\n")  # the last setting of a name wins
            return
        os.makedirs(self.dir, exist_ok=True)
        if self.prefix:
            entry = pwd.getpwnam(PG_USER)
            os.chown(self.dir, entry.pw_uid, entry.pw_gid)
        self._run(
            "initdb", "-D", self.data, "-U", "postgres", "--auth=trust", "--no-sync",
            "-E", "UTF8", "--locale=C",
        )  # fmt: skip
        self._conf(
            f"listen_addresses = '127.0.0.1'\nport = {self.port}\n"
            "unix_socket_directories = ''\nmax_connections = 60\n"
            "shared_buffers = 16MB\nfsync = on\nsynchronous_commit = on\n"
        )

    def _conf(self, text: str) -> None:
        with open(os.path.join(self.data, "postgresql.conf"), "a") as conf:
            conf.write(text)

    def _run(self, tool: str, *args: str) -> None:
        assert PG_BIN is not None
        done = subprocess.run(
            [*self.prefix, os.path.join(PG_BIN, tool), *args],
            check=False,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if done.returncode != 0:
            last = (done.stderr or done.stdout).strip().splitlines()
            raise RuntimeError(
                f"{tool} failed (status {done.returncode}): {last[-1] if last else ''}"
            )

    def start(self, owner: int | None = None) -> None:
        """Start the server, and its watchdog: once the process ``owner`` (default: this
        one; 0: none) is gone, the watchdog stops the server (a fast shutdown, then
        SIGQUIT and SIGKILL to the postmaster if it lingers, 10 s each) and ends; it
        ends too when the server stops first."""
        self._run("pg_ctl", "-D", self.data, "-l", os.path.join(self.dir, "log"), "-w", "start")
        self.running = True
        if owner != 0:
            self._watchdog = subprocess.Popen(
                [sys.executable, "-c", _WATCHDOG, str(owner or os.getpid()),
                 str(self.postmaster_pid())],
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # not in the owner's group: a Ctrl-C spares it
            )  # fmt: skip

    def postmaster_pid(self) -> int:
        """The running server's postmaster pid (``postmaster.pid``'s first line)."""
        with open(os.path.join(self.data, "postmaster.pid")) as f:
            return int(f.readline())

    def stop(self, mode: str = "fast") -> None:
        """``pg_ctl stop``: ``fast`` rolls back open transactions and shuts down cleanly,
        ``immediate`` ends every process at once (a crash: recovery runs at the next
        start)."""
        if self.running:
            self._run("pg_ctl", "-D", self.data, "-m", mode, "-w", "stop")
            self.running = False
            if self._watchdog is not None:  # it sees the postmaster go, and ends
                try:
                    self._watchdog.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    self._watchdog.kill()
                    self._watchdog.wait()
                self._watchdog = None

    def destroy(self) -> None:
        """Stop it at once and remove its directory."""
        try:
            self.stop("immediate")
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)

    @property
    def dsn(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def sql(self, query: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """Run one statement on a connection of its own (autocommit); its rows."""
        import psycopg  # noqa: PLC0415 -- only the clusters' users need it

        with psycopg.connect(self.dsn, autocommit=True) as conn:
            cur = conn.execute(query, params)
            return cur.fetchall() if cur.description else []
