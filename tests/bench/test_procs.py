"""benchmarks.procs.Server: a server process that never says it listens is killed
after START_TIMEOUT with an error, instead of hanging the benchmark run."""

from __future__ import annotations

import sys

import pytest

from benchmarks import procs


def test_a_server_that_prints_nothing_is_killed_with_an_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(procs, "START_TIMEOUT", 0.5)
    silent = [sys.executable, "-c", "import time; time.sleep(600)"]
    with pytest.raises(RuntimeError, match="nothing within"):
        procs.Server(silent)


def test_a_server_that_prints_listen_is_ready() -> None:
    ready = [sys.executable, "-c", "print('LISTEN 127.0.0.1:1', flush=True); input()"]
    server = procs.Server(ready)
    try:
        assert server.addr == "127.0.0.1:1"
    finally:
        server.stop()


def test_a_server_that_exits_at_once_says_what_it_printed() -> None:
    broken = [sys.executable, "-c", "print('no listener here')"]
    with pytest.raises(RuntimeError, match="no listener here"):
        procs.Server(broken)


def test_wait_child_returns_the_status_and_kills_a_child_past_its_timeout() -> None:
    import gosim  # noqa: PLC0415

    async def main() -> tuple[int, str]:
        code = await procs.wait_child([sys.executable, "-c", "raise SystemExit(3)"])
        try:
            await procs.wait_child([sys.executable, "-c", "import time; time.sleep(600)"], 0.5)
        except TimeoutError as exc:
            return code, str(exc)
        return code, "no timeout"

    code, error = gosim.run(main)
    assert code == 3
    assert "killed" in error
