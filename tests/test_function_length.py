"""No function of the packages runs over ``MAX_LINES`` lines.

A function is counted from its ``def`` line (decorators aside) through its last line,
docstring and comments included: ``end_lineno - lineno + 1`` of its ``ast`` node. Every
function and method of ``gosim``, ``netframe`` and ``idempotency`` is walked, nested ones
too, under a dotted name (``Class.method``, ``outer.inner``). A long function on a keyed
call's path is split into helpers that each do one thing. Those listed in ``ALLOWED``
are not on that path and stay long for the reason given beside them.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("gosim", "netframe", "idempotency")
MAX_LINES = 80

_TESTING_TOOL = (
    "gosim.testing's linearizability checker, run by tests, not by a call: one search "
    "whose state (the event list, the cache, the undo stack) lives in its locals"
)
_DEMO = "the demo's command-line driver (python -m idempotency.demo), not a library call"

#: ``"path:qualified.name"``: why it stays over MAX_LINES. Not on a keyed call's path.
ALLOWED: dict[str, str] = {
    "gosim/testing/_linearizability.py:_search": _TESTING_TOOL,
    "gosim/testing/_linearizability.py:_minimize": _TESTING_TOOL,
    "idempotency/demo/__main__.py:main": _DEMO,
    "idempotency/demo/_audit.py:audit": _DEMO,
    "idempotency/demo/_clients.py:run_fleet": _DEMO,
    "idempotency/demo/_run.py:run": _DEMO,
    "idempotency/demo/_run.py:_Conductor.conduct": _DEMO,
    "idempotency/demo/_run.py:_Conductor.report": _DEMO,
    "idempotency/demo/_sim.py:run_simulation": _DEMO,
    "idempotency/demo/_sim.py:run_simulation.system": _DEMO,
}


def _functions(tree: ast.AST, prefix: str = "") -> list[tuple[str, int, int]]:
    """(qualified name, first line, line count) of every function under tree."""
    found: list[tuple[str, int, int]] = []
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            name = prefix + node.name
            assert node.end_lineno is not None
            found.append((name, node.lineno, node.end_lineno - node.lineno + 1))
            found.extend(_functions(node, name + "."))
        elif isinstance(node, ast.ClassDef):
            found.extend(_functions(node, prefix + node.name + "."))
        else:
            found.extend(_functions(node, prefix))
    return found


def _long_functions(source: str, path: str) -> dict[str, tuple[int, int]]:
    """``"path:name"`` -> (first line, line count) for each function over MAX_LINES."""
    tree = ast.parse(source, filename=path)
    return {
        f"{path}:{name}": (line, count)
        for name, line, count in _functions(tree)
        if count > MAX_LINES
    }


def _all_long_functions() -> dict[str, tuple[int, int]]:
    found: dict[str, tuple[int, int]] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            found.update(_long_functions(path.read_text(), rel))
    return found


def test_no_function_is_over_the_limit() -> None:
    over = {k: v for k, v in _all_long_functions().items() if k not in ALLOWED}
    assert not over, "functions over {} lines (split them): {}".format(
        MAX_LINES,
        ", ".join(f"{k} (line {line}: {n} lines)" for k, (line, n) in sorted(over.items())),
    )


def test_every_allowed_function_is_still_long() -> None:
    # An entry whose function was split or renamed is dropped, so the list stays short.
    long = _all_long_functions()
    assert [k for k in ALLOWED if k not in long] == []


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("def f():\n" + "    x = 1\n" * 79, {}),
        ("def f():\n" + "    x = 1\n" * 80, {"m.py:f": (1, 81)}),
        (
            "class C:\n    async def m(self):\n" + "        x = 1\n" * 80,
            {"m.py:C.m": (2, 81)},
        ),
        (
            "def outer():\n    def inner():\n" + "        x = 1\n" * 80,
            {"m.py:outer": (1, 82), "m.py:outer.inner": (2, 81)},
        ),
        ('def f():\n    """' + "doc\n" * 80 + '"""\n', {"m.py:f": (1, 82)}),
    ],
)
def test_the_check_counts_def_through_last_line(
    source: str, expected: dict[str, tuple[int, int]]
) -> None:
    assert _long_functions(source, "m.py") == expected
