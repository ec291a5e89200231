"""RedisStore: records in Redis, shared by processes and machines (redis-py, Lua).

Every operation runs inside a Lua script, so Redis runs it atomically: the claim reads
the record, decides, takes a fencing token (``INCR`` on one counter key) and writes;
the completion checks the fence and writes; an effect runs in the completion's script.
The records of one store and its fence counter must live on one Redis (not spread over
a cluster's slots): a script touches several of them. The
scripts implement the table of ``idempotency._record`` and must agree with it (the
contract suite and the state-machine test run against both; the names of the states
are the same integers).

Layout of a record: a hash at ``{prefix}rec:{len(caller)}:{caller}:{key}`` (the length
keeps a caller with ``:`` in it from colliding with another; the fence counter is
``{prefix}fence``) with fields ``s`` (state),
``fp`` (fingerprint), ``f`` (fence), ``x`` (expiry, Unix milliseconds), and once
completed ``ok`` and ``p`` (payload). The key also carries a Redis TTL at its expiry, so
Redis sweeps expired records itself; :meth:`RedisStore.sweep` exists for a clock other
than the server's.

Time: by default the scripts read the server's clock (``TIME``), one clock for every
process. A ``clock`` given to the store is sent with each call instead (tests use it to
move time by hand); the key's Redis TTL still runs on the server's clock. On a runtime
with a virtual clock, which the server's does not follow, a store without a ``clock``
fails every operation with :class:`RuntimeError` saying why (a lease would not lapse in
simulated time): give it one that follows the runtime's (``clock=lambda: base +
gosim.now()``).

Batching: concurrent calls' operations go through the same
:class:`~._batch.GroupCommitter` as SQLite's group commit, off the scheduler on the
committer's thread: a batch's claims, completions, releases and reads travel as one
script call (the script loops over them), and effects as further scripts in the same
pipeline, so a batch costs one round trip and redis-py's per-command cost is paid per
batch. redis-py's own retries are off: a script whose reply was lost may have run, and
sending it again could, for example, answer a claim with its own BUSY.

Durability is Redis's: configure ``appendonly yes`` with ``appendfsync always`` for an
acknowledged record to survive a crash of the Redis server (``everysec`` may lose the
last second). A lost connection fails the batch's operations with
:class:`StoreUnavailable`; one whose script had already run may have claimed (the claim
lapses with its lease) or completed (a retry replays it).

Exactly-once effects: a handler returns ``LuaEffect(script, keys, args)``. The script
body runs inside the completion's script after the fence check, with its own ``KEYS``
and ``ARGV``, and returns the call's result (encoded with ``cmsgpack``). It may call
``idempotency_fail(code, message, data)`` to refuse: the refusal is recorded. Redis
cannot roll a script back, so the body should check everything before its first
write: a script that fails before writing releases the key (a retry runs it again),
and one that has written is recorded whatever follows (its error, or a result over
the limit, becomes the final ``UNRECORDED_RESULT`` error), so it is never applied twice.

Prefixes: two stores on one Redis must not share keys, yet a prefix followed by a
record's key can spell another prefix followed by another record's key: the store of
``"app:"`` keeps caller ``"bob"``'s key ``"x:rec:1:c:k"`` at ``app:rec:3:bob:x:rec:1:c:k``,
which is also where the store of ``"app:rec:3:bob:x:"`` keeps caller ``"c"``'s key
``"k"``. Every such pair has ``rec:`` in the longer prefix, so a prefix with ``rec:`` in
it is refused (ValueError at construction): between prefixes without it, no two
stores' keys meet. The sweep matches its prefix literally (glob characters in it are
escaped), so it never reads another store's records either.

Leases and TTLs of ``math.inf`` (or longer than about 3,000 years) never expire: the
record keeps the expiry ``NEVER`` and no Redis TTL.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Sequence
from typing import Any, Final

import msgpack
import redis as redis_py
from redis.backoff import NoBackoff
from redis.retry import Retry

import gosim

from .._errors import CorruptedRecord, InProgress, InvalidResult, StaleClaim, StoreUnavailable
from .._keys import FINGERPRINT_SIZE
from .._record import (
    COMPLETED,
    IN_PROGRESS,
    ClaimKind,
    ClaimResult,
    Record,
    _new_claim_result,
    _new_record,
)
from .._secrets import clean_cause, masked, redact
from ._batch import BatchedStore, GroupCommitter, Op, OpKind
from ._contract import (
    Effect,
    StoredRecord,
    refused_on_virtual_clock,
)

__all__ = ["LuaEffect", "RedisStore"]

# Redis's cmsgpack predates msgpack's bin type: bytes go as raw strings, which it reads
# as Lua strings, byte for byte.
_packb = msgpack.Packer(use_bin_type=False, autoreset=True).pack

# The library every script starts with: the time, and one function per operation of
# idempotency._record (which they must agree with; the states are the same integers).
# KEYS[1] is always the fence counter; ARGV[1] is the caller's clock in ms, or "" for
# the server's. Functions return the reply of their operation; -9 is a corrupted record.
_LIB: Final = """
local now = tonumber(ARGV[1])
if not now then
    local t = redis.call('TIME')
    now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local fence_key = KEYS[1]
-- The expiry of a record that never expires (a lease or TTL of math.inf, or one past
-- it): fourteen digits, which Lua's number-to-string conversion keeps exact.
local NEVER = 99999999999999

-- The expiry `d` ms from now; then k's Redis TTL to match it (none for NEVER).
local function expiry(d)
    if now + d >= NEVER then return NEVER end
    return now + d
end
local function expire(k, d, x)
    if x == NEVER then redis.call('PERSIST', k) else redis.call('PEXPIRE', k, d) end
end

-- k's record: {rec = HMGET fields, s, x, live}, or nil and the corruption reply.
local function load(k)
    local rec = redis.call('HMGET', k, 's', 'fp', 'f', 'x', 'ok', 'p')
    local s, x = tonumber(rec[1]), tonumber(rec[4])
    if rec[1] and (not (s == 1 or s == 2) or not x or not tonumber(rec[3])) then
        return nil, {-9, 'corrupted', rec[1] or '', rec[3] or '', rec[4] or ''}
    end
    return {rec = rec, s = s, x = x, live = s ~= nil and x > now}
end

-- _record._check_holder: nil when `fence` holds k's live claim, else the stale reply.
local function stale(r, fence)
    if not r.rec[1] then return {-1, 'gone', 0} end
    if tonumber(r.rec[3]) ~= fence then return {-1, 'taken', tonumber(r.rec[3])} end
    if not r.live then return {-1, 'lapsed', 0} end
    if r.s == 2 then return {-1, 'completed', 0} end
    return nil
end

-- _record.claim: 0 claimed, 1 replay, 2 busy, 3 mismatch.
local function claim(k, fp, lease)
    local r, bad = load(k)
    if bad then return bad end
    if not r.live then
        local fence = redis.call('INCR', fence_key)
        -- A lapsed record's fields go first; a new key has none (and skips the call).
        if r.rec[1] then redis.call('DEL', k) end
        local expires = expiry(lease)
        redis.call('HSET', k, 's', 1, 'fp', fp, 'f', fence, 'x', expires)
        expire(k, lease, expires)
        return {0, fence, expires}
    end
    local rec = r.rec
    if rec[2] ~= fp then return {3, tonumber(rec[3]), r.x, r.s, rec[2]} end
    if r.s == 2 then return {1, tonumber(rec[3]), r.x, tonumber(rec[5]), rec[6]} end
    return {2, tonumber(rec[3]), r.x}
end

-- _record.complete. The payload is sent back only when the script made it (`echo`,
-- an effect's result): a batch's caller has its own, and it may be a megabyte.
local function complete(k, fence, ttl, ok, payload, echo)
    local r, bad = load(k)
    if bad then return bad end
    local st = stale(r, fence)
    if st then return st end
    local expires = expiry(ttl)
    redis.call('HSET', k, 's', 2, 'x', expires, 'ok', ok, 'p', payload)
    expire(k, ttl, expires)
    return {0, expires, tonumber(ok), echo and payload or false, r.rec[2]}
end

-- _record.renew: the live claim's lease runs `lease` ms from now (never shortened).
local function renew(k, fence, lease)
    local r, bad = load(k)
    if bad then return bad end
    local st = stale(r, fence)
    if st then return st end
    local expires = expiry(lease)
    if expires <= r.x then return {0, r.x, r.rec[2]} end
    redis.call('HSET', k, 'x', expires)
    expire(k, lease, expires)
    return {0, expires, r.rec[2]}
end

-- _record.release.
local function release(k, fence)
    local r, bad = load(k)
    if bad then return bad end
    local st = stale(r, fence)
    if st then return st end
    redis.call('DEL', k)
    return {0}
end

-- The live record, or {0}.
local function get(k)
    local r, bad = load(k)
    if bad then return bad end
    if not r.live then return {0} end
    local rec = r.rec
    return {1, r.s, rec[2], tonumber(rec[3]), r.x, tonumber(rec[5]) or 1, rec[6] or false}
end
"""

# A whole batch in one script: KEYS[2..] are the operations' records, ARGV[2] the
# msgpack array of their kinds and arguments in order. One command per batch keeps
# redis-py's per-command cost (packing, parsing: most of a round trip's CPU) off the
# per-call path, and one packed argument its per-argument cost (an encode and a buffer
# for each of four or five arguments an operation). Each operation runs under pcall, so
# one's error (a key of the wrong type) is its own reply (-8).
_BATCH_LUA: Final = (
    _LIB
    + """
local spec, out, a = cmsgpack.unpack(ARGV[2]), {}, 1
for i = 2, #KEYS do
    local kind, k, ok, res = spec[a], KEYS[i], nil, nil
    if kind == 0 then
        ok, res = pcall(claim, k, spec[a + 1], spec[a + 2])
        a = a + 3
    elseif kind == 1 then
        ok, res = pcall(complete, k, spec[a + 1], spec[a + 2], spec[a + 3], spec[a + 4], false)
        a = a + 5
    elseif kind == 2 then
        ok, res = pcall(release, k, spec[a + 1])
        a = a + 2
    elseif kind == 4 then
        ok, res = pcall(renew, k, spec[a + 1], spec[a + 2])
        a = a + 3
    else
        ok, res = pcall(get, k)
        a = a + 1
    end
    if not ok then
        if type(res) == 'table' and res.err then res = res.err end
        res = {-8, tostring(res)}
    end
    out[i - 1] = res
end
return out
"""
)

# Commands that only read: an effect that has called nothing else has written nothing.
_READ_ONLY: Final = (
    "GET", "MGET", "STRLEN", "GETRANGE", "EXISTS", "TYPE", "TTL", "PTTL", "HGET", "HMGET",
    "HGETALL", "HEXISTS", "HLEN", "HKEYS", "HVALS", "HSTRLEN", "LLEN", "LRANGE", "LINDEX",
    "SCARD", "SISMEMBER", "SMISMEMBER", "SMEMBERS", "ZCARD", "ZSCORE", "ZMSCORE", "ZRANGE",
    "ZRANGEBYSCORE", "ZREVRANGE", "ZRANK", "ZREVRANK", "ZCOUNT", "TIME",
)  # fmt: skip

# A completion with an effect: KEYS = fence, record, the effect's KEYS...; ARGV = now,
# fence, ttl ms, max payload bytes, the effect's ARGV... The body is spliced in below;
# it runs only after the fence check, and its result is recorded by `complete`. The
# body's ``redis`` is a stand-in that notes whether it wrote (a command not in
# _READ_ONLY that succeeded): Redis cannot undo a script, so once the body has written,
# the key is completed whatever happens next (its error, or a result too large to
# record, becomes the final UNRECORDED_RESULT error): a retry replays it, and the
# effect is never applied twice. An effect that failed before writing releases the key.
_EFFECT_HEAD: Final = (
    _LIB
    + """
local r, bad = load(KEYS[2])
if bad then return bad end
local st = stale(r, tonumber(ARGV[2]))
if st then return st end
local function idempotency_fail(code, message, data)
    error({idempotency_fail = true, code = code, message = message, data = data})
end
local effect_keys, effect_argv = {}, {}
for i = 3, #KEYS do effect_keys[i - 2] = KEYS[i] end
for i = 5, #ARGV do effect_argv[i - 4] = ARGV[i] end
local wrote, reads, real_redis = false, {"""
    + ", ".join(f"{name}=true" for name in _READ_ONLY)
    + """}, redis
local function noting(fn, answered)
    return function(cmd, ...)
        local res = fn(cmd, ...)
        if answered(res) and not (type(cmd) == 'string' and reads[string.upper(cmd)]) then
            wrote = true
        end
        return res
    end
end
local redis = setmetatable({
    call = noting(real_redis.call, function(res) return true end),
    pcall = noting(real_redis.pcall, function(res)
        return not (type(res) == 'table' and res.err) end),
}, {__index = real_redis})
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
    if not wrote then return real_redis.error_reply('LuaEffect failed: ' .. tostring(res)) end
    okflag, payload = 0, cmsgpack.pack({13, string.sub('the effect was applied but its'
        .. ' result cannot be recorded: LuaEffect failed after writing: '
        .. tostring(res), 1, 512)})
end
if #payload > tonumber(ARGV[4]) then
    if not wrote then return {-2, #payload} end
    okflag, payload = 0, cmsgpack.pack({13, 'the effect was applied but its result cannot'
        .. ' be recorded: result encodes to ' .. #payload .. ' bytes; the limit is '
        .. ARGV[4]})
end
return complete(KEYS[2], tonumber(ARGV[2]), tonumber(ARGV[3]), okflag, payload, true)
"""

# Delete KEYS[2] if it has expired. ARGV: now.
_SWEEP_LUA: Final = (
    _LIB
    + """
local r, bad = load(KEYS[2])
if bad then return 0 end
if r.rec[1] and not r.live then redis.call('DEL', KEYS[2]) return 1 end
return 0
"""
)

# The operator's tools: the record of KEYS[2] as stored, and with ARGV[2] == "1" deleted
# in the same script unless it is a live claim (ARGV[3] == "1": even then). Replies
# {0, now} when nothing is stored, else {1 (or 2: refused, kept), now, type, s, fp, f, x,
# ok, p} (a damaged record, of another type or with bad fields, is deleted too).
_OPERATOR_LUA: Final = (
    _LIB
    + """
local k = KEYS[2]
local t = redis.call('TYPE', k)['ok']
if t == 'none' then return {0, now} end
if t ~= 'hash' then
    if ARGV[2] == '1' then redis.call('DEL', k) end
    return {1, now, t}
end
local rec = redis.call('HMGET', k, 's', 'fp', 'f', 'x', 'ok', 'p')
local reply = {1, now, t, rec[1], rec[2], rec[3], rec[4], rec[5], rec[6]}
if ARGV[2] == '1' then
    local r, bad = load(k)
    if not bad and r.live and r.s == 1 and ARGV[3] ~= '1' then
        reply[1] = 2
        return reply
    end
    redis.call('DEL', k)
end
return reply
"""
)

_CLAIM: Final = OpKind.CLAIM
_COMPLETE: Final = OpKind.COMPLETE
_RELEASE: Final = OpKind.RELEASE
_GET: Final = OpKind.GET
_EFFECT: Final = OpKind.EFFECT  # a completion with a LuaEffect: a script of its own
_RENEW: Final = OpKind.RENEW  # the batch script's kind 4
_NEVER_MS: Final = 99_999_999_999_999  # the scripts' NEVER: an expiry that never comes
_OP_NAMES: Final[dict[int, str]] = {
    _CLAIM: "claim", _COMPLETE: "completion", _RELEASE: "release", _GET: "read",
    _EFFECT: "completion", _RENEW: "renewal",
}  # fmt: skip
_KINDS: Final = (ClaimKind.CLAIMED, ClaimKind.REPLAY, ClaimKind.BUSY, ClaimKind.MISMATCH)
_STALE_WHY: Final = {
    b"gone": "the record is gone (released or swept)",
    b"lapsed": "its lease lapsed",
    b"completed": "it was already completed",
}


def _ms(seconds: float) -> int:
    """A lease or TTL in the scripts' milliseconds: at least 1, and _NEVER_MS for
    ``math.inf`` or anything as long (the record then never expires)."""
    ms = seconds * 1000
    return _NEVER_MS if ms >= _NEVER_MS else max(1, round(ms))


def _seconds(ms: int) -> float:
    """A record's expiry from the scripts' milliseconds (NEVER is ``math.inf``)."""
    return math.inf if ms >= _NEVER_MS else ms / 1000


def _array_header(n: int) -> bytes:
    """The msgpack header of an array of ``n`` items."""
    if n < 16:
        return bytes((0x90 | n,))
    if n < 0x10000:
        return b"\xdc" + n.to_bytes(2, "big")
    return b"\xdd" + n.to_bytes(4, "big")


def check_reachable(url: str, timeout: float = 3.0) -> None:
    """Ping the Redis server at ``url`` once, within ``timeout`` seconds.

    Raises :class:`~idempotency.StoreUnavailable` saying what failed in one line (a
    malformed URL, a refused connection, a server that does not answer), so a command
    line can refuse a bad ``--redis`` before it starts anything.
    """
    try:
        client = redis_py.Redis.from_url(
            url, socket_connect_timeout=timeout, socket_timeout=timeout
        )
        try:
            client.ping()
        finally:
            client.close()
    except (ValueError, redis_py.RedisError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise StoreUnavailable(redact(first, url)) from clean_cause(exc, url)


class LuaEffect(Effect):
    """An effect committed with its record: the Lua ``script`` body runs inside the
    script that completes the record, with ``KEYS = keys`` and ``ARGV = args``, and
    returns the call's result (see the module docstring for the rules).

    Once the script has written (called a command that is not a read, and it
    succeeded), its writes stand: if it then fails, or its result cannot be recorded,
    the key is completed with the final ``UNRECORDED_RESULT`` error, which every retry
    replays. A script that fails before writing, or does not compile, releases the key
    and fails its own call only."""

    __slots__ = ("args", "keys", "script")

    def __init__(self, script: str, keys: Sequence[str] = (), args: Sequence[Any] = ()) -> None:
        self.script = script
        self.keys = list(keys)
        self.args = list(args)


class RedisStore(BatchedStore):
    """Records in Redis at ``url`` under ``prefix`` (see the module docstring; a prefix
    with ``rec:`` in it is refused with ValueError, see "Prefixes" there).

    ``socket_timeout`` bounds each round trip; ``max_batch`` bounds a pipeline.
    ``clock``: None for the server's clock (the right choice for several processes;
    refused on a virtual clock, see the module docstring).
    """

    _effect_type = LuaEffect
    _effect_kind = _EFFECT

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
        if not isinstance(prefix, str) or "rec:" in prefix:
            raise ValueError(
                f"RedisStore: prefix must be a str without 'rec:' in it (a prefix with it"
                " can be another store's prefix followed by one of its records' keys: see"
                f" the module docstring), not {prefix!r:.120}"
            )
        self.url = url
        self.prefix = prefix
        self._clock = clock
        self._name = f"RedisStore({masked(url)!r}, prefix={prefix!r})"  # never the password
        self.client = client or redis_py.Redis.from_url(
            url,
            socket_timeout=socket_timeout,
            socket_connect_timeout=socket_timeout,
            retry=Retry(NoBackoff(), 0),
        )
        self._fence_key = f"{prefix}fence"
        self._shas: dict[str, str] = {}  # script source -> SHA1 loaded in the server
        self._shas_lock = threading.Lock()
        self._committer = GroupCommitter(
            self._apply_batch, max_batch, refused=None if clock is not None else self._refused
        )

    def __repr__(self) -> str:
        return self._name

    def _redact(self, exc: BaseException) -> str:
        """``exc``'s text without the URL's password."""
        return redact(str(exc), self.url)

    def record_key(self, caller: str, key: str) -> str:
        """The Redis key of (caller, key)'s record."""
        return f"{self.prefix}rec:{len(caller)}:{caller}:{key}"

    # ------------------------------------------------------------------ public API

    def _close(self) -> None:
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

    def _batch_args(self, op: Op) -> tuple[str, int, bytes]:
        """``op``'s record key, and its ``kind, arguments`` for the batch script: how many
        items, and their msgpack encoding (each op's own, so that one the script cannot
        be sent fails alone)."""
        kind = op.kind
        rkey = self.record_key(op.args[0], op.args[1])
        items: tuple[Any, ...]
        if kind == _CLAIM:
            items = (0, op.args[2], _ms(op.args[3]))
        elif kind == _COMPLETE:
            c = op.args[3]
            items = (1, op.args[2], _ms(c.ttl), int(c.ok), c.payload)
        elif kind == _RELEASE:
            items = (2, op.args[2])
        elif kind == _RENEW:
            items = (4, op.args[2], _ms(op.args[3]))
        else:
            items = (3,)
        return rkey, len(items), _packb(items)[1:]  # less the array's one-byte header

    def _effect_command(self, op: Op, now: str) -> tuple[str, list[Any]]:
        caller, key, fence, c = op.args
        eff: LuaEffect = c.effect
        keys = [self._fence_key, self.record_key(caller, key), *eff.keys]
        source = _EFFECT_HEAD + eff.script + _EFFECT_TAIL
        return source, [len(keys), *keys, now, fence, _ms(c.ttl), c.max_result_bytes, *eff.args]

    def _bad_call(self, op: Op, exc: Exception) -> Exception:
        """The error of an operation that cannot be sent, naming its call."""
        what = _OP_NAMES.get(op.kind, f"operation {op.kind}")
        caller, key = op.args[0], op.args[1]
        err = TypeError(
            f"{self._name}: {what} of caller {caller!r}, key {key!r} cannot be sent:"
            f" {type(exc).__name__}: {exc}"
        )
        err.__cause__ = exc
        return err

    def _apply_batch(self, ops: list[Op]) -> None:
        now = self._now_arg()
        # Commands of the pipeline: (script, numkeys + keys + args, the ops it serves).
        todo: list[tuple[str, list[Any], list[Op]]] = []
        plain: list[Op] = []
        keys: list[Any] = [self._fence_key]
        chunks: list[bytes] = []
        items = 0
        for op in ops:
            # An operation whose arguments cannot be encoded fails alone.
            try:
                if op.kind == _EFFECT:
                    source, argv = self._effect_command(op, now)
                    todo.append((source, argv, [op]))
                    continue
                rkey, n, chunk = self._batch_args(op)
            except Exception as exc:
                op.error = self._bad_call(op, exc)
                continue
            plain.append(op)
            keys.append(rkey)
            chunks.append(chunk)
            items += n
        if plain:
            spec = _array_header(items) + b"".join(chunks)
            todo.insert(0, (_BATCH_LUA, [len(keys), *keys, now, spec], plain))
        for attempt in range(2):
            try:
                pipe = self.client.pipeline(transaction=False)
                sent = []
                for command in todo:
                    try:
                        sha = self._sha(command[0])
                    except redis_py.exceptions.ResponseError as exc:
                        if "compiling" not in str(exc):
                            raise
                        # An effect's script that does not compile: its call alone.
                        for op in command[2]:
                            op.error = RuntimeError(f"LuaEffect does not compile: {exc}")
                        continue
                    pipe.evalsha(sha, *command[1])
                    sent.append(command)
                todo = sent
                replies = pipe.execute(raise_on_error=False) if todo else []
            except redis_py.RedisError as exc:
                err = StoreUnavailable(f"{self._name}: {type(exc).__name__}: {self._redact(exc)}")
                for _, _, served in todo:
                    for op in served:
                        op.error = err
                return
            retry = []
            for (source, argv, served), reply in zip(todo, replies, strict=True):
                if isinstance(reply, redis_py.exceptions.NoScriptError) and attempt == 0:
                    # The server lost its script cache (a restart): the script did not
                    # run. Load it again and resend just this command.
                    with self._shas_lock:
                        self._shas.pop(source, None)
                    retry.append((source, argv, served))
                    continue
                per_op = reply if source is _BATCH_LUA and isinstance(reply, list) else [reply]
                if len(per_op) != len(served):  # the whole command failed
                    per_op = [reply] * len(served)
                for op, op_reply in zip(served, per_op, strict=True):
                    try:
                        op.result = self._decode(op, op_reply)
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
        if code == -8:  # an error inside the batch script, for this operation only
            text = reply[1].decode(errors="replace")
            if "WRONGTYPE" in text:
                raise self._corrupt(op, "the key does not hold a hash")
            raise StoreUnavailable(f"{self._name}: {text}")
        if code == -9:
            raise self._corrupt(op, f"fields s={reply[2]!r} f={reply[3]!r} x={reply[4]!r}")
        kind = op.kind
        caller, key = op.args[0], op.args[1]
        # Records and results of the common answers are built with every field given
        # (tuple.__new__): a named tuple's own constructor is a Python function, about
        # 3,000 instructions a call (see _record).
        if kind == _CLAIM:
            fp = op.args[2]
            fence, x = reply[1], _seconds(reply[2])
            if code == 0:
                rec = _new_record(Record, (IN_PROGRESS, fp, fence, x, True, None))
                return _new_claim_result(ClaimResult, (ClaimKind.CLAIMED, rec))
            if code == 1:
                rec = _new_record(Record, (COMPLETED, fp, fence, x, bool(reply[3]), reply[4]))
                return _new_claim_result(ClaimResult, (ClaimKind.REPLAY, rec))
            if code == 2:
                rec = _new_record(Record, (IN_PROGRESS, fp, fence, x, True, None))
                return _new_claim_result(ClaimResult, (ClaimKind.BUSY, rec))
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
            payload = reply[3] if kind == _EFFECT else op.args[3].payload
            return _new_record(
                Record, (COMPLETED, reply[4], fence, _seconds(reply[1]), bool(reply[2]), payload)
            )
        if kind == _RELEASE:
            return code == 0
        if kind == _RENEW:
            fence = op.args[2]
            if code == -1:
                why = _STALE_WHY.get(reply[1]) or f"taken over by claim {reply[2]}"
                raise StaleClaim(caller, key, fence, why)
            return Record(IN_PROGRESS, reply[2], fence, _seconds(reply[1]))
        # _GET
        if code == 0:
            return None
        _, s, fp, fence, x, ok, payload = reply
        if s == COMPLETED:
            if type(payload) is not bytes:
                raise self._corrupt(op, "completed without a payload")
            return Record(COMPLETED, fp, fence, _seconds(x), bool(ok), payload)
        return Record(IN_PROGRESS, fp, fence, _seconds(x))

    async def sweep(self) -> int:
        if refused := self._refused():
            raise refused
        return await gosim.syscall(self._sweep)

    def _refused(self) -> RuntimeError | None:
        """Why the running runtime cannot use the store (the server's clock on a
        virtual one), or None: the batches' check and the tools'."""
        if self._clock is not None:
            return None
        return refused_on_virtual_clock(self._name, "the Redis server's clock (TIME)")

    def _sweep(self) -> int:
        now = self._now_arg()
        deleted = 0
        try:
            sha = self._sha(_SWEEP_LUA)
            match = _glob_escape(self.prefix) + "rec:*"
            for rkey in self.client.scan_iter(match=match, count=1000):
                deleted += int(self.client.evalsha(sha, 2, self._fence_key, rkey, now))
        except redis_py.RedisError as exc:
            text = self._redact(exc)
            raise StoreUnavailable(
                f"{self._name}: sweep: {type(exc).__name__}: {text}"
            ) from clean_cause(exc, self.url)
        return deleted

    # ------------------------------------------------------------ operator's tools

    async def inspect(self, caller: str, key: str) -> StoredRecord | None:
        if refused := self._refused():
            raise refused
        return await gosim.syscall(self._inspect_or_forget, caller, key, False, False)

    async def forget(self, caller: str, key: str, *, force: bool = False) -> StoredRecord | None:
        if refused := self._refused():
            raise refused
        return await gosim.syscall(self._inspect_or_forget, caller, key, True, force)

    def _inspect_or_forget(
        self, caller: str, key: str, delete: bool, force: bool
    ) -> StoredRecord | None:
        """``inspect`` or ``forget`` in one script (so the check and the delete are
        atomic), on the syscall thread. The script's source is sent each time: an
        operator's call is rare, and it then never meets a server that lost its cache."""
        rkey = self.record_key(caller, key)
        try:
            reply = self.client.eval(
                _OPERATOR_LUA, 2, self._fence_key, rkey, self._now_arg(), int(delete), int(force)
            )
        except redis_py.RedisError as exc:
            doing = "forget" if delete else "inspect"
            text = self._redact(exc)
            raise StoreUnavailable(
                f"{self._name}: {doing}: {type(exc).__name__}: {text}"
            ) from clean_cause(exc, self.url)
        now = reply[1] / 1000
        if reply[0] == 0:
            return None
        where = f"{self._name}: record {rkey!r} (caller={caller!r}, key={key!r})"
        if reply[2] != b"hash":
            why = f"{where}: the key does not hold a hash but a {reply[2].decode()}"
            return StoredRecord(caller, key, None, why, now)
        try:
            held = StoredRecord(caller, key, _stored_record(where, *reply[3:9]), None, now)
        except CorruptedRecord as exc:
            held = StoredRecord(caller, key, None, str(exc), now)
        if reply[0] == 2:
            raise InProgress(caller, key)
        return held


def _glob_escape(text: str) -> str:
    """``text`` as a Redis glob pattern (``SCAN MATCH``) that matches it alone."""
    return "".join("\\" + c if c in "*?[]\\^" else c for c in text)


def _stored_record(where: str, s: Any, fp: Any, f: Any, x: Any, ok: Any, payload: Any) -> Record:
    """The Record of a hash's fields as read (bytes or None); CorruptedRecord saying
    which field is wrong."""
    if s not in (b"1", b"2"):
        raise CorruptedRecord(f"{where}: state {s!r} is not 1 or 2")
    if type(fp) is not bytes or len(fp) != FINGERPRINT_SIZE:
        raise CorruptedRecord(f"{where}: fingerprint is not {FINGERPRINT_SIZE} bytes: {fp!r:.80}")
    try:
        fence = int(f)
        expires_ms = float(x)
    except (TypeError, ValueError):
        raise CorruptedRecord(f"{where}: fence {f!r} or expiry {x!r} is not a number") from None
    if fence < 1:
        raise CorruptedRecord(f"{where}: fence {fence} is not positive")
    if s == b"1":
        if payload is not None:
            raise CorruptedRecord(f"{where}: in progress with a payload")
        return Record(IN_PROGRESS, fp, fence, expires_ms / 1000)
    if ok not in (b"0", b"1") or type(payload) is not bytes:
        raise CorruptedRecord(f"{where}: completed without an ok flag and a payload")
    return Record(COMPLETED, fp, fence, expires_ms / 1000, ok == b"1", payload)
