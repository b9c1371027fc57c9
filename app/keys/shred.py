"""When a forget asks its keys to be destroyed (docs/erasure-at-rest.md, "Shred now"): the request word both front
doors take, `POST /v1/forget`'s `shred` and a memory DELETE's `?shred=`."""

from __future__ import annotations

from typing import Final, Literal

Shred = Literal["now", "horizon"]
SHRED_DOC: Final = (
    "`horizon` (default): every key of what the forget erased is destroyed as soon as it committed, and a refused "
    "shred is retried within LETHE_ERASURE_HORIZON_S. `now`: the forget waits for the shred; a key provider that "
    "does not answer refuses it (503 `keys-unavailable`, nothing written), and it reads as ended only once "
    "`erasure.at_rest` is `complete`"
)
