"""Keys, caller scopes and request fingerprints (pure: no trio, no gosim).

* A **key** is chosen by the client: 1-255 printable ASCII characters, as the IETF
  ``Idempotency-Key`` draft and Stripe allow (UUIDs, ULIDs, or any opaque token).
* A **caller** is the identity the key is scoped to (an account, a client id): the same
  key from two callers names two records. 1-255 printable characters (any script).
  A key or caller that is a ``str`` subclass (a ``StrEnum`` member) is accepted as the
  str it holds: validation returns a plain ``str`` of the same characters, and that is
  what stores keep (the subclass's own methods are never consulted).
* A **fingerprint** identifies the request a key was first used for: the SHA-256 of the
  canonical msgpack encoding of ``[operation, args]``. Two requests are the same when
  their arguments are the same msgpack value, whatever Python types carry it:

  - maps are unordered: every ``collections.abc.Mapping`` (``dict`` and its subclasses,
    ``OrderedDict``, ``defaultdict``, ``MappingProxyType``, ...) is written with its
    entries sorted by encoded key, so insertion order and the mapping's type do not
    matter. Two keys of one map that encode alike (two NaNs) are refused: a peer
    decoding the map would keep only one of them;
  - arrays are ordered: ``list``, ``tuple`` and their subclasses (named tuples) are the
    one msgpack array type, so ``(1, 2)`` and ``[1, 2]`` are the same request. Other
    containers (``set``, ``deque``, ``range``, generators) have no msgpack form and are
    refused with :class:`InvalidRequest`: convert them to a list first (being a
    ``Sequence`` is not enough: ``str``, ``bytes`` and ``array.array`` are sequences);
  - scalars keep their msgpack type: a ``str`` subclass is its str, an ``int`` subclass
    (``IntEnum``) its int, ``bytearray`` and ``memoryview`` are bytes. Strings and bytes
    stay distinct (``use_bin_type``), as do ``True`` and ``1``, and ``1`` and ``1.0``:
    msgpack keeps an integer and a float apart, a handler may treat them differently
    (``str(1.0)`` is ``"1.0"``, ``items[1.0]`` raises, a float drops digits past 2**53),
    and a JSON or msgpack peer sends each as what it is. Floats compare by their bits
    (``0.0`` and ``-0.0`` differ; a NaN equals the same NaN).

Alternatives rejected: hashing ``repr(args)`` (unstable across versions and types) and
JSON (no bytes, no non-string map keys). Stripe compares the whole stored request; a
32-byte digest keeps records small and comparisons constant-time in size. Treating ``1``
and ``1.0`` as one request (Python's ``==``) would replay an outcome computed from an
int to a caller that sent a float; a client that means the same amount sends the same
type.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any, Final

import msgpack

from ._accel import speedups as _speedups
from ._errors import InvalidKey, InvalidRequest

__all__ = [
    "DEFAULT_MAX_ARGS_BYTES",
    "FINGERPRINT_SIZE",
    "MAX_KEY_LENGTH",
    "canonical_packb",
    "fingerprint",
    "validate_caller",
    "validate_key",
]

MAX_KEY_LENGTH: Final = 255
FINGERPRINT_SIZE: Final = 32  # SHA-256
DEFAULT_MAX_ARGS_BYTES: Final = 1 << 20

_SCALARS: Final = frozenset({int, float, str, bytes, bool, type(None)})
_packb = msgpack.Packer(use_bin_type=True, autoreset=True).pack
# Encoded ``[operation,`` prefixes by operation name, bounded: names come from clients.
_HEADS: dict[str, bytes] = {}
_MAX_HEADS: Final = 1024


def _builtin_sha256() -> Any:
    """CPython's own SHA-256 constructor, else OpenSSL's. The built-in one costs about a
    quarter fewer instructions per small request (OpenSSL's context set-up dominates a
    one-block hash); the digests are the same."""
    try:
        return getattr(hashlib, "__get_builtin_constructor")("sha256")
    except (AttributeError, ValueError):  # pragma: no cover -- a Python without it
        return hashlib.sha256


_sha256: Final = _builtin_sha256()


def validate_key(key: object) -> str:
    """Return ``key`` as a plain ``str`` when it is a valid idempotency key, else raise
    :class:`InvalidKey`. A str subclass is checked (and returned) as the exact str of its
    characters."""
    if type(key) is str and 0 < len(key) <= MAX_KEY_LENGTH and key.isascii() and key.isprintable():
        return key
    return _checked_text(key, "idempotency key", True)


def validate_caller(caller: object) -> str:
    """Return ``caller`` as a plain ``str`` when it is a valid caller identity, else raise
    :class:`InvalidKey`. A str subclass is checked (and returned) as the exact str of
    its characters."""
    if type(caller) is str and 0 < len(caller) <= MAX_KEY_LENGTH and caller.isprintable():
        return caller
    return _checked_text(caller, "caller", False)


def _checked_text(value: object, what: str, ascii_only: bool) -> str:
    """The slow path of validate_key (``ascii_only``) and validate_caller: a str
    subclass, or a value that fails, with the InvalidKey that says why."""
    if not isinstance(value, str):
        raise InvalidKey(f"{what} must be a str, not {type(value).__name__}")
    # The subclass's own __len__, isprintable or __iter__ are not to be trusted.
    value = str.__str__(value)
    if not value:
        raise InvalidKey(f"{what} is empty")
    if len(value) > MAX_KEY_LENGTH:
        raise InvalidKey(
            f"{what} is {len(value)} characters long; at most {MAX_KEY_LENGTH} are allowed"
        )
    for i, c in enumerate(value):
        if ascii_only and not (c.isascii() and c.isprintable()):
            raise InvalidKey(
                f"{what} {value[:40]!r} contains {c!r} at index {i}: "
                "only printable ASCII (space to '~') is allowed"
            )
        if not c.isprintable():
            raise InvalidKey(f"{what} {value[:40]!r} contains the unprintable {c!r}")
    return value


def _first(item: tuple[bytes, Any, Any]) -> bytes:
    return item[0]


def _canonical(obj: Any) -> Any:
    """``obj`` with every map rebuilt as a dict in sorted order of its encoded keys, and
    every array that holds a map (or is a list or tuple subclass) rebuilt as a list."""
    t = type(obj)
    if t in _SCALARS:
        return obj
    if t is list or t is tuple:
        for item in obj:
            if type(item) not in _SCALARS:
                return [_canonical(x) for x in obj]
        return obj  # the common case: a flat argument list, returned untouched
    if t is dict:
        return _sorted_map(obj)
    if isinstance(obj, Mapping):  # dict subclasses, OrderedDict, MappingProxyType, ...
        return _sorted_map(obj)
    if isinstance(obj, (list, tuple)):  # subclasses: a named tuple, a list of one's own
        return [_canonical(x) for x in obj]
    return obj  # a scalar subclass or ExtType (the packer takes it), or TypeError there


def _sorted_map(obj: Mapping[Any, Any]) -> dict[Any, Any]:
    # Sort by the encoded key: a total order over every msgpack type. Keys are hashable,
    # so they hold no maps and encode the same with or without _canonical.
    items = sorted(((_packb(k), k, _canonical(v)) for k, v in obj.items()), key=_first)
    out = {k: v for _, k, v in items}
    if len(out) != len(items) or any(items[i][0] == items[i + 1][0] for i in range(len(items) - 1)):
        raise ValueError("a map has two keys that are equal or encode alike (a peer keeps one)")
    return out


def canonical_packb(obj: Any) -> bytes:
    """The canonical msgpack encoding of ``obj`` (maps sorted by encoded key).

    Raises TypeError, ValueError or OverflowError from msgpack when ``obj`` cannot be
    encoded.
    """
    packed: bytes = _packb(_canonical(obj))
    return packed


def fingerprint(operation: object, args: Any, max_bytes: int = DEFAULT_MAX_ARGS_BYTES) -> bytes:
    """The 32-byte fingerprint of the request ``(operation, args)``.

    Raises :class:`InvalidRequest` when the operation is not a non-empty str that UTF-8
    can encode (a lone surrogate cannot), when the arguments cannot be encoded as msgpack
    (such a string among them included), or when their encoding exceeds ``max_bytes``.
    """
    if type(operation) is not str:
        if not isinstance(operation, str):
            raise InvalidRequest(f"operation must be a non-empty str, not {operation!r:.60}")
        operation = str.__str__(operation)  # a StrEnum member: the str it holds
    if not operation:
        raise InvalidRequest(f"operation must be a non-empty str, not {operation!r:.60}")
    # The encoding of ``[operation, args]`` is a two-element array header, the
    # operation, then the arguments: the first two are cached per operation name.
    head = _HEADS.get(operation)
    if head is None:
        try:
            head = b"\x92" + _packb(operation)
        except UnicodeEncodeError as exc:  # a lone surrogate: no UTF-8 for it
            raise InvalidRequest(
                f"operation {operation!r:.60} cannot be encoded as UTF-8: {exc.reason} "
                f"at index {exc.start}"
            ) from exc
        if len(_HEADS) < _MAX_HEADS:
            _HEADS[operation] = head
    try:
        packed = head + _packb(_canonical(args))
    except (TypeError, ValueError, OverflowError, RecursionError) as exc:
        raise InvalidRequest(
            f"arguments of {operation!r} are not msgpack-serialisable: {exc}"
        ) from exc
    if len(packed) > max_bytes:
        raise InvalidRequest(
            f"arguments of {operation!r} encode to {len(packed)} bytes; the limit is {max_bytes}"
        )
    digest: bytes = _sha256(packed).digest()
    return digest


# The C twin (idempotency/_speedups_keys.c.h), when built: arguments of scalars in lists and
# tuples (no map) whose operation's prefix is cached; the function above, kept as the
# reference, serves every other request and says what is wrong with a bad one.
_py_fingerprint: Final = fingerprint
if _speedups is not None:
    _speedups.configure_keys(fingerprint=_py_fingerprint, pack=_packb, sha256=_sha256, heads=_HEADS)
    fingerprint = _speedups.fingerprint
