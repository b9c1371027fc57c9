"""A turn and a forget's replay run one transition function (app/runtime/transition.py), so they cannot diverge.

The check: recompute transitions whose inputs did not change, and compare what the replay wrote with what the turns
wrote, artifact by artifact, straight from the tables: kind, position, content, token ids, token span, the chunk
recipe and finish reason in `meta`, `committed`, what a compaction archived, provenance parents and sources (ids
mapped from the originals to the recomputed outputs), and the checkpoints. A full reset whose target entered in the
last transition recomputes every earlier transition from a cold cache with exactly its original inputs: any
difference between how a turn and how a replay computes a transition (sampling, context, tools, records,
checkpoints, compaction) shows up here, with seeded temperature sampling so a different seed or context could not
hide. The retrieval policy's regeneration runs through the same function and is checked the same way.
"""

from __future__ import annotations

import json
from typing import Any

import httpx

from tests.forget.forget_helpers import (
    assert_recomputed_equal,
    checkpoint_offsets,
    forget,
    provenance_parents,
    recorded_rows,
    user,
)
from tests.support import sql

SEEDED = {"temperature": 0.7, "top_p": 0.95, "max_tokens": 16, "seed": 5}
# The setting under which the tiny model copies a tool call (tests/forget/test_forget_tools.py): greedy, with room.
TOOLS = [
    {"name": "get_balance", "builtin": True},
    {"name": "transfer", "builtin": True},
    {"name": "lookup_contact", "description": "Find a contact's IBAN",
     "parameters": {"type": "object", "properties": {"name": {"type": "string"}}}},
]
SYSTEM = "You are a banking assistant. Use tools."
GREEDY_TOOLS = {"temperature": 0, "max_tokens": 48, "seed": 1}
TARGET = "My PIN is 5512."


def _turn(client: httpx.Client, session_id: str, *inputs: dict[str, Any]) -> dict[str, Any]:
    r = client.post(f"/v1/sessions/{session_id}/turns", json={"inputs": list(inputs)})
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


def _copy_call(name: str, arguments: dict[str, Any]) -> dict[str, str]:
    """The tiny model calls a tool when told to copy the call verbatim (tests/forget/test_forget_tools.py)."""
    return user(f"Copy this exactly: <tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>")


def test_a_replay_writes_what_the_turns_wrote(client: httpx.Client, database_url: str) -> None:
    """Full context: tools (a builtin call fires and changes the environment), a document, a compaction. Greedy (the
    tool call must come); the retrieval case below samples at temperature 0.7."""
    r = client.post("/v1/sessions", json={"system_prompt": SYSTEM, "tools": TOOLS, "sampling": GREEDY_TOOLS})
    assert r.status_code == 201, r.text
    sid = r.json()["id"]
    fired = _turn(client, sid, _copy_call("transfer", {"to": "DE11", "amount": 5}))
    assert fired["reply"]["tool_calls"], fired  # the call fired: the replay must re-apply it, not fire it again
    _turn(client, sid, user("What is my balance now?"))
    _turn(client, sid, user("Read this."), {"type": "document", "content": "Rent due: 700 EUR.", "source": "mail"})
    compacted = client.post(f"/v1/sessions/{sid}/compact", json={"keep_last_turns": 1})
    assert compacted.status_code == 200, compacted.text
    _turn(client, sid, user("Thanks. Anything else due?"))
    target_turn = _turn(client, sid, user(TARGET))["turn"]

    before = recorded_rows(database_url, sid, target_turn)
    assert {"summary", "tool_call", "tool_result", "document"} <= {r["kind"] for r in before}
    parents_before = provenance_parents(database_url, sid)
    checkpoints_before = checkpoint_offsets(database_url, sid, target_turn)
    job = forget(client, {"session_id": sid, "text": TARGET}, strategy="full_reset", wait=True)
    assert job["status"] == "succeeded", job
    assert job["sessions"][0]["transitions_replayed"] == target_turn  # every transition, from a cold cache
    assert_recomputed_equal(database_url, sid, before, parents_before, target_turn)
    assert checkpoint_offsets(database_url, sid, target_turn) == checkpoints_before
    ledger = sql(database_url, "SELECT count(*) AS n FROM tool_executions WHERE session_id = $1", sid)
    assert ledger[0]["n"] == 1  # the transfer fired once, ever


def test_a_regeneration_writes_what_the_turns_wrote(client: httpx.Client, database_url: str) -> None:
    """Retrieval (DeLLM): every output regenerated over the unchanged store equals the one the turn wrote, its
    retrieved context and summary included."""
    r = client.post("/v1/sessions", json={
        "system_prompt": "You are a helpful assistant. Answer briefly.", "context_policy": "retrieval",
        "retrieval": {"top_k": 2, "min_similarity": 0.1}, "sampling": SEEDED,
    })
    assert r.status_code == 201, r.text
    sid = r.json()["id"]
    for text in ("I live in Lyon.", "I have a dog named Rex.", "Where do I live?"):
        _turn(client, sid, user(text))
    compacted = client.post(f"/v1/sessions/{sid}/compact", json={"keep_last_turns": 1})
    assert compacted.status_code == 200, compacted.text
    _turn(client, sid, user("What is my dog called?"))
    target_turn = _turn(client, sid, user(TARGET))["turn"]

    before = recorded_rows(database_url, sid, target_turn)
    assert {"summary", "assistant"} <= {r["kind"] for r in before}
    assert any(r["meta"].get("retrieved") for r in before), "no reply retrieved anything: a weak check"
    parents_before = provenance_parents(database_url, sid)
    job = forget(client, {"session_id": sid, "text": TARGET}, strategy="full_reset", wait=True)
    assert job["status"] == "succeeded", job
    assert_recomputed_equal(database_url, sid, before, parents_before, target_turn)
