"""Settings choose the provider; an OpenBao provider without its address or token refuses to start."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.errors import InvalidRequest
from app.keys.factory import PROVIDERS, build_keyring, build_provider
from app.keys.local import LocalProvider
from app.keys.openbao import OpenBaoProvider
from app.settings import Settings


def _settings(**values: object) -> Settings:
    return Settings(_env_file=None, **values)  # type: ignore[call-arg, arg-type]


def test_the_default_is_local_under_the_data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LETHE_KEY_DIR", raising=False)  # the suite's shared key store (tests/conftest.py)
    provider = build_provider(_settings(data_dir=tmp_path))
    assert isinstance(provider, LocalProvider) and provider.directory == tmp_path / "keys"
    elsewhere = build_provider(_settings(data_dir=tmp_path, key_dir=tmp_path / "vault"))
    assert isinstance(elsewhere, LocalProvider) and elsewhere.directory == tmp_path / "vault"
    keyring = build_keyring(_settings(data_dir=tmp_path, erasure_horizon_s=60))
    assert keyring.ciphers._ttl_s == 30  # half the horizon


@pytest.mark.parametrize("name", ["openbao", "vault"])
def test_openbao_needs_its_address_and_token(name: str) -> None:
    with pytest.raises(RuntimeError, match="LETHE_OPENBAO_ADDRESS"):
        build_provider(_settings(key_provider=name))
    provider = build_provider(_settings(key_provider=name, openbao_address="http://127.0.0.1:1", openbao_token="t"))
    assert isinstance(provider, OpenBaoProvider)


def test_an_unknown_provider_is_refused() -> None:
    assert PROVIDERS.names == ["local", "openbao", "vault"]
    with pytest.raises(InvalidRequest):
        PROVIDERS.named("kms")
    with pytest.raises(ValueError):
        _settings(key_provider="kms")
