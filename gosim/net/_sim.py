"""The simulated network: ``listen("sim", "server:1")`` and ``dial("sim", ...)`` in memory.

For deterministic mode (``gosim.run(..., seed=N, virtual_time=True)``): connections are
pairs of in-memory byte queues whose behaviour comes from one seeded generator and a
fault plan, and every delivery is a runtime timer on the virtual clock. A whole
client/server system therefore replays exactly from its seed: the same bytes arrive at
the same virtual times, the same connections reset, the same partitions cut the same
links. :attr:`SimNetwork.log` records every event for comparing runs (``log=None``
records nothing: a long simulation's log grows by a few tuples per segment).

The model, per direction of a connection:

* each ``write`` is one segment, delivered after a latency drawn uniformly from
  ``latency`` (seconds) and, with ``bandwidth`` (bytes/s), not before the previous
  segment has finished arriving; segments never overtake each other;
* with probability ``reset_rate`` a write resets the connection instead (both ends get
  ``BrokenError``, as after a TCP RST); ``resets`` names the writes that reset instead
  (schedule exploration's shrinker replays a run with fewer of its resets so);
* a partition ``(start, end, hosts_a, hosts_b)`` cuts every link between a host in
  ``hosts_a`` and one in ``hosts_b`` during ``[start, end)``: segments sent meanwhile are
  held and delivered after the partition heals (TCP retransmits), and dials across it
  are refused. Heartbeats see a silent peer, which is what they must detect.

Hosts are the part of the address before ``:``; a dialing side names itself with
``dial(..., local_host=...)`` (default ``"client"``).
"""

from __future__ import annotations

import errno
import random
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from gosim import Chan, lowlevel
from gosim.lowlevel import RuntimeTimer, WaitReason
from gosim.time import sleep

from ._net import (
    AddrError,
    BrokenError,
    BusyError,
    ClosedError,
    DeadlineExceeded,
    read_full,
)

_NETWORK: lowlevel.RuntimeVar[SimNetwork] = lowlevel.RuntimeVar("gosim.net.sim")
_IO_WAIT = WaitReason.IO_WAIT


@dataclass
class SimNetwork:
    """A seeded in-memory network with a fault plan; see the module docstring."""

    seed: int = 0
    latency: tuple[float, float] = (0.0005, 0.002)
    bandwidth: float | None = None
    reset_rate: float = 0.0
    partitions: Iterable[tuple[float, float, Iterable[str], Iterable[str]]] = ()
    #: Every event as ``(time, what, conn, bytes)``; None keeps none.
    log: list[tuple[float, str, int, int]] | None = field(default_factory=list)
    #: The fault plan's resets by hand: when given, exactly the writes with these
    #: numbers reset (the network's writes counted from 0 in the order they are made),
    #: whatever ``reset_rate`` draws. The draws are made all the same, so every other
    #: draw (latencies) stays where it was: a run replayed with a subset of the resets
    #: it made (:attr:`resets_made`) is that run with fewer faults.
    resets: frozenset[int] | None = None

    def __post_init__(self) -> None:
        lo, hi = self.latency
        if not 0 <= lo <= hi:
            raise ValueError(f"latency must be (lo, hi) with 0 <= lo <= hi, got {self.latency}")
        if self.bandwidth is not None and self.bandwidth <= 0:
            raise ValueError("bandwidth must be positive (or None for unlimited)")
        if not 0 <= self.reset_rate <= 1:
            raise ValueError("reset_rate must be a probability")
        self.rng = random.Random(self.seed)
        self._partitions = [
            (float(s), float(e), frozenset(a), frozenset(b)) for s, e, a, b in self.partitions
        ]
        self._listeners: dict[str, SimListener] = {}
        self._next_conn = 0
        self._writes = 0
        #: The numbers of the writes that reset, in order (see :attr:`resets`).
        self.resets_made: list[int] = []

    def cut_until(self, now: float, h1: str, h2: str) -> float:
        """The end of the partition cutting h1 from h2 at ``now``, or 0 if none does."""
        end = 0.0
        for s, e, a, b in self._partitions:
            if s <= now < e and ((h1 in a and h2 in b) or (h1 in b and h2 in a)):
                end = max(end, e)
        return end

    def record(self, now: float, what: str, conn: int, n: int) -> None:
        """Append ``(now, what, conn, n)`` to :attr:`log` when it is kept (None: not)."""
        if self.log is not None:
            self.log.append((now, what, conn, n))

    def log_bytes(self) -> bytes:
        """The log, one line per event (empty when ``log`` is None)."""
        return "".join(f"{t!r} {w} {c} {n}\n" for t, w, c, n in self.log or ()).encode()


def use_sim_network(network: SimNetwork) -> None:
    """Install ``network`` as the running runtime's simulated network (before first use)."""
    old = _NETWORK.get()
    if old is not None and old is not network:
        raise RuntimeError("use_sim_network: this runtime already uses another simulated network")
    _NETWORK.set(network)


def sim_network() -> SimNetwork:
    """The runtime's simulated network; a default one seeded from the runtime's generator."""
    rt = lowlevel.current_runtime()
    net = _NETWORK.get_in(rt)
    if net is None:
        net = SimNetwork(seed=rt.rng.getrandbits(64))
        _NETWORK.set_in(rt, net)
    return net


def _split(address: str) -> tuple[str, str]:
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port:
        raise AddrError(f"sim address {address!r}: want host:port")
    return host, port


class _Pipe:
    """One direction: segments in flight, bytes arrived, and a parked reader."""

    __slots__ = ("arrived", "eof", "last_arrival", "reader", "reset", "timers")

    def __init__(self) -> None:
        self.arrived: deque[bytes] = deque()
        self.eof = False
        self.reset = False
        self.last_arrival = 0.0
        self.reader: lowlevel.Waiter | None = None  # the parked reader's (one at a time)
        self.timers = 0  # segments in flight


class SimConn:
    """One end of a simulated connection; the same API as :class:`gosim.net.Conn`."""

    def __init__(
        self, net: SimNetwork, cid: int, local: str, remote: str, inbox: _Pipe, outbox: _Pipe
    ) -> None:
        self.network = "sim"
        self._net = net
        self._id = cid
        self._local = local
        self._remote = remote
        self._in = inbox
        self._out = outbox
        self._closed = False
        self._reading = False
        self._rdeadline = 0.0
        self._wclosed = False
        self._pending = b""

    def __repr__(self) -> str:
        return f"<gosim.net.SimConn {self._local} -> {self._remote}>"

    def local_addr(self) -> str:
        """This end's address on the simulated network, ``host:port``."""
        return self._local

    def remote_addr(self) -> str:
        """The peer's address on the simulated network, ``host:port``."""
        return self._remote

    def _host(self, addr: str) -> str:
        return addr.rpartition(":")[0]

    async def read(self, n: int = 65536) -> bytes:
        """Up to ``n`` bytes as soon as some have arrived; ``b""`` at end of stream, as
        :meth:`Conn.read`. A reset raises :class:`BrokenError`, a passed read deadline
        :class:`DeadlineExceeded`."""
        if self._closed:
            raise ClosedError()
        if self._reading:
            raise BusyError("another goroutine is already reading this connection")
        self._reading = True
        try:
            pipe = self._in
            while True:
                if self._pending:
                    out, self._pending = self._pending[:n], self._pending[n:]
                    return out
                if pipe.arrived:
                    self._pending = pipe.arrived.popleft()
                    continue
                if pipe.reset:
                    raise BrokenError(errno.ECONNRESET, "read: connection reset by peer")
                if pipe.eof:
                    return b""
                rt = lowlevel.current_runtime()
                if self._rdeadline and self._rdeadline <= rt.now():
                    raise DeadlineExceeded()
                w = pipe.reader = lowlevel.Waiter()
                if self._rdeadline:
                    w.set_deadline(self._rdeadline, "timeout")
                try:
                    why = await w.wait(_IO_WAIT)
                finally:
                    if pipe.reader is w:  # left by an exception or the deadline
                        pipe.reader = None
                if why == "timeout":
                    raise DeadlineExceeded()
                if why == "closed" or self._closed:
                    raise ClosedError()
        finally:
            self._reading = False

    async def read_exactly(self, n: int) -> bytes:
        """Exactly ``n`` bytes; :class:`BrokenError` if the stream ends first (``io.ReadFull``)."""
        return await read_full(self, n)

    async def write(self, data: bytes | bytearray | memoryview) -> int:
        """Send all of ``data`` (it arrives after the network's latency, unless a fault
        intervenes); return its length. Never blocks."""
        if self._closed:
            raise ClosedError()
        if self._wclosed:
            raise BrokenError(errno.EPIPE, "write: broken pipe (write side closed)")
        if self._out.reset or self._in.reset:
            raise BrokenError(errno.ECONNRESET, "write: connection reset by peer")
        payload = bytes(data)
        net = self._net
        rt = lowlevel.current_runtime()
        now = rt.now()
        nwrite = net._writes
        net._writes = nwrite + 1
        reset = bool(net.reset_rate) and net.rng.random() < net.reset_rate
        if net.resets is not None:
            reset = nwrite in net.resets
        if reset:
            net.resets_made.append(nwrite)
            net.record(now, "reset", self._id, len(payload))
            self._out.reset = True
            self._in.reset = True
            _wake(self._out, "data")
            _wake(self._in, "data")
            raise BrokenError(errno.ECONNRESET, "write: connection reset by peer")
        lo, hi = net.latency
        start = now
        healed = (  # no partition, nothing to look up: the common case, on every write
            net.cut_until(now, self._host(self._local), self._host(self._remote))
            if net._partitions
            else 0.0
        )
        if healed:
            net.record(now, "held", self._id, len(payload))
            start = healed
        at = start + (lo if lo == hi else net.rng.uniform(lo, hi))
        if net.bandwidth:
            at = max(at, self._out.last_arrival) + len(payload) / net.bandwidth
        at = max(at, self._out.last_arrival)  # segments never overtake each other
        self._out.last_arrival = at
        self._out.timers += 1
        rt.timers.add(RuntimeTimer(_deliver, (net, self._id, self._out, payload)), at)
        net.record(now, "send", self._id, len(payload))
        return len(payload)

    def close_write(self) -> None:
        """Half-close: the peer reads end of stream once what was sent has arrived."""
        if self._closed:
            raise ClosedError()
        self._wclosed = True
        self._schedule_eof()

    def _schedule_eof(self) -> None:
        rt = lowlevel.current_runtime()
        rt.timers.add(
            RuntimeTimer(_deliver, (self._net, self._id, self._out, None)), self._out.last_arrival
        )

    def close(self) -> None:
        """Close both directions; a goroutine reading this end gets :class:`ClosedError`."""
        if self._closed:
            return
        self._closed = True
        if not self._wclosed:
            self._wclosed = True
            self._schedule_eof()
        _wake(self._in, "closed")

    def set_deadline(self, t: float | None) -> None:
        """Deadline for reads (writes never block here): a ``gosim.now()`` time; 0/None clears."""
        self._rdeadline = t or 0.0

    def set_read_deadline(self, t: float | None) -> None:
        """Deadline for reads: an absolute ``gosim.now()`` time; 0/None clears."""
        self._rdeadline = t or 0.0

    def set_write_deadline(self, t: float | None) -> None:
        """Writes never block on the simulated network; accepted for API parity."""

    def set_no_delay(self, on: bool = True) -> None:
        """No Nagle on the simulated network; accepted for API parity."""

    def set_keepalive(self, on: bool = True) -> None:
        """Accepted for API parity; use heartbeats to detect dead peers."""


def _wake(pipe: _Pipe, why: str) -> None:
    w = pipe.reader
    if w is not None:
        pipe.reader = None
        w.settle(why)


def _deliver(arg: tuple[SimNetwork, int, _Pipe, bytes | None], now: float) -> None:
    net, cid, pipe, payload = arg
    if payload is None:
        pipe.eof = True
        net.record(now, "eof", cid, 0)
    else:
        pipe.timers -= 1
        if pipe.reset:
            return
        pipe.arrived.append(payload)
        net.record(now, "deliver", cid, len(payload))
    _wake(pipe, "data")


class SimListener:
    """A listener on the simulated network."""

    def __init__(self, net: SimNetwork, address: str) -> None:
        self.network = "sim"
        self._net = net
        self._address = address
        self._pending: Chan[SimConn] = Chan(4096)
        self._closed = False

    def addr(self) -> str:
        """The address listened on, ``host:port``."""
        return self._address

    async def accept(self) -> SimConn:
        """Wait for the next connection and return it; :class:`ClosedError` once closed."""
        if self._closed:
            raise ClosedError()
        conn = await self._pending.recv()
        if conn is None:
            raise ClosedError()
        return conn

    def close(self) -> None:
        """Stop listening; a goroutine blocked in ``accept`` gets :class:`ClosedError`."""
        if self._closed:
            return
        self._closed = True
        self._net._listeners.pop(self._address, None)
        self._pending.close()


def sim_listen(address: str) -> SimListener:
    net = sim_network()
    _split(address)
    if address in net._listeners:
        raise OSError(errno.EADDRINUSE, f"listen sim {address}: address already in use")
    ln = SimListener(net, address)
    net._listeners[address] = ln
    return ln


async def sim_dial(
    address: str, timeout: float | None = None, local_host: str = "client"
) -> SimConn:
    net = sim_network()
    host, _ = _split(address)
    rt = lowlevel.current_runtime()
    now = rt.now()
    ln = net._listeners.get(address)
    healed = net.cut_until(now, local_host, host)
    if ln is None or healed:
        net.record(now, "refused", -1, 0)
        raise ConnectionRefusedError(errno.ECONNREFUSED, f"dial sim {address}: connection refused")
    net._next_conn += 1
    cid = net._next_conn
    local = f"{local_host}:{10000 + cid}"
    a_to_b, b_to_a = _Pipe(), _Pipe()
    client = SimConn(net, cid, local, address, b_to_a, a_to_b)
    server = SimConn(net, cid, address, local, a_to_b, b_to_a)
    lo, hi = net.latency
    rtt = 2 * (lo if lo == hi else net.rng.uniform(lo, hi))
    net.record(now, "dial", cid, 0)
    if not ln._pending.try_send(server):
        raise ConnectionRefusedError(errno.ECONNREFUSED, f"dial sim {address}: backlog full")
    if rtt:
        await sleep(rtt)  # the handshake's round trip
    return client
