"""Builds the key provider and keyring that settings name; the composition root calls it once per process."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from app.keys.keyring import Keyring
from app.keys.provider import KeyProvider
from app.registry import Registry
from app.settings import Settings


@dataclass(frozen=True)
class ProviderBuilder:
    name: str  # what LETHE_KEY_PROVIDER says
    build: Callable[[Settings], KeyProvider]
    where: Callable[[Settings], str]  # the settings that point at the key store, for an operator's error message


def _key_dir(settings: Settings) -> Path:
    return settings.key_dir or settings.data_dir / "keys"


def _local(settings: Settings) -> KeyProvider:
    from app.keys.local import LocalProvider

    return LocalProvider(_key_dir(settings))


def _local_where(settings: Settings) -> str:
    return f"LETHE_KEY_PROVIDER=local with LETHE_KEY_DIR={_key_dir(settings)}"


def _openbao(settings: Settings) -> KeyProvider:
    from app.keys.openbao import OpenBaoProvider  # imports hvac only when this provider is the one asked for

    if not settings.openbao_address or settings.openbao_token is None:
        raise RuntimeError(
            f"LETHE_KEY_PROVIDER={settings.key_provider} needs LETHE_OPENBAO_ADDRESS and LETHE_OPENBAO_TOKEN"
        )
    return OpenBaoProvider(
        settings.openbao_address, settings.openbao_token.get_secret_value(),
        mount=settings.openbao_kv_mount, prefix=settings.openbao_prefix,
        ca_cert=str(settings.openbao_ca_cert) if settings.openbao_ca_cert else None,
    )


def _openbao_where(settings: Settings) -> str:
    return (f"LETHE_KEY_PROVIDER={settings.key_provider} with LETHE_OPENBAO_ADDRESS={settings.openbao_address} "
            f"(mount {settings.openbao_kv_mount}, prefix {settings.openbao_prefix})")


# Vault's KV engine and OpenBao's answer the same API: two names, one builder.
PROVIDERS: Final[Registry[ProviderBuilder]] = Registry(
    "key provider", ProviderBuilder("local", _local, _local_where),
    ProviderBuilder("openbao", _openbao, _openbao_where), ProviderBuilder("vault", _openbao, _openbao_where),
)


def build_provider(settings: Settings) -> KeyProvider:
    return PROVIDERS.named(settings.key_provider).build(settings)


def provider_location(settings: Settings) -> str:
    """Where the settings point for the key store, as the settings an operator would change."""
    return PROVIDERS.named(settings.key_provider).where(settings)


def build_keyring(settings: Settings) -> Keyring:
    """The process's keyring: its caches forget a shredded key within half the erasure horizon even when the
    notification of the shred never arrives."""
    return Keyring(build_provider(settings), ttl_s=settings.erasure_horizon_s / 2)
