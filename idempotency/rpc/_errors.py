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

    ``key``: the idempotency key of the client's call that failed (given, or generated
    for a method of ``idempotent_methods``), on every error of a keyed call; None for a
    call without one. A final status of a keyed call (one outside the retry policy's
    set) is the recorded outcome: resending under the key answers it again.
    """

    #: Whether the error leaves open if the method ran (a timeout, a lost connection):
    #: for a keyed call, its text then says how to learn which.
    _undecided = False

    def __init__(
        self,
        code: int,
        message: str,
        data: Any = None,
        *,
        peer_type: int | None = None,
        key: str | None = None,
    ) -> None:
        super().__init__(code, message, data)
        self.code = int(code)
        self.message = message
        self.data = data
        self.peer_type = peer_type
        #: The idempotency key of the failed call, given or generated (None: the call
        #: had none). ``client.call(method, *params, idempotency_key=err.key)`` resends
        #: it: the server answers with the outcome of its one run, running it if no
        #: earlier attempt did.
        self.key = key

    @property
    def status(self) -> Status:
        """``code`` as a :class:`Status`; ``UNKNOWN`` for codes outside gRPC's set."""
        try:
            return Status(self.code)
        except ValueError:
            return Status.UNKNOWN

    @property
    def type_name(self) -> str | None:
        """The remote exception's type name our servers put in ``data``, else None."""
        return type_name_of(self.data)

    @classmethod
    def from_info(cls, info: ErrorInfo) -> RPCError:
        """The exception for an error response; the subclass its code calls for."""
        if info.code == Status.DEADLINE_EXCEEDED:
            return CallTimeout(info.message, info.data)
        if info.code == Status.UNAVAILABLE:
            return Unavailable(info.message, info.data)
        return cls(info.code, info.message, info.data, peer_type=info.peer_type)

    def __repr__(self) -> str:
        base = super().__repr__()
        return base if self.key is None else f"{base[:-1]}, key={self.key!r})"

    def __str__(self) -> str:
        name = self.type_name
        head = f"{self.status.name}" if self.status.value == self.code else f"code {self.code}"
        if self.peer_type is not None:
            head += f" (peer error type {self.peer_type})"
        text = f"{head}: {name + ': ' if name else ''}{self.message}"
        if self.key is not None and self._undecided:
            text += f"; not applied, or applied once: resend under key {self.key!r} to learn which"
        return text


class CallTimeout(RPCError, TimeoutError):
    """The call's deadline passed: the caller's own timeout, or the server's answer that
    the deadline passed while it worked (``DEADLINE_EXCEEDED``).

    The method may have run (in part or in full). A keyed call's error carries its key
    (``key``, a generated one too): resend under it
    (``client.call(method, *params, idempotency_key=err.key, timeout=...)``) to get the
    outcome of its one run, or have it run now if no attempt reached the method; the
    method never runs twice for one key. Without a key, nothing can tell.
    """

    _undecided = True

    def __init__(
        self, message: str = "deadline exceeded", data: Any = None, *, key: str | None = None
    ) -> None:
        super().__init__(Status.DEADLINE_EXCEEDED, message, data, key=key)


class Unavailable(RPCError, ConnectionError):
    """No server could take the call, or the call's outcome could not be learned.

    For a call without an idempotency key: every attempt failed to connect or was
    refused (the method never ran), the retry budget was spent, the server answered
    ``UNAVAILABLE`` (its store unreachable), or the connection was lost with the call
    in flight (it was not resent: it may or may not have run; the message says so).

    A keyed call is resent through lost connections until its deadline, so it sees this
    only without a deadline once the policy's ``resend_budget`` is spent, after
    ``max_attempts`` ``UNAVAILABLE`` answers of a live server, or when the client was
    closed. Its ``key`` is set: resend under it, as for :class:`CallTimeout`.
    """

    _undecided = True

    def __init__(self, message: str, data: Any = None, *, key: str | None = None) -> None:
        super().__init__(Status.UNAVAILABLE, message, data, key=key)
