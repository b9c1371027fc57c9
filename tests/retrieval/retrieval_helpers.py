"""Helpers of the retrieval-policy tests: a DeLLM-style session built over HTTP, message by message."""

from __future__ import annotations

from typing import Any

import httpx

# The scenario: two facts, then a question about each.
PERSONA: list[tuple[str, str]] = [
    ("paris", "I live in Paris."),
    ("guitar", "I play the guitar every evening."),
    ("home", "Which city is my home in?"),
    ("music", "What instrument do I play?"),
]
SAMPLING = {"temperature": 0, "max_tokens": 24, "seed": 5}


def retrieval_session(
    client: httpx.Client,
    messages: list[tuple[str, str]],
    *,
    top_k: int = 2,
    min_similarity: float = 0.25,
    **config: Any,
) -> tuple[str, dict[str, str]]:
    """A retrieval session with one turn per message; returns its id and `name` / `name.reply` artifact ids."""
    body = {
        "system_prompt": "You are a helpful assistant.", "context_policy": "retrieval",
        "retrieval": {"top_k": top_k, "min_similarity": min_similarity}, "sampling": SAMPLING, **config,
    }
    created = client.post("/v1/sessions", json=body)
    assert created.status_code == 201, created.text
    session_id: str = created.json()["id"]
    ids: dict[str, str] = {}
    for name, text in messages:
        turn = say(client, session_id, text)
        ids[name] = turn["inputs"][0]["artifact_id"]
        ids[f"{name}.reply"] = turn["reply"]["artifact_id"]
    return session_id, ids


def say(client: httpx.Client, session_id: str, text: str) -> dict[str, Any]:
    response = client.post(f"/v1/sessions/{session_id}/turns", json={"inputs": [{"type": "user", "content": text}]})
    assert response.status_code == 200, response.text
    turn: dict[str, Any] = response.json()
    return turn


def descendants(client: httpx.Client, session_id: str, artifact_id: str) -> set[str]:
    response = client.get(f"/v1/sessions/{session_id}/artifacts/{artifact_id}/descendants")
    assert response.status_code == 200, response.text
    return {a["id"] for a in response.json()["artifacts"]}
