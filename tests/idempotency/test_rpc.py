"""idempotency.rpc's server and client over real loopback sockets, both transports."""

from __future__ import annotations

import functools
import random
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

import msgpack
import pytest
import trio

import gosim
from gosim import Chan, context, go, net, recv, select
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


def run_bounded(main: Callable[[], Awaitable[Any]], seconds: float = 20.0) -> Any:
    """Run ``main`` in a runtime; fail (instead of hanging) if it takes over ``seconds``."""

    async def bounded() -> Any:
        out: Chan[tuple[bool, Any]] = Chan(1)

        async def body() -> None:
            try:
                await out.send((True, await main()))
            except BaseException as exc:  # reported to the test below
                await out.send((False, exc))

        go(body)
        i, got, _ = await select(recv(out), recv(gosim.after(seconds)))
        if i == 1:
            raise TimeoutError(f"test body did not finish within {seconds} s")
        assert got is not None
        ok, value = got
        if not ok:
            raise value
        return value

    return gosim.run(bounded)


class CuttingProxy:
    """A TCP proxy on 127.0.0.1; while ``cut_next`` is set, the next connection carries
    one write from the client (a request), waits ``linger`` seconds (the server has it),
    and is cut in both directions before any reply can come back."""

    def __init__(self, upstream: str, cut_next: bool = False, linger: float = 0.05) -> None:
        self.upstream = upstream
        self.cut_next = cut_next
        self.linger = linger
        self.listener = net.listen("tcp", "127.0.0.1:0")
        go(self._serve)

    def addr(self) -> str:
        return self.listener.addr()

    def close(self) -> None:
        self.listener.close()

    async def _serve(self) -> None:
        while True:
            try:
                down = await self.listener.accept()
            except OSError:
                return
            up = await net.dial("tcp", self.upstream)
            cut, self.cut_next = self.cut_next, False
            go(self._pump, down, up, cut)
            go(self._pump, up, down, False)

    async def _pump(self, src: Any, dst: Any, cut: bool) -> None:
        try:
            while True:
                data = await src.read(65536)
                if not data:
                    break
                await dst.write(data)
                if cut:
                    if self.linger:
                        await gosim.sleep(self.linger)
                    break
        except OSError:
            pass
        src.close()
        dst.close()


def make_server(**options: Any) -> Server:
    options.setdefault("heartbeat_interval", None)
    srv = Server(**options)

    @srv.method()
    def add(a: int, b: int) -> int:
        return a + b

    @srv.method()
    def echo(*args: Any) -> list[Any]:
        return list(args)

    @srv.method("fail")
    def fail(kind: str) -> None:
        if kind == "value":
            raise ValueError("bad value")
        raise RPCError(Status.NOT_FOUND, "no such account", {"account": kind})

    @srv.method(pass_context=True)
    async def slow(ctx: context.Context, seconds: float) -> bool:
        done = ctx.done()
        timer = gosim.after(seconds)
        if done is None:
            await timer.recv()
            return True
        i, _, _ = await select(recv(timer), recv(done))
        return i == 0

    @srv.method()
    async def later(x: int) -> int:
        await gosim.sleep(0.001 * (x % 7))
        return x * 2

    return srv


@pytest.mark.parametrize("transport", ["framed", "stream"])
def test_calls_errors_and_concurrency(transport: str) -> None:
    async def main() -> None:
        srv = make_server()
        ln = net.listen("tcp", "127.0.0.1:0")
        go(srv.serve if transport == "framed" else srv.serve_stream, ln)
        c = Client([ln.addr()], transport=transport, heartbeat_interval=None)
        assert await c.call("add", 2, 3) == 5
        assert await c.call("echo", b"\x00bin", "s", [1, {"k": None}]) == [
            b"\x00bin",
            "s",
            [1, {"k": None}],
        ]
        with pytest.raises(RPCError) as info:
            await c.call("nope")
        assert info.value.status is Status.UNIMPLEMENTED
        assert "no method 'nope'" in str(info.value)
        with pytest.raises(RPCError) as info:
            await c.call("add", 1)
        assert info.value.status is Status.INVALID_ARGUMENT
        assert info.value.message == "add() takes 2 argument(s), 1 given"
        with pytest.raises(RPCError) as info:
            await c.call("fail", "value")
        assert info.value.status is Status.UNKNOWN
        # The plain stream's handshake gets our client the framed error shape too.
        assert (info.value.type_name, info.value.message) == ("ValueError", "bad value")
        assert info.value.peer_type is None
        with pytest.raises(RPCError) as info:
            await c.call("fail", "acct-9")
        assert info.value.status is Status.NOT_FOUND
        assert info.value.data == {"account": "acct-9"}

        # Many calls in flight on one connection, answered out of order, each matched.
        results: Chan[tuple[int, int]] = Chan(200)

        async def one(x: int) -> None:
            await results.send((x, await c.call("later", x)))

        for x in range(200):
            go(one, x)
        got = dict([await results.recv() or (0, 0) for _ in range(200)])
        assert got == {x: 2 * x for x in range(200)}
        stats = c.statistics()
        assert stats.connects == 1 and stats.retries == 0
        await c.close()
        await srv.shutdown(1.0)

    run_bounded(main)


def test_deadline_reaches_the_method_as_a_context() -> None:
    async def main() -> None:
        srv = make_server()
        ln = net.listen("tcp", "127.0.0.1:0")
        go(srv.serve, ln)
        c = Client([ln.addr()], heartbeat_interval=None)
        assert await c.call("slow", 0.01, timeout=5.0) is True
        with pytest.raises(CallTimeout):
            await c.call("slow", 10.0, timeout=0.2)
        with pytest.raises(TimeoutError):  # CallTimeout is a TimeoutError
            await c.call("slow", 10.0, timeout=0.05)
        await gosim.sleep(0.1)
        # The server answered DEADLINE_EXCEEDED itself and the method saw its context end.
        assert srv.statistics().deadline_exceeded >= 2
        await c.close()
        await srv.shutdown(1.0)

    run_bounded(main)


def test_the_server_answers_at_the_deadline_and_the_method_runs_to_its_end() -> None:
    """A method that ignores its context: the caller is answered DEADLINE_EXCEEDED when
    the deadline passes, not when the method ends; the method goes on and is counted
    as a late completion; a call that ends in time is answered with its result."""

    async def main() -> tuple[list[Any], float, Any]:
        srv = Server(heartbeat_interval=None)
        finished: Chan[str] = Chan(4)

        @srv.method()
        async def stubborn(seconds: float, tag: str) -> str:
            await gosim.sleep(seconds)
            await finished.send(tag)
            return tag

        ln = net.listen("tcp", "127.0.0.1:0")
        go(srv.serve_stream, ln)
        conn = await net.dial("tcp", ln.addr())
        started = gosim.now()
        await conn.write(
            msgpack.packb([0, 1, "stubborn", [2.0, "late"], {"timeout": 100}])
            + msgpack.packb([0, 2, "stubborn", [0.0, "quick"], {"timeout": 5000}])
        )
        unpacker = msgpack.Unpacker()
        out: list[Any] = []
        while len(out) < 2:
            unpacker.feed(await conn.read(4096))
            out.extend(unpacker)
        answered = gosim.now() - started
        assert sorted([await finished.recv(), await finished.recv()]) == ["late", "quick"]
        await gosim.sleep(0.05)  # the late method's goroutine settles after its send
        stats = srv.statistics()
        conn.close()
        await srv.shutdown(1.0)
        return sorted(out, key=lambda m: m[1]), answered, stats

    replies, answered, stats = run_bounded(main)
    # A peer that sent no handshake gets Neovim's [type, message] shape.
    assert replies[0][:3] == [1, 1, [0, "DEADLINE_EXCEEDED: deadline exceeded"]]
    assert replies[1] == [1, 2, None, "quick"]
    # At the 0.1 s deadline, not at the method's 2 s end (the margin holds under load).
    assert answered < 1.5
    assert (stats.deadline_exceeded, stats.late_completions) == (1, 1)


def test_the_first_call_on_a_new_plain_stream_connection_carries_its_deadline() -> None:
    """The client waits for the handshake's answer before it sends a call with a
    deadline, so the server learns the deadline of the very first call on a connection
    (and of the first after every reconnect): it answers DEADLINE_EXCEEDED itself and
    the method's context ends, where a call sent before the answer ran its full time."""

    async def main() -> tuple[int, int]:
        srv = make_server()
        ln = net.listen("tcp", "127.0.0.1:0")
        go(srv.serve_stream, ln)
        c = Client([ln.addr()], transport="stream", heartbeat_interval=None)
        with pytest.raises(CallTimeout):
            await c.call("slow", 10.0, timeout=0.2)  # the connection's first call
        await gosim.sleep(0.1)
        first = srv.statistics().deadline_exceeded
        await c.close()
        c = Client([ln.addr()], transport="stream", heartbeat_interval=None)
        assert await c.call("add", 1, 2) == 3  # no deadline, no key: not held
        await c.close()
        await srv.shutdown(1.0)
        return first, c.statistics().connects

    first, connects = run_bounded(main)
    assert first == 1
    assert connects == 1


def test_a_malformed_request_gets_an_error_and_the_connection_goes_on() -> None:
    async def main() -> list[Any]:
        srv = make_server()
        ln = net.listen("tcp", "127.0.0.1:0")
        go(srv.serve_stream, ln)
        conn = await net.dial("tcp", ln.addr())
        bad = msgpack.packb([0, 11, "add", {"not": "a list"}])
        await conn.write(bad + encode_request(12, "add", [1, 2]))
        unpacker = msgpack.Unpacker()
        out: list[Any] = []
        while len(out) < 2:
            unpacker.feed(await conn.read(4096))
            out.extend(unpacker)
        conn.close()
        await srv.shutdown(1.0)
        return out

    replies = sorted(run_bounded(main), key=lambda m: m[1])
    assert replies[0] == [
        1,
        11,
        [1, "INVALID_ARGUMENT: request params must be an array, not dict"],
        None,
    ]
    assert replies[1] == [1, 12, None, 3]


def test_lost_connection_resends_keyed_calls_and_fails_unkeyed_ones() -> None:
    """A proxy cuts the first connection right after a request went through."""

    async def main() -> tuple[int, str]:
        srv = make_server()
        ln = net.listen("tcp", "127.0.0.1:0")
        go(srv.serve, ln)
        proxy = CuttingProxy(ln.addr(), cut_next=True, linger=0.0)  # cut before any reply
        c = Client(
            [proxy.addr()],
            heartbeat_interval=None,
            retry=RetryPolicy(initial_backoff=0.01),
        )
        calls = 0
        # Keyed: the request reaches the server, the connection dies, the call is sent
        # again on a new connection with the same key, and returns.
        res = await c.call_result("add", 20, 22, idempotency_key="k-1")
        assert res.result == 42 and res.attempts == 2 and res.key == "k-1"
        calls += 1
        await c.close()
        # Unkeyed: the same fault fails the call, saying it may have run.
        proxy.cut_next = True
        c = Client([proxy.addr()], heartbeat_interval=None)
        with pytest.raises(Unavailable) as info:
            await c.call("add", 1, 1)
        assert c.statistics().attempts == 1
        await c.close()
        proxy.close()
        await srv.shutdown(1.0)
        return calls, str(info.value)

    calls, message = run_bounded(main)
    assert calls == 1
    assert "may or may not have run" in message


def test_retry_gives_up_at_max_attempts_and_the_throttle_stops_storms() -> None:
    async def main() -> tuple[int, int]:
        # Nothing listens here: every attempt fails to connect ("never left").
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        addr = f"127.0.0.1:{sock.getsockname()[1]}"
        sock.close()
        throttle = RetryThrottle(max_tokens=6, token_ratio=0.5)
        c = Client(
            [addr],
            connect_attempts=1,
            retry=RetryPolicy(max_attempts=3, initial_backoff=0.001),
            throttle=throttle,
        )
        with pytest.raises(Unavailable, match="could not connect"):
            await c.call("add", 1, 2)
        first = c.statistics().attempts
        # The bucket is now at or below half: the next call is not retried at all.
        with pytest.raises(Unavailable):
            await c.call("add", 1, 2)
        return first, c.statistics().attempts - first

    assert run_bounded(main) == (3, 1)


def test_retry_policy_and_throttle_rules() -> None:
    policy = RetryPolicy(initial_backoff=0.1, max_backoff=0.5, backoff_multiplier=2)
    rng = random.Random(1)
    for n, cap in [(1, 0.1), (2, 0.2), (3, 0.4), (4, 0.5), (9, 0.5)]:
        waits = [policy.backoff(n, rng) for _ in range(200)]
        assert all(0 <= w <= cap for w in waits)
        assert max(waits) > cap * 0.8  # full jitter spans the whole range
    t = RetryThrottle(max_tokens=10, token_ratio=0.1)
    assert t.allows_retry()
    for _ in range(5):
        t.record_failure()
    assert not t.allows_retry()  # 5 tokens: not more than half
    t.record_success()
    assert t.allows_retry()
    for bad in ({"max_attempts": 0}, {"initial_backoff": 0}, {"backoff_multiplier": 0.5}):
        with pytest.raises(ValueError):
            RetryPolicy(**bad)


def test_server_refuses_methods_it_cannot_call() -> None:
    srv = Server()

    def needs_kw(a: int, *, b: int) -> None: ...

    with pytest.raises(TypeError, match="keyword-only parameter 'b' has no default"):
        srv.add_method(needs_kw)
    srv.add_method(lambda: 1, "one")
    with pytest.raises(ValueError, match="registered already"):
        srv.add_method(lambda: 2, "one")
    with pytest.raises(TypeError, match="pass_context needs a first parameter"):
        srv.add_method(lambda: 1, "ctxless", pass_context=True)


# ------------------------------------------------------------------------ Neovim

nvim = shutil.which("nvim")
needs_nvim = pytest.mark.skipif(
    nvim is None, reason="nvim is not installed (apt-get install neovim)"
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@needs_nvim
def test_our_client_calls_neovim() -> None:
    assert nvim is not None
    port = _free_port()
    proc = subprocess.Popen(
        [nvim, "--headless", "--clean", "--listen", f"127.0.0.1:{port}"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:

        async def main() -> tuple[Any, ...]:
            c = Client(
                [f"127.0.0.1:{port}"],
                transport="stream",
                connect_attempts=50,
                backoff_initial=0.05,
                backoff_max=0.1,
            )
            three = await c.call("nvim_eval", "1 + 2")
            await c.call("nvim_buf_set_lines", 0, 0, -1, False, ["alpha", "beta"])
            lines = await c.call("nvim_buf_get_lines", 0, 0, -1, False)
            buf = await c.call("nvim_get_current_buf")
            with pytest.raises(RPCError) as info:
                await c.call("nvim_eval", "undefined_variable_x")
            await c.notify("nvim_set_var", "from_gosim", 7)
            var = await c.call("nvim_get_var", "from_gosim")
            await c.close()
            return three, lines, buf, info.value.message, var

        three, lines, buf, message, var = run_bounded(main)
    finally:
        proc.kill()
        proc.wait()
    assert three == 3
    assert lines == ["alpha", "beta"]
    assert isinstance(buf, msgpack.ExtType)  # Neovim's Buffer handle, kept as sent
    assert "E121" in message
    assert var == 7


@needs_nvim
def test_neovim_calls_our_server(tmp_path: Any) -> None:
    assert nvim is not None
    out_file = tmp_path / "out.txt"
    port_box: list[int] = []
    ready = threading.Event()

    async def main() -> int:
        srv = make_server()
        notes: list[Any] = []

        @srv.method()
        def note(x: Any) -> None:
            notes.append(x)

        ln = net.listen("tcp", "127.0.0.1:0")
        go(srv.serve_stream, ln)
        port_box.append(int(ln.addr().rsplit(":", 1)[1]))
        ready.set()
        script = (
            f"let ch = sockconnect('tcp', '127.0.0.1:{port_box[0]}', {{'rpc': v:true}})\n"
            "let r = []\n"
            "call add(r, string(rpcrequest(ch, 'add', 20, 22)))\n"
            "call add(r, string(rpcrequest(ch, 'echo', 'x', [1, 2], {'k': 'v'})))\n"
            "try\n"
            "  call rpcrequest(ch, 'fail', 'value')\n"
            "catch\n"
            "  call add(r, v:exception)\n"
            "endtry\n"
            "call rpcnotify(ch, 'note', 'hello')\n"
            "call add(r, string(rpcrequest(ch, 'add', 1, 1)))\n"
            f"call writefile(r, '{out_file}')\n"
            "qa!\n"
        )
        script_file = tmp_path / "script.vim"
        script_file.write_text(script)
        run_nvim = functools.partial(
            subprocess.run,
            [nvim, "--headless", "--clean", "-S", str(script_file)],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=30,
        )
        result = await gosim.syscall(run_nvim)
        await srv.shutdown(1.0)
        assert notes == ["hello"]
        return int(result.returncode)

    assert run_bounded(main, 40.0) == 0
    lines = out_file.read_text().splitlines()
    assert lines[0] == "42"
    assert lines[1] == "['x', [1, 2], {'k': 'v'}]"
    assert lines[2].endswith("ValueError: bad value")
    assert lines[3] == "2"


def test_usable_from_a_trio_program_through_open_runtime() -> None:
    async def start(srv: Server) -> str:
        ln = net.listen("tcp", "127.0.0.1:0")
        go(srv.serve, ln)
        return ln.addr()

    async def trio_main() -> list[int]:
        with trio.fail_after(20):
            async with gosim.open_runtime() as rt:
                srv = make_server()
                addr = await rt.call(start, srv)
                c = Client([addr], heartbeat_interval=None)
                got = [await rt.call(c.call, "add", i, i) for i in range(5)]
                await rt.call(c.close)
                await rt.call(srv.shutdown, 1.0)
                return got

    assert trio.run(trio_main) == [0, 2, 4, 6, 8]


@pytest.mark.parametrize("transport", ["framed", "stream"])
def test_shutdown_drains_calls_already_received(transport: str) -> None:
    async def main() -> tuple[list[Any], float]:
        srv = make_server()
        ln = net.listen("tcp", "127.0.0.1:0")
        go(srv.serve if transport == "framed" else srv.serve_stream, ln)
        c = Client([ln.addr()], transport=transport, heartbeat_interval=None)
        await c.call("add", 0, 0)  # connected
        out: Chan[Any] = Chan(10)

        async def one(i: int) -> None:
            try:
                await out.send(await c.call("slow", 0.2))
            except RPCError as exc:
                await out.send(exc.status)

        for i in range(10):
            go(one, i)
        await gosim.sleep(0.05)  # all ten are running on the server
        start = gosim.now()
        await srv.shutdown(grace=5.0)
        took = gosim.now() - start
        got = [await out.recv() for _ in range(10)]
        await c.close()
        return got, took

    got, took = run_bounded(main)
    assert got == [True] * 10  # every call already received finished and replied
    assert took < 5.0  # and shutdown did not wait out its grace for nothing


def test_a_goaway_sends_new_calls_to_the_next_server() -> None:
    async def main() -> tuple[int, int, int]:
        a, b = make_server(), make_server()
        ln_a, ln_b = net.listen("tcp", "127.0.0.1:0"), net.listen("tcp", "127.0.0.1:0")
        go(a.serve, ln_a)
        go(b.serve, ln_b)
        c = Client([ln_a.addr(), ln_b.addr()], heartbeat_interval=None)
        assert await c.call("add", 1, 1) == 2  # connected to a
        slow: Chan[Any] = Chan(1)

        async def in_flight() -> None:
            await slow.send(await c.call("slow", 0.3))

        go(in_flight)
        await gosim.sleep(0.05)
        go(a.shutdown, 2.0)  # GOAWAY now; a drains its call in flight
        await gosim.sleep(0.05)
        results = [await c.call("add", i, 1) for i in range(20)]
        assert results == [i + 1 for i in range(20)]
        assert await slow.recv() is True  # the call a owed still came back
        stats = c.statistics()
        await c.close()
        await b.shutdown(1.0)
        return stats.goaways, b.statistics().calls, a.statistics().calls

    goaways, on_b, on_a = run_bounded(main)
    assert goaways == 1
    assert on_b == 20  # every call made after the GOAWAY went to b
    assert on_a == 2


def test_the_plain_stream_closes_silent_peers_but_not_waiting_ones() -> None:
    """A peer on another thread connects and sends nothing: it is closed after the idle
    timeout. A peer whose call runs longer than the timeout is answered, not closed."""
    results: dict[str, Any] = {}

    def silent(addr: str) -> None:
        host, port = addr.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=10) as s:
            start = time.monotonic()
            results["silent"] = (s.recv(1), time.monotonic() - start)  # b"": closed

    def waiting(addr: str) -> None:
        host, port = addr.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=10) as s:
            s.sendall(encode_request(1, "slow", [0.6]))
            unpacker = msgpack.Unpacker()
            while True:
                data = s.recv(4096)
                if not data:
                    results["waiting"] = "closed"
                    return
                unpacker.feed(data)
                for msg in unpacker:
                    results["waiting"] = msg
                    return

    async def main() -> None:
        srv = make_server(idle_timeout=0.3)
        ln = net.listen("tcp", "127.0.0.1:0")
        go(srv.serve_stream, ln)
        threads = [threading.Thread(target=f, args=(ln.addr(),)) for f in (silent, waiting)]
        for t in threads:
            t.start()
        for t in threads:
            await gosim.syscall(t.join, 15)
        await srv.shutdown(1.0)

    run_bounded(main)
    data, took = results["silent"]
    assert data == b"" and 0.25 < took < 5
    assert results["waiting"] == [1, 1, None, True]


def test_a_call_waiting_for_someone_elses_connect_keeps_its_deadline() -> None:
    async def main() -> tuple[str, float]:
        gate: Chan[None] = Chan()

        async def slow_dial() -> Any:
            await gate.recv()  # never released: the dial hangs
            raise OSError("unreachable")

        c = Client(slow_dial, heartbeat_interval=None)
        first: Chan[str] = Chan(1)

        async def connecting_call() -> None:
            try:
                await c.call("add", 1, 2, timeout=5.0)
            except Exception as exc:
                await first.send(type(exc).__name__)

        go(connecting_call)
        await gosim.sleep(0.01)  # the first call is dialing
        start = gosim.now()
        try:
            await c.call("add", 1, 2, timeout=0.2)
        except CallTimeout as exc:
            return str(exc), gosim.now() - start
        return "no timeout", 0.0

    message, took = run_bounded(main)
    assert "deadline exceeded while connecting" in message
    assert took < 2.0


def test_the_client_counts_the_connections_it_found_dead() -> None:
    """A server that accepts and then says nothing (no pong, no reply): the client's
    heartbeat finds it dead, the call in flight fails as lost, and the client's
    statistics say this side gave up (servers_found_dead), apart from other losses."""

    async def main() -> tuple[str, int, int]:
        ln = net.listen("tcp", "127.0.0.1:0")
        held: list[Any] = []

        async def silent() -> None:
            while True:
                try:
                    held.append(await ln.accept())
                except OSError:
                    return

        go(silent)
        c = Client([ln.addr()], heartbeat_interval=0.1, connect_attempts=1)
        try:
            await c.call("anything", timeout=5.0)
            outcome = "answered"
        except Unavailable as exc:
            outcome = type(exc).__name__
        stats = c.statistics()
        await c.close()
        ln.close()
        for conn in held:
            conn.close()
        return outcome, stats.servers_found_dead, stats.connections_lost

    assert run_bounded(main) == ("Unavailable", 1, 1)


def _framed_peer(answer: Callable[[bytes], bytes | None]) -> Any:
    """A netframe session server that answers each payload with ``answer(payload)``:
    a server that does not speak msgpack-rpc as the client expects."""
    import netframe  # noqa: PLC0415

    return netframe.Server(answer, heartbeat_interval=None)


def test_a_request_from_the_server_is_refused_and_the_client_goes_on() -> None:
    """The server answers a call with a request of its own: the client says
    UNIMPLEMENTED, as a server would, and its call ends at its deadline."""
    got: list[Any] = []

    def answer(payload: bytes) -> bytes | None:
        msg = msgpack.unpackb(payload)
        got.append(msg)
        return msgpack.packb([0, 9, "ping_client", []]) if msg[0] == 0 else None

    async def main() -> str:
        peer = _framed_peer(answer)
        ln = net.listen("tcp", "127.0.0.1:0")
        go(peer.serve, ln)
        c = Client([ln.addr()], heartbeat_interval=None)
        try:
            await c.call("anything", timeout=0.3)
            outcome = "answered"
        except CallTimeout:
            outcome = "timed out"
        await gosim.sleep(0.05)
        await c.close()
        await peer.shutdown(1.0)
        return outcome

    assert run_bounded(main) == "timed out"
    refusals = [m for m in got if m[0] == 1]
    assert len(refusals) == 1 and refusals[0][1] == 9
    assert refusals[0][2][0] == Status.UNIMPLEMENTED and "ping_client" in refusals[0][2][1]


def test_an_undecodable_reply_ends_the_link_and_fails_its_calls() -> None:
    async def main() -> str:
        peer = _framed_peer(lambda payload: b"\xc1")  # 0xc1: never valid msgpack
        ln = net.listen("tcp", "127.0.0.1:0")
        go(peer.serve, ln)
        c = Client([ln.addr()], heartbeat_interval=None, connect_attempts=1)
        try:
            await c.call("anything", timeout=5.0)
            outcome = "answered"
        except Unavailable as exc:
            outcome = str(exc)
        await c.close()
        await peer.shutdown(1.0)
        return outcome

    assert "undecodable message from the server" in run_bounded(main)


def test_refusing_a_request_on_a_link_that_ended_loses_only_the_answer() -> None:
    # The refusal runs on the link's reader: a send that fails (the link ended, or its
    # queue is full) must not raise there, where it would end the reader's goroutine.
    from idempotency.rpc._client import _Link  # noqa: PLC0415
    from netframe import Client as FramedClient  # noqa: PLC0415

    async def main() -> None:
        c = Client(["127.0.0.1:1"], heartbeat_interval=None)
        link = _Link(FramedClient(lambda: net.dial("tcp", "127.0.0.1:1")), None)
        await c._refuse(link, 3, "x")  # never connected: ConnectionLost, swallowed

    run_bounded(main)
