"""Keys, caller scopes and request fingerprints (pure: no trio, no gosim).

* A **key** is chosen by the client: 1-255 printable ASCII characters, as the IETF
  ``Idempotency-Key`` draft and Stripe allow (UUIDs, ULIDs, or any opaque token).
* A **caller** is the identity the key is scoped to (an account, a client id): the same
  key from two callers names two records. 1-255 printable characters (any script).
* A **fingerprint** identifies the request a key was first used for: the SHA-256 of the
  canonical msgpack encoding of ``[operation, args]``. Canonical means equal requests
  encode to equal bytes: maps are written with their entries sorted by the encoded key,
  and tuples encode as lists (msgpack has one array type). Strings and bytes stay
  distinct (``use_bin_type``), as do ``True`` and ``1``.

Alternatives rejected: hashing ``repr(args)`` (unstable across versions and types) and
JSON (no bytes, no non-string map keys). Stripe compares the whole stored request; a
32-byte digest keeps records small and comparisons constant-time in size.
"""

from __future__ import annotations

import hashlib
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
    """Return ``key`` when it is a valid idempotency key, else raise :class:`InvalidKey`."""
    if type(key) is str and 0 < len(key) <= MAX_KEY_LENGTH and key.isascii() and key.isprintable():
        return key
    if not isinstance(key, str):
        raise InvalidKey(f"idempotency key must be a str, not {type(key).__name__}")
    if not key:
        raise InvalidKey("idempotency key is empty")
    if len(key) > MAX_KEY_LENGTH:
        raise InvalidKey(
            f"idempotency key is {len(key)} characters long; at most {MAX_KEY_LENGTH} are allowed"
        )
    bad = next(c for c in key if not (c.isascii() and c.isprintable()))
    raise InvalidKey(
        f"idempotency key {key[:40]!r} contains {bad!r} at index {key.index(bad)}: "
        "only printable ASCII (space to '~') is allowed"
    )


def validate_caller(caller: object) -> str:
    """Return ``caller`` when it is a valid caller identity, else raise :class:`InvalidKey`."""
    if type(caller) is str and 0 < len(caller) <= MAX_KEY_LENGTH and caller.isprintable():
        return caller
    if not isinstance(caller, str):
        raise InvalidKey(f"caller must be a str, not {type(caller).__name__}")
    if not caller:
        raise InvalidKey("caller is empty")
    if len(caller) > MAX_KEY_LENGTH:
        raise InvalidKey(
            f"caller is {len(caller)} characters long; at most {MAX_KEY_LENGTH} are allowed"
        )
    bad = next(c for c in caller if not c.isprintable())
    raise InvalidKey(f"caller {caller[:40]!r} contains the unprintable {bad!r}")


def _first(item: tuple[bytes, Any, Any]) -> bytes:
    return item[0]


def _canonical(obj: Any) -> Any:
    """``obj`` with every map rebuilt in sorted order of its encoded keys."""
    t = type(obj)
    if t in _SCALARS:
        return obj
    if t is list or t is tuple:
        for item in obj:
            if type(item) not in _SCALARS:
                return [_canonical(x) for x in obj]
        return obj  # the common case: a flat argument list, returned untouched
    if t is dict:
        # Sort by the encoded key: a total order over every msgpack type. Keys are
        # hashable, so they hold no maps and encode the same with or without _canonical.
        items = sorted(((_packb(k), k, _canonical(v)) for k, v in obj.items()), key=_first)
        return {k: v for _, k, v in items}
    return obj  # the packer accepts it (a subclass, ExtType) or raises TypeError


def canonical_packb(obj: Any) -> bytes:
    """The canonical msgpack encoding of ``obj`` (maps sorted by encoded key).

    Raises TypeError, ValueError or OverflowError from msgpack when ``obj`` cannot be
    encoded.
    """
    packed: bytes = _packb(_canonical(obj))
    return packed


def fingerprint(operation: object, args: Any, max_bytes: int = DEFAULT_MAX_ARGS_BYTES) -> bytes:
    """The 32-byte fingerprint of the request ``(operation, args)``.

    Raises :class:`InvalidRequest` when the operation is not a non-empty str, when the
    arguments cannot be encoded as msgpack, or when their encoding exceeds ``max_bytes``.
    """
    if type(operation) is not str or not operation:
        raise InvalidRequest(f"operation must be a non-empty str, not {operation!r:.60}")
    # The encoding of ``[operation, args]`` is a two-element array header, the
    # operation, then the arguments: the first two are cached per operation name.
    head = _HEADS.get(operation)
    if head is None:
        head = b"\x92" + _packb(operation)
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


# The C twin (idempotency/_speedups.c), when built: arguments of scalars in lists and
# tuples (no map) whose operation's prefix is cached; the function above, kept as the
# reference, serves every other request and says what is wrong with a bad one.
_py_fingerprint: Final = fingerprint
if _speedups is not None:
    _speedups.configure_keys(fingerprint=_py_fingerprint, pack=_packb, sha256=_sha256, heads=_HEADS)
    fingerprint = _speedups.fingerprint
