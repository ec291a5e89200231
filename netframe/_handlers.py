"""Calling a server's handlers: the handler types, and the pieces the handler
strategies (``Server._handle_inline`` and the rest, in ``_server.py``) are built from.

``_handle_each_py`` is the Python twin of the C ``handle_each`` (the inline strategy's
per-frame loop, ``netframe/_speedups_server.c.h``), ``_drop_none_py`` the Python twin
of ``drop_none``, ``handle_batch``'s reply filter; ``_resume`` and ``_settle`` finish a handler that
loop stopped at, ``_awaitable`` tells a reply from a result still to be awaited.
"""

from __future__ import annotations

import inspect
import types
from collections.abc import Awaitable, Callable, Generator
from typing import Any

from ._accel import speedups as _c_speedups

__all__ = ["BatchHandler", "Handler"]


#: An async function, or a plain function (its return value is the reply: no coroutine
#: per request, for handlers that never wait).
Handler = Callable[[bytes], Awaitable[bytes | None] | bytes | None]
BatchHandler = Callable[[list[bytes]], Awaitable[list[bytes | None]] | list[bytes | None]]

_Coroutine = types.CoroutineType


def _handle_each_py(
    handler: Handler, frames: list[bytes], start: int, replies: list[Any], run: bool = True
) -> tuple[int, Any, bool, int]:
    """``handle_each``'s twin (``netframe/_speedups_server.c.h`` says what it returns):
    ``handler(frame)`` for ``frames[start:]``, the replies appended, up to the first
    result that must wait; with ``run``, a coroutine is run with one send first."""
    errors = 0
    count = len(frames)
    i = start
    while i < count:
        try:
            result: Any = handler(frames[i])
            if run and type(result) is _Coroutine:
                try:
                    yielded = result.send(None)
                except StopIteration as stop:
                    result = stop.value
                else:
                    return i, (result, yielded), True, errors
        except Exception:
            errors += 1
            i += 1
            continue
        if result is not None:
            if type(result) is not bytes and type(result) is not bytearray:
                return i, result, False, errors  # an awaitable, or an unusual reply
            replies.append(result)
        i += 1
    return i, None, False, errors


def _drop_none_py(replies: list[bytes | None]) -> list[bytes]:
    """A batch handler's replies without its Nones (the requests it answers with no
    reply), in order: ``drop_none``'s twin. The list itself when it holds no None (no
    copy); the input is never changed."""
    if type(replies) is not list:
        raise TypeError("drop_none: a list is needed")
    if None not in replies:
        return replies  # type: ignore[return-value]  # no None in it
    return [r for r in replies if r is not None]


# The one place this module chooses C or Python: the twins of handle_each and of
# drop_none (a batch handler's reply filter).
_handle_each: Any
_drop_none: Any
if _c_speedups is None:
    _handle_each, _drop_none = _handle_each_py, _drop_none_py
else:
    _handle_each, _drop_none = _c_speedups.handle_each, _c_speedups.drop_none


@types.coroutine
def _resume(coro: Any, yielded: Any) -> Generator[Any, Any, Any]:
    """Go on with a coroutine that was started elsewhere (handle_each) and suspended,
    yielding ``yielded``: pass that up to the driver, then delegate as ``await`` would."""
    while True:
        try:
            sent = yield yielded
        except GeneratorExit:
            coro.close()
            raise
        except BaseException as exc:  # thrown in by the driver: the coroutine's to handle
            try:
                yielded = coro.throw(exc)
            except StopIteration as stop:
                return stop.value
        else:
            try:
                yielded = coro.send(sent)
            except StopIteration as stop:
                return stop.value


def _awaitable(value: Any) -> bool:
    """A handler's result that is still to be awaited (an async handler's coroutine, or
    any awaitable a plain function returned) rather than the reply itself."""
    if type(value) is _Coroutine:
        return True
    return value is not None and type(value) is not bytes and inspect.isawaitable(value)


async def _settle(pending: Any, suspended: bool) -> Any:
    """The reply of a handler ``handle_each`` stopped at: resume its suspended coroutine,
    or await what it returned, or take that as the reply (``write_frames`` judges it)."""
    if suspended:
        return await _resume(*pending)
    if _awaitable(pending):
        return await pending
    return pending
