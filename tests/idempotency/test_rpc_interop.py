"""idempotency.rpc with msgpack-rpc peers that are not ours, each a real process: Neovim
and aio-msgpack-rpc as servers of our client, pynvim as a client of our server. And the
at-most-once rule for unkeyed calls: only a refusal the server marks as made before
dispatch is sent again, never a status a method can raise."""

from __future__ import annotations

import json
import os
import select as select_mod
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest

import gosim
from gosim import Chan, go, net
from idempotency.rpc import (
    CallTimeout,
    Client,
    RetryPolicy,
    RetryThrottle,
    RPCError,
    Server,
    Status,
    Unavailable,
    encode_request,
)

from .conftest import DIE_WITH_PARENT, free_port
from .test_rpc import run_bounded

ROOT = Path(__file__).resolve().parents[2]

# Our server in a process of its own, on both transports. `count(name)` says how many
# times a method ran there.
OUR_SERVER = textwrap.dedent(
    """
    import sys
    import gosim
    from gosim import go, net
    from idempotency.rpc import RPCError, Server, Status

    counts = {}
    srv = Server(heartbeat_interval=None)

    def counted(name):
        counts[name] = counts.get(name, 0) + 1

    @srv.method()
    def add(a, b):
        counted("add")
        return a + b

    @srv.method()
    def fail(kind):
        if kind == "value":
            raise ValueError("bad value")
        raise RPCError(Status.NOT_FOUND, "no such account", {"account": kind})

    @srv.method()
    def unavailable():
        counted("unavailable")  # then answers as a server that is going away would
        raise RPCError(Status.UNAVAILABLE, "the method's own UNAVAILABLE")

    @srv.method()
    def count(name):
        return counts.get(name, 0)

    @srv.method()
    def nvim_get_api_info():  # what pynvim.attach asks first
        types = {"Buffer": {"id": 0}, "Window": {"id": 1}, "Tabpage": {"id": 2}}
        return [1, {"types": types}]

    async def main():
        stream_ln = net.listen("tcp", "127.0.0.1:0")
        framed_ln = net.listen("tcp", "127.0.0.1:0")
        go(srv.serve_stream, stream_ln)
        go(srv.serve, framed_ln)
        print("ready", stream_ln.addr(), framed_ln.addr(), flush=True)
        await gosim.syscall(sys.stdin.readline)  # serve until the test closes stdin
        await srv.shutdown(1.0)

    gosim.run(main)
    """
)

# aio-msgpack-rpc's server (asyncio), a plain msgpack-rpc peer written by others.
AIO_SERVER = textwrap.dedent(
    """
    import asyncio, sys
    from aio_msgpack_rpc import Server

    class Handler:
        def add(self, a, b):
            return a + b

        def boom(self):
            raise RuntimeError("boom")

        async def hang(self):  # never answers
            await asyncio.sleep(3600)

    async def main():
        srv = await asyncio.start_server(Server(Handler()), "127.0.0.1", 0)
        print("ready", "127.0.0.1:%d" % srv.sockets[0].getsockname()[1], flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)

    asyncio.run(main())
    """
)


class Child:
    """A server process of the test's own: started with a script, ready once it prints
    ``ready ADDR...``, stopped by closing its stdin (then killed by PID if need be)."""

    def __init__(self, script: str) -> None:
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        self.proc = subprocess.Popen(
            [*DIE_WITH_PARENT, sys.executable, "-c", script],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            cwd=ROOT,
        )
        assert self.proc.stdout is not None
        ready, _, _ = select_mod.select([self.proc.stdout], [], [], 60)
        line = self.proc.stdout.readline().decode() if ready else ""
        if not line.startswith("ready "):
            self.stop()
            raise RuntimeError(f"server process did not start: {line!r} {self.stderr()}")
        self.addrs = line.split()[1:]

    def stderr(self) -> str:
        assert self.proc.stderr is not None
        if self.proc.poll() is None:
            return ""
        return self.proc.stderr.read().decode(errors="replace")[-2000:]

    def stop(self) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.close()
            self.proc.wait(10)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()
        for pipe in (self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                pipe.close()


@pytest.fixture(scope="module")
def our_server() -> Iterator[Child]:
    child = Child(OUR_SERVER)
    try:
        yield child
    finally:
        child.stop()


@pytest.fixture(scope="module")
def aio_server() -> Iterator[str]:
    pytest.importorskip("aio_msgpack_rpc", reason="aio-msgpack-rpc is in the dev extra")
    child = Child(AIO_SERVER)
    try:
        yield child.addrs[0]
    finally:
        child.stop()


nvim = shutil.which("nvim")


@pytest.fixture(scope="module")
def neovim() -> Iterator[str]:
    if nvim is None:
        pytest.skip("nvim is not installed (apt-get install neovim)")
    port = free_port()
    proc = subprocess.Popen(
        [*DIE_WITH_PARENT, nvim, "--headless", "--clean", "--listen", f"127.0.0.1:{port}"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        yield f"127.0.0.1:{port}"
    finally:
        proc.kill()
        proc.wait()


def stream_client(addr: str, **options: Any) -> Client:
    # Neovim starts listening a moment after its process starts: dial until it does.
    options.setdefault("connect_attempts", 50)
    return Client(
        [addr],
        transport="stream",
        backoff_initial=0.05,
        backoff_max=0.1,
        heartbeat_interval=None,
        **options,
    )


# ------------------------------------------------------------------------ Neovim


def test_a_bounded_named_call_to_neovim_gets_its_answer(neovim: str) -> None:
    """Neovim answers a five-element request with "Request array size must be 4" and
    ends the channel: a call with timeout= and caller= must reach it as four."""

    async def main() -> tuple[Any, ...]:
        c = stream_client(neovim, caller="acct-7", timeout=10.0)
        three = await c.call("nvim_eval", "1 + 2")
        four = await c.call("nvim_eval", "2 + 2", timeout=5.0)
        await c.call("nvim_set_var", "from_rpc", [1, "x"], timeout=5.0)
        var = await c.call("nvim_get_var", "from_rpc", timeout=5.0)
        stats = c.statistics()
        # A keyed call is refused here, unsent: Neovim cannot run it once per key.
        with pytest.raises(RPCError) as info:
            await c.call("nvim_eval", "1", idempotency_key="k-1")
        keyed = info.value
        assert await c.call("nvim_eval", "8") == 8  # the channel is fine
        await c.close()
        return three, four, var, stats.connects, stats.errors, keyed

    three, four, var, connects, errors, keyed = run_bounded(main, 30.0)
    assert (three, four, var, connects, errors) == (3, 4, [1, "x"], 1, {})
    assert keyed.status is Status.FAILED_PRECONDITION and keyed.peer_type is None
    assert "not sent" in keyed.message


def test_the_client_keeps_the_deadline_of_a_call_neovim_never_answers(neovim: str) -> None:
    """``getchar()`` waits for a key that never comes: Neovim sends no answer, and the
    call ends at its own deadline, kept by the client alone. The connection goes on:
    the late answer (once a key is typed) is dropped, later calls are answered."""

    async def main() -> tuple[str, float, Any, Any]:
        c = stream_client(neovim, caller="acct-7")
        assert await c.call("nvim_eval", "1", timeout=10.0) == 1  # connected
        start = gosim.now()
        try:
            await c.call("nvim_eval", "getchar()", timeout=0.3)
            outcome = "answered"
        except CallTimeout:
            outcome = "timed out"
        took = gosim.now() - start
        typed = await c.call("nvim_input", "x", timeout=10.0)  # releases getchar()
        after = await c.call("nvim_eval", "5 * 5", timeout=10.0)
        await c.close()
        return outcome, took, typed, after

    outcome, took, typed, after = run_bounded(main, 30.0)
    assert outcome == "timed out"
    assert 0.25 <= took < 10.0  # at its deadline, not at the next call's or never
    assert (typed, after) == (1, 25)


def test_neovims_errors_keep_their_type_and_message(neovim: str) -> None:
    """Neovim's errors are ``[type, message]`` (0 exception, 1 validation), not ours:
    UNKNOWN, with the type in ``peer_type`` and Neovim's message as it is (E15 was
    read as status OK, a type-1 error as CANCELLED)."""

    async def main() -> list[RPCError]:
        c = stream_client(neovim)
        errors = []
        for method, args in [
            ("nvim_eval", ["1 +"]),
            ("nvim_call_function", ["NoSuchFunction", []]),
            ("nvim_get_var", ["no_such_var"]),
        ]:
            with pytest.raises(RPCError) as info:
                await c.call(method, *args)
            errors.append(info.value)
        assert await c.call("nvim_eval", "7") == 7  # the channel is fine
        await c.close()
        return errors

    e15, e117, validation = run_bounded(main, 30.0)
    # Read as [status, message] these were OK, OK and CANCELLED.
    assert [e.status for e in (e15, e117, validation)] == [Status.UNKNOWN] * 3
    assert (e15.status, e15.peer_type) == (Status.UNKNOWN, 0)
    assert e15.message == "Vim:E15: Invalid expression: 1 +"
    assert (e117.status, e117.peer_type) == (Status.UNKNOWN, 0)
    assert e117.message == "Vim:E117: Unknown function: NoSuchFunction"
    assert (validation.status, validation.peer_type) == (Status.UNKNOWN, 1)
    assert validation.message == "Key not found: no_such_var"
    assert "(peer error type 1)" in str(validation)
    for error in (e15, e117, validation):
        assert type(error) is RPCError and error.type_name is None


# ------------------------------------------------------------------------ aio-msgpack-rpc


def test_aio_msgpack_rpc_answers_bounded_named_calls(aio_server: str) -> None:
    """aio-msgpack-rpc never answers a five-element request (it unpacks four)."""

    async def main() -> tuple[Any, ...]:
        c = stream_client(aio_server, caller="acct-7", connect_attempts=3)
        total = await c.call("add", 20, 22, timeout=10.0)
        again = await c.call("add", 1, 2, timeout=10.0)
        with pytest.raises(RPCError) as info:
            await c.call("boom", timeout=10.0)
        boom = info.value
        with pytest.raises(RPCError) as info:
            await c.call("add", 1, 1, idempotency_key="k-1", timeout=10.0)
        keyed = info.value
        stats = c.statistics()
        await c.close()
        return total, again, boom, keyed, stats

    total, again, boom, keyed, stats = run_bounded(main, 30.0)
    assert (total, again) == (42, 3)
    assert (boom.status, boom.message, boom.peer_type) == (Status.UNKNOWN, "boom", None)
    assert keyed.status is Status.FAILED_PRECONDITION
    assert stats.attempts == 4 and stats.retries == 0


def test_the_client_keeps_the_deadline_of_a_call_aio_msgpack_rpc_never_answers(
    aio_server: str,
) -> None:
    async def main() -> tuple[str, float, Any]:
        c = stream_client(aio_server, caller="acct-7", connect_attempts=3)
        start = gosim.now()
        try:
            await c.call("hang", timeout=0.3)
            outcome = "answered"
        except CallTimeout:
            outcome = "timed out"
        took = gosim.now() - start
        after = await c.call("add", 2, 3, timeout=10.0)
        await c.close()
        return outcome, took, after

    outcome, took, after = run_bounded(main, 30.0)
    assert outcome == "timed out"
    assert 0.25 <= took < 10.0
    assert after == 5


# ------------------------------------------------------------------------ pynvim


# pynvim as a client, in a process of its own (its asyncio loop is its own business).
PYNVIM_CLIENT = textwrap.dedent(
    """
    import json, sys
    import pynvim

    host, port = sys.argv[1].rsplit(":", 1)
    nv = pynvim.attach("tcp", address=host, port=int(port))
    out = {"add": nv.request("add", 2, 3), "errors": []}
    for method, args in [("fail", ["value"]), ("fail", ["acct-9"]), ("add", [1]), ("nope", [])]:
        try:
            nv.request(method, *args)
            out["errors"].append("no error")
        except pynvim.NvimError as exc:
            out["errors"].append(str(exc))
    out["after"] = nv.request("add", 1, 1)
    nv.close()
    print(json.dumps(out), flush=True)
    """
)


def test_pynvim_reads_our_errors(our_server: Child) -> None:
    """pynvim raises ``err[1]`` of an error: a string error showed it one character.
    Our plain-stream errors are Neovim's ``[type, message]``."""
    pytest.importorskip("pynvim", reason="pynvim is in the dev extra")
    done = subprocess.run(
        [*DIE_WITH_PARENT, sys.executable, "-c", PYNVIM_CLIENT, our_server.addrs[0]],
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-2000:]
    out = json.loads(done.stdout)
    assert (out["add"], out["after"]) == (5, 2)
    assert out["errors"] == [
        "UNKNOWN: ValueError: bad value",
        "NOT_FOUND: no such account",
        "INVALID_ARGUMENT: add() takes 2 argument(s), 1 given",
        "UNIMPLEMENTED: no method 'nope'",
    ]


def test_our_client_reads_our_server_whatever_the_handshake(our_server: Child) -> None:
    """With the handshake our client gets our error shape on the plain stream; without
    it, our server is a plain peer to it, and its errors are read as a plain peer's."""

    async def main() -> tuple[RPCError, RPCError]:
        out = []
        for handshake in (True, False):
            c = stream_client(our_server.addrs[0], handshake=handshake, connect_attempts=3)
            with pytest.raises(RPCError) as info:
                await c.call("fail", "acct-9", timeout=10.0)
            out.append(info.value)
            await c.close()
        return out[0], out[1]

    ours, plain = run_bounded(main, 30.0)
    assert (ours.status, ours.message, ours.data, ours.peer_type) == (
        Status.NOT_FOUND,
        "no such account",
        {"account": "acct-9"},
        None,
    )
    assert (plain.status, plain.message, plain.peer_type) == (
        Status.UNKNOWN,
        "NOT_FOUND: no such account",
        0,
    )


# ------------------------------------------------------------------------ at most once


@pytest.mark.parametrize("transport", ["framed", "stream"])
def test_an_unkeyed_call_whose_method_raises_unavailable_runs_once(
    our_server: Child, transport: str
) -> None:
    """UNAVAILABLE raised by the method is an answer, not a refusal: the method ran, so
    the unkeyed call is not sent again (it ran five times). Counted in the server's
    process."""
    addr = our_server.addrs[0 if transport == "stream" else 1]

    async def main() -> tuple[int, int, RPCError]:
        c = Client(
            [addr],
            transport=transport,
            heartbeat_interval=None,
            retry=RetryPolicy(initial_backoff=0.001),
            throttle=RetryThrottle(max_tokens=1000),  # no throttling to hide a retry
        )
        before = await c.call("count", "unavailable", timeout=10.0)
        with pytest.raises(RPCError) as info:
            await c.call("unavailable", timeout=10.0)
        ran = await c.call("count", "unavailable", timeout=10.0) - before
        attempts = c.statistics().attempts
        await c.close()
        return ran, attempts, info.value

    ran, attempts, error = run_bounded(main, 30.0)
    assert ran == 1
    assert attempts == 3  # count, unavailable once, count
    assert isinstance(error, Unavailable) and error.message == "the method's own UNAVAILABLE"


def _draining_servers() -> tuple[Server, Server, dict[str, int]]:
    ran = {"a": 0, "b": 0}
    servers = []
    for name in ("a", "b"):
        srv = Server(heartbeat_interval=None)

        def add(x: int, y: int, name: str = name) -> int:
            ran[name] += 1
            return x + y

        async def slow(seconds: float) -> bool:
            await gosim.sleep(seconds)
            return True

        srv.add_method(add)
        srv.add_method(slow)
        servers.append(srv)
    return servers[0], servers[1], ran


def test_a_refusal_before_dispatch_is_still_retried() -> None:
    """Server a drains (a call of the connection is still running) and refuses new
    calls before dispatch, marking the refusal: the unkeyed call is sent again, on a
    new connection, and runs on b, once."""

    async def main() -> tuple[Any, int, dict[str, int], bool, int]:
        a, b, ran = _draining_servers()
        ln_a, ln_b = net.listen("tcp", "127.0.0.1:0"), net.listen("tcp", "127.0.0.1:0")
        go(a.serve_stream, ln_a)
        go(b.serve_stream, ln_b)
        c = Client(
            [ln_a.addr(), ln_b.addr()],
            transport="stream",
            heartbeat_interval=None,
            retry=RetryPolicy(max_attempts=100, initial_backoff=0.02, max_backoff=0.05),
            throttle=RetryThrottle(max_tokens=1000),
        )
        assert await c.call("add", 0, 0, timeout=10.0) == 0  # connected to a
        slow_done: Chan[Any] = Chan(1)

        async def in_flight() -> None:
            await slow_done.send(await c.call("slow", 0.5, timeout=10.0))

        go(in_flight)
        while a.statistics().calls < 2:
            await gosim.sleep(0.005)
        go(a.shutdown, 10.0)
        while not all(sc.draining for sc in a._stream_links):
            await gosim.sleep(0.005)
        res = await c.call_result("add", 1, 2, timeout=20.0)
        slow_ok = await slow_done.recv()
        goaways = c.statistics().goaways
        await c.close()
        await b.shutdown(1.0)
        return res.result, res.attempts, ran, slow_ok, goaways

    result, attempts, ran, slow_ok, goaways = run_bounded(main, 40.0)
    assert result == 3 and slow_ok is True
    # Refused by a, then sent again on a new connection (to b): a marked UNAVAILABLE is
    # the plain stream's GOAWAY, so no new call goes on the connection a will close.
    assert attempts == 2 and goaways == 1
    assert ran == {"a": 1, "b": 1}  # a ran only the first call; the refused one ran on b


def test_the_refusal_mark_goes_only_to_a_peer_that_said_it_speaks_the_extension() -> None:
    """Raw sockets on a draining server: after the handshake a request's refusal is
    ours and marked; without it, it is Neovim's shape, with no fifth element."""

    async def main() -> tuple[list[Any], list[Any]]:
        srv, _, _ = _draining_servers()
        ln = net.listen("tcp", "127.0.0.1:0")
        go(srv.serve_stream, ln)
        hello_conn = await net.dial("tcp", ln.addr())
        plain_conn = await net.dial("tcp", ln.addr())
        await hello_conn.write(
            encode_request(0, "idempotency.rpc.hello", [1]) + encode_request(1, "slow", [0.5])
        )
        await plain_conn.write(encode_request(1, "slow", [0.5]))
        while srv.statistics().calls < 2:
            await gosim.sleep(0.005)
        go(srv.shutdown, 10.0)
        while not all(sc.draining for sc in srv._stream_links):
            await gosim.sleep(0.005)
        await hello_conn.write(encode_request(2, "add", [1, 2]))
        await plain_conn.write(encode_request(2, "add", [1, 2]))
        got = []
        for conn, n in ((hello_conn, 3), (plain_conn, 2)):
            unpacker = msgpack.Unpacker()
            out: list[Any] = []
            while len(out) < n:
                data = await conn.read(4096)
                assert data, "the server closed before answering"
                unpacker.feed(data)
                out.extend(unpacker)
            conn.close()
            got.append(sorted(out, key=lambda m: m[1]))
        return got[0], got[1]

    with_hello, plain = run_bounded(main, 30.0)
    assert with_hello[0] == [1, 0, None, {"extension": 1}]
    assert with_hello[2] == [
        1,
        2,
        [Status.UNAVAILABLE, "server is shutting down", {"type": "Refused"}],
        None,
        {"refused": True},
    ]
    assert plain[1] == [1, 2, [0, "UNAVAILABLE: server is shutting down"], None]


def test_a_peer_that_never_answers_the_handshake_is_plain() -> None:
    """A peer that reads and never answers: a call with a deadline (or a key) waits
    for the handshake's answer, since what it carries beside the request goes only to a
    server that speaks the extension; the first one's deadline (0.2 s) comes before the
    handshake gives up (``connect_timeout``, 0.3 s), so it ends unsent. A keyed call
    waits no longer than ``connect_timeout``, then is refused unsent; the link is known
    plain from then on, and an unkeyed call is sent as a four-element request and ends
    at its own deadline. The peer never receives anything but four-element requests."""

    async def main() -> tuple[str, str, str, list[Any]]:
        ln = net.listen("tcp", "127.0.0.1:0")
        received: list[Any] = []

        async def silent_peer() -> None:
            conn = await ln.accept()
            unpacker = msgpack.Unpacker()
            while True:
                try:
                    data = await conn.read(4096)
                except OSError:
                    break
                if not data:
                    break
                unpacker.feed(data)
                received.extend(unpacker)
            conn.close()

        go(silent_peer)
        c = stream_client(ln.addr(), caller="acct-7", connect_timeout=0.3, connect_attempts=3)
        try:
            await c.call("anything", 1, timeout=0.2)
            unkeyed = "answered"
        except CallTimeout:
            unkeyed = "timed out"
        try:
            await c.call("anything", 2, idempotency_key="k-1", timeout=10.0)
            keyed = "answered"
        except RPCError as exc:
            keyed = exc.status.name
        try:
            await c.call("anything", 3, timeout=0.2)
            plain = "answered"
        except CallTimeout:
            plain = "timed out"
        await c.close()
        await gosim.sleep(0.05)  # the peer reads the end of the stream
        ln.close()
        return unkeyed, keyed, plain, received

    unkeyed, keyed, plain, received = run_bounded(main, 30.0)
    assert (unkeyed, keyed, plain) == ("timed out", "FAILED_PRECONDITION", "timed out")
    assert [m[2:] for m in received] == [["idempotency.rpc.hello", [1]], ["anything", [3]]]
    assert all(len(m) == 4 for m in received)


def test_neovim_reads_our_clients_refusal_of_its_request(neovim: str) -> None:
    """Neovim calls back into our client (rpcrequest on the client's channel): the
    client serves no methods and says so in Neovim's shape, which Neovim raises as a
    readable error (our shape was "unknown error" to it)."""

    async def main() -> RPCError:
        c = stream_client(neovim)
        channel, _ = await c.call("nvim_get_api_info")
        with pytest.raises(RPCError) as info:
            await c.call("nvim_eval", f"rpcrequest({channel}, 'ping_client')")
        assert await c.call("nvim_eval", "9") == 9
        await c.close()
        return info.value

    error = run_bounded(main, 30.0)
    assert error.status is Status.UNKNOWN and error.peer_type == 0
    assert "UNIMPLEMENTED: no method 'ping_client'" in error.message


# ------------------------------------------------------------------------ our own peers

REFUSE_IN_LUA = "return idempotency_fail(9, 'account ' .. ARGV[1] .. ' has 30')"


@pytest.mark.parametrize("transport", ["framed", "stream"])
def test_a_refusal_recorded_on_redis_without_data_stays_ours(
    redis_server: Any, transport: str
) -> None:
    """A LuaEffect's refusal with nil data is recorded by Redis's Lua encoder as
    ``[code, message]`` (it drops a trailing nil) and replayed so: it is our shape, and
    keeps its status, on both transports."""
    from idempotency import Idempotency, LuaEffect, RedisStore  # noqa: PLC0415

    async def main() -> list[tuple[Status, str, bool]]:
        store = RedisStore(redis_server.url, prefix=f"interop-{transport}-{gosim.now()}:")
        srv = Server(idempotency=Idempotency(store), heartbeat_interval=None)

        @srv.method(idempotent=True)
        def debit(account: str) -> LuaEffect:
            return LuaEffect(REFUSE_IN_LUA, [], [account])

        ln = net.listen("tcp", "127.0.0.1:0")
        go(srv.serve if transport == "framed" else srv.serve_stream, ln)
        c = Client([ln.addr()], transport=transport, heartbeat_interval=None)
        out = []
        for _ in range(2):  # the first run, then its replay
            with pytest.raises(RPCError) as info:
                await c.call("debit", "11", idempotency_key="d-1", timeout=10.0)
            out.append((info.value.status, info.value.message, info.value.peer_type is None))
        await c.close()
        await srv.shutdown(1.0)
        store.close()
        return out

    got = run_bounded(main, 30.0)
    assert got == [(Status.FAILED_PRECONDITION, "account 11 has 30", True)] * 2
