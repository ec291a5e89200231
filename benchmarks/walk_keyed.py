"""Follow one keyed call's payload through the server as it runs, with the C code off.

    python -m benchmarks.walk_keyed [sqlite|memory] [--one-step] [--runs N] [--list]

A server (``idempotency.rpc.Server`` with ``echo`` idempotent, on a SQLite file or a
MemoryStore) runs in this process under ``GOSIM_PURE_PYTHON=1`` (every C accelerator
off: the Python that is the reference is what runs); a thread of its own sends keyed
calls over a real socket. After three calls that warm the server up (its committer
thread, its caches), one call is followed: from the first frame that is handed its
payload's bytes to the frame that hands the reply's bytes to the socket (the first
frame of ``netframe`` or ``gosim.net`` on the path that calls a socket send:
``os.write`` on its descriptor, or a socket's ``send``, ``sendmsg``, ``sendall``).

Following is done with a profile hook on every thread of the server, as a value is
followed by hand: a Python frame is *on the path* when one of its arguments is a value
already on it (the payload at the start; one level into a tuple, list or dict; a bound
method's object); what a frame on the path returns, and what it holds when it calls
another (what it made of the value: a C call's result is seen no other way), is on the
path; and an object handed a value on the path by one of its methods (``self``) is on
it too. A comprehension's frame is its function's (Python 3.12 runs it inline). The
scheduler's core (``gosim/_core``) carries goroutines, not values: its frames are never
on the path, and the path re-enters the code above it there.

What it prints, over the frames on the path in the order they ran:

- **stays**: the runs of consecutive frames in one file (a room), the files of the
  project only (``gosim``, ``netframe``, ``idempotency``);
- **returns**: the stays in a room the path had already left;
- **hand-offs**: the frames on the path that no frame on the path called (or, a
  coroutine's, resumed: an awaiter resumes what it awaits): the value reached them
  another way, each named with the frame it reached and how: ``thread`` (another OS
  thread's, a store's committer), ``resumed`` (a goroutine on the path resumed by the
  scheduler after its own wait: reading follows it to its next line), ``started`` (a
  goroutine's first step, from a ``go`` elsewhere) or ``callback`` (called from
  outside the path: a settle's consumer, a queue's).

The figures count code, not time, but a store with a thread of its own could move them
from run to run (what the driver runs while the committer's thread works depends on
when the thread is done): each figure is the median of
``--runs`` calls followed (a server each; 5 by default), with its range. ``--list``
prints every stay of the median run.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import tempfile
import threading
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.ops_rpc import HEADER, PARAMS, _read_frame

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tuple(str(ROOT / top) + os.sep for top in ("gosim", "netframe", "idempotency"))
CORE = str(ROOT / "gosim" / "_core") + os.sep
WARM_UP = 3
#: The calls that hand bytes to a socket (``os.write`` on its descriptor, or a
#: socket's own), and the layers the reply's are sent from.
SENDS = frozenset(("write", "send", "sendmsg", "sendall"))
OS_CALLS = os.write.__self__  # the module that defines os.write (posix)
NETWORK = (str(ROOT / "netframe") + os.sep, str(ROOT / "gosim" / "net") + os.sep)
#: The code names of comprehensions (a frame of their own before Python 3.12).
COMPREHENSIONS = frozenset(("<listcomp>", "<dictcomp>", "<setcomp>", "<genexpr>"))
#: Values never followed: scalars are shared by everything (a msgid of 1, a str the
#: interpreter interns), and classes and modules are not data.
UNFOLLOWED = (int, float, str, bool, type(None), type, types.ModuleType, types.FunctionType)


@dataclass
class Stay:
    """A run of frames on the path in one room."""

    room: str
    functions: list[str] = field(default_factory=list)
    again: bool = False  # the path had left this room before


@dataclass
class Walk:
    """What the hook saw of the followed call."""

    frames: list[tuple[str, str]] = field(default_factory=list)  # (room, function)
    hand_offs: list[str] = field(default_factory=list)

    def stays(self) -> list[Stay]:
        stays: list[Stay] = []
        seen: set[str] = set()
        for room, function in self.frames:
            if not stays or stays[-1].room != room:
                stays.append(Stay(room, again=room in seen))
                seen.add(room)
            stays[-1].functions.append(function)
        return stays


class Follower:
    """The profile hook: which frames a value on the path reaches (see the docstring)."""

    def __init__(self, payload: bytes, skip_thread: int) -> None:
        self.payload = payload
        self.skip_thread = skip_thread
        self.active = False
        self.sent = False  # the reply's bytes have been handed to the socket
        self.values: dict[int, Any] = {}  # id -> value, kept alive so ids stay unique
        self.on_path: dict[int, types.FrameType] = {}
        self.walk = Walk()
        self.driver_thread = 0  # the thread of the walk's first frame: the runtime's

    def _add(self, value: Any) -> None:
        if not isinstance(value, UNFOLLOWED):
            self.values[id(value)] = value

    def _is_payload(self, value: Any) -> bool:
        """The payload's bytes, or a list of frames holding them (as the reader cuts)."""
        if type(value) is bytes:
            return value == self.payload
        return type(value) is list and any(v == self.payload for v in value[:16])

    def _carries(self, value: Any) -> bool:
        values = self.values
        if id(value) in values:
            return True
        t = type(value)
        if t is bytes:
            return bool(value == self.payload)
        if t is tuple or t is list:
            return any(id(v) in values or v == self.payload for v in value[:16])
        if t is dict:
            return any(id(v) in values for v in list(value.values())[:16])
        if t is types.MethodType:
            return id(value.__self__) in values
        return False

    def hook(self, frame: types.FrameType, event: str, arg: Any) -> None:
        if not self.active or self.sent or threading.get_ident() == self.skip_thread:
            return
        if event == "call":
            self._call(frame)
        elif event == "c_call":
            # The end: a frame of the network layers on the path hands bytes to the
            # socket (the reply's: the only send on the path there).
            owner = getattr(arg, "__self__", None)
            to_socket = owner is OS_CALLS or isinstance(owner, socket.socket)
            if to_socket and arg.__name__ in SENDS and id(frame) in self.on_path:
                self.sent = frame.f_code.co_filename.startswith(NETWORK)
        elif event == "return" and id(frame) in self.on_path:
            flags = frame.f_code.co_flags
            if not flags & (0x20 | 0x80 | 0x200):  # a generator, coroutine: suspended
                self._add(arg)

    def _call(self, frame: types.FrameType) -> None:
        code = frame.f_code
        filename = code.co_filename
        if filename.startswith(CORE):
            return
        known = id(frame) in self.on_path
        caller = frame.f_back
        if caller is not None and id(caller) in self.on_path:
            # What a frame on the path holds is what it made of the value (a C call's
            # result, msgpack's decode say, is seen no other way).
            for value in list(caller.f_locals.values()):
                self._add(value)
        inline = code.co_name in COMPREHENSIONS and caller is not None
        if not known and inline and id(caller) in self.on_path:
            # A comprehension's frame is its function's own expression (Python 3.12
            # runs it inline): on the path with the function that holds it.
            self.on_path[id(frame)] = frame
        elif not known:
            nargs = code.co_argcount + code.co_kwonlyargcount
            nargs += bool(code.co_flags & 0x04) + bool(code.co_flags & 0x08)
            local = frame.f_locals
            args = [local.get(name) for name in code.co_varnames[:nargs]]
            if not any(self._carries(a) for a in args):
                return
            self.on_path[id(frame)] = frame
            for a in args:
                if self._is_payload(a):
                    self._add(a)
            if nargs and code.co_varnames[0] == "self" and filename.startswith(PROJECT):
                self._add(args[0])  # the object is handed the value
        if not filename.startswith(PROJECT):
            return
        room = filename[len(str(ROOT)) + 1 :]
        if not self.walk.frames:
            self.driver_thread = threading.get_ident()
        self.walk.frames.append((room, code.co_qualname))
        # Reached by reading: called (or, a coroutine, resumed) by a frame on the path.
        # The outermost frame of a resumed goroutine is resumed by the scheduler.
        reached = caller is not None and id(caller) in self.on_path
        if not reached and self.walk.frames[1:]:  # the first frame is where it starts
            kind = self._hand_off_kind(code, known)
            self.walk.hand_offs.append(f"{kind}: {room}:{code.co_qualname}")

    def _hand_off_kind(self, code: types.CodeType, known: bool) -> str:
        """How a hand-off reached its frame: on another thread (``thread``), a goroutine
        on the path resumed by the scheduler after its own wait (``resumed``: its next
        line), a goroutine's first step (``started``: by a ``go`` elsewhere), or a call
        from outside the path (``callback``: a settle's consumer, a queue's)."""
        if threading.get_ident() != self.driver_thread:
            return "thread"
        if known:
            return "resumed"
        if code.co_flags & 0x80:  # a coroutine's first step
            return "started"
        return "callback"


def _request(msgid: int) -> bytes:
    import msgpack  # noqa: PLC0415

    body: bytes = msgpack.packb([0, msgid, "echo", PARAMS, {"key": f"k-{msgid}", "caller": "w"}])
    return body


def _read_reply(sock: socket.socket, buf: bytearray) -> bytes:
    """The next session DATA frame's body (control frames passed over)."""
    while True:
        body = _read_frame(sock, buf)
        if body[:1] == b"\x00":
            return body


def follow(store: str, one_step: bool) -> Walk:
    """Serve, warm up, follow one call; the walk (see the module docstring)."""
    if "gosim" in sys.modules and os.environ.get("GOSIM_PURE_PYTHON") != "1":
        raise SystemExit("walk_keyed must import gosim itself, with GOSIM_PURE_PYTHON=1")
    os.environ["GOSIM_PURE_PYTHON"] = "1"
    import msgpack  # noqa: PLC0415

    import gosim  # noqa: PLC0415
    from gosim import go, net  # noqa: PLC0415
    from idempotency import Idempotency, MemoryStore, SQLiteStore  # noqa: PLC0415
    from idempotency.rpc import Server  # noqa: PLC0415

    followed = _request(WARM_UP)
    follower = Follower(followed, skip_thread=-1)
    threading.setprofile(follower.hook)  # the committer's thread, started later
    sys.setprofile(follower.hook)
    records = tempfile.mkdtemp(prefix="walk-keyed-")
    backend = SQLiteStore(records + "/records.db") if store == "sqlite" else MemoryStore()
    srv = Server(idempotency=Idempotency(backend), heartbeat_interval=10.0)

    def echo(*args: object) -> list[object]:
        return list(args)

    srv.add_method(echo, "echo", idempotent=True, one_step=one_step)
    port_ready = threading.Event()
    ports: list[int] = []
    failure: list[BaseException] = []

    def client() -> None:
        follower.skip_thread = threading.get_ident()
        port_ready.wait(10)
        try:
            with socket.create_connection(("127.0.0.1", ports[0]), timeout=10) as sock:
                buf = bytearray()
                for msgid in range(WARM_UP + 1):
                    body = b"\x00" + _request(msgid)
                    follower.active = msgid == WARM_UP
                    sock.sendall(HEADER.pack(len(body)) + body)
                    reply = msgpack.unpackb(_read_reply(sock, buf)[1:])
                    follower.active = False
                    if reply != [1, msgid, None, PARAMS]:
                        raise AssertionError(f"bad reply {reply!r}")
        except BaseException as exc:  # reported by the main thread
            failure.append(exc)

    async def main() -> None:
        listener = net.listen("tcp", "127.0.0.1:0")
        ports.append(int(listener.addr().rpartition(":")[2]))
        go(srv.serve, listener)
        thread = threading.Thread(target=client, daemon=True)
        thread.start()
        port_ready.set()
        await gosim.syscall(thread.join, 30)
        await srv.shutdown(grace=1.0)

    try:
        gosim.run(main)
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
        backend.close()
    if failure:
        raise failure[0]
    return follower.walk


def figures(walk: Walk) -> dict[str, int]:
    """The walk's figures (see the module docstring)."""
    stays = walk.stays()
    return {
        "frames": len(walk.frames),
        "rooms": len({s.room for s in stays}),
        "stays": len(stays),
        "returns": sum(s.again for s in stays),
        "hand-offs": len(walk.hand_offs),
    }


def report(walks: list[Walk], listing: bool, out: Callable[[str], None] = print) -> None:
    """Each figure's median over the runs, with its range; the hand-offs (and with
    ``listing`` the stays) of the run whose stays are the median."""
    runs = [figures(w) for w in walks]
    for name in runs[0]:
        values = sorted(r[name] for r in runs)
        median = values[len(values) // 2]
        out(f"{name}: {median} (range {values[0]} to {values[-1]}, {len(values)} runs)")
    by_stays = sorted(range(len(walks)), key=lambda i: runs[i]["stays"])
    walk = walks[by_stays[len(by_stays) // 2]]
    out("hand-offs of the median run:")
    for h in walk.hand_offs:
        out(f"  {h}")
    if listing:
        for i, stay in enumerate(walk.stays(), 1):
            mark = " (again)" if stay.again else ""
            out(f"{i:3} {stay.room}{mark}: {', '.join(stay.functions)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("store", nargs="?", choices=("sqlite", "memory"), default="sqlite")
    parser.add_argument("--one-step", action="store_true", help="echo declared one_step")
    parser.add_argument("--runs", type=int, default=5, help="calls followed, a server each")
    parser.add_argument("--list", action="store_true", help="print every stay")
    args = parser.parse_args()
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    report([follow(args.store, args.one_step) for _ in range(args.runs)], args.list)


if __name__ == "__main__":
    main()
