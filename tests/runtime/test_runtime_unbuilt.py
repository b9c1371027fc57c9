"""Options the runtime does not honour yet are refused with 501, never accepted and silently ignored."""

from __future__ import annotations

import httpx
import pytest


@pytest.mark.parametrize(
    ("option", "word"),
    [
        ({"context_policy": "retrieval"}, "retrieval"),
    ],
)
def test_unbuilt_session_options_answer_501(client: httpx.Client, option: dict[str, object], word: str) -> None:
    response = client.post("/v1/sessions", json={"system_prompt": "Hi.", **option})
    assert response.status_code == 501, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    assert word in response.json()["detail"]
