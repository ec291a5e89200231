"""G status transitions: ``GOSIM_DEBUG=1`` checks each against ``_g.TRANSITIONS``.

The flag is read once at import, so each check runs a small program in a fresh
interpreter with ``GOSIM_DEBUG=1``, on the C accelerator and on the pure-Python path,
and looks at the error it ends with. Without the flag ``G.status`` is the plain slot
(nothing is checked, nothing costs). The whole suite also runs once under the flag in
CI (``.ci/run``), which drives every scheduler path past the checks.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from gosim._core import _g
from gosim._core._accel import speedups

PATHS = [
    pytest.param(
        "c",
        marks=pytest.mark.skipif(speedups is None, reason="gosim._speedups is not built here"),
    ),
    "pure",
]


def _run_debug(path: str, body: str) -> str:
    """Run body (defines async main) under GOSIM_DEBUG=1; return what gosim.run raised:
    its type, "panic" if it escaped a goroutine (the runtime noted Go's crash report on
    it) or "-" (the driver's own), and its message."""
    program = textwrap.dedent(
        """
        import gosim
        from gosim import lowlevel
        from gosim._core._g import G, WAITING, RUNNING, DEAD

        {body}

        try:
            gosim.run(main, procs=1)
        except BaseException as exc:
            escaped = lowlevel.panic_report(exc) != str(exc)
            print(type(exc).__name__, "panic" if escaped else "-", exc)
        else:
            print("no error")
        """
    ).format(body=textwrap.dedent(body).strip())
    env = dict(os.environ, GOSIM_DEBUG="1")
    env.pop("GOSIM_PURE_PYTHON", None)
    if path == "pure":
        env["GOSIM_PURE_PYTHON"] = "1"
    done = subprocess.run(
        [sys.executable, "-c", program],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.mark.parametrize("path", PATHS)
def test_an_illegal_status_write_from_python_is_caught(path: str) -> None:
    out = _run_debug(
        path,
        """
        async def main():
            lowlevel.current_g().status = DEAD - 5  # running -> idle: no such edge
        """,
    )
    assert out.startswith("RuntimeInternalError panic casgstatus: goroutine 1: bad transition")
    assert out.endswith("running -> idle")


@pytest.mark.parametrize("path", PATHS)
def test_the_driver_checks_its_own_transitions(path: str) -> None:
    # A runnable G whose record was corrupted to "waiting" behind the check's back: the
    # driver's execute (waiting -> running) is not an edge. The C loop checks in C.
    out = _run_debug(
        path,
        """
        async def child():
            pass

        async def main():
            gosim.go(child)
            rt = lowlevel.current_runtime()
            g = rt.curp.runnext
            G._status_slot.__set__(g, WAITING)
            await gosim.gosched()
        """,
    )
    assert out.startswith("RuntimeInternalError - casgstatus: goroutine 2: bad transition")


@pytest.mark.parametrize("path", PATHS)
def test_goready_of_a_running_goroutine_throws(path: str) -> None:
    out = _run_debug(
        path,
        """
        async def main():
            lowlevel.ready(lowlevel.current_g(), None)
        """,
    )
    assert out.startswith("RuntimeInternalError panic goready: goroutine 1")


@pytest.mark.parametrize("path", PATHS)
def test_runqput_of_a_running_goroutine_throws(path: str) -> None:
    out = _run_debug(
        path,
        """
        async def main():
            rt = lowlevel.current_runtime()
            rt.runqput(rt.curp, rt.curg, False)
        """,
    )
    assert out.startswith("RuntimeInternalError panic runqput: goroutine 1")


@pytest.mark.parametrize("path", PATHS)
def test_legal_programs_pass_the_checks(path: str) -> None:
    out = _run_debug(
        path,
        """
        from gosim.sync import WaitGroup

        async def main():
            ch = gosim.Chan(0)
            wg = WaitGroup()
            for i in range(20):
                wg.go(ch.send, i)
            total = 0
            for _ in range(20):
                total += await ch.recv()
            await wg.wait()
            await gosim.sleep(0.001)
            assert total == 190
        """,
    )
    assert out == "no error"


def test_every_edge_joins_two_statuses() -> None:
    statuses = range(len(_g.STATUS_NAMES))
    assert all(a in statuses and b in statuses and a != b for a, b in _g.TRANSITIONS)


def test_without_the_flag_status_is_the_plain_slot() -> None:
    if _g.DEBUG:
        pytest.skip("this run has GOSIM_DEBUG=1: status is the checking property")
    assert "status" not in _g.G.__dict__  # no property: reads and writes cost nothing
