"""Opaque, prefixed, time-ordered ids (`ses_`, `art_`, `call_`, `fgt_`, ...).

48 bits of milliseconds then 80 random bits in lowercase Crockford base32: ids sort by creation time, which keeps
B-tree inserts local, and carry no information a client could rely on beyond their prefix.
"""

from __future__ import annotations

import re
import secrets
import time

_ALPHABET = "0123456789abcdefghjkmnpqrstvwxyz"
PREFIXES = frozenset({"ten", "key", "ses", "art", "call", "fgt", "ckp", "env", "conv", "resp", "hld"})


def new_id(prefix: str) -> str:
    if prefix not in PREFIXES:
        raise ValueError(f"unknown id prefix {prefix!r}")
    value = (int(time.time() * 1000) << 80) | secrets.randbits(80)
    chars = []
    for _ in range(26):
        chars.append(_ALPHABET[value & 31])
        value >>= 5
    return f"{prefix}_{''.join(reversed(chars))}"


def has_prefix(value: str, prefix: str) -> bool:
    return value.startswith(prefix + "_") and len(value) == len(prefix) + 27


_PLAUSIBLE = re.compile(r"[A-Za-z0-9_-]{1,64}")


def plausible(value: str) -> bool:
    """Whether `value` could be an id this service issued: letters, digits, `_` and `-`, at most 64 characters (the
    API's bound for ids; the ones it issues are shorter). Anything else names nothing: it answers 404 without a
    database lookup, so a NUL or an unpaired surrogate in a path never reaches a statement."""
    return _PLAUSIBLE.fullmatch(value) is not None


# A data subject's id is the caller's own name for a person (an account id, a customer number: app/subjects/), not
# one this service issues. It travels in paths, so it is kept to characters a path carries as they are.
SUBJECT_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:@+=-]{0,199}$"
