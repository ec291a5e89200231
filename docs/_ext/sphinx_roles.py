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


_MODULE_DOCSTRING = re.compile(r"\bthe module docstring\b")


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def literal_blocks_to_fences(text: str) -> str:
    """``text`` with each reST literal block as a fenced ``python`` block."""
    lines = text.split("\n")
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        if not line.rstrip().endswith("::"):
            out.append(line)
            continue
        head = line.rstrip()[:-2]
        if head.strip():
            out.append(head.rstrip() if head.endswith(" ") else head + ":")
        # the block: blank lines, then every line indented deeper than the paragraph
        start = i
        while i < len(lines) and not lines[i].strip():
            i += 1
        body: list[str] = []
        while i < len(lines) and (not lines[i].strip() or _indent(lines[i]) > _indent(line)):
            body.append(lines[i])
            i += 1
        while body and not body[-1].strip():
            body.pop()
            i -= 1
        if not body:
            out.extend(lines[start:i])
            continue
        depth = min(_indent(b) for b in body if b.strip())
        pad = " " * _indent(line)
        out.extend(["", pad + "```python", *(pad + b[depth:] for b in body), pad + "```"])
    return "\n".join(out)


def _rewrite(obj: griffe.Object) -> None:
    if obj.docstring is None:
        return
    text = literal_blocks_to_fences(_ROLE.sub(_code, obj.docstring.value))
    if not obj.is_module:
        link = f"[the module docstring][{obj.module.path}]"
        text = _MODULE_DOCSTRING.sub(link, text)
    obj.docstring.value = text


_ENUM_BASES = {"Enum", "IntEnum", "StrEnum", "Flag", "IntFlag"}


def _is_enum(cls: griffe.Class) -> bool:
    return any(str(base).rsplit(".", 1)[-1] in _ENUM_BASES for base in cls.bases)


class SphinxRoles(griffe.Extension):
    def on_class_members(self, *, cls: griffe.Class, **kwargs: Any) -> None:
        enum = _is_enum(cls)
        for name, member in list(cls.members.items()):
            if member.is_alias or member.docstring:
                continue
            # __init__ stays: its signature becomes the class's (merge_init_into_class)
            special = name.startswith("__") and name.endswith("__") and name != "__init__"
            if special or (member.is_attribute and not enum):
                cls.del_member(name)

    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        _rewrite(obj)

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        # The top package's own docstring: visited here rather than as an object.
        _rewrite(pkg)
