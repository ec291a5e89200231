"""RedisStore: records in Redis, shared by processes and machines (redis-py, Lua).

Every operation is one Lua script, so Redis runs it atomically: the claim reads the
record, decides, takes a fencing token (``INCR`` on one counter key) and writes; the
completion checks the fence and writes; an effect runs in the completion's script. The
scripts implement the table of ``idempotency._record`` and must agree with it (the
contract suite and the state-machine test run against both; the names of the states
are the same integers).

Layout of a record: a hash at ``{prefix}rec:{len(caller)}:{caller}:{key}`` (the length
keeps a caller with ``:`` in it from colliding with another) with fields ``s`` (state),
``fp`` (fingerprint), ``f`` (fence), ``x`` (expiry, Unix milliseconds), and once
completed ``ok`` and ``p`` (payload). The key also carries a Redis TTL at its expiry, so
Redis sweeps expired records itself; :meth:`RedisStore.sweep` exists for a clock other
than the server's.

Time: by default the scripts read the server's clock (``TIME``), one clock for every
process. A ``clock`` given to the store is sent with each call instead (tests use it to
move time by hand); the key's Redis TTL still runs on the server's clock.

Batching: concurrent calls' scripts are pipelined (one round trip per batch) through the
same :class:`~._batch.GroupCommitter` as SQLite's group commit, off the scheduler in
``gosim.syscall``. redis-py's own retries are off: a script whose reply was lost may
have run, and sending it again could, for example, answer a claim with its own BUSY.

Durability is Redis's: configure ``appendonly yes`` with ``appendfsync always`` for an
acknowledged record to survive a crash of the Redis server (``everysec`` may lose the
last second). A lost connection fails the batch's operations with
:class:`StoreUnavailable`; one whose script had already run may have claimed (the claim
lapses with its lease) or completed (a retry replays it).

Exactly-once effects: a handler returns ``LuaEffect(script, keys, args)``. The script
body runs inside the completion's script after the fence check, with its own ``KEYS``
and ``ARGV``, and returns the call's result (encoded with ``cmsgpack``). It may call
``idempotency_fail(code, message, data)`` to refuse: the refusal is recorded. Redis
cannot roll a script back: the body must check everything before its first write, so
that a refusal or an error leaves nothing written.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any, Final

import redis as redis_py
from redis.backoff import NoBackoff
from redis.retry import Retry

from .._errors import CorruptedRecord, InvalidResult, StaleClaim, StoreUnavailable
from .._keys import FINGERPRINT_SIZE
from .._record import COMPLETED, IN_PROGRESS, ClaimKind, ClaimResult, Record
from ._batch import GroupCommitter, Op
from ._contract import Completion, Effect, Store, StoreStatistics

__all__ = ["LuaEffect", "RedisStore"]

# The prelude every script starts with: the time, and the record read back. ARGV[1] is
# the caller's clock in ms, or "" for the server's. Must agree with _record.state_at.
_PRELUDE: Final = """
local now = tonumber(ARGV[1])
if not now then
    local t = redis.call('TIME')
    now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local rec = redis.call('HMGET', KEYS[1], 's', 'fp', 'f', 'x', 'ok', 'p')
local s = tonumber(rec[1])
local x = tonumber(rec[4])
if rec[1] and (not (s == 1 or s == 2) or not x or not tonumber(rec[3])) then
    return {-9, 'corrupted', rec[1] or '', rec[3] or '', rec[4] or ''}
end
local live = s ~= nil and x > now
"""

# _record.claim. ARGV: now, fingerprint, lease ms. KEYS: record, fence counter.
_CLAIM_LUA: Final = (
    _PRELUDE
    + """
if not live then
    local fence = redis.call('INCR', KEYS[2])
    local expires = now + tonumber(ARGV[3])
    redis.call('DEL', KEYS[1])
    redis.call('HSET', KEYS[1], 's', 1, 'fp', ARGV[2], 'f', fence, 'x', expires)
    redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[3]))
    return {0, fence, expires}
end
if rec[2] ~= ARGV[2] then
    return {3, tonumber(rec[3]), x, s, rec[2]}
end
if s == 2 then
    return {1, tonumber(rec[3]), x, tonumber(rec[5]), rec[6]}
end
return {2, tonumber(rec[3]), x}
"""
)

# _record._check_holder, shared by completion and release. ARGV[2] is the fence.
_HOLDER: Final = """
if not rec[1] then return {-1, 'gone', 0} end
if tonumber(rec[3]) ~= tonumber(ARGV[2]) then return {-1, 'taken', tonumber(rec[3])} end
if not live then return {-1, 'lapsed', 0} end
if s == 2 then return {-1, 'completed', 0} end
"""

# _record.complete. ARGV: now, fence, ttl ms, ok, payload.
_COMPLETE_LUA: Final = (
    _PRELUDE
    + _HOLDER
    + """
local expires = now + tonumber(ARGV[3])
redis.call('HSET', KEYS[1], 's', 2, 'x', expires, 'ok', ARGV[4], 'p', ARGV[5])
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[3]))
return {0, expires, tonumber(ARGV[4]), ARGV[5], rec[2]}
"""
)

# _record.complete with an effect. ARGV: now, fence, ttl ms, max payload bytes, the
# effect's ARGV...; KEYS: record, the effect's KEYS... The body is spliced in below.
_EFFECT_HEAD: Final = (
    _PRELUDE
    + _HOLDER
    + """
local function idempotency_fail(code, message, data)
    error({idempotency_fail = true, code = code, message = message, data = data})
end
local effect_keys, effect_argv = {}, {}
for i = 2, #KEYS do effect_keys[i - 1] = KEYS[i] end
for i = 5, #ARGV do effect_argv[i - 4] = ARGV[i] end
local function effect(KEYS, ARGV)
"""
)
_EFFECT_TAIL: Final = """
end
local okflag, payload
local ran, res = pcall(effect, effect_keys, effect_argv)
if ran then
    okflag, payload = 1, cmsgpack.pack(res)
elseif type(res) == 'table' and res.idempotency_fail then
    okflag, payload = 0, cmsgpack.pack({res.code, res.message, res.data})
else
    if type(res) == 'table' and res.err then res = res.err end
    return redis.error_reply('LuaEffect failed: ' .. tostring(res))
end
if #payload > tonumber(ARGV[4]) then return {-2, #payload} end
local expires = now + tonumber(ARGV[3])
redis.call('HSET', KEYS[1], 's', 2, 'x', expires, 'ok', okflag, 'p', payload)
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[3]))
return {0, expires, okflag, payload, rec[2]}
"""

# _record.release. ARGV: now, fence.
_RELEASE_LUA: Final = (
    _PRELUDE
    + _HOLDER
    + """
redis.call('DEL', KEYS[1])
return {0}
"""
)

# The live record, or nothing. ARGV: now.
_GET_LUA: Final = (
    _PRELUDE
    + """
if not live then return {0} end
return {1, s, rec[2], tonumber(rec[3]), x, tonumber(rec[5]) or 1, rec[6] or false}
"""
)

# Delete the record if expired. ARGV: now.
_SWEEP_LUA: Final = (
    _PRELUDE
    + """
if rec[1] and not live then redis.call('DEL', KEYS[1]) return 1 end
return 0
"""
)

_CLAIM: Final = 0
_COMPLETE: Final = 1
_RELEASE: Final = 2
_GET: Final = 3
_EFFECT: Final = 4
_KINDS: Final = (ClaimKind.CLAIMED, ClaimKind.REPLAY, ClaimKind.BUSY, ClaimKind.MISMATCH)
_STALE_WHY: Final = {
    b"gone": "the record is gone (released or swept)",
    b"lapsed": "its lease lapsed",
    b"completed": "it was already completed",
}


class LuaEffect(Effect):
    """An effect committed with its record: the Lua ``script`` body runs inside the
    script that completes the record, with ``KEYS = keys`` and ``ARGV = args``, and
    returns the call's result (see the module docstring for the rules)."""

    __slots__ = ("args", "keys", "script")

    def __init__(self, script: str, keys: Sequence[str] = (), args: Sequence[Any] = ()) -> None:
        self.script = script
        self.keys = list(keys)
        self.args = list(args)


class RedisStore(Store):
    """Records in Redis at ``url`` under ``prefix`` (see the module docstring).

    ``socket_timeout`` bounds each round trip; ``max_batch`` bounds a pipeline.
    ``clock``: None for the server's clock (the right choice for several processes).
    """

    def __init__(
        self,
        url: str = "redis://127.0.0.1:6379/0",
        *,
        prefix: str = "idempotency:",
        clock: Callable[[], float] | None = None,
        max_batch: int = 512,
        socket_timeout: float = 5.0,
        client: redis_py.Redis | None = None,
    ) -> None:
        self.url = url
        self.prefix = prefix
        self._clock = clock
        self._name = f"RedisStore({url!r}, prefix={prefix!r})"
        self.client = client or redis_py.Redis.from_url(
            url,
            socket_timeout=socket_timeout,
            socket_connect_timeout=socket_timeout,
            retry=Retry(NoBackoff(), 0),
        )
        self._fence_key = f"{prefix}fence"
        self._shas: dict[str, str] = {}  # script source -> SHA1 loaded in the server
        self._shas_lock = threading.Lock()
        self._committer = GroupCommitter(self._apply_batch, max_batch)

    def __repr__(self) -> str:
        return self._name

    def record_key(self, caller: str, key: str) -> str:
        """The Redis key of (caller, key)'s record."""
        return f"{self.prefix}rec:{len(caller)}:{caller}:{key}"

    # ------------------------------------------------------------------ public API

    async def claim(self, caller: str, key: str, fingerprint: bytes, lease: float) -> ClaimResult:
        return await self._committer.submit(Op(_CLAIM, (caller, key, fingerprint, lease)))  # type: ignore[no-any-return]

    async def complete(self, caller: str, key: str, fence: int, completion: Completion) -> Record:
        effect = completion.effect
        if effect is not None:
            if not isinstance(effect, LuaEffect):
                raise TypeError(f"RedisStore cannot run a {type(effect).__name__}")
            return await self._committer.submit(Op(_EFFECT, (caller, key, fence, completion)))  # type: ignore[no-any-return]
        return await self._committer.submit(Op(_COMPLETE, (caller, key, fence, completion)))  # type: ignore[no-any-return]

    async def release(self, caller: str, key: str, fence: int) -> bool:
        return await self._committer.submit(Op(_RELEASE, (caller, key, fence)))  # type: ignore[no-any-return]

    async def get(self, caller: str, key: str) -> Record | None:
        return await self._committer.submit(Op(_GET, (caller, key)))  # type: ignore[no-any-return]

    async def sweep(self) -> int:
        import gosim  # noqa: PLC0415 -- only here: the batch path never needs it

        return await gosim.syscall(self._sweep)

    def statistics(self) -> StoreStatistics:
        c = self._committer
        return StoreStatistics(c.operations, c.batches, c.largest_batch)

    def close(self) -> None:
        with self._committer._thread_lock:
            self.client.close()

    # ------------------------------------------------------- on the syscall thread

    def _now_arg(self) -> str:
        return "" if self._clock is None else str(round(self._clock() * 1000))

    def _sha(self, source: str) -> str:
        sha = self._shas.get(source)
        if sha is None:
            sha = self.client.script_load(source)
            with self._shas_lock:
                self._shas[source] = sha
        return sha

    def _command(self, op: Op, now: str) -> tuple[str, list[Any]]:
        """The script source and its ``keys + args`` for ``op``."""
        kind = op.kind
        if kind == _CLAIM:
            caller, key, fp, lease = op.args
            keys = [self.record_key(caller, key), self._fence_key]
            return _CLAIM_LUA, [2, *keys, now, fp, max(1, round(lease * 1000))]
        if kind == _COMPLETE:
            caller, key, fence, c = op.args
            ttl = max(1, round(c.ttl * 1000))
            return _COMPLETE_LUA, [
                1,
                self.record_key(caller, key),
                now,
                fence,
                ttl,
                int(c.ok),
                c.payload,
            ]
        if kind == _EFFECT:
            caller, key, fence, c = op.args
            eff: LuaEffect = c.effect
            source = _EFFECT_HEAD + eff.script + _EFFECT_TAIL
            ttl = max(1, round(c.ttl * 1000))
            keys = [self.record_key(caller, key), *eff.keys]
            return source, [len(keys), *keys, now, fence, ttl, c.max_result_bytes, *eff.args]
        if kind == _RELEASE:
            caller, key, fence = op.args
            return _RELEASE_LUA, [1, self.record_key(caller, key), now, fence]
        caller, key = op.args
        return _GET_LUA, [1, self.record_key(caller, key), now]

    def _apply_batch(self, ops: list[Op]) -> None:
        now = self._now_arg()
        todo = [(op, *self._command(op, now)) for op in ops]
        for attempt in range(2):
            try:
                pipe = self.client.pipeline(transaction=False)
                for _, source, argv in todo:
                    pipe.evalsha(self._sha(source), *argv)
                replies = pipe.execute(raise_on_error=False)
            except redis_py.RedisError as exc:
                err = StoreUnavailable(f"{self._name}: {type(exc).__name__}: {exc}")
                for op, _, _ in todo:
                    op.error = err
                return
            retry = []
            for (op, source, argv), reply in zip(todo, replies, strict=True):
                if isinstance(reply, redis_py.exceptions.NoScriptError) and attempt == 0:
                    # The server lost its script cache (a restart): the script did not
                    # run. Load it again and resend just these.
                    with self._shas_lock:
                        self._shas.pop(source, None)
                    retry.append((op, source, argv))
                    continue
                try:
                    op.result = self._decode(op, reply)
                except Exception as exc:
                    op.error = exc
            if not retry:
                return
            todo = retry

    def _corrupt(self, op: Op, why: str) -> CorruptedRecord:
        caller, key = op.args[0], op.args[1]
        return CorruptedRecord(
            f"{self._name}: record {self.record_key(caller, key)!r} (caller={caller!r}, "
            f"key={key!r}): {why}"
        )

    def _decode(self, op: Op, reply: Any) -> Any:
        if isinstance(reply, redis_py.exceptions.ResponseError):
            text = str(reply)
            if "WRONGTYPE" in text:
                raise self._corrupt(op, "the key does not hold a hash")
            if op.kind == _EFFECT and "LuaEffect failed" in text:
                raise RuntimeError(text[text.index("LuaEffect failed") :])
            raise StoreUnavailable(f"{self._name}: {text}")
        if isinstance(reply, Exception):
            raise StoreUnavailable(f"{self._name}: {type(reply).__name__}: {reply}")
        code = reply[0]
        if code == -9:
            raise self._corrupt(op, f"fields s={reply[2]!r} f={reply[3]!r} x={reply[4]!r}")
        kind = op.kind
        caller, key = op.args[0], op.args[1]
        if kind == _CLAIM:
            fp = op.args[2]
            fence, x = reply[1], reply[2] / 1000
            if code == 0:
                return ClaimResult(ClaimKind.CLAIMED, Record(IN_PROGRESS, fp, fence, x))
            if code == 1:
                return ClaimResult(
                    ClaimKind.REPLAY, Record(COMPLETED, fp, fence, x, bool(reply[3]), reply[4])
                )
            if code == 2:
                return ClaimResult(ClaimKind.BUSY, Record(IN_PROGRESS, fp, fence, x))
            stored = reply[4]
            if type(stored) is not bytes or len(stored) != FINGERPRINT_SIZE:
                raise self._corrupt(op, f"fingerprint is not {FINGERPRINT_SIZE} bytes")
            if reply[3] == COMPLETED:
                return ClaimResult(_KINDS[code], Record(COMPLETED, stored, fence, x, True, b""))
            return ClaimResult(_KINDS[code], Record(IN_PROGRESS, stored, fence, x))
        if kind in (_COMPLETE, _EFFECT):
            fence = op.args[2]
            if code == -1:
                why = _STALE_WHY.get(reply[1]) or f"taken over by claim {reply[2]}"
                raise StaleClaim(caller, key, fence, why)
            if code == -2:
                limit = op.args[3].max_result_bytes
                raise InvalidResult(f"result encodes to {reply[1]} bytes; the limit is {limit}")
            return Record(COMPLETED, reply[4], fence, reply[1] / 1000, bool(reply[2]), reply[3])
        if kind == _RELEASE:
            return code == 0
        # _GET
        if code == 0:
            return None
        _, s, fp, fence, x, ok, payload = reply
        if s == COMPLETED:
            if type(payload) is not bytes:
                raise self._corrupt(op, "completed without a payload")
            return Record(COMPLETED, fp, fence, x / 1000, bool(ok), payload)
        return Record(IN_PROGRESS, fp, fence, x / 1000)

    def _sweep(self) -> int:
        now = self._now_arg()
        deleted = 0
        try:
            sha = self._sha(_SWEEP_LUA)
            for rkey in self.client.scan_iter(match=f"{self.prefix}rec:*", count=1000):
                deleted += int(self.client.evalsha(sha, 1, rkey, now))
        except redis_py.RedisError as exc:
            raise StoreUnavailable(f"{self._name}: sweep: {type(exc).__name__}: {exc}") from exc
        return deleted
