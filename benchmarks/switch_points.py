"""Count the import-time C-or-Python switch points of gosim, netframe and idempotency.

``python -m benchmarks.switch_points [PATH ...]`` prints, for every module with any, its
count of each kind and the total, then the total over all; without paths it reads
``gosim/``, ``netframe/`` and ``idempotency/`` beside this directory. The source is read
with :mod:`ast`, never executed.

What is counted, in *import-level code* only: a module's body and the bodies of the
classes in it (which run when the module is imported), through ``if``/``else``,
``try``/``except``/``else``/``finally`` and ``with`` blocks, but not inside a function or
lambda (code that runs when called, not when imported).

An *accelerator name* is a name a module imports under the name ``speedups`` or
``C_ENABLED`` (``from .._accel import speedups as _speedups``, ``from gosim._internals
import speedups``: the loaded C extension, or None, and whether it is in use), a name
assigned such an attribute of a module (``_speedups = _accel.speedups``), or a *flag*
derived from one: a name assigned, at import level, a comparison, an
``and``/``or``/``not`` expression or a ``bool(...)`` call that reads an accelerator name
(``_C_TWINS = _speedups is not None and ...``).

* **branch**: an ``if`` statement (an ``elif`` is one of its own) or a conditional
  expression (``A if test else B``) whose test reads an accelerator name: one place where
  the import chooses between a C object and a Python one. The ``configure_*`` calls and
  rebinds inside it belong to it and are not counted again.
* **patch**: a ``setattr`` or ``delattr`` call, at import level, that reads an accelerator
  name in its arguments or sits in a counted branch: a class (or module) modified after
  its definition to swap an implementation.

A flag's own assignment is not counted (it chooses nothing; the branches that read it
do), and neither are the accelerator loaders' (``_accel.py``) tests of the environment,
which decide whether there is an accelerator, not which object a name is bound to.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ACCELERATOR_IMPORTS", "Counts", "count_file", "count_source", "main"]

#: The imported names that are accelerators (before any ``as``).
ACCELERATOR_IMPORTS = frozenset({"speedups", "C_ENABLED"})

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("gosim", "netframe", "idempotency")


@dataclass(frozen=True)
class Counts:
    """A module's switch points, by kind (see the module docstring)."""

    branches: int = 0
    patches: int = 0

    @property
    def total(self) -> int:
        return self.branches + self.patches

    def __add__(self, other: Counts) -> Counts:
        return Counts(self.branches + other.branches, self.patches + other.patches)


def _reads(node: ast.AST, names: set[str]) -> bool:
    """Whether ``node`` reads any of ``names``."""
    return any(isinstance(n, ast.Name) and n.id in names for n in ast.walk(node))


def _is_flag_value(value: ast.expr) -> bool:
    if isinstance(value, ast.Compare | ast.BoolOp):
        return True
    if isinstance(value, ast.UnaryOp) and isinstance(value.op, ast.Not):
        return True
    return (
        isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "bool"
    )


def _expressions(stmt: ast.stmt) -> Iterator[ast.AST]:
    """The expressions ``stmt`` itself evaluates at import (not its nested statements,
    nor a function's body)."""
    if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef):
        return  # runs when called
    if isinstance(stmt, ast.ClassDef):
        yield from stmt.bases
        yield from (k.value for k in stmt.keywords)
        yield from stmt.decorator_list
        return
    for name, value in ast.iter_fields(stmt):
        if name in ("body", "orelse", "handlers", "finalbody"):
            continue
        items = value if isinstance(value, list) else [value]
        yield from (v for v in items if isinstance(v, ast.AST))


def _import_level(body: Iterable[ast.stmt]) -> Iterator[ast.stmt]:
    """Every import-level statement under ``body``, in source order."""
    for stmt in body:
        yield stmt
        if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for field in ("body", "orelse", "finalbody"):
            yield from _import_level(getattr(stmt, field, []))
        for handler in getattr(stmt, "handlers", []):
            yield from _import_level(handler.body)


def _walk_expr(node: ast.AST) -> Iterator[ast.AST]:
    """``ast.walk`` that does not enter a lambda's body."""
    stack = [node]
    while stack:
        n = stack.pop()
        yield n
        if isinstance(n, ast.Lambda):
            continue
        stack.extend(ast.iter_child_nodes(n))


def count_source(source: str) -> Counts:
    """The switch points of one module's source (see the module docstring)."""
    tree = ast.parse(source)
    stmts = list(_import_level(tree.body))
    names: set[str] = set()
    for stmt in stmts:
        if isinstance(stmt, ast.ImportFrom):
            names |= {a.asname or a.name for a in stmt.names if a.name in ACCELERATOR_IMPORTS}
    # Names assigned a module's accelerator, and flags, in source order (a flag may be
    # derived from another).
    for stmt in stmts:
        if isinstance(stmt, ast.Assign | ast.AnnAssign) and stmt.value is not None:
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            value = stmt.value
            if (isinstance(value, ast.Attribute) and value.attr in ACCELERATOR_IMPORTS) or (
                _is_flag_value(value) and _reads(value, names)
            ):
                names |= {t.id for t in targets if isinstance(t, ast.Name)}
    branches = patches = 0
    in_branch: set[int] = set()  # ids of statements inside a counted if
    for stmt in stmts:
        if isinstance(stmt, ast.If) and _reads(stmt.test, names):
            branches += 1
            for field in ("body", "orelse"):
                in_branch |= {id(s) for s in _import_level(getattr(stmt, field))}
        for expr in _expressions(stmt):
            for node in _walk_expr(expr):
                if isinstance(node, ast.IfExp) and _reads(node.test, names):
                    branches += 1
                elif (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Name)
                    and node.func.id in ("setattr", "delattr")
                    and (id(stmt) in in_branch or any(_reads(a, names) for a in node.args))
                ):
                    patches += 1
    return Counts(branches, patches)


def count_file(path: Path) -> Counts:
    """:func:`count_source` of the file at ``path``."""
    return count_source(path.read_text(encoding="utf-8"))


def main(argv: list[str] | None = None) -> int:
    """Print the counts per module with any, and the total."""
    args = sys.argv[1:] if argv is None else argv
    roots = [Path(a) for a in args] or [ROOT / p for p in PACKAGES]
    files = sorted(f for r in roots for f in (r.rglob("*.py") if r.is_dir() else [r]))
    total = Counts()
    print(f"{'branches':>8} {'patches':>7} {'total':>5}  module")
    for f in files:
        c = count_file(f)
        if c.total:
            name = f.relative_to(ROOT) if f.is_relative_to(ROOT) else f
            print(f"{c.branches:>8} {c.patches:>7} {c.total:>5}  {name}")
        total += c
    print(f"{total.branches:>8} {total.patches:>7} {total.total:>5}  total ({len(files)} files)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
