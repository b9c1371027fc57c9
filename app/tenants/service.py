"""Tenant administration and request authentication.

API keys are 32 random bytes shown once at creation; only their SHA-256 is stored. Because the key is
high-entropy a plain hash is as strong as a slow KDF here, and it keeps authentication to one indexed lookup.

That lookup was a transaction of its own on every request (a sixth of the memory API's server time under load), so
a process remembers a key it has verified for `LETHE_AUTH_CACHE_S` seconds (5 by default; 0 turns it off). Revoking a
key (`api_keys.revoked_at`) therefore takes effect within that bound on every process. Unknown keys are not
remembered: a wrong key always costs its lookup, and a key created a moment ago works at once.
"""

from __future__ import annotations

import base64
import hashlib
import secrets
import time
from collections import OrderedDict
from dataclasses import dataclass

from app.db.database import Database
from app.errors import Conflict, NotFound, Unauthorized
from app.settings import Settings, decode_webhook_secret
from app.tenants import repository as repo

DEFAULT_TENANT = "default"
KEY_PREFIX = "lethe_"


@dataclass(frozen=True)
class Principal:
    """Who is calling: every query of the request is scoped to this tenant."""

    tenant_id: str
    key_id: str | None = None  # the API key's id: what an audit trail names (legal holds)


def hash_key(api_key: str) -> str:
    return hashlib.sha256(api_key.encode()).hexdigest()


def generate_api_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


def generate_webhook_secret() -> str:
    return "whsec_" + base64.b64encode(secrets.token_bytes(24)).decode()


class TenantService:
    MAX_REMEMBERED_KEYS = 10_000

    def __init__(self, db: Database, *, auth_cache_s: float = 0.0) -> None:
        self.db = db
        self.auth_cache_s = auth_cache_s
        self._verified: OrderedDict[str, tuple[str, str, float]] = OrderedDict()  # key hash -> (tenant, key, until)

    async def authenticate(self, authorization: str | None) -> Principal:
        if not authorization:
            raise Unauthorized("send Authorization: Bearer <api key>")
        scheme, _, token = authorization.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise Unauthorized("send Authorization: Bearer <api key>")
        digest = hash_key(token)
        now = time.monotonic()
        remembered = self._verified.get(digest)
        if remembered is not None and remembered[2] > now:
            return Principal(tenant_id=remembered[0], key_id=remembered[1])
        async with self.db.single_statement() as session:
            owner = await repo.tenant_for_key(session, digest)
        if owner is None:
            self._verified.pop(digest, None)
            raise Unauthorized("unknown or revoked API key")
        tenant_id, key_id = owner
        if self.auth_cache_s > 0:
            self._verified[digest] = (tenant_id, key_id, now + self.auth_cache_s)
            self._verified.move_to_end(digest)
            while len(self._verified) > self.MAX_REMEMBERED_KEYS:
                self._verified.popitem(last=False)
        return Principal(tenant_id=tenant_id, key_id=key_id)

    async def create_tenant(self, name: str) -> tuple[str, str]:
        """Create a tenant and its first API key; returns (tenant id, key). The key is never retrievable again."""
        api_key = generate_api_key()
        async with self.db.transaction() as session:
            tenant = await repo.create(session, name)
            if tenant is None:
                raise Conflict(f"tenant {name!r} already exists")
            await repo.add_key(session, tenant.id, hash_key(api_key), label="created by lethe tenant create")
        return tenant.id, api_key

    async def reserve_leaves(self, tenant_id: str, count: int) -> int:
        """`count` leaves of the tenant's key tree, never handed out again (app/keys/leaves.py's `Reserve`), in a
        transaction of their own: whatever the caller's transaction does, the numbers are gone once answered."""
        if count < 1:
            raise ValueError("reserve one leaf at least")
        async with self.db.transaction() as session:
            first = await repo.reserve_leaves(session, tenant_id, count)
        if first is None:
            raise NotFound(f"no tenant {tenant_id!r}")
        return first

    async def add_api_key(self, name: str) -> str:
        api_key = generate_api_key()
        async with self.db.transaction() as session:
            tenant = await repo.get_by_name(session, name)
            if tenant is None:
                raise NotFound(f"no tenant {name!r}")
            await repo.add_key(session, tenant.id, hash_key(api_key), label="created by lethe tenant key")
        return api_key

    async def rotate_webhook_secret(self, name: str, secret: str | None = None) -> str:
        secret = secret or generate_webhook_secret()
        decode_webhook_secret(secret)
        async with self.db.transaction() as session:
            tenant = await repo.get_by_name(session, name)
            if tenant is None:
                raise NotFound(f"no tenant {name!r}")
            await repo.set_webhook_secret(session, tenant.id, secret)
        return secret

    async def bootstrap(self, settings: Settings) -> None:
        """Register tenant `default` with the bootstrap key and secret; idempotent across restarts and processes."""
        if settings.bootstrap_api_key is None and settings.bootstrap_webhook_secret is None:
            return
        async with self.db.transaction() as session:
            tenant = await repo.ensure(session, DEFAULT_TENANT)
            if settings.bootstrap_api_key is not None:
                key = settings.bootstrap_api_key.get_secret_value()
                await repo.add_key(session, tenant.id, hash_key(key), label="bootstrap")
            if settings.bootstrap_webhook_secret is not None:
                await repo.set_webhook_secret(session, tenant.id, settings.bootstrap_webhook_secret.get_secret_value())
