"""Errors a caller of :mod:`idempotency.rpc` sees, and the one a method raises to choose its code.

Every remote failure is an :class:`RPCError` carrying the wire's ``[code, message,
data]``; the subclasses say which failures are the caller's own (:class:`CallTimeout`,
:class:`Unavailable`) so that ``except TimeoutError`` and ``except ConnectionError``
work as they do elsewhere in Python.
"""

from __future__ import annotations

from typing import Any

from ._protocol import ErrorInfo, Status, type_name_of

__all__ = ["CallTimeout", "RPCError", "Unavailable"]


class RPCError(Exception):
    """A call failed: the server answered with an error, or the call could not finish.

    ``code`` is a gRPC status code (:class:`~idempotency.rpc.Status` where it is one),
    ``message`` the server's text, ``data`` whatever the server attached, and
    ``type_name`` the remote exception's type name when the server sent one (ours do:
    an application ``ValueError`` arrives as ``RPCError`` with ``type_name ==
    "ValueError"``).

    A peer that does not speak our error shape (Neovim, pynvim's hosts,
    aio-msgpack-rpc) gets ``code`` ``UNKNOWN``, whatever it sent: its own type is kept in
    ``peer_type`` (Neovim's ``[type, message]``: 0 for an exception, 1 for a validation
    error) and its text in ``message``; ``peer_type`` is None for our servers' errors.

    A method raises ``RPCError(code, message, data)`` itself to answer with a chosen
    code (``Status.NOT_FOUND``, say); any other exception is answered as ``UNKNOWN``
    with its type name.
    """

    def __init__(
        self, code: int, message: str, data: Any = None, *, peer_type: int | None = None
    ) -> None:
        super().__init__(code, message, data)
        self.code = int(code)
        self.message = message
        self.data = data
        self.peer_type = peer_type

    @property
    def status(self) -> Status:
        """``code`` as a :class:`Status`; ``UNKNOWN`` for codes outside gRPC's set."""
        try:
            return Status(self.code)
        except ValueError:
            return Status.UNKNOWN

    @property
    def type_name(self) -> str | None:
        return type_name_of(self.data)

    @classmethod
    def from_info(cls, info: ErrorInfo) -> RPCError:
        """The exception for an error response; the subclass its code calls for."""
        if info.code == Status.DEADLINE_EXCEEDED:
            return CallTimeout(info.message, info.data)
        if info.code == Status.UNAVAILABLE:
            return Unavailable(info.message, info.data)
        return cls(info.code, info.message, info.data, peer_type=info.peer_type)

    def __str__(self) -> str:
        name = self.type_name
        head = f"{self.status.name}" if self.status.value == self.code else f"code {self.code}"
        if self.peer_type is not None:
            head += f" (peer error type {self.peer_type})"
        return f"{head}: {name + ': ' if name else ''}{self.message}"


class CallTimeout(RPCError, TimeoutError):
    """The call's deadline passed: the caller's own timeout, or the server's answer that
    the deadline passed while it worked (``DEADLINE_EXCEEDED``).

    The method may have run (in part or in full): retry it with the same idempotency
    key to learn the outcome without running it twice.
    """

    def __init__(self, message: str = "deadline exceeded", data: Any = None) -> None:
        super().__init__(Status.DEADLINE_EXCEEDED, message, data)


class Unavailable(RPCError, ConnectionError):
    """No server could take the call: every attempt failed to connect, the connection
    was lost with the call in flight and it had no idempotency key (so it was not
    resent: it may have run), the retry budget was spent, or the server answered
    ``UNAVAILABLE`` (shutting down, store unreachable).
    """

    def __init__(self, message: str, data: Any = None) -> None:
        super().__init__(Status.UNAVAILABLE, message, data)
