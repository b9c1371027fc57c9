"""The `openbao` provider (and `vault`): covers as secrets of an OpenBao or Vault KV version 2 engine.

Several Lethe processes on several hosts share it, so they puncture the same covers. A shard's cover is the secret
`lethe/<tenant>/<shard>` (base64 in `data.cover`); a write is KV's check-and-set on the secret's version (`cas`), and
the versions it replaced are then destroyed (`destroy`: the server deletes their data for good, unlike `delete`).
A write killed between the two leaves an old version undestroyed; `sweep` (and every later write of the shard)
destroys every version below the current one that is not destroyed yet.

Why KV and not transit: transit keeps a key's versions and can only trim them from the oldest, and whatever an old
version wrapped for a survivor would have to be re-wrapped in PostgreSQL, whose backups would then no longer decrypt
(docs/erasure-at-rest.md). A cover per shard keeps the key material in one mutable place, out of every backup.

`hvac` is the client. A server unreachable, sealed or answering 5xx, and a refused token, are `Unavailable`: nothing
was written and the caller answers 503. The token's own lease is kept alive by app/keys/renewal.py.
"""

from __future__ import annotations

import base64
import contextlib
import re
import secrets
from collections.abc import Callable
from typing import Any, TypeVar

import hvac
import hvac.exceptions
import requests

from app.keys import tree
from app.keys.errors import Tampered, Unavailable
from app.keys.provider import Cover
from app.keys.renewal import TokenLease

T = TypeVar("T")
_TENANT = re.compile(r"[A-Za-z0-9_-]{1,64}")


class OpenBaoProvider:
    name = "openbao"

    def __init__(
        self, address: str, token: str, *, mount: str = "secret", prefix: str = "lethe", timeout_s: float = 5.0,
        retry_after_s: int = 2, ca_cert: str | None = None,
    ) -> None:
        verify: str | bool = ca_cert if ca_cert is not None else True
        self._client = hvac.Client(url=address, token=token, timeout=timeout_s, verify=verify)
        self._mount = mount
        self._prefix = prefix
        self._retry_after_s = retry_after_s

    def _call(self, operation: Callable[[], T]) -> T:
        try:
            return operation()
        except (requests.ConnectionError, requests.Timeout, hvac.exceptions.VaultDown,
                hvac.exceptions.InternalServerError, hvac.exceptions.BadGateway) as exc:
            raise Unavailable(f"key provider unreachable: {type(exc).__name__}",
                              retry_after_s=self._retry_after_s) from exc
        except (hvac.exceptions.Forbidden, hvac.exceptions.Unauthorized) as exc:
            raise Unavailable("key provider refused the token", retry_after_s=self._retry_after_s) from exc

    def _url(self, kind: str, tenant: str, shard: int) -> str:
        if _TENANT.fullmatch(tenant) is None:
            raise ValueError(f"tenant id {tenant!r} cannot name a secret")
        return f"/v1/{self._mount}/{kind}/{self._prefix}/{tenant}/{shard}"

    def _get(self, url: str) -> dict[str, Any] | None:
        try:
            answer: dict[str, Any] = self._call(lambda: self._client.adapter.get(url))
        except hvac.exceptions.InvalidPath:
            return None
        return answer

    def token(self) -> TokenLease:
        """What the server says of this provider's token: whether it can be renewed, and for how long it lives."""
        data = self._call(lambda: self._client.auth.token.lookup_self())["data"]
        return TokenLease(
            renewable=bool(data.get("renewable")), ttl_s=int(data.get("ttl") or 0),
            full_s=int(data.get("period") or data.get("creation_ttl") or 0),
        )

    def renew(self) -> int:
        """Renews the token for its full term (its period, else the TTL it was created with, both capped by its
        max TTL); returns the seconds it now lives."""
        try:
            answer = self._call(lambda: self._client.auth.token.renew_self())
        except hvac.exceptions.InvalidRequest as exc:  # not renewable (any more): the caller says when it expires
            raise Unavailable(f"key provider refused to renew the token: {exc}",
                              retry_after_s=self._retry_after_s) from exc
        return int(answer["auth"]["lease_duration"])

    def identity(self) -> str:
        url = f"/v1/{self._mount}/data/{self._prefix}/.identity"  # a tenant id never starts with a dot
        answer = self._get(url)
        if answer is None:
            body = {"options": {"cas": 0}, "data": {"id": secrets.token_hex(16)}}
            with contextlib.suppress(hvac.exceptions.InvalidRequest):  # another host made it first
                self._call(lambda: self._client.adapter.post(url, json=body))
            answer = self._get(url)
            if answer is None:
                raise Unavailable("the key store's identity could not be read back", retry_after_s=self._retry_after_s)
        return str(answer["data"]["data"]["id"])

    def read(self, tenant: str, shard: int) -> Cover | None:
        answer = self._get(self._url("data", tenant, shard))
        if answer is None:
            return None
        data = answer["data"]
        if data.get("data") is None:  # the current version deleted or destroyed: never done by Lethe
            raise Tampered(f"the cover of shard {shard} of {tenant!r} was deleted outside Lethe")
        return Cover(int(data["metadata"]["version"]), tree.decode(base64.b64decode(data["data"]["cover"])))

    def write(self, tenant: str, shard: int, nodes: tree.Nodes, expected: int) -> Cover | None:
        body = {"options": {"cas": expected}, "data": {"cover": base64.b64encode(tree.encode(nodes)).decode()}}
        try:
            answer = self._call(lambda: self._client.adapter.post(self._url("data", tenant, shard), json=body))
        except hvac.exceptions.InvalidRequest as exc:
            if "check-and-set" in str(exc):
                return None
            raise
        version = int(answer["data"]["version"])
        self.sweep(tenant, shard)
        return Cover(version, nodes)

    def sweep(self, tenant: str, shard: int) -> None:
        answer = self._get(self._url("metadata", tenant, shard))
        if answer is None:
            return
        current = int(answer["data"]["current_version"])
        alive = [
            int(number) for number, version in answer["data"]["versions"].items()
            if int(number) < current and not version["destroyed"]
        ]
        if alive:
            url = self._url("destroy", tenant, shard)
            self._call(lambda: self._client.adapter.post(url, json={"versions": alive}))
