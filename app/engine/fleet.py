"""What the vllm-remote engine knows about a fleet behind vllm-router: which session a request is for (the routing
key), and whether the session found its prefix cache where it left it (its affinity).

A fleet's prefix cache is per worker. vllm-router's `consistent_hash` policy places a request by its `X-Session-ID`
header on a hash ring, so every request of a session lands on the same worker while that worker lives, and the
session's next turn finds its prefix there. The key is `tenant:session` (runtime/salts.py `route_of`), never the cache
generation: a forget that gives the session a new salt keeps its worker.

The engine cannot see which worker answered (vLLM and the router say nothing of it), but it can tell from the answer
whether the session kept its cache. After a request the worker holds every full block of the prompt under the
handle's salt; a later request of the same handle whose log still starts with that prompt must reuse at least one
block, unless the session moved to another worker (the worker died, the ring changed) or the blocks were evicted.
So each request is one of:

- `kept`: it reused part of the log from the cache;
- `lost`: it reused nothing though this process had sent at least a full block of its log before, under the same
  salt: the session's cache was lost (a failover, a rebalance, or an eviction);
- `new`: there was nothing to find (a new session, a new salt after a forget, a handle this process just opened);
- `failed`: the fleet did not answer (a worker or the router went away): the caller gets `EngineUnavailable`.

The block size is not reported either: the smallest reuse seen so far stands in for it. Reuse is counted in whole
blocks, so that is at least one block and a request is called `lost` only when a full block was provably cached.
Before any reuse has been seen, no request is called `lost`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Literal, Protocol, runtime_checkable

from app.engine.protocol import CacheHandle

SESSION_HEADER: Final = "X-Session-ID"  # what vllm-router's consistent_hash policy reads first

Affinity = Literal["kept", "lost", "new", "failed"]
AFFINITIES: Final[tuple[Affinity, ...]] = ("kept", "lost", "new", "failed")


@dataclass(frozen=True)
class FleetRequest:
    """One request of a session to the fleet, as the engine saw it answered (or not)."""

    affinity: Affinity
    prompt_tokens: int
    reused_tokens: int


FleetObserver = Callable[[FleetRequest], None]


@runtime_checkable
class ObservedFleet(Protocol):
    """An engine that reports each session request to an observer (vllm-remote; the app's metrics observe it)."""

    def observe(self, observer: FleetObserver) -> None: ...


@dataclass
class Sent:
    """The part of a handle's log that this process has sent to the fleet under the handle's current salt. The log
    only grows at its end and shrinks by crops, so `tokens` leading tokens of the log are exactly what was sent."""

    tokens: int = 0


def sent_of(handle: CacheHandle) -> Sent:
    if not isinstance(handle.state, Sent):
        handle.state = Sent()
    return handle.state


class AffinityTracker:
    """Classifies a session's requests (module docstring) and learns the fleet's block size from the reuse it sees."""

    def __init__(self) -> None:
        self.block: int | None = None  # the smallest reuse seen: a multiple of the fleet's block, hence >= one block

    def answered(self, handle: CacheHandle, prompt_tokens: int, reused_tokens: int) -> FleetRequest:
        sent = sent_of(handle)
        if reused_tokens > 0:
            affinity: Affinity = "kept"
            self.block = reused_tokens if self.block is None else min(self.block, reused_tokens)
        elif self.block is not None and sent.tokens >= self.block:
            affinity = "lost"
        else:
            affinity = "new"
        sent.tokens = prompt_tokens
        return FleetRequest(affinity, prompt_tokens, reused_tokens)

    @staticmethod
    def failed(prompt_tokens: int) -> FleetRequest:
        return FleetRequest("failed", prompt_tokens, 0)

    @staticmethod
    def cropped(handle: CacheHandle, n_tokens: int) -> None:
        sent = sent_of(handle)
        sent.tokens = min(sent.tokens, n_tokens)

    @staticmethod
    def resalted(handle: CacheHandle) -> None:
        sent_of(handle).tokens = 0  # nothing is cached under the new salt yet
