"""``python -m gosim.testing replay module:function PLAN [--invariant module:function]``.

Runs the program (an async function of no arguments, or a test made with
``gosim.testing.explored``) under the plan an exploration printed, and ends as the run
does: the failure's message on stderr and exit status 1, or exit status 0 if it passed.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Any

from ._explore import run_plan
from ._plan import Plan


def _resolve(spec: str) -> Any:
    module, sep, qualname = spec.partition(":")
    if not sep or not module or not qualname:
        raise SystemExit(f"gosim.testing: want module:function, got {spec!r}")
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise SystemExit(f"gosim.testing: {module} has no {qualname}") from None
    return getattr(obj, "__gosim_program__", obj)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gosim.testing")
    sub = parser.add_subparsers(dest="command", required=True)
    rp = sub.add_parser("replay", help="run a program under a plan that exploration printed")
    rp.add_argument("program", help="module:function, an async function of no arguments")
    rp.add_argument("plan", help="the plan (v1.…)")
    rp.add_argument("--invariant", help="module:function checked on main's result")
    a = parser.parse_args(argv)
    sys.path.insert(0, "")  # the program's module is found from here, as python -m does
    program = _resolve(a.program)
    invariant = _resolve(a.invariant) if a.invariant else None
    try:
        plan = Plan.decode(a.plan)
    except ValueError as exc:
        print(f"gosim.testing: {exc}", file=sys.stderr)
        return 2
    # The run's failure is whatever escaped a goroutine (its crash report printed), the
    # deadlock or the invariant's refusal: each the program's, so exit 1.
    failure = run_plan(program, plan, invariant).failure
    if failure is not None:
        print(failure.message, file=sys.stderr)
        return 1
    print("the run passed", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
