"""The fault injector: a frame-aware proxy between the clients and the ledger server.

Every connection from a client gets its own connection to the server, and whole
netframe frames are forwarded both ways. On a seeded plan, a DATA frame may meet one
fault:

* **drop** (client to server): the connection is cut before the request is forwarded,
  mid-call;
* **lose reply** (server to client): the server has committed, the reply is dropped and
  the connection cut; the client must retry with the same key and get the replay;
* **duplicate** (client to server): the request is forwarded twice;
* **stall**: the connection forwards nothing, heartbeats included, for ``stall_for``
  seconds (past the heartbeat timeout, so both sides declare the other dead).

Heartbeat frames are never faulted on their own. The proxy prints a JSON line of its
counters every half second.
"""

from __future__ import annotations

import json
import os
import random
import signal
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import gosim
from gosim import go, net
from netframe import FramedConn

from ._ledger import process_trace, raise_nofile_limit, write_trace

__all__ = ["FaultPlan", "run_proxy", "serve_proxy"]


class FaultPlan:
    """Probabilities per DATA frame, from one seeded generator."""

    def __init__(
        self,
        seed: int,
        drop: float = 0.002,
        lose_reply: float = 0.002,
        duplicate: float = 0.002,
        stall: float = 0.0003,
        stall_for: float = 3.5,
    ) -> None:
        for name, p in (
            ("drop", drop),
            ("lose_reply", lose_reply),
            ("duplicate", duplicate),
            ("stall", stall),
        ):
            if not 0 <= p <= 1:
                raise ValueError(f"{name} must be a probability, not {p}")
        self.rng = random.Random(seed)
        self.drop, self.lose_reply, self.duplicate, self.stall = drop, lose_reply, duplicate, stall
        self.stall_for = stall_for
        self.counts = {"drops": 0, "lost_replies": 0, "duplicates": 0, "stalls": 0}

    def pick(self, upstream: bool) -> str | None:
        roll = self.rng.random()
        if upstream:
            if roll < self.drop:
                return "drop"
            roll -= self.drop
            if roll < self.duplicate:
                return "duplicate"
            roll -= self.duplicate
        else:
            if roll < self.lose_reply:
                return "lose_reply"
            roll -= self.lose_reply
        if roll < self.stall:
            return "stall"
        return None


class _Link:
    """The two directions of one proxied connection share its stalls."""

    __slots__ = ("stalled_until",)

    def __init__(self) -> None:
        self.stalled_until = 0.0


async def _pump(
    plan: FaultPlan, link: _Link, src: FramedConn, dst: FramedConn, upstream: bool
) -> None:
    try:
        while True:
            frame = await src.read_frame()
            if frame is None:
                break
            fault = plan.pick(upstream) if frame[:1] == b"\x00" else None
            if fault == "drop":
                plan.counts["drops"] += 1
                break
            if fault == "lose_reply":
                plan.counts["lost_replies"] += 1
                break
            if fault == "stall":
                plan.counts["stalls"] += 1
                link.stalled_until = max(link.stalled_until, gosim.now() + plan.stall_for)
            wait = link.stalled_until - gosim.now()
            if wait > 0:  # nothing crosses a stalled connection, heartbeats included
                await gosim.sleep(wait)
            if fault == "duplicate":
                plan.counts["duplicates"] += 1
                await dst.write_frames([frame, frame])
            else:
                await dst.write_frame(frame)
    except OSError:
        pass
    finally:
        src.conn.close()
        dst.conn.close()


async def serve_proxy(
    ln: Any, dial_upstream: Callable[[], Awaitable[Any]], plan: FaultPlan
) -> None:
    """Accept on ``ln`` and proxy each connection to a new upstream one, with faults,
    until ``ln`` is closed."""

    async def connect(down: Any) -> None:
        try:
            up = await dial_upstream()
        except OSError:
            down.close()  # the server is down (killed): the client reconnects later
            return
        link = _Link()
        go(_pump, plan, link, FramedConn(down), FramedConn(up), True)
        go(_pump, plan, link, FramedConn(up), FramedConn(down), False)

    while True:
        try:
            down = await ln.accept()
        except OSError:
            return
        go(connect, down)


def run_proxy(listen: str, upstream: str, plan: FaultPlan, trace_path: Path | None = None) -> None:
    """Proxy ``listen`` to ``upstream`` with faults until killed; prints ``LISTEN addr``.
    With ``trace_path``, the runtime's trace is written there on SIGTERM (then exit
    status 0); a SIGKILL leaves none."""
    raise_nofile_limit()
    trace = process_trace(trace_path, "fault proxy")
    if trace is not None:

        def write_and_exit(signum: int, frame: Any) -> None:
            write_trace(trace, trace_path)
            os._exit(0)

        signal.signal(signal.SIGTERM, write_and_exit)

    async def report() -> None:
        while True:
            print(json.dumps({"faults": plan.counts, "cpu": time.process_time()}), flush=True)
            await gosim.sleep(0.5)

    async def dial() -> Any:
        return await net.dial("tcp", upstream)

    async def main() -> None:
        ln = net.listen("tcp", listen)
        print("LISTEN", ln.addr(), flush=True)
        go(report)
        await serve_proxy(ln, dial, plan)

    gosim.run(main, trace=trace)
