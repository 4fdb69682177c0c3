"""Key names: what a key may be, ``key@version`` refs, where a key lives in the store.

A key is a path-like name (``models/churn``).  The rule is strict so that every key
is also a safe object-name prefix and a safe local path: segments of
``[A-Za-z0-9._-]`` joined by ``/``, no empty segment, no ``.``/``..`` segment, no
leading or trailing ``/``.  ``@`` is not part of a key: it only separates a key from
a version (``models/churn@3fa9...``), and because no key segment may hold ``@``, the
pointer object's own name (``@key.json``) can never collide with a key below it.

Every refusal names the value and the allowed form, and is raised before anything
moves.
"""

from __future__ import annotations

import difflib
import re

from airflow_provider_kinetic.core.errors import KineticError

#: Where keys live in the store, beside kinetic's data cache (``default/data-cache``).
KEYS_PREFIX = "default/keys"
#: The object holding one key's state (its version history), under the key's path.
POINTER_NAME = "@key.json"
_SEGMENT = re.compile(r"[A-Za-z0-9._-]+")
#: Length caps, checked before anything is uploaded: a segment is a directory name on a
#: local store (most filesystems allow 255 bytes: NAME_MAX), and the key sits inside an
#: object name with the store's root before it and ``/@key.json`` after it (GCS allows
#: 1024 bytes: https://cloud.google.com/storage/docs/objects#naming).
MAX_SEGMENT = 200
MAX_KEY = 512
_VERSION = re.compile(r"[0-9a-f]{6,64}")
KEY_FORM = (
    "a key is one or more '/'-separated segments of letters, digits, '.', '_' and '-' "
    "(e.g. 'models/churn'), with no leading or trailing '/', no empty, '.' or '..' "
    "segment, '@' only before a version ('models/churn@<hash>'), at most "
    f"{MAX_KEY} characters in all and {MAX_SEGMENT} per segment"
)
VERSION_FORM = "a version is a content hash: 6 to 64 lowercase hex digits (a unique prefix)"


class KeyNameError(KineticError, ValueError):
    """A key, prefix or version that is not of the allowed form."""


class KeyNotFound(KineticError, LookupError):
    """A key (or a version of it) that the store does not hold."""


def check_key(key: object) -> str:
    """``key`` if it is a valid key; else ``KeyNameError`` naming it and the form."""
    if not isinstance(key, str) or not key:
        raise KeyNameError(f"empty key {key!r}: {KEY_FORM}")
    if "@" in key:
        raise KeyNameError(f"key {key!r} has '@' outside a version: {KEY_FORM}")
    if key.startswith("/"):
        raise KeyNameError(f"key {key!r} starts with '/': {KEY_FORM}")
    if len(key) > MAX_KEY:
        raise KeyNameError(f"key {key[:40]!r}... is {len(key)} characters long: {KEY_FORM}")
    for segment in key.split("/"):
        if segment in (".", ".."):
            raise KeyNameError(f"key {key!r} has a {segment!r} segment: {KEY_FORM}")
        if not _SEGMENT.fullmatch(segment):
            bad = sorted({c for c in segment if not re.fullmatch(r"[A-Za-z0-9._-]", c)})
            what = f"character(s) {''.join(bad)!r}" if bad else "an empty segment"
            raise KeyNameError(f"key {key!r} has {what}: {KEY_FORM}")
        if len(segment) > MAX_SEGMENT:
            raise KeyNameError(
                f"key {key!r} has a segment of {len(segment)} characters: {KEY_FORM}"
            )
    return key


def check_version(version: object) -> str:
    """A version (full content hash or a prefix of one) of the allowed form."""
    if not isinstance(version, str) or not _VERSION.fullmatch(version):
        raise KeyNameError(f"version {version!r} is not valid: {VERSION_FORM}")
    return version


def check_prefix(prefix: object) -> str:
    """A listing prefix: empty, or the start of a key (a trailing '/' allowed)."""
    if prefix == "":
        return ""
    if not isinstance(prefix, str):
        raise KeyNameError(f"prefix {prefix!r} is not a string: {KEY_FORM}")
    check_key(prefix[:-1] if prefix.endswith("/") and len(prefix) > 1 else prefix)
    return prefix


def parse_ref(ref: object, version: str | None = None) -> tuple[str, str | None]:
    """``"key"`` or ``"key@version"`` -> ``(key, version)``; a version given both ways
    must agree."""
    if isinstance(ref, str) and ref.count("@") == 1:
        key, _, pinned = ref.partition("@")
        check_key(key)
        if not _VERSION.fullmatch(pinned):
            raise KeyNameError(f"key {ref!r} has '@' outside a version: {KEY_FORM}; {VERSION_FORM}")
        if version is not None and check_version(version) != pinned:
            raise KeyNameError(f"{ref!r} pins version {pinned!r} but version={version!r}")
        return key, pinned
    key = check_key(ref)
    return key, None if version is None else check_version(version)


def pointer_key(key: str) -> str:
    """The store object holding ``key``'s state."""
    return f"{KEYS_PREFIX}/{key}/{POINTER_NAME}"


def key_of_pointer(obj: str) -> str | None:
    """The key whose pointer object is ``obj`` (None: not a pointer)."""
    head, tail = f"{KEYS_PREFIX}/", f"/{POINTER_NAME}"
    if obj.startswith(head) and obj.endswith(tail):
        return obj[len(head) : -len(tail)]
    return None


def nearest(key: str, known: list[str], n: int = 5) -> str:
    """The closest known keys, for a not-found message."""
    close = difflib.get_close_matches(key, known, n=n, cutoff=0.4)
    if close:
        return "nearest keys: " + ", ".join(close)
    return "the store holds no key" if not known else "no key is close; `ls` lists them"
