"""A griffe extension for the reference: the docstrings' reST roles as Markdown code.

The docstrings are read in the terminal and by ``help()`` as well as on the site, and
they name other objects the reST way (``:class:`~idempotency.rpc.Status```). Markdown has
no roles, so the site would show ``:class:`` before the name; this turns each role into
the code span it stands for (the last component with ``~``, as Sphinx shows it). The
sources stay as they are.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:py:)?(?:class|meth|func|data|mod|attr|exc|obj|const):`(~?)([^`]+)`")


def _code(match: re.Match[str]) -> str:
    short, target = match.group(1), match.group(2)
    if short:
        target = target.rsplit(".", 1)[-1]
    return f"`{target}`"


def _rewrite(obj: griffe.Object) -> None:
    if obj.docstring is not None:
        obj.docstring.value = _ROLE.sub(_code, obj.docstring.value)


class SphinxRoles(griffe.Extension):
    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        _rewrite(obj)

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        # The top package's own docstring: visited here rather than as an object.
        _rewrite(pkg)
