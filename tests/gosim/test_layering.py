"""The core is reached through one door: ``gosim.lowlevel`` (and the exceptions module).

Every module of gosim outside ``gosim/_core``, and of netframe and idempotency, is
parsed; an import of ``gosim._core`` or any module under it, other than
``gosim._core._exceptions`` and other than in ``gosim/lowlevel.py`` itself, fails the
test with the file and line. The core's own modules import nothing above the core.

The same rule holds for every package, not only the core: a private name (one that
starts with an underscore) of a package, ``pkg._x``, is imported only from inside
``pkg``. Packages above gosim use its public modules (``gosim.jit``, ``gosim.lowlevel``),
and a module of ``idempotency`` outside ``idempotency.stores`` uses ``idempotency.stores``,
not its ``_contract``.
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ALLOWED = {"gosim._core._exceptions"}
DOOR = ROOT / "gosim" / "lowlevel.py"
#: gosim's own packages' door to the runtime's records and traps (private to gosim).
INSIDE_DOOR = ROOT / "gosim" / "_internals.py"
LAYERS = ("gosim", "netframe", "idempotency")


def _imports(path: Path, source: str | None = None) -> list[tuple[int, str]]:
    """(line, module) for every import in path (or in source, read as if at path),
    ``from . import x`` resolved."""
    text = path.read_text() if source is None else source
    tree = ast.parse(text, filename=str(path))
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = node.module or ""
            found.append((node.lineno, module))
            # `from gosim._core import _sched` names a core module too.
            found.extend((node.lineno, f"{module}.{alias.name}") for alias in node.names)
    return found


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_package(name: str) -> bool:
    parts = name.split(".")
    if parts[0] in LAYERS:
        return (ROOT / Path(*parts)).is_dir()
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return False
    return spec is not None and spec.submodule_search_locations is not None


def _private_owners(module: str) -> list[str]:
    """The packages that own a private part of ``module``: for ``a._b._c``, ``a`` (which
    owns ``_b``) and ``a._b`` (which owns ``_c``). A module's private name belongs to the
    module's package (its siblings may share it). Dunder names are not private."""
    parts = module.split(".")
    owners = []
    for i, part in enumerate(parts):
        if i and part.startswith("_") and not (part.startswith("__") and part.endswith("__")):
            owner = ".".join(parts[:i])
            owners.append(owner if _is_package(owner) else ".".join(parts[: i - 1]))
    return owners


def _is_door(importer: str, module: str) -> bool:
    # The documented doors: the exceptions module is open to all, and gosim.lowlevel
    # (functions and primitives, for everyone) and gosim._internals (the records and
    # traps, for gosim's own packages) are the modules outside the core that import the
    # rest of it.
    if any(module == ok or module.startswith(ok + ".") for ok in ALLOWED):
        return True
    return importer in ("gosim.lowlevel", "gosim._internals") and _is_core(module)


def _reaches_into(importer: str, module: str) -> bool:
    """True when ``importer`` imports a private name of a package it is not inside."""
    return not _is_door(importer, module) and any(
        importer != owner and not importer.startswith(owner + ".")
        for owner in _private_owners(module)
    )


def _outside_core() -> list[Path]:
    files: list[Path] = []
    for top in ("gosim", "netframe", "idempotency"):
        for path in sorted((ROOT / top).rglob("*.py")):
            if (ROOT / "gosim" / "_core") in path.parents or path in (DOOR, INSIDE_DOOR):
                continue
            files.append(path)
    return files


def _is_core(module: str) -> bool:
    return module == "gosim._core" or module.startswith("gosim._core.")


def test_nothing_outside_the_core_imports_its_privates() -> None:
    files = _outside_core()
    assert len(files) > 20  # the walk found the layers (gosim, netframe, idempotency)
    bad = [
        f"{path.relative_to(ROOT)}:{line}: imports {module}"
        for path in files
        for line, module in _imports(path)
        if _is_core(module)
        and module not in ALLOWED
        # `from gosim._core._exceptions import X` also yields "..._exceptions.X".
        and not any(module.startswith(ok + ".") for ok in ALLOWED)
    ]
    assert not bad, "import the core through gosim.lowlevel:\n" + "\n".join(bad)


def test_the_core_imports_nothing_above_it() -> None:
    bad = [
        f"{path.relative_to(ROOT)}:{line}: imports {module}"
        for path in sorted((ROOT / "gosim" / "_core").glob("*.py"))
        for line, module in _imports(path)
        if module.split(".")[0] in ("gosim", "netframe", "idempotency") and not _is_core(module)
    ]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize(
    "source",
    [
        "from gosim._core import _runtime\n",
        "from gosim._core._state import _state\n",
        "import gosim._core._runq\n",
        "from .._core import _g\n",
    ],
)
def test_the_check_sees_each_form_of_import(source: str) -> None:
    # The parser above must catch every spelling, or the first test could not fail.
    found = _imports(ROOT / "gosim" / "sync" / "_probe.py", source)
    assert any(_is_core(m) and m not in ALLOWED for _, m in found)


def _all_modules() -> list[Path]:
    return [path for top in LAYERS for path in sorted((ROOT / top).rglob("*.py"))]


def test_no_module_imports_a_private_name_of_a_package_it_is_not_in() -> None:
    files = _all_modules()
    assert len(files) > 20
    bad = [
        f"{path.relative_to(ROOT)}:{line}: imports {module}"
        for path in files
        for line, module in _imports(path)
        if _reaches_into(_module_name(path), module)
    ]
    assert not bad, "import a package's public modules from outside it:\n" + "\n".join(bad)


@pytest.mark.parametrize(
    ("importer", "source"),
    [
        ("netframe/_kernels.py", "from gosim._numba import kernel\n"),
        ("netframe/_kernels.py", "import gosim._chan\n"),
        ("netframe/_kernels.py", "from gosim import _chan\n"),
        ("idempotency/_idempotency.py", "from .stores._contract import deliver\n"),
        ("idempotency/demo/_sim.py", "from ..stores import _contract\n"),
        ("gosim/_chan.py", "from gosim._core import _runq\n"),
        ("gosim/_chan.py", "from trio._core import _run\n"),
        ("netframe/_server.py", "from gosim import _internals\n"),
        ("idempotency/_idempotency.py", "from gosim._internals import state\n"),
    ],
)
def test_the_general_check_sees_a_reach_into_another_package(importer: str, source: str) -> None:
    path = ROOT / importer
    assert any(_reaches_into(_module_name(path), m) for _, m in _imports(path, source))


@pytest.mark.parametrize(
    ("importer", "source"),
    [
        ("gosim/_chan.py", "from gosim._core._exceptions import NotInRuntime\n"),
        ("netframe/_kernels.py", "from gosim._core._exceptions import NotInRuntime\n"),
        ("gosim/lowlevel.py", "from gosim._core._g import G\n"),
        ("gosim/_select.py", "from gosim._chan import Chan\n"),
        ("gosim/_core/_runtime.py", "from gosim._core._state import _trap\n"),
        ("netframe/_server.py", "from ._conn import _send_data\n"),
        ("idempotency/stores/__init__.py", "from ._contract import Store\n"),
        ("gosim/__init__.py", "from __future__ import annotations\n"),
        ("netframe/_kernels.py", "from gosim.jit import kernel\n"),
    ],
)
def test_the_general_check_lets_insiders_and_doors_through(importer: str, source: str) -> None:
    path = ROOT / importer
    assert not any(_reaches_into(_module_name(path), m) for _, m in _imports(path, source))


# ---------------------------------------------------------------- the door's width

#: The types gosim.lowlevel hands out: the waiting primitive and its parts, the
#: runtime timer, a per-runtime variable, the netpoller's protocol, and the enum and
#: errors of a wait. Anything else it hands out must be a function (trio's lowlevel hands out
#: functions and primitives, never the Runner): the runtime's records (``state``,
#: ``G``, ``Runtime``, ``Sudog``) and its traps are gosim's own packages' only.
PRIMITIVES = {
    "NetPoller",
    "ParkingLot",
    "ParkingLotStatistics",
    "RuntimeTimer",
    "RuntimeVar",
    "ThreadWake",
    "WaitCancelled",
    "WaitReason",
    "WaitTimeout",
    "Waiter",
}


def _lowlevel_names(path: Path, source: str | None = None) -> list[tuple[int, str]]:
    """(line, name) for every name taken from gosim.lowlevel in path: ``lowlevel.X``
    (the module imported as ``lowlevel`` or under another name) and
    ``from gosim.lowlevel import X``."""
    text = path.read_text() if source is None else source
    tree = ast.parse(text, filename=str(path))
    aliases: set[str] = set()
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "gosim":
            aliases.update(a.asname or a.name for a in node.names if a.name == "lowlevel")
        elif isinstance(node, ast.ImportFrom) and node.module == "gosim.lowlevel":
            found.extend((node.lineno, a.name) for a in node.names)
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name == "gosim.lowlevel" and a.asname:
                    aliases.add(a.asname)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            base = node.value
            if (isinstance(base, ast.Name) and base.id in aliases) or (  # gosim.lowlevel.X
                isinstance(base, ast.Attribute)
                and base.attr == "lowlevel"
                and isinstance(base.value, ast.Name)
                and base.value.id == "gosim"
            ):
                found.append((node.lineno, node.attr))
    return found


def _door_allows(name: str) -> bool:
    from gosim import lowlevel  # noqa: PLC0415

    if name in PRIMITIVES:
        return True
    obj = getattr(lowlevel, name, None)
    # A wait reason's member (WAIT_SLEEP, ...) is a value of a primitive; an exception
    # class (NotInRuntime) is what a function raises.
    if isinstance(obj, lowlevel.WaitReason) or (
        isinstance(obj, type) and issubclass(obj, BaseException)
    ):
        return True
    return inspect.isfunction(obj) or inspect.isbuiltin(obj)


def _handed_out() -> list[str]:
    """Every public name of gosim.lowlevel: its ``__all__`` and any other attribute
    without an underscore that is not a module or a typing helper it imported."""
    import types  # noqa: PLC0415

    from gosim import lowlevel  # noqa: PLC0415

    names = set(lowlevel.__all__)
    for name, obj in vars(lowlevel).items():
        if not name.startswith("_") and not isinstance(obj, types.ModuleType):
            names.add(name)
    return sorted(names - {"annotations", "TYPE_CHECKING", "Any", "Awaitable", "Callable"})


def test_lowlevel_hands_out_only_functions_and_primitives() -> None:
    # The door itself, not only its users: the runtime's records (state, G, Sudog,
    # Runtime), its traps and the C accelerator are gosim._internals', so no code above
    # gosim -- a user's extension included -- can reach them through a public module.
    names = _handed_out()
    assert {"park", "ready", "Waiter", "ParkingLot"} <= set(names)
    bad = [name for name in names if not _door_allows(name)]
    assert not bad, f"gosim.lowlevel hands out more than functions and primitives: {bad}"


def test_gosim_internals_holds_what_lowlevel_no_longer_hands_out() -> None:
    from gosim import _internals, lowlevel  # noqa: PLC0415

    for name in ("state", "trap", "PARK", "G", "Sudog", "Runtime", "speedups"):
        assert hasattr(_internals, name)
        assert not hasattr(lowlevel, name), name


def test_upper_layers_take_only_functions_and_primitives_from_lowlevel() -> None:
    files = [
        path for top in ("netframe", "idempotency") for path in sorted((ROOT / top).rglob("*.py"))
    ]
    assert len(files) > 20
    bad = [
        f"{path.relative_to(ROOT)}:{line}: gosim.lowlevel.{name}"
        for path in files
        for line, name in _lowlevel_names(path)
        if not _door_allows(name)
    ]
    assert not bad, (
        "netframe and idempotency take only functions and the waiting primitives from "
        "gosim.lowlevel, not the runtime's records:\n" + "\n".join(bad)
    )


@pytest.mark.parametrize(
    "source",
    [
        "from gosim import lowlevel\nrt = lowlevel.state.rt\n",
        "from gosim import lowlevel as ll\ng: ll.G\n",
        "from gosim.lowlevel import state\n",
        "from gosim.lowlevel import Runtime as R\n",
        "import gosim\nx = gosim.lowlevel.state\n",
        "import gosim.lowlevel as ll\nll.trap(ll.PARK)\n",
    ],
)
def test_the_door_check_sees_each_way_to_a_runtime_field(source: str) -> None:
    found = _lowlevel_names(ROOT / "netframe" / "_probe.py", source)
    assert found and not all(_door_allows(name) for _, name in found)


@pytest.mark.parametrize(
    "source",
    [
        "from gosim import lowlevel\nw = lowlevel.Waiter()\nlowlevel.current_runtime()\n",
        "from gosim.lowlevel import Waiter, WaitReason, add_timer\n",
    ],
)
def test_the_door_check_lets_functions_and_primitives_through(source: str) -> None:
    found = _lowlevel_names(ROOT / "netframe" / "_probe.py", source)
    assert found and all(_door_allows(name) for _, name in found)
