"""Text that PostgreSQL cannot store: the one rule every input passes before it can reach a statement.

PostgreSQL's `text`, `varchar` and `jsonb` cannot hold the NUL character (`\\u0000` in JSON), and asyncpg cannot
encode a string holding an unpaired surrogate (`\\ud800`, which Python's JSON parser lets through) as UTF-8. Either
one turned into a 500 once it reached a statement; the request schemas (app/web/schemas.py) and the memory
rules (app/memory/validation.py) reject it up front instead, naming where it is.
"""

from __future__ import annotations

import re
from typing import Any

_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]{0,63}")
REASON = "holds a NUL character or an unpaired surrogate, which cannot be stored"


def storable(text: str) -> bool:
    return _UNSTORABLE.search(text) is None


def unstorable_path(value: Any) -> str | None:
    """Where in a JSON-like value (strings, lists, tuples, dicts and their keys) the first unstorable text is: `""`
    for the value itself, `"[2].name"` inside it; None when everything can be stored. Objects of other types (a
    nested pydantic model, which checks its own fields) are skipped. Iterative, so deep nesting cannot overflow."""
    stack: list[tuple[Any, str]] = [(value, "")]
    while stack:
        item, path = stack.pop()
        if isinstance(item, str):
            if not storable(item):
                return path
        elif isinstance(item, list | tuple):
            stack.extend((inner, f"{path}[{i}]") for i, inner in reversed(list(enumerate(item))))
        elif isinstance(item, dict):
            for i, (member, inner) in reversed(list(enumerate(item.items()))):
                # A member name is echoed only when it looks like a name, never when it could be a client's text.
                named = isinstance(member, str) and _NAME.fullmatch(member) is not None
                name = f"{path}.{member}" if named else f"{path}.<member {i}>"
                if isinstance(member, str) and not storable(member):
                    return name
                stack.append((inner, name))
    return None
