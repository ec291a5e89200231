"""benchmarks/switch_points.py: what it counts as an import-time C-or-Python switch point."""

from __future__ import annotations

import textwrap

from benchmarks.switch_points import Counts, count_source

SOURCE = textwrap.dedent(
    """
    from typing import TYPE_CHECKING
    from .._accel import speedups as _speedups
    from other import speedy  # not an accelerator name

    _FLAG = _speedups is not None and bool(_speedups.fits())  # a flag: not counted itself
    _ALIAS = _speedups.thing  # bound, not chosen: not counted

    def ref(x):
        if _speedups is not None:  # in a function: runs when called, not counted
            return _speedups.f(x) if x else None
        return x

    if _speedups is not None:  # 1 branch
        _speedups.configure_f(ref=ref)
        ref = _speedups.f

    f2 = _speedups.g if _speedups is not None else ref  # 2
    f3 = speedy.g if speedy is not None else ref  # another module: not counted
    picked = (lambda: _speedups.h if _FLAG else ref)  # in a lambda: not counted

    class A:
        if TYPE_CHECKING or not _FLAG:  # 3: a class body runs at import
            def m(self): ...
        else:
            m = _speedups.m

    try:
        import zlib
    except ImportError:
        zlib = None
    else:
        if _FLAG:  # 4
            setattr(A, "n", _speedups.n)  # patch 1
            delattr(A, "m")  # patch 2: in a counted branch
        elif zlib:  # an elif is an if of its own; this one reads no accelerator
            pass

    setattr(A, "o", ref)  # reads no accelerator and sits in no branch: not counted
    """
)


def test_branches_and_patches_of_a_synthetic_module() -> None:
    assert count_source(SOURCE) == Counts(branches=4, patches=2)


def test_a_flag_derives_from_a_flag_and_an_accel_attribute_is_a_name() -> None:
    source = textwrap.dedent(
        """
        from . import _accel
        _c = _accel.speedups
        _ON = _c is not None
        _BOTH = not _ON
        x = 1 if _BOTH else 2
        if _accel:  # the module itself is not an accelerator name
            pass
        """
    )
    assert count_source(source) == Counts(branches=1, patches=0)


def test_c_enabled_is_an_accelerator_name_under_any_alias() -> None:
    source = "from x import C_ENABLED as on\nif on:\n    pass\nelif on is None:\n    pass\n"
    assert count_source(source) == Counts(branches=2, patches=0)
    assert count_source(source).total == 2


def test_a_module_without_an_accelerator_has_none() -> None:
    assert count_source("speedups = None\nif speedups is None:\n    x = 1\n") == Counts()
