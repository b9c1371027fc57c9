"""Read-your-forgets for the clients: keep the newest `Lethe-Consistency` token seen, send it with every read.

Every write's answer (a memory write or forget, a turn, a finished forget job) carries a token: the primary's WAL
position once that write was durable. A read carrying it is served by a replica only once the replica has replayed
past it (else by the primary), so a client that sends the newest token it has seen never reads a state older than
its own writes and forgets, whichever replica answers. The client does this by itself; `consistency` and
`observe_consistency` let a program hand the token to another client (another process reading for the same user).
"""

from __future__ import annotations

import re
import threading

HEADER = "Lethe-Consistency"
_V1 = re.compile(r"^v1[0-9a-f]{40}$")  # v1, then system identifier (16 hex), timeline (8), WAL position (16)


def _order(token: str) -> tuple[str, int, int] | None:
    """(cluster, timeline, position) of a token this client understands; None for any other."""
    if not _V1.match(token):
        return None
    return token[2:18], int(token[18:26], 16), int(token[26:42], 16)


def newer(current: str | None, seen: str) -> str:
    """The token to keep: the later one in the same cluster's history (a promotion's new timeline is later); across
    clusters, or for a form this client does not know, the one seen last (the server it now talks to made it)."""
    if current is None:
        return seen
    mine, theirs = _order(current), _order(seen)
    if mine is None or theirs is None or mine[0] != theirs[0]:
        return seen
    return seen if theirs[1:] > mine[1:] else current


class TokenKeeper:
    """The newest token, safe to share between threads (the sync client may be used from several)."""

    def __init__(self) -> None:
        self._token: str | None = None
        self._lock = threading.Lock()

    @property
    def token(self) -> str | None:
        return self._token

    def observe(self, token: str | None) -> None:
        if token:
            with self._lock:
                self._token = newer(self._token, token)

    def read_headers(self) -> dict[str, str]:
        token = self._token
        return {} if token is None else {HEADER: token}
