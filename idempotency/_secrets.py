"""Passwords out of every text a store or a tool shows: ``repr``, errors, log lines.

A store is configured with a URL or a connection string that may hold a password
(``redis://:pw@host/0``, ``postgresql://app:pw@host/db``, ``host=h password=pw``,
``...?password=pw``). Whatever shows it, a name, an error message, a message of the
driver that quotes the string back (libpq's parse errors do), shows it through
:func:`redact`, which replaces every form of each password found in the string with
``***``. The password is looked for without parsing the string as its driver would,
since the string to redact may be one the driver refused (a typo in the scheme).
"""

from __future__ import annotations

import re
import urllib.parse
from typing import Final

MASK: Final = "***"

# scheme://userinfo@ -- the userinfo up to the last "@" before the host's "/", "?" or "#".
_URL_USERINFO: Final = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*://([^/?#]*)@")
# password=value in libpq's key/value form: a single-quoted value (backslash escapes) or
# a bare one up to white space.
_KEYWORD: Final = re.compile(r"\bpassword\s*=\s*('(?:[^'\\]|\\.)*'|\S+)", re.IGNORECASE)
# ?password=value or &password=value in a URL's query.
_QUERY: Final = re.compile(r"[?&]password=([^&#\s]*)", re.IGNORECASE)


def _is_url(conninfo: str) -> bool:
    return re.match(r"^[A-Za-z][A-Za-z0-9+.\-]*://", conninfo) is not None


def passwords_in(conninfo: str) -> list[str]:
    """Every password ``conninfo`` carries, in each form it may be shown in (as written,
    percent-decoded, unquoted), longest first."""
    found: set[str] = set()
    if _is_url(conninfo):
        m = _URL_USERINFO.match(conninfo)
        if m is not None and ":" in m.group(1):
            found.add(m.group(1).split(":", 1)[1])
        found.update(m.group(1) for m in _QUERY.finditer(conninfo))
    else:
        for m in _KEYWORD.finditer(conninfo):
            value = m.group(1)
            found.add(value)
            if value.startswith("'") and value.endswith("'") and len(value) >= 2:
                found.add(re.sub(r"\\(.)", r"\1", value[1:-1]))
    forms = set()
    for secret in found:
        forms.add(secret)
        forms.add(urllib.parse.unquote(secret))
        forms.add(urllib.parse.unquote_plus(secret))
    forms.discard("")
    return sorted(forms, key=len, reverse=True)


def masked(conninfo: str) -> str:
    """``conninfo`` with each password replaced by ``***`` where it stands: what a name
    or a message shows of it."""
    if not _is_url(conninfo):
        return _KEYWORD.sub(lambda m: m.group(0)[: m.start(1) - m.start(0)] + MASK, conninfo)
    m = _URL_USERINFO.match(conninfo)
    if m is not None and ":" in m.group(1):
        user = m.group(1).split(":", 1)[0]
        conninfo = conninfo[: m.start(1)] + f"{user}:{MASK}" + conninfo[m.end(1) :]
    return _QUERY.sub(lambda m: m.group(0)[: m.start(1) - m.start(0)] + MASK, conninfo)


def redact(text: str, conninfo: str) -> str:
    """``text`` with ``conninfo`` shown masked, and every other appearance of one of its
    passwords (a driver's message quoting a piece of it) replaced by ``***``."""
    secrets = passwords_in(conninfo)
    pieces = text.split(conninfo) if conninfo else [text]
    for i in range(len(pieces)):
        for secret in secrets:
            pieces[i] = pieces[i].replace(secret, MASK)
    return masked(conninfo).join(pieces)


def clean_cause(cause: BaseException, conninfo: str) -> BaseException | None:
    """``cause`` when its text holds no password of ``conninfo``, else None: what to
    chain an error to (``raise err from clean_cause(exc, dsn)``), since a driver's error
    that quotes the string back would show the password in every traceback."""
    return cause if redact(str(cause), conninfo) == str(cause) else None
