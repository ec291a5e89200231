"""Public surface and layering: exports, module names, argument errors, and the rule
that lower layers never import higher ones."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest
import trio

import gosim
import netframe
from gosim import Chan

REPO = Path(__file__).resolve().parents[2]


def test_every_exported_name_exists_and_reads_as_gosim() -> None:
    for name in gosim.__all__:
        obj = getattr(gosim, name)
        if isinstance(obj, type):
            assert obj.__module__ == "gosim", name
    for name in netframe.__all__:
        assert getattr(netframe, name) is not None


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(
                node.module.split(".")[0] if not node.module.startswith("gosim.") else node.module
            )
    return found


def test_core_imports_only_stdlib_and_trio() -> None:
    allowed_third_party = {"trio", "outcome"}
    for path in (REPO / "gosim" / "_core").glob("*.py"):
        for mod in _imports(path):
            if mod.startswith("gosim."):
                assert mod.startswith("gosim._core"), f"{path.name} imports {mod}"
            elif mod not in sys.stdlib_module_names:
                assert mod in allowed_third_party, f"{path.name} imports {mod}"


def test_lower_layers_never_import_higher_ones() -> None:
    for path in (REPO / "gosim").rglob("*.py"):
        mods = _imports(path)
        assert "netframe" not in mods and "idempotency" not in mods, path
    for path in (REPO / "netframe").rglob("*.py"):
        assert "idempotency" not in _imports(path), path


def test_the_tour_runs_on_gosim_alone() -> None:
    # `python -m gosim` is gosim's tour; netframe's is `python -m netframe`.
    script = "import runpy, sys; runpy.run_module('gosim', run_name='__main__'); " + (
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('netframe', 'idempotency')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        check=True,
    ).stdout
    assert "prime sieve, 15 chained goroutines: [2, 3, 5, 7, 11, 13, 17" in out
    assert out.rstrip().endswith("[]"), out  # nothing above gosim was imported


def test_chan_argument_errors() -> None:
    with pytest.raises(ValueError, match="makechan: size out of range"):
        Chan(-1)
    with pytest.raises(TypeError):
        Chan(1.5)  # type: ignore[arg-type]
    with pytest.raises(gosim.CloseOfNilChannel, match=r"^close of nil channel$"):
        gosim.close(None)
    ch: Chan[int] = Chan(2)
    ch.close()
    with pytest.raises(gosim.CloseOfClosedChannel, match=r"^close of closed channel$"):
        ch.close()
    assert issubclass(gosim.SendOnClosedChannel, gosim.ChanError)
    assert repr(ch) == "<Chan len=0 cap=2 closed>"


def test_select_rejects_things_that_are_not_channels() -> None:
    with pytest.raises(TypeError):
        gosim.recv([1, 2])  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        gosim.send("ch", 1)  # type: ignore[arg-type]


def test_deterministic_mode_runs_syscalls_and_trio_calls_inline() -> None:
    async def trio_side() -> str:
        await trio.sleep(5)  # virtual: instant
        return "trio"

    async def main() -> tuple[int, str, int]:
        v = await gosim.syscall(sum, [1, 2, 3])
        t = await gosim.trio_call(trio_side)
        return v, t, gosim.statistics().trio_calls

    assert gosim.run(main, procs=2, seed=9, virtual_time=True) == (6, "trio", 1)


def test_open_runtime_deadlock_is_raised_from_the_call_and_on_exit() -> None:
    async def stuck() -> None:
        await Chan[int]().recv()

    async def trio_main() -> None:
        async with gosim.open_runtime(procs=1) as rt:
            await rt.call(stuck)

    with pytest.raises(gosim.Deadlock, match="goroutine 1 \\[chan receive\\]"):
        trio.run(trio_main)


def test_time_helpers() -> None:
    async def main() -> tuple[float, bool]:
        t0 = gosim.now()
        await gosim.sleep(2.5)
        ch = gosim.time.tick(1.0)
        assert ch is not None
        await ch.recv()
        return gosim.time.since(t0), gosim.time.Millisecond == 1e-3

    elapsed, ok = gosim.run(main, procs=1, virtual_time=True)
    assert elapsed == pytest.approx(3.5) and ok
