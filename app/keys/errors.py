"""What can go wrong with a key, as three types a caller branches on.

`Erased` is the normal outcome of a forget (or of a backup restored from before one): the caller renders the content
as erased and never answers 5xx. `Tampered` means a key was there and the bytes did not authenticate under it (moved
to another row, edited, truncated): that is an integrity failure and must stay loud. `Unavailable` is the provider
being unreachable: the operation wrote nothing and may be retried.
"""

from __future__ import annotations

from typing import Any

from app.errors import NotReady


class Erased(Exception):
    """The key able to decrypt this is destroyed: the content is gone for good."""


class Tampered(Exception):
    """The key exists but the ciphertext does not authenticate under it (or its format is unknown)."""


class Missing(Tampered):
    """The leaf's shard was never written in this key store, though content names it: the store that sealed it was
    lost or replaced (only a keyring that must not create shards says so: `lethe keys verify`)."""


class Unavailable(NotReady):
    """The key provider cannot be reached; nothing was written. Answered 503 with `Retry-After`."""

    type_slug = "keys-unavailable"
    title = "Key provider unavailable"

    def __init__(self, detail: str | None = None, *, retry_after_s: int = 2, **extra: Any) -> None:
        super().__init__(detail, headers={"Retry-After": str(retry_after_s)}, **extra)
        self.retry_after_s = retry_after_s


class ShredPending(Unavailable):
    """A forget that asked for `"shred": "now"` committed (what it erased is gone from every live row), but the key
    provider refused the shred after the commit: 503 naming the forget job, whose `erasure` says when the worker's
    retry completed it (within the erasure horizon)."""

    def __init__(self, forget_id: str) -> None:
        super().__init__(
            f"forgotten, but its keys could not be destroyed now: forget job {forget_id} completes the shred within "
            "the erasure horizon (its `erasure.at_rest`)", forget_id=forget_id,
        )
