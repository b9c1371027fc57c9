"""Fixtures of the OpenAI-compatible tests: the real `openai` SDK against the live server (real HTTP, real model)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from tests.support import BOOTSTRAP_KEY

LiveServer = Any  # tests/conftest.py's class; fixtures are not imported from a conftest


def sdk(live_server: LiveServer, key: str) -> openai.OpenAI:
    # No retries: a 409 or a 5xx must reach the test as it happened.
    return openai.OpenAI(base_url=live_server.base_url + "/v1", api_key=key, max_retries=0, timeout=300)


@pytest.fixture
def oai(live_server: LiveServer) -> Iterator[openai.OpenAI]:
    client = sdk(live_server, BOOTSTRAP_KEY)
    yield client
    client.close()


@pytest.fixture
def other_oai(live_server: LiveServer, other_tenant_key: str) -> Iterator[openai.OpenAI]:
    client = sdk(live_server, other_tenant_key)
    yield client
    client.close()


@pytest.fixture
def model(oai: openai.OpenAI) -> str:
    models = oai.models.list().data
    assert len(models) == 1
    return models[0].id


@pytest.fixture
def native(live_server: LiveServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=live_server.base_url, headers={"Authorization": f"Bearer {BOOTSTRAP_KEY}"},
                      timeout=300) as c:
        yield c
