"""Keeps the OpenBao / Vault token Lethe presents alive: renewed once at start, then at half of every term the server
grants, by each Lethe process that holds it (several processes renewing one token only reset the same lease).

Why Lethe renews it itself: a token that lapses turns every seal, open and shred into a 503 until someone notices,
and a forget's erasure at rest then waits past its horizon. The compose stack's OpenBao also renews the token from
its side (deploy/openbao/bootstrap.sh); elsewhere nothing else would. A token that cannot be renewed (created
non-renewable, or renewed up to its max TTL) is logged with the moment it expires, and
`lethe_key_provider_token_expiry_timestamp_seconds` says it for an alert to compare with `time()`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Protocol, runtime_checkable

from app.keys.errors import Unavailable

log = logging.getLogger(__name__)

RETRY_S = 30.0  # after a failed look or renewal, unless the token has less than twice that left
LONGEST_S = 3600.0  # look at least hourly: the token may have been revoked or re-created meanwhile


@dataclass(frozen=True)
class TokenLease:
    renewable: bool
    ttl_s: int  # seconds left; 0: the token never expires (a root token)
    full_s: int  # what a renewal grants while no max TTL is near: the period, else the TTL it was created with


@runtime_checkable
class TokenHolder(Protocol):
    """A key provider that authenticates with a token of limited life (app/keys/openbao.py)."""

    def token(self) -> TokenLease: ...

    def renew(self) -> int:
        """Renews the token for its full term, capped by its max TTL; the seconds it now lives."""
        ...


class TokenRenewal:
    def __init__(
        self, holder: TokenHolder, *, expiry: Callable[[float], None] = lambda _: None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.holder = holder
        self.expiry = expiry  # called with the Unix time the token expires at (0: never)
        self.clock = clock
        self.expires_at: float | None = None  # None: not known yet

    @classmethod
    def of(cls, provider: object, *, expiry: Callable[[float], None] = lambda _: None) -> TokenRenewal | None:
        """The renewal a provider needs: None for one without a token (`local`)."""
        return cls(provider, expiry=expiry) if isinstance(provider, TokenHolder) else None

    def step(self) -> float | None:
        """Renews the token when it can be renewed; the seconds until the next step (None: it never expires)."""
        try:
            lease = self.holder.token()
            if lease.ttl_s == 0:
                self._expires(0)
                log.info("the key provider's token never expires: nothing to renew")
                return None
            if not lease.renewable:
                self._expires(lease.ttl_s)
                log.error("the key provider's token cannot be renewed: it expires at %s, and the key store answers "
                          "503 from then; give Lethe a renewable periodic token", self._when())
                return self._half(lease.ttl_s)
            granted = self.holder.renew()
        except Unavailable as exc:
            left = None if self.expires_at is None else self.expires_at - self.clock()
            log.warning("renewing the key provider's token failed (%s); it expires at %s", exc, self._when())
            return RETRY_S if left is None else max(1.0, min(RETRY_S, left / 2))
        self._expires(granted)
        if granted < lease.full_s:
            log.warning("the key provider's token reached its max TTL: renewed for %d s only, it expires for good at "
                        "%s; give Lethe a periodic token", granted, self._when())
        return self._half(granted)

    async def run(self, first_delay: float | None) -> None:
        """Steps at each delay the last step asked for, from `first_delay` (the one the start's step returned)."""
        delay = first_delay
        while delay is not None:
            await asyncio.sleep(delay)
            try:
                delay = await asyncio.to_thread(self.step)
            except Exception:  # an answer nobody foresaw: the loop must outlive it, the token depends on it
                log.exception("renewing the key provider's token failed unexpectedly; trying again in %.0f s", RETRY_S)
                delay = RETRY_S

    def _expires(self, ttl_s: int) -> None:
        self.expires_at = 0.0 if ttl_s == 0 else self.clock() + ttl_s
        self.expiry(self.expires_at)

    def _when(self) -> str:
        if self.expires_at is None:
            return "an unknown time"
        return datetime.fromtimestamp(self.expires_at, UTC).isoformat(timespec="seconds")

    @staticmethod
    def _half(ttl_s: int) -> float:
        return max(1.0, min(LONGEST_S, ttl_s / 2))
