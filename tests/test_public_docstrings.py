"""``help()`` shows the same, real docstring whichever implementation runs.

Several public names are C objects when the accelerators are built (``gosim.select``,
``gosim.Chan`` and its methods, ``idempotency.fingerprint``, ...) and pure-Python ones
under ``GOSIM_PURE_PYTHON=1``. setup.py copies each pure-Python reference's docstring
into its C twin; this test walks every public name of the packages (their ``__all__``,
and the public methods and properties of the public classes) in a fresh interpreter per
mode and holds the two to the same ``inspect.getdoc()``, which must not be empty or a
pointer elsewhere ("(see gosim._select.select)"), and to the same parameter names where
both have a signature.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: The public modules whose ``__all__`` the walk reads.
MODULES = (
    "gosim",
    "gosim.lowlevel",
    "gosim.sync",
    "gosim.context",
    "gosim.net",
    "gosim.time",
    "gosim.atomic",
    "gosim.spin",
    "gosim.mem",
    "gosim.testing",
    "gosim.jit",
    "netframe",
    "netframe.lowlevel",
    "idempotency",
    "idempotency.rpc",
    "idempotency.stores",
)

# Run in a fresh interpreter: prints {name: [doc, parameter names or None, kind]} as JSON.
_WALK = r"""
import importlib, inspect, json, sys

PACKAGES = ("gosim", "netframe", "idempotency")

def ours(obj):
    return (getattr(obj, "__module__", None) or "").split(".")[0] in PACKAGES

def params(obj):
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return None
    return [p.name for p in sig.parameters.values()]

out = {}
for modname in sys.argv[1:]:
    mod = importlib.import_module(modname)
    for name in mod.__all__:
        obj = getattr(mod, name)
        if not (inspect.isroutine(obj) or inspect.isclass(obj)) or not ours(obj):
            continue  # constants, type aliases, a re-exported stdlib name
        out[f"{modname}.{name}"] = [inspect.getdoc(obj), params(obj), type(obj).__name__]
        if not inspect.isclass(obj):
            continue
        for attr in dir(obj):
            owner = next((k for k in obj.__mro__ if attr in vars(k)), None)
            if attr.startswith("_") or not ours(owner):
                continue  # private, or inherited from a builtin (BaseException.args)
            try:
                static = inspect.getattr_static(obj, attr)
            except AttributeError:
                continue
            if isinstance(static, (staticmethod, classmethod)):
                static = static.__func__
            kind = type(static).__name__
            value = getattr(obj, attr)
            if kind in ("property", "getset_descriptor"):
                out[f"{modname}.{name}.{attr}"] = [inspect.getdoc(static), None, kind]
            elif inspect.isroutine(value) and not inspect.isclass(value):
                out[f"{modname}.{name}.{attr}"] = [
                    inspect.getdoc(value),
                    params(value),
                    type(static).__name__,
                ]
print(json.dumps(out))
"""

# A stub: nothing, or only a pointer to another object.
_POINTER = re.compile(r"^\s*see\b|\(see (?:gosim|netframe|idempotency)\.[\w.]+\)", re.I)


def _walk(pure: bool) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k != "GOSIM_PURE_PYTHON"}
    if pure:
        env["GOSIM_PURE_PYTHON"] = "1"
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [sys.executable, "-c", _WALK, *MODULES],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    walked: dict[str, Any] = json.loads(proc.stdout)
    return walked


def _is_stub(doc: str | None) -> bool:
    return not doc or not doc.strip() or (len(doc.splitlines()) == 1 and bool(_POINTER.search(doc)))


@pytest.fixture(scope="module")
def modes() -> tuple[dict[str, Any], dict[str, Any]]:
    for ext in ("gosim._speedups", "netframe._speedups", "idempotency._speedups"):
        if importlib.util.find_spec(ext) is None:
            pytest.skip(f"{ext} is not built: there is no C mode to compare with")
    return _walk(pure=False), _walk(pure=True)


def test_the_walk_sees_the_c_twins(modes: tuple[dict[str, Any], dict[str, Any]]) -> None:
    # The walk is worth something only if it reaches the names that are C objects.
    c_mode, pure = modes
    for name in ("gosim.select", "gosim.Chan.send", "idempotency.fingerprint"):
        assert name in c_mode and name in pure


def test_every_public_docstring_is_real(modes: tuple[dict[str, Any], dict[str, Any]]) -> None:
    c_mode, pure = modes
    # A C field whose pure-Python twin is a slot (Waiter.data) has no docstring to copy.
    c_only_fields = {n for n, (_, _, kind) in c_mode.items() if kind == "getset_descriptor"}
    stubs = sorted(
        f"{name} ({mode}): {doc!r}"
        for mode, walked in (("C", c_mode), ("pure", pure))
        for name, (doc, _, _) in walked.items()
        if _is_stub(doc) and not (mode == "C" and name in c_only_fields - pure.keys())
    )
    assert not stubs, "public names without a real docstring:\n" + "\n".join(stubs)


def test_docstrings_are_the_same_in_both_modes(
    modes: tuple[dict[str, Any], dict[str, Any]],
) -> None:
    c_mode, pure = modes
    differ = [
        f"{name}:\n  C:    {c_mode[name][0]!r}\n  pure: {pure[name][0]!r}"
        for name in sorted(c_mode.keys() & pure.keys())
        if c_mode[name][0] != pure[name][0]
    ]
    assert not differ, (
        "docstrings that depend on the implementation (a C one stale: rebuild with "
        "setup.py build_ext):\n" + "\n".join(differ)
    )


def test_signatures_name_the_same_parameters(
    modes: tuple[dict[str, Any], dict[str, Any]],
) -> None:
    c_mode, pure = modes
    differ = [
        f"{name}: C {c_mode[name][1]} != pure {pure[name][1]}"
        for name in sorted(c_mode.keys() & pure.keys())
        if c_mode[name][1] is not None
        and pure[name][1] is not None
        and c_mode[name][1] != pure[name][1]
    ]
    assert not differ, "\n".join(differ)
    # The hot C functions carry a text signature, so inspect.signature answers for them.
    for name in ("gosim.select", "gosim.go", "gosim.recv", "gosim.send", "gosim.Chan.send"):
        assert c_mode[name][1] is not None and c_mode[name][1] == pure[name][1], name


def test_the_hot_c_functions_are_not_wrapped(modes: tuple[dict[str, Any], dict[str, Any]]) -> None:
    # The docstrings are the C objects' own: no Python wrapper (and its frame) stands
    # between a caller and the C select, go or channel operation.
    c_mode, _ = modes
    for name in ("gosim.select", "gosim.go", "gosim.recv", "gosim.send"):
        assert c_mode[name][2] == "builtin_function_or_method", name
    for name in ("gosim.Chan.send", "gosim.Chan.recv", "gosim.Chan.try_send"):
        assert c_mode[name][2] == "method_descriptor", name
