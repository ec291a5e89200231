"""Channels and select against a model, driven by hypothesis's RuleBasedStateMachine.

A live runtime runs in a background thread. Its main goroutine is a controller: it
takes one command at a time from the test (through a blocking ``syscall``, so the
runtime never looks deadlocked), starts a goroutine that performs one channel
operation, then yields until every other goroutine is parked or done, and reports the
operations that have completed. The model is Go's rules written plainly: per channel a
buffer, a closed flag, and FIFO queues of parked senders and receivers; a parked select
sits in the queues of all its channels until one of them serves it.
"""

from __future__ import annotations

import queue
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import hypothesis.strategies as st
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import gosim
from gosim import Chan, go, recv, select, send

NCHANS = 3


@dataclass
class Waiter:
    """A parked operation in the model: one case per (channel, kind, value)."""

    op: int
    cases: list[tuple[int, str, Any]]  # (channel index, "send"|"recv", value)
    done: bool = False


@dataclass
class ModelChan:
    cap: int
    buf: deque[Any] = field(default_factory=deque)
    closed: bool = False
    sendq: deque[tuple[Waiter, int]] = field(default_factory=deque)  # (waiter, case index)
    recvq: deque[tuple[Waiter, int]] = field(default_factory=deque)


def first_live(q: deque[tuple[Waiter, int]]) -> tuple[Waiter, int] | None:
    while q:
        w, i = q.popleft()
        if not w.done:
            return w, i
    return None


class Controller:
    """The runtime side: a thread running gosim.run with a command-driven main."""

    def __init__(self, caps: list[int], procs: int) -> None:
        self.commands: queue.Queue[Any] = queue.Queue()
        self.replies: queue.Queue[Any] = queue.Queue()
        self.caps = caps
        self.procs = procs
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._thread, daemon=True)
        self.thread.start()

    def _thread(self) -> None:
        try:
            gosim.run(self._main, procs=self.procs)
        except BaseException as exc:  # reported to the test through the reply queue
            self.error = exc
            self.replies.put(("error", exc))

    async def _main(self) -> None:
        chans: list[Chan[Any]] = [Chan(c) for c in self.caps]
        completed: list[tuple[int, Any]] = []

        async def do_send(op: int, ch: Chan[Any], v: Any) -> None:
            try:
                await ch.send(v)
            except gosim.SendOnClosedChannel:
                completed.append((op, ("panic",)))
                return
            completed.append((op, ("sent",)))

        async def do_recv(op: int, ch: Chan[Any]) -> None:
            v, ok = await ch.recv2()
            completed.append((op, ("recv", v, ok)))

        async def do_select(op: int, cases: list[tuple[int, str, Any]], default: bool) -> None:
            built = [recv(chans[c]) if k == "recv" else send(chans[c], v) for c, k, v in cases]
            try:
                i, v, ok = await select(*built, default=default)
            except gosim.SendOnClosedChannel:
                completed.append((op, ("panic",)))
                return
            completed.append((op, ("select", i, v, ok)))

        while True:
            cmd = await gosim.syscall(self.commands.get)
            kind = cmd[0]
            if kind == "stop":
                return
            if kind == "send":
                go(do_send, cmd[1], chans[cmd[2]], cmd[3])
            elif kind == "recv":
                go(do_recv, cmd[1], chans[cmd[2]])
            elif kind == "select":
                go(do_select, cmd[1], cmd[2], cmd[3])
            elif kind == "close":
                try:
                    chans[cmd[2]].close()
                    completed.append((cmd[1], ("closed",)))
                except gosim.CloseOfClosedChannel:
                    completed.append((cmd[1], ("close-panic",)))
            # Quiesce: yield until nothing else is runnable.
            while True:
                await gosim.gosched()
                s = gosim.statistics()
                if sum(s.local_runq) == 0 and s.global_runq == 0:
                    break
            self.replies.put(("ok", list(completed), [c.len() for c in chans]))
            completed.clear()

    def do(self, *cmd: Any) -> tuple[list[tuple[int, Any]], list[int]]:
        self.commands.put(cmd)
        reply = self.replies.get(timeout=60)
        if reply[0] == "error":
            raise reply[1]
        return reply[1], reply[2]

    def stop(self) -> None:
        if self.thread.is_alive() and self.error is None:
            self.commands.put(("stop",))
        self.thread.join(timeout=60)


class ChannelMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.ctl: Controller | None = None
        self.model: list[ModelChan] = []
        self.next_op = 0
        self.next_value = 0
        self.expected: dict[int, Any] = {}
        self.lens: list[int] = []

    @precondition(lambda self: self.ctl is None)
    @rule(
        caps=st.lists(st.sampled_from([0, 0, 1, 2, 3]), min_size=NCHANS, max_size=NCHANS),
        procs=st.sampled_from([1, 2, 3]),
    )
    def start(self, caps: list[int], procs: int) -> None:
        self.ctl = Controller(caps, procs)
        self.model = [ModelChan(c) for c in caps]

    def teardown(self) -> None:
        if self.ctl is not None:
            self.ctl.stop()

    # ------------------------------------------------------------ the model

    def _complete(self, w: Waiter, result: Any) -> None:
        w.done = True
        self.expected[w.op] = result

    def _try_case(self, w: Waiter, case: int, is_select: bool) -> bool:
        """Apply Go's rules for one case if it can complete now; True when it did."""
        c, kind, v = w.cases[case]
        ch = self.model[c]
        if kind == "send":
            if ch.closed:
                self._complete(w, ("panic",))
                return True
            r = first_live(ch.recvq)
            if r is not None:
                rw, rcase = r
                self._complete(rw, self._shape(rw, rcase, v, True))
                self._complete(w, ("select", case, None, True) if is_select else ("sent",))
                return True
            if len(ch.buf) < ch.cap:
                ch.buf.append(v)
                self._complete(w, ("select", case, None, True) if is_select else ("sent",))
                return True
            return False
        if ch.buf:
            got = ch.buf.popleft()
            s = first_live(ch.sendq)
            if s is not None:
                sw, scase = s
                ch.buf.append(sw.cases[scase][2])
                self._complete(sw, self._shape(sw, scase, None, True, sent=True))
            self._complete(w, ("select", case, got, True) if is_select else ("recv", got, True))
            return True
        s = first_live(ch.sendq)
        if s is not None:
            sw, scase = s
            self._complete(sw, self._shape(sw, scase, None, True, sent=True))
            got = sw.cases[scase][2]
            self._complete(w, ("select", case, got, True) if is_select else ("recv", got, True))
            return True
        if ch.closed:
            self._complete(w, ("select", case, None, False) if is_select else ("recv", None, False))
            return True
        return False

    def _shape(self, w: Waiter, case: int, v: Any, ok: bool, sent: bool = False) -> Any:
        if len(w.cases) > 1 or getattr(w, "is_select", False):
            return ("select", case, v, ok)
        return ("sent",) if sent else ("recv", v, ok)

    def _park(self, w: Waiter) -> None:
        for i, (c, kind, _) in enumerate(w.cases):
            (self.model[c].sendq if kind == "send" else self.model[c].recvq).append((w, i))

    def _check(self, completed: list[tuple[int, Any]], lens: list[int]) -> None:
        got = dict(completed)
        assert got == self.expected, (got, self.expected)
        self.expected = {}
        assert lens == [len(m.buf) for m in self.model]

    # ---------------------------------------------------------------- rules

    @precondition(lambda self: self.ctl is not None)
    @rule(c=st.integers(0, NCHANS - 1))
    def send(self, c: int) -> None:
        assert self.ctl is not None
        op, v = self.next_op, self.next_value
        self.next_op += 1
        self.next_value += 1
        w = Waiter(op, [(c, "send", v)])
        if not self._try_case(w, 0, False):
            self._park(w)
        self._check(*self.ctl.do("send", op, c, v))

    @precondition(lambda self: self.ctl is not None)
    @rule(c=st.integers(0, NCHANS - 1))
    def receive(self, c: int) -> None:
        assert self.ctl is not None
        op = self.next_op
        self.next_op += 1
        w = Waiter(op, [(c, "recv", None)])
        if not self._try_case(w, 0, False):
            self._park(w)
        self._check(*self.ctl.do("recv", op, c))

    @precondition(lambda self: self.ctl is not None)
    @rule(c=st.integers(0, NCHANS - 1))
    def close(self, c: int) -> None:
        assert self.ctl is not None
        op = self.next_op
        self.next_op += 1
        ch = self.model[c]
        if ch.closed:
            self.expected[op] = ("close-panic",)
        else:
            ch.closed = True
            self.expected[op] = ("closed",)
            while (r := first_live(ch.recvq)) is not None:
                rw, rcase = r
                self._complete(rw, self._shape(rw, rcase, None, False))
            while (s := first_live(ch.sendq)) is not None:
                sw, _ = s
                self._complete(sw, ("panic",))
        self._check(*self.ctl.do("close", op, c))

    @precondition(lambda self: self.ctl is not None)
    @rule(
        cases=st.lists(
            st.tuples(st.integers(0, NCHANS - 1), st.sampled_from(["send", "recv"])),
            min_size=1,
            max_size=3,
        ),
        default=st.booleans(),
    )
    def select_(self, cases: list[tuple[int, str]], default: bool) -> None:
        assert self.ctl is not None
        op = self.next_op
        self.next_op += 1
        full: list[tuple[int, str, Any]] = []
        for c, kind in cases:
            full.append((c, kind, self.next_value if kind == "send" else None))
            self.next_value += 1
        completed, lens = self.ctl.do("select", op, full, default)
        got = dict(completed)
        w = Waiter(op, full)
        w.is_select = True  # type: ignore[attr-defined]
        result = got.get(op)
        if result is None:
            # It parked: no case may have been ready (Go polls every case first).
            assert not default
            for i in range(len(full)):
                assert not self._ready(full[i]), f"select parked with case {i} ready"
            self._park(w)
        elif result == ("panic",):
            assert any(k == "send" and self.model[c].closed for c, k, _ in full)
            self._complete(w, ("panic",))
        elif result[1] == -1:
            assert default and not any(self._ready(case) for case in full)
            self._complete(w, result)
        else:
            chosen = result[1]
            assert self._ready(full[chosen]), "select chose a case that was not ready"
            assert self._try_case(w, chosen, True)
        self._check(completed, lens)

    def _ready(self, case: tuple[int, str, Any]) -> bool:
        c, kind, _ = case
        ch = self.model[c]
        live = lambda q: any(not w.done for w, _ in q)  # noqa: E731
        if kind == "send":
            return ch.closed or live(ch.recvq) or len(ch.buf) < ch.cap
        return bool(ch.buf) or live(ch.sendq) or ch.closed

    @invariant()
    def model_invariants(self) -> None:
        # Go's hchan invariants, on the model: parked receivers imply an empty buffer,
        # parked senders a full one.
        for ch in self.model:
            if any(not w.done for w, _ in ch.recvq):
                assert not ch.buf
            if any(not w.done for w, _ in ch.sendq):
                assert len(ch.buf) == ch.cap


ChannelMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
TestChannelMachine = ChannelMachine.TestCase
