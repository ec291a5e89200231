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


def g_state(g: G) -> str:
    """What a dump prints between the brackets: the wait reason of a parked goroutine
    (``chan receive``), else its status (``runnable``)."""
    if g.status == WAITING:
        return str(g.waitreason or "waiting")
    return STATUS_NAMES[g.status]


def coro_stack(coro: Any) -> list[str]:
    """Where a suspended coroutine is, innermost call first, as Go's traceback prints
    it: ``module.qualname(...)`` then a tab and ``file:line``, for each Python frame
    down its chain of awaits. The chain ends at an awaitable without a frame (the C
    accelerator's channel operations, the runtime's traps)."""
    frames = []
    seen = 0
    while coro is not None and seen < 200:  # bounded: a chain is a few calls deep
        seen += 1
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
        if frame is None:
            break
        code = frame.f_code
        module = frame.f_globals.get("__name__")
        name = f"{module}.{code.co_qualname}" if module else code.co_qualname
        frames.append(f"{name}(...)\n\t{code.co_filename}:{frame.f_lineno}")
        nxt = getattr(coro, "cr_await", None)
        if nxt is None:
            nxt = getattr(coro, "gi_yieldfrom", None)
        coro = nxt
    frames.reverse()
    return frames


def goroutine_dump(goroutines: Iterable[G], stacks: bool = False) -> str:
    """Go's crash-dump listing: one stanza per goroutine with its state, in goid order.

    Each names the function the goroutine runs and the one that started it; with
    ``stacks``, the goroutine's Python frames with their file and line instead of its
    function alone (:func:`coro_stack`), as a leak report needs to find the wait.
    """
    lines = []
    for g in sorted(goroutines, key=lambda g: g.goid):
        lines.append(f"goroutine {g.goid} [{g_state(g)}]:")
        stack = coro_stack(g.coro) if stacks and g.coro is not None else []
        lines.extend(stack or [f"{g_funcname(g)}(...)"])
        creator = created_by(g)
        if creator is not None:
            lines.append(creator)
        lines.append("")
    return "\n".join(lines)
