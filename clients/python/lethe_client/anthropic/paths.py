"""The /memories tree's paths as Lethe memory keys.

A file is one key; a directory is any path some key lies under (none is stored). Keys may not hold '/', so a path
below /memories is written with '%' and '/' percent-encoded (`notes/todo.md` → `notes%2Ftodo.md`): the mapping is
exact both ways and leaves every other character readable in Lethe's listings.
"""

from __future__ import annotations

from urllib.parse import unquote

from anthropic.lib.tools import ToolError

ROOT = "/memories"
MAX_KEY = 200  # Lethe's key length limit


def relative(path: str) -> str:
    """The path below /memories ('' for /memories itself); ToolError for anything outside it, `..` included.

    `..` is refused even where it would stay inside (`/memories/a/../b`): a path names one file as written, so a
    model cannot reach one file under two names."""
    if not isinstance(path, str):
        raise ToolError(f"Path must be a string starting with /memories, got: {path!r}")
    if path != ROOT and not path.startswith(ROOT + "/"):
        raise ToolError(f"Path must start with /memories, got: {path}")
    if any(ord(c) < 32 or ord(c) == 127 for c in path):
        raise ToolError(f"Path {path!r} contains control characters")
    parts = [p for p in path[len(ROOT) :].split("/") if p not in ("", ".")]
    if ".." in parts:
        raise ToolError(f"Path {path} would escape /memories directory")
    rel = "/".join(parts)
    if len(key(rel)) > MAX_KEY:
        raise ToolError(f"Path {path} is too long: Lethe memory keys hold at most {MAX_KEY} characters")
    return rel


def display(rel: str) -> str:
    return f"{ROOT}/{rel}" if rel else ROOT


def key(rel: str) -> str:
    return rel.replace("%", "%25").replace("/", "%2F")


def from_key(stored: str) -> str:
    # Only %25 and %2F occur in keys this module wrote, so unquote inverts `key` exactly.
    return unquote(stored)


def under(rel: str, directory: str) -> bool:
    """Whether `rel` lies strictly below `directory` ('' is /memories)."""
    return directory == "" or rel.startswith(directory + "/")
