"""The size of the house's rooms, checked on the source: no source file over 1,200
lines (Python or C), and no function in ``idempotency/`` taking more than 8 parameters
positionally (``self`` counted; keyword-only options are not).

A file past the bound is a room that holds more than one thing; a function with that
many positional parameters is state that wants an object of its own (a keyed call's
steps once took 13, threaded through partials). Each check is tested on a small source
of its own, so neither can pass by reading nothing.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("gosim", "netframe", "idempotency")
MAX_LINES = 1200
MAX_POSITIONAL = 8


def _sources() -> list[Path]:
    found = []
    for package in PACKAGES:
        for pattern in ("*.py", "*.c", "*.h"):
            found += (ROOT / package).rglob(pattern)
    return sorted(found)


def long_rooms(paths: list[Path]) -> list[tuple[str, int]]:
    """The files of ``paths`` over MAX_LINES lines, with their lengths."""
    over = []
    for path in paths:
        n = len(path.read_text(encoding="utf-8").splitlines())
        if n > MAX_LINES:
            over.append((str(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path), n))
    return over


def wide_functions(source: str) -> list[tuple[str, int]]:
    """The functions of ``source`` taking more than MAX_POSITIONAL parameters
    positionally (``self`` included), with their counts."""
    wide = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            n = len(node.args.posonlyargs) + len(node.args.args)
            if n > MAX_POSITIONAL:
                wide.append((node.name, n))
    return wide


def test_no_source_room_is_over_its_bound() -> None:
    paths = _sources()
    assert len(paths) > 100  # the packages' sources were found
    assert long_rooms(paths) == []


def test_no_idempotency_function_takes_more_than_eight_positionally() -> None:
    wide = {}
    for path in sorted((ROOT / "idempotency").rglob("*.py")):
        found = wide_functions(path.read_text(encoding="utf-8"))
        if found:
            wide[str(path.relative_to(ROOT))] = found
    assert wide == {}


def test_the_room_check_counts_lines(tmp_path: Path) -> None:
    short, long = tmp_path / "short.py", tmp_path / "long.c"
    short.write_text("x = 1\n" * MAX_LINES)
    long.write_text("int x;\n" * (MAX_LINES + 1))
    assert long_rooms([short, long]) == [(str(long), MAX_LINES + 1)]


def test_the_width_check_counts_positional_parameters_only() -> None:
    source = """
class C:
    def nine(self, a, b, c, d, e, f, g, h): ...
    def eight(self, a, b, c, d, e, f, g, *, h, i, j): ...
async def nine_too(a, b, c, d, e, f, g, h, /, i): ...
def star(*args, **kwargs): ...
"""
    assert sorted(wide_functions(source)) == [("nine", 9), ("nine_too", 9)]
