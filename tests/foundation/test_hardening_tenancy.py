"""Another tenant cannot change anything about a session it does not own, its KV cache included: every request it
makes on the id answers 404, and the owner's next turn reuses exactly the tokens it would have reused anyway."""

from __future__ import annotations

import httpx

from tests.support import problem

FAST = {"temperature": 0, "max_tokens": 8, "seed": 3}


def test_another_tenants_requests_leave_the_session_and_its_cache_alone(
    client: httpx.Client, other_tenant: httpx.Client
) -> None:
    created = client.post("/v1/sessions", json={"system_prompt": "You are terse.", "sampling": FAST})
    assert created.status_code == 201, created.text
    sid = created.json()["id"]
    first = client.post(f"/v1/sessions/{sid}/turns", json={"inputs": [{"type": "user", "content": "I like tea."}]})
    assert first.status_code == 200, first.text
    art = first.json()["inputs"][0]["artifact_id"]
    before = client.get(f"/v1/sessions/{sid}").json()
    artifacts_before = client.get(f"/v1/sessions/{sid}/artifacts").json()

    turn = {"inputs": [{"type": "user", "content": "hello"}]}
    attempts = [
        ("POST", f"/v1/sessions/{sid}/turns", turn),
        ("POST", f"/v1/sessions/{sid}/turns", {"inputs": [{"type": "user", "content": "Forget that I like tea"}]}),
        ("POST", f"/v1/sessions/{sid}/turns", {"inputs": [], "generate": False}),
        ("POST", f"/v1/sessions/{sid}/turns", {**turn, "stream": True}),
        ("POST", f"/v1/sessions/{sid}/compact", {"keep_last_turns": 0}),
        ("DELETE", f"/v1/sessions/{sid}", None),
        ("GET", f"/v1/sessions/{sid}", None),
        ("GET", f"/v1/sessions/{sid}/artifacts", None),
        ("GET", f"/v1/sessions/{sid}/artifacts/{art}/descendants", None),
        ("POST", "/v1/forget", {"target": {"artifact_id": art}}),
        ("POST", "/v1/forget", {"target": {"artifact_id": art}, "dry_run": True}),
        ("POST", "/v1/forget", {"target": {"session_id": sid, "text": "tea"}, "wait": True}),
        ("POST", "/v1/forget", {"target": {"session_id": sid, "keyword": "tea"}}),
        ("POST", "/v1/forget", {"target": {"session_id": sid, "artifact_ids": [art]}, "strategy": "full_reset"}),
        ("POST", "/v1/forget", {"target": {"session_id": sid, "query": "tea"}}),
    ]
    for method, url, body in attempts:
        problem(other_tenant.request(method, url, json=body), 404)

    assert client.get(f"/v1/sessions/{sid}").json() == before
    assert client.get(f"/v1/sessions/{sid}/artifacts").json() == artifacts_before
    second = client.post(f"/v1/sessions/{sid}/turns", json=turn)
    assert second.status_code == 200, second.text
    usage = second.json()["usage"]
    # The whole log of the first turn is still cached in this process: nothing was evicted or rebuilt.
    assert usage["reused_tokens"] == before["token_count"] > 0, usage
