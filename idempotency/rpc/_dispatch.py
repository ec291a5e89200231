"""Method registry and dispatch: one request's bytes in, its response's bytes out.

Both transports (netframe frames and the plain msgpack stream) hand every message to
:meth:`Dispatcher.handle`, so a method behaves the same whichever way it was called.

How a request is answered, fast to slow
---------------------------------------
1. A plain (non-async) method, called without a timeout: checked against its arity,
   called, and its response encoded, all in the caller's frame. ``handle`` returns the
   bytes, so netframe's server writes them without making a coroutine.
2. An async method without a timeout: ``handle`` returns a coroutine that awaits it.
3. A call with a timeout: the method runs in a goroutine of its own (given a
   :mod:`gosim.context` cancelled at the deadline when it takes one); the reply is
   whichever comes first, the method's outcome or ``DEADLINE_EXCEEDED``. A method that
   ignores its context runs on to its end (as in Go, cancellation is cooperative) and
   its late outcome is dropped.
4. A keyed call to a one-step idempotent method (no wait but its commit: a
   ``pass_context`` method's context only tells it its deadline), with a timeout or
   not, or to a two-step one without a timeout: ``handle`` returns the call itself, an
   :class:`RPCCall` (a keyed call that is the :class:`netframe.Later` the server
   waits on, settled with the reply's bytes when the call finishes: a one-step
   method's effect is built in the caller's frame, and the store's batch finishes it
   once the commit returns: no goroutine waits for it), or the reply's bytes when the
   call was over before ``begin`` returned (a two-step call on a store whose
   operations never wait). A one-step reply is ``DEADLINE_EXCEEDED`` when the
   deadline has passed by the time its commit returns; a two-step call with a
   timeout runs as in 3.

Arguments are checked against the method's signature before it runs, from counts taken
once at registration (``inspect.signature().bind`` per call costs more than the rest of
the dispatch together): msgpack-rpc params are positional, so arity is the whole check.
"""

from __future__ import annotations

import functools
import inspect
import math
import types
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Final

import msgpack

import gosim
from gosim import context, go
from gosim.lowlevel import Waiter, WaitReason
from netframe import Later

from .._accel import speedups as _speedups
from .._errors import (
    ApplicationError,
    CorruptedRecord,
    InProgress,
    InvalidKey,
    InvalidRequest,
    InvalidResult,
    KeyReused,
    StaleClaim,
    StoreUnavailable,
)
from .._idempotency import Call, Idempotency, KeyedCall, _KeyedCall
from .._outcome import Outcome
from ._errors import RPCError
from ._protocol import (
    DEFAULT_LIMITS,
    HELLO_METHOD,
    MAX_MSGID,
    CallMeta,
    Limits,
    Notification,
    RemoteProtocolError,
    Request,
    Response,
    Status,
    decode,
    encode_error,
    encode_plain_error,
    encode_response_payloads,
    parse,
)
from ._protocol import parse_request as _parse_request

__all__ = ["Dispatcher", "MethodSpec", "ServerStatistics"]

_unpackb = msgpack.unpackb
_UNDECODED: Final[Any] = object()
_pack_response: Final[Callable[[Any], bytes]] = msgpack.Packer(
    use_bin_type=True, autoreset=True
).pack


@dataclass(slots=True)
class MethodSpec:
    """A registered method and what was learnt of it at registration."""

    name: str
    fn: Callable[..., Any]
    is_async: bool
    pass_context: bool
    min_args: int
    max_args: int | None  # None: takes *args
    idempotent: bool = False
    key_optional: bool = False
    pass_call: bool = False
    one_step: bool = False  # the method only builds its outcome: Idempotency's one step
    # Derived by finish(), read by the fast path (attributes, not properties: cheaper).
    fast: bool = False  # called in the caller's frame: plain, no context, not idempotent
    max_fast: int = 0  # max_args, or MAX_MSGID for *args

    def finish(self) -> MethodSpec:
        self.fast = not (self.is_async or self.pass_context or self.idempotent)
        self.max_fast = MAX_MSGID if self.max_args is None else self.max_args
        return self

    def arity_error(self, n: int) -> str | None:
        if n < self.min_args or (self.max_args is not None and n > self.max_args):
            if self.max_args is None:
                want = f"at least {self.min_args}"
            elif self.min_args == self.max_args:
                want = str(self.min_args)
            else:
                want = f"{self.min_args} to {self.max_args}"
            return f"{self.name}() takes {want} argument(s), {n} given"
        return None


def method_spec(
    name: str, fn: Callable[..., Any], pass_context: bool, pass_call: bool = False
) -> MethodSpec:
    """Read a function's positional arity; refuse what msgpack-rpc cannot call."""
    if not callable(fn):
        raise TypeError(f"method {name!r}: {fn!r} is not callable")
    sig = inspect.signature(fn)
    min_args = 0
    max_args: int | None = 0
    for p in sig.parameters.values():
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            assert max_args is not None
            max_args += 1
            if p.default is p.empty:
                min_args += 1
        elif p.kind is p.VAR_POSITIONAL:
            max_args = None
        elif p.kind is p.KEYWORD_ONLY and p.default is p.empty:
            raise TypeError(
                f"method {name!r}: keyword-only parameter {p.name!r} has no default, "
                "and msgpack-rpc passes arguments by position"
            )
    if pass_context and pass_call:
        raise TypeError(f"method {name!r}: pass_context or pass_call, not both (call.ctx)")
    if pass_context or pass_call:
        what = (
            "pass_context needs a first parameter (ctx)"
            if pass_context
            else ("pass_call needs a first parameter (call)")
        )
        if min_args < 1 and max_args == 0:
            raise TypeError(f"method {name!r}: {what}")
        min_args = max(min_args - 1, 0)
        if max_args is not None:
            max_args -= 1
    is_async = inspect.iscoroutinefunction(fn)
    spec = MethodSpec(name, fn, is_async, pass_context, min_args, max_args)
    spec.pass_call = pass_call
    return spec


@dataclass
class ServerStatistics:
    """Counters of a dispatcher; a snapshot, see :meth:`Dispatcher.statistics`."""

    calls: int = 0
    notifications: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    bad_messages: int = 0
    deadline_exceeded: int = 0
    late_completions: int = 0
    replays: int = 0


#: The scope of idempotency keys sent without a caller.
ANONYMOUS_CALLER: Final = "anonymous"
# inspect.isawaitable asks collections.abc.Awaitable, a Python-level ABC check of about
# 2,000 instructions: its answer is kept by type (what methods return comes in a few
# types: None, scalars, containers, an Effect, a coroutine). A generator's answer
# depends on its code's flags, not its type, so generators are asked every time.
_AWAITABLE_BY_TYPE: Final[dict[type, bool]] = dict.fromkeys(
    (type(None), bool, int, float, str, bytes, bytearray, list, tuple, dict), False
)
_AWAITABLE_TYPES_KEPT: Final = 256  # a bound, for programs that make classes at run time


def _needs_await(result: Any) -> bool:
    """Whether a method's result is an awaitable to await (what inspect.isawaitable says)."""
    t = type(result)
    known = _AWAITABLE_BY_TYPE.get(t)
    if known is not None:
        return known
    answer = inspect.isawaitable(result)
    if t is not types.GeneratorType and len(_AWAITABLE_BY_TYPE) < _AWAITABLE_TYPES_KEPT:
        _AWAITABLE_BY_TYPE[t] = answer
    return answer


_BACKGROUND: Final = context.background()
_RPC_REPLY: Final = WaitReason.RPC_REPLY  # the race of a method against its deadline


def _run_method(
    spec: MethodSpec, params: list[Any], ctx: context.Context, two_step: bool, call: Call
) -> Any:
    """An idempotent method's handler: its return value, where an RPCError raised
    becomes the final ApplicationError of the method's chosen status. A one-step
    method's value is its whole call. For a two-step method, an awaitable (an async
    method's coroutine) comes back as a coroutine awaiting it, where an RPCError raised
    becomes the same ApplicationError; a plain method's call then costs no coroutine,
    and ``Idempotency.run`` awaits what needs it."""
    if spec.pass_call:
        args: Any = (call, *params)
    elif spec.pass_context:
        args = (ctx, *params)
    else:
        args = params
    try:
        result = spec.fn(*args)
    except RPCError as exc:  # a method's chosen status: final, recorded
        raise ApplicationError(exc.code, exc.message, exc.data) from exc
    if two_step and (spec.is_async or _needs_await(result)):
        return _awaited(result)
    return result


async def _awaited(result: Awaitable[Any]) -> Any:
    try:
        return await result
    except RPCError as exc:  # as in _run_method
        raise ApplicationError(exc.code, exc.message, exc.data) from exc


class RPCCall(KeyedCall, Later):
    """A keyed RPC call, from its parsed request to its reply's bytes: the
    :class:`KeyedCall` whose handler is the method and whose end is the reply, and the
    :class:`netframe.Later` the server waits on for it (one object, no callback between
    the call and the reply).

    Made as a KeyedCall is (its ``handler`` None: :meth:`invoke` calls the method); the
    dispatcher then sets its own slots -- the dispatcher, the method, the msgid, the
    context the method is given, the deadline and the context's cancel -- and begins
    it. Where the C accelerator is built, ``_RPCCall`` below is its twin (made by
    ``_speedups.twin_of``), whose C ``finish`` answers the common outcome (recorded now,
    a value) without a Python frame and calls this class's for every other."""

    __slots__ = ("cancel_ctx", "deadline", "dispatcher", "method_ctx", "msgid", "spec")
    dispatcher: Dispatcher
    spec: MethodSpec
    msgid: int
    method_ctx: context.Context  # what a pass_context method is given
    deadline: float  # math.inf: none
    cancel_ctx: Callable[[], None] | None  # ends method_ctx with the call

    def invoke(self, call: Call) -> Any:
        """The method, with ``call``'s fence for a ``pass_call`` method: as
        :func:`_run_method` (a two-step method's awaitable comes back awaited by a
        coroutine that turns its RPCError into the status it chose)."""
        return _run_method(self.spec, self.args, self.method_ctx, not self.one_step, call)

    def finish(self, outcome: Outcome | None, error: BaseException | None) -> None:
        """The call is over: its reply's bytes settle it (the deadline's answer once
        the deadline has passed, an error's status, or the outcome's response)."""
        if self.cancel_ctx is not None:
            self.cancel_ctx()  # the context given to a pass_context method, over with its call
        dispatcher = self.dispatcher
        msgid = self.msgid
        if self.deadline != math.inf and gosim.now() >= self.deadline:
            dispatcher._stats.late_completions += 1
            reply = dispatcher._deadline_exceeded(msgid, "deadline exceeded")
        elif error is not None:
            code, message, data = _idempotency_error(error)
            reply = dispatcher._error(msgid, code, message, data)
        else:
            assert outcome is not None
            reply = dispatcher._outcome_reply(msgid, outcome)
        self.reply(reply)


# The one place that chooses C or Python for a keyed RPC call: the C twin where
# KeyedCall has one.
_RPCCall: type[RPCCall] = RPCCall
if _speedups is not None and _KeyedCall is not KeyedCall:
    _RPCCall = _speedups.configure_rpc_call(RPCCall)


def _idempotency_error(exc: BaseException) -> tuple[int, str, Any]:
    """The status an idempotency failure (or a method's exception) is answered with."""
    name = type(exc).__name__
    if isinstance(exc, KeyReused):
        code: int = Status.ALREADY_EXISTS
    elif isinstance(exc, InProgress | StaleClaim):
        code = Status.ABORTED  # retry the same key to get the first execution's outcome
    elif isinstance(exc, InvalidKey | InvalidRequest):
        code = Status.INVALID_ARGUMENT
    elif isinstance(exc, StoreUnavailable):
        code = Status.UNAVAILABLE
    elif isinstance(exc, CorruptedRecord):
        code = Status.DATA_LOSS
    elif isinstance(exc, InvalidResult):
        code = Status.INTERNAL
    elif isinstance(exc, context.DeadlineExceeded):
        code = Status.DEADLINE_EXCEEDED
    elif isinstance(exc, ApplicationError):  # retryable: nothing was recorded
        # Its code is the status when it is one: an int, a Status member included (an
        # IntEnum, which a type check for int would miss and answer UNAVAILABLE, a
        # status the client resends); a string code, or a bool, names no status.
        status = exc.code
        ok = isinstance(status, int) and not isinstance(status, bool)
        return (
            int(status) if ok else Status.UNAVAILABLE,
            exc.message,
            exc.data if exc.data is not None else {"type": name},
        )
    else:
        return _error_payload(exc)
    return code, str(exc), {"type": name}


def _status_name(code: int) -> str:
    try:
        return Status(code).name
    except ValueError:
        return str(code)


def _error_payload(exc: BaseException) -> tuple[int, str, Any]:
    if isinstance(exc, RPCError):
        return exc.code, exc.message, exc.data
    return Status.UNKNOWN, str(exc), {"type": type(exc).__name__}


class Dispatcher:
    """Turns requests into responses by calling registered methods; no I/O."""

    def __init__(
        self,
        limits: Limits = DEFAULT_LIMITS,
        *,
        plain_errors: bool = False,
        idempotency: Idempotency | None = None,
    ) -> None:
        self.limits = limits
        self.idempotency = idempotency
        # Plain msgpack-rpc peers read errors their own way: Neovim takes a string, or
        # [0 or 1, string], and reports anything else as "unknown error"; pynvim reads
        # err[1]. To them the plain stream sends [type, "STATUS: message"]
        # (plain_error); the framed transport, and a plain-stream peer that answered
        # the handshake, get [code, message, data].
        self.plain_errors = plain_errors
        self.methods: dict[str, MethodSpec] = {}
        self._stats = ServerStatistics()
        self._bare_max = limits.bare_max
        # Set once the server has said it starts no new work (a GOAWAY sent on the
        # framed transport, shutdown on the stream): every request is refused.
        self.refusing = False
        #: The plain stream's handshake (a request for HELLO_METHOD): its answer, where
        #: a connection's dispatcher speaks the handshake; None elsewhere (no method).
        self.on_hello: Callable[[Request], bytes] | None = None

    def sibling(self, *, plain_errors: bool) -> Dispatcher:
        """A dispatcher with the same methods and counters, another error shape."""
        other = Dispatcher(self.limits, plain_errors=plain_errors, idempotency=self.idempotency)
        other.methods = self.methods
        other._stats = self._stats
        return other

    def register(
        self,
        fn: Callable[..., Any],
        name: str | None = None,
        *,
        pass_context: bool = False,
        idempotent: bool = False,
        key_optional: bool = False,
        pass_call: bool = False,
        one_step: bool = False,
    ) -> MethodSpec:
        name = fn.__name__ if name is None else name
        if not isinstance(name, str) or not name:
            raise ValueError(f"a method name must be a non-empty str, not {name!r}")
        if name == HELLO_METHOD:
            raise ValueError(f"method name {name!r} is the plain stream's handshake")
        if name in self.methods:
            raise ValueError(f"method {name!r} is registered already")
        if (idempotent or pass_call) and self.idempotency is None:
            raise ValueError(
                f"method {name!r}: idempotent methods need Server(idempotency=Idempotency(store))"
            )
        if pass_call and not idempotent:
            raise ValueError(f"method {name!r}: pass_call is for idempotent methods")
        if one_step and not idempotent:
            raise ValueError(f"method {name!r}: one_step is for idempotent methods")
        spec = method_spec(name, fn, pass_context, pass_call)
        if one_step and spec.is_async:
            raise TypeError(f"method {name!r}: a one_step method returns at once (not async)")
        spec.idempotent = idempotent
        spec.key_optional = key_optional
        spec.one_step = one_step
        self.methods[name] = spec.finish()
        return spec

    def statistics(self) -> ServerStatistics:
        s = self._stats
        return ServerStatistics(
            s.calls,
            s.notifications,
            dict(s.errors),
            s.bad_messages,
            s.deadline_exceeded,
            s.late_completions,
            s.replays,
        )

    def _count_error(self, code: int) -> None:
        key = _status_name(code)
        self._stats.errors[key] = self._stats.errors.get(key, 0) + 1

    def _error(self, msgid: int, code: int, message: str, data: Any = None) -> bytes:
        self._count_error(code)
        if self.plain_errors:
            return encode_plain_error(msgid, code, message, data)
        return encode_error(msgid, code, message, data)

    # ------------------------------------------------------------------ entry points

    def error(self, msgid: int, code: int, message: str, data: Any = None) -> bytes:
        """An error response in this dispatcher's shape, counted."""
        return self._error(msgid, code, message, data)

    def refuse(self, msgid: int, message: str = "server is shutting down") -> bytes:
        """The answer to a request refused before dispatch (draining, a GOAWAY sent):
        ``UNAVAILABLE``, marked ``{"refused": true}``, which tells our client the
        method never started, so even an unkeyed call may be sent again (elsewhere).
        Never for a method's error (a method cannot set the mark). A plain peer gets
        the plain shape, unmarked."""
        if self.plain_errors:
            return self._error(msgid, Status.UNAVAILABLE, message)
        self._count_error(Status.UNAVAILABLE)
        return encode_error(msgid, Status.UNAVAILABLE, message, {"type": "Refused"}, refused=True)

    def _refuse_payload(self, payload: bytes) -> bytes | None:
        """A frame received while refusing: a request gets :meth:`refuse`, a
        notification is dropped, anything else is answered as usual (a bad message)."""
        try:
            msg = decode(payload, self.limits)
        except RemoteProtocolError as exc:
            return self.bad_message(exc)
        if type(msg) is Request:
            self._stats.calls += 1
            return self.refuse(msg.msgid)
        if type(msg) is Notification:
            self._stats.notifications += 1
            return None
        self.handle(msg)  # a response: nothing asked for it (counted)
        return None

    def bad_message(self, exc: RemoteProtocolError) -> bytes | None:
        """The answer to a message that did not parse: an error if it had a msgid."""
        self._stats.bad_messages += 1
        if exc.msgid is not None:
            return self._error(exc.msgid, Status.INVALID_ARGUMENT, exc.reason)
        return None  # nothing to answer: no request id could be read

    def handle_payload(self, payload: bytes) -> Any:
        """netframe's handler: one frame's payload in; bytes, None or an awaitable out."""
        if self.refusing:
            return self._refuse_payload(payload)
        if len(payload) <= self._bare_max:
            # A payload this small cannot pass the limits: decoded with msgpack's
            # defaults (see Limits.bare_max), only its shape is left to check, not the
            # bytes again (a well-formed request in one C call where that is built).
            # Bytes that did not decode go to decode(), which decodes again to say
            # what is wrong with them.
            try:
                obj = _unpackb(payload)
            except Exception:
                obj = _UNDECODED
            if obj is not _UNDECODED:
                request = None if _parse_request is None else _parse_request(obj)
                if request is not None:
                    return self.handle(request)
                try:
                    msg = parse(obj)
                except RemoteProtocolError as exc:
                    return self.bad_message(exc)
                return self.handle(msg)
        try:
            msg = decode(payload, self.limits)
        except RemoteProtocolError as exc:
            return self.bad_message(exc)
        return self.handle(msg)

    def handle(self, msg: Request | Response | Notification) -> Any:
        """One decoded message: the response's bytes, None (no reply), or an awaitable."""
        if type(msg) is Request:
            spec = self.methods.get(msg.method)
            if spec is None and self.on_hello is not None and msg.method == HELLO_METHOD:
                return self.on_hello(msg)  # the plain stream's handshake: not a call
            self._stats.calls += 1
            if spec is None:
                return self._error(msg.msgid, Status.UNIMPLEMENTED, f"no method {msg.method!r}")
            n = len(msg.params)
            if n < spec.min_args or n > spec.max_fast:  # arity_error says why
                problem = spec.arity_error(n)
                if problem is not None:
                    return self._error(msg.msgid, Status.INVALID_ARGUMENT, problem)
            meta = msg.meta
            if spec.idempotent:
                if meta is not None and meta.key is not None:
                    if meta.timeout_ms is None or spec.one_step:
                        return self._keyed_later(spec, msg, meta)
                    return self._call_with_deadline(self._idempotent_reply, spec, msg, meta)
                if not spec.key_optional:
                    return self._error(
                        msg.msgid,
                        Status.FAILED_PRECONDITION,
                        f"method {spec.name!r} is idempotent: call it with an idempotency key",
                    )
            if meta is not None and meta.timeout_ms is not None:
                return self._call_with_deadline(self._plain_reply, spec, msg, meta)
            if spec.is_async or spec.pass_context:
                return self._plain_reply(spec, msg, meta, _BACKGROUND, math.inf)
            try:
                result = spec.fn(*msg.params)
            except Exception as exc:
                return self._error(msg.msgid, *_error_payload(exc))
            return self._response(msg.msgid, result)
        if type(msg) is Notification:
            self._stats.notifications += 1
            spec = self.methods.get(msg.method)
            if spec is None or spec.arity_error(len(msg.params)) is not None:
                self._count_error(Status.UNIMPLEMENTED if spec is None else Status.INVALID_ARGUMENT)
                return None
            return self._notify(spec, msg.params)
        # A response sent to a server: nothing asked for it.
        self._stats.bad_messages += 1
        return None

    # ------------------------------------------------------------------ slower paths

    def _response(self, msgid: int, result: Any) -> bytes:
        """``[1, msgid, nil, result]`` (the msgid was checked by the parse); for a result
        msgpack cannot encode, the INTERNAL error that says why."""
        try:
            return _pack_response([1, msgid, None, result])
        except (TypeError, ValueError, OverflowError) as exc:
            return self._error(
                msgid, Status.INTERNAL, f"result cannot be encoded: cannot encode as msgpack: {exc}"
            )

    async def _invoke(self, spec: MethodSpec, params: list[Any], ctx: context.Context) -> Any:
        args = (ctx, *params) if spec.pass_context else params
        result = spec.fn(*args)
        if spec.is_async or _needs_await(result):
            result = await result
        return result

    async def _plain_reply(
        self,
        spec: MethodSpec,
        msg: Request,
        meta: CallMeta | None,
        ctx: context.Context,
        deadline: float,  # unused: the signature _call_with_deadline's runs share
    ) -> bytes:
        try:
            result = await self._invoke(spec, msg.params, ctx)
        except Exception as exc:
            return self._error(msg.msgid, *_error_payload(exc))
        return self._response(msg.msgid, result)

    async def _idempotent_reply(
        self,
        spec: MethodSpec,
        msg: Request,
        meta: CallMeta,
        ctx: context.Context,
        deadline: float,
    ) -> bytes:
        """Run the call through the idempotency core: once per (caller, key). A wait for
        another execution of the key ends with ``ctx``, or at ``deadline`` (the call's
        deadline when it has no context)."""
        idem = self.idempotency
        assert idem is not None and meta.key is not None
        msgid, params = msg.msgid, msg.params
        try:
            outcome = await idem.run(
                caller=meta.caller or ANONYMOUS_CALLER,
                key=meta.key,
                request=(spec.name, params),
                handler=functools.partial(_run_method, spec, params, ctx, True),
                # A wait for another execution of the key ends with ctx, or else at the
                # deadline.
                timeout=(
                    None
                    if deadline == math.inf or ctx is not _BACKGROUND
                    else max(deadline - gosim.now(), 0.0)
                ),
                ctx=None if ctx is _BACKGROUND else ctx,
            )
        except Exception as exc:
            code, message, data = _idempotency_error(exc)
            return self._error(msgid, code, message, data)
        return self._outcome_reply(msgid, outcome)

    def _outcome_reply(self, msgid: int, outcome: Outcome) -> bytes:
        """The response for an idempotent call's outcome (a replay counted)."""
        if outcome.replayed:
            self._stats.replays += 1
        if outcome.ok:
            return encode_response_payloads(msgid, None, outcome.payload, outcome.replayed)
        if self.plain_errors:
            err = outcome.error
            assert err is not None
            code = err.code if type(err.code) is int else Status.UNKNOWN
            return self._error(msgid, code, err.message, err.data)
        self._count_error(Status.UNKNOWN)
        return encode_response_payloads(msgid, outcome.payload, None, outcome.replayed)

    def _keyed_later(self, spec: MethodSpec, msg: Request, meta: CallMeta) -> bytes | Later:
        """A keyed call to a one-step method (with a timeout or not), or to a two-step
        method without a timeout, with no goroutine of its own where the store needs
        none: the call is an :class:`RPCCall`, begun here. A one-step method's effect is
        built now and the store's batch calls back with the outcome, whose reply
        settles the call, which is returned (a :class:`netframe.Later`); a two-step
        call on a store that never waits is over before ``begin`` returns, and its
        reply's bytes are returned.

        A one-step call has nothing to cancel once it starts: its commit goes on to its
        end either way (its outcome is recorded, and a retry replays it). So a deadline
        needs no race: the reply is DEADLINE_EXCEEDED when the deadline has passed by
        the time the commit returns, the call's reply otherwise. A wait for another
        execution of the key still ends at the deadline. Only a store that stalls past
        the deadline makes this answer late (the client's own timer has answered its
        caller then)."""
        msgid = msg.msgid
        deadline = math.inf
        timeout = None
        ctx: context.Context = _BACKGROUND
        cancel = None
        if meta.timeout_ms is not None:
            if meta.timeout_ms <= 0:  # nothing may start
                return self._deadline_exceeded(msgid, "deadline exceeded before start")
            timeout = meta.timeout_ms / 1000.0
            if spec.pass_context:  # the method reads its deadline from it
                ctx, cancel = context.with_timeout(_BACKGROUND, timeout)
                deadline = ctx.deadline_or_inf()
            else:
                deadline = gosim.now() + timeout
        idem = self.idempotency
        assert idem is not None and meta.key is not None
        one_step = spec.one_step
        try:
            call = _RPCCall(
                idem, meta.caller or ANONYMOUS_CALLER, meta.key, (spec.name, msg.params), None,
                wait=idem.wait, timeout=timeout, ctx=None, one_step=one_step,
            )  # fmt: skip
            call.dispatcher = self
            call.spec = spec
            call.msgid = msgid
            call.method_ctx = ctx
            call.deadline = deadline
            call.cancel_ctx = cancel
            call.begin()
        except Exception as exc:
            if cancel is not None:
                cancel()
            code, message, data = _idempotency_error(exc)
            return self._error(msgid, code, message, data)
        if call.done():  # answered in this frame: its bytes, sent with this pass's
            return call.result()  # type: ignore[no-any-return]
        return call

    async def _call_with_deadline(
        self,
        run: Callable[[MethodSpec, Request, Any, context.Context, float], Awaitable[bytes]],
        spec: MethodSpec,
        msg: Request,
        meta: CallMeta,
    ) -> bytes:
        """Race the call (run in a goroutine of its own, which goes on past the
        deadline) against its deadline: the first to finish answers the caller.

        The race waits on its own timer. Only a method that is given a context
        (``pass_context``, or ``pass_call``'s ``call.ctx``) gets one, cancelled at the
        same deadline (its timer is armed only if the method waits on it)."""
        assert meta.timeout_ms is not None
        if meta.timeout_ms <= 0:  # nothing may start
            return self._deadline_exceeded(msg.msgid, "deadline exceeded before start")
        ctx: context.Context = _BACKGROUND
        cancel = None
        if spec.pass_context or spec.pass_call:
            ctx, cancel = context.with_timeout(_BACKGROUND, meta.timeout_ms / 1000.0)
            deadline = ctx.deadline_or_inf()  # one clock read for both
        else:
            deadline = gosim.now() + meta.timeout_ms / 1000.0
        race = Waiter()
        race.set_deadline(deadline, None)
        go(self._run_to, race, run, spec, msg, ctx, deadline, cancel)
        reply: bytes | None = await race.wait(_RPC_REPLY)
        if reply is not None:
            return reply
        return self._deadline_exceeded(msg.msgid, "deadline exceeded")

    def _deadline_exceeded(self, msgid: int, message: str) -> bytes:
        """The DEADLINE_EXCEEDED answer, counted."""
        self._stats.deadline_exceeded += 1
        return self._error(msgid, Status.DEADLINE_EXCEEDED, message)

    async def _run_to(
        self,
        race: Waiter,
        run: Callable[[MethodSpec, Request, Any, context.Context, float], Awaitable[bytes]],
        spec: MethodSpec,
        msg: Request,
        ctx: context.Context,
        deadline: float,
        cancel: Callable[[], None] | None,
    ) -> None:
        # The method (and, for idempotent ones, the recording of its outcome) runs to its
        # end here even when the caller's deadline passes first: a retry then replays.
        reply = None
        try:
            reply = await run(spec, msg, msg.meta, ctx, deadline)
        finally:
            expired = False
            if cancel is not None:
                cancel()  # releases the deadline's timer, if the method armed it
                # Once the deadline has passed (the cancel says so: err() is then
                # DeadlineExceeded, not Canceled) the caller is answered
                # DEADLINE_EXCEEDED, even when this reply (a method that returned as
                # its context ended) beats the race's timer.
                expired = type(ctx.err()) is context.DeadlineExceeded
            if expired:
                race.settle(None)
                self._stats.late_completions += 1
            elif not race.settle(reply):
                self._stats.late_completions += 1

    async def _notify(self, spec: MethodSpec, params: list[Any]) -> None:
        try:
            await self._invoke(spec, params, context.background())
        except Exception as exc:
            self._count_error(_error_payload(exc)[0])
