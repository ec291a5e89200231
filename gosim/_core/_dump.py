"""How the runtime names goroutines in its crash output: Go's dump wording.

``goroutine_dump`` is the listing of a deadlock error (``goroutine 1 [chan receive]:``
stanzas), ``panic_line`` the first line of a panic's report; both follow Go's
``traceback.go`` so a reader who knows Go's crashes recognises them.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable
from typing import Any

from gosim._core._exceptions import FatalError
from gosim._core._g import STATUS_NAMES, WAITING, G


def describe_fn(fn: Any) -> str:
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)
    module = getattr(fn, "__module__", None)
    return f"{module}.{name}" if module else str(name)


def coro_funcname(coro: Any) -> str:
    """The function a coroutine runs, as dumps print it (``module.qualname``)."""
    code = getattr(coro, "cr_code", None)
    if code is None:
        return "?"
    frame = getattr(coro, "cr_frame", None)
    if frame is not None:
        module = frame.f_globals.get("__name__")
    else:  # finished: no frame, so find the module by the code's file
        found = inspect.getmodule(code)
        module = found.__name__ if found is not None else None
    return f"{module}.{code.co_qualname}" if module else str(code.co_qualname)


def g_funcname(g: G) -> str:
    """The function a goroutine runs, as dumps print it (``module.qualname``)."""
    if g.fn is not None:
        return describe_fn(g.fn)
    return coro_funcname(g.coro)


def created_by(g: G) -> str | None:
    """Go's ``created by F in goroutine N`` line, F the function that ran ``go``."""
    if not g.parent:
        return None
    return f"created by {coro_funcname(g.creator)} in goroutine {g.parent}"


def panic_line(exc: BaseException) -> str:
    """The first line of Go's crash report for exc: ``fatal error: ...`` for a throw,
    else ``panic: `` and the value's message (Go prints an error's ``Error()``), the
    type's name when the message is empty."""
    if isinstance(exc, FatalError):
        return str(exc)
    return f"panic: {str(exc) or type(exc).__name__}"


def panic_report(exc: BaseException) -> str:
    """Go's crash report for exc, which the runtime added to it as a note when exc
    escaped a goroutine and stopped the runtime (``panic: ...``, ``goroutine N
    [running]:``, ...); ``str(exc)`` when it has no such note."""
    head = panic_line(exc) + "\n\ngoroutine "
    for note in reversed(getattr(exc, "__notes__", ())):
        if isinstance(note, str) and note.startswith(head):
            return note
    return str(exc)


def goroutine_dump(goroutines: Iterable[G]) -> str:
    """Go's crash-dump listing: one stanza per goroutine with its state, in goid order."""
    lines = []
    for g in sorted(goroutines, key=lambda g: g.goid):
        waiting = g.status == WAITING
        state = (g.waitreason or "waiting") if waiting else STATUS_NAMES[g.status]
        lines.append(f"goroutine {g.goid} [{state}]:")
        lines.append(f"{g_funcname(g)}(...)")
        creator = created_by(g)
        if creator is not None:
            lines.append(creator)
        lines.append("")
    return "\n".join(lines)
