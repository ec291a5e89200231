"""gosim.jit: the one kernel decorator and JIT flag, and the imports it keeps light."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gosim import jit

REPO = Path(__file__).resolve().parents[2]


def run_python(script: str, **env: str) -> str:
    environ = {**os.environ, "PYTHONPATH": str(REPO), **env}
    for name, value in env.items():
        if value == "<unset>":
            del environ[name]
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        cwd=REPO,
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


@pytest.mark.parametrize("value", ["<unset>", "", "0", "1", "2", "yes"])
def test_jit_flag_reads_the_environment_as_numba_does(value: str) -> None:
    # gosim.jit decides without importing numba; numba's own reading is the truth.
    out = run_python(
        """
        import warnings
        warnings.simplefilter("ignore")
        from gosim import jit
        from numba.core import config
        print(jit.JIT_ENABLED, not config.DISABLE_JIT)
        """,
        NUMBA_DISABLE_JIT=value,
    )
    ours, numbas = out.split()
    assert ours == numbas


def test_kernel_options_are_the_projects() -> None:
    # One decorator, one set of options: nogil and disk cache always; the two that
    # differ by kernel are parameters.
    def add(a: int, b: int) -> int:
        return a + b

    plain = jit.kernel(add)
    tuned = jit.kernel(inline=True, refcounts=False)(add)
    assert plain(2, 3) == 5
    assert tuned(2, 3) == 5
    if not jit.JIT_ENABLED:
        pytest.skip("NUMBA_DISABLE_JIT is set: njit returns a dispatcher without options")
    options: dict[str, object] = plain.targetoptions  # type: ignore[attr-defined]
    tuned_options: dict[str, object] = tuned.targetoptions  # type: ignore[attr-defined]
    assert options["nogil"] is True
    assert "inline" not in options
    assert "_nrt" not in options
    assert (tuned_options["inline"], tuned_options["_nrt"]) == ("always", False)
    for dispatcher in (plain, tuned):  # cache=True gives the dispatcher a disk cache
        assert type(dispatcher._cache).__name__ == "FunctionCache"  # type: ignore[attr-defined]


def test_the_runtime_and_the_network_layers_do_not_load_numba_or_numpy() -> None:
    # numba and numpy are 70 MB of a process; only the array-shaped modules need them.
    out = run_python(
        """
        import json, sys
        import gosim, netframe, idempotency, idempotency.rpc
        from gosim import net

        async def main():
            ln = net.listen("tcp", "127.0.0.1:0")
            server = netframe.Server(lambda payload: payload)
            gosim.go(server.serve, ln)
            await gosim.sleep(0.05)
            await server.shutdown(0)

        gosim.run(main)
        print(json.dumps(sorted({m.split(".")[0] for m in sys.modules} & {"numba", "numpy"})))
        """
    )
    assert json.loads(out) == []


def test_numba_loads_with_the_first_kernel_module() -> None:
    out = run_python(
        """
        import sys
        import gosim.jit
        before = "numba" in sys.modules
        import gosim.atomic
        print(before, "numba" in sys.modules)
        """
    )
    assert out == "False True"
