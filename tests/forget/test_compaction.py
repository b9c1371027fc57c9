"""Compaction, and forgetting through it: the summary replaces older turns in the live prompt, the originals are
archived (not deleted) so a forget can replay the compaction without the target, and a summary written back into
memory is tombstoned when what it was derived from is forgotten."""

from __future__ import annotations

import uuid
from typing import Any

import httpx

from tests.forget.forget_helpers import (
    artifacts,
    assert_tiles,
    forget,
    run_script,
    shape,
    tables_holding,
    user,
    wait_job,
)
from tests.support import problem

GREEDY = {"temperature": 0, "max_tokens": 24, "seed": 9}
SYSTEM = "You are a helpful assistant."



def compact(client: httpx.Client, session_id: str, **body: Any) -> dict[str, Any]:
    r = client.post(f"/v1/sessions/{session_id}/compact", json=body)
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


def test_compaction_replaces_older_turns_with_a_summary(client: httpx.Client) -> None:
    session_id, ids = run_script(client, [[user("I live in Lyon.")], [user("I like tea.")], [user("Hi!")]], GREEDY)
    before = artifacts(client, session_id)
    session = compact(client, session_id, keep_last_turns=1)
    assert session["turns"] == 4
    after = artifacts(client, session_id)
    assert [(a["kind"], a["turn"]) for a in after] == [("system", 0), ("summary", 4), ("user", 4), ("assistant", 4)]
    assert_tiles(after)
    summary = after[1]
    summarized = {a["id"] for a in before if a["turn"] in (1, 2)}
    assert set(summary["parents"]) == summarized and summary["content"]
    assert after[2]["content"] == "Hi!" and after[2]["parents"] == [ids[2][0]]  # a copy, derived from its original
    assert after[2]["source_ids"] == [ids[2][0]]
    r = client.post(f"/v1/sessions/{session_id}/turns", json={"inputs": [user("Where do I live?")]})
    assert r.status_code == 200 and r.json()["turn"] == 5
    assert r.json()["usage"]["reused_tokens"] == after[-1]["token_span"][1]  # the cache holds the compacted prompt
    # A valid request the session's state cannot take: 409.
    problem(client.post(f"/v1/sessions/{session_id}/compact", json={"keep_last_turns": 50}), 409)
    problem(client.post(f"/v1/sessions/{session_id}/compact", json={"write_back": True}), 409)  # no namespace


def test_forgetting_a_summarized_fact_replays_the_compaction(client: httpx.Client, database_url: str) -> None:
    secret = f"Rue {uuid.uuid4().hex[:6]}"
    script = [[user("Hello!")], [user(f"My address is {secret}.")], [user("I like tea.")], [user("Thanks.")]]
    session_id, ids = run_script(client, script, GREEDY)
    compact(client, session_id, keep_last_turns=1)
    assert client.post(f"/v1/sessions/{session_id}/turns", json={"inputs": [user("Bye.")]}).status_code == 200
    job = forget(client, {"artifact_id": ids[1][0]}, wait=True)  # archived by the compaction: still forgettable
    assert job["status"] == "succeeded", job
    receipt = job["sessions"][0]
    assert (receipt["tau"], receipt["T"], receipt["transitions_replayed"]) == (2, 6, 5)

    reference, _ = run_script(client, [script[0], [], script[2], script[3]], GREEDY)
    compact(client, reference, keep_last_turns=1)
    client.post(f"/v1/sessions/{reference}/turns", json={"inputs": [user("Bye.")]})
    after = artifacts(client, session_id)
    assert shape(after, database_url) == shape(artifacts(client, reference), database_url)
    assert_tiles(after)
    assert not tables_holding(database_url, secret)


def test_a_written_back_summary_is_tombstoned_with_what_it_was_derived_from(client: httpx.Client) -> None:
    ns = "user-" + uuid.uuid4().hex[:8]
    r = client.put(f"/v1/memory/{ns}/home", json={"value": "The user lives in Oslo.", "source": "user"},
                   headers={"If-None-Match": "*"})
    assert r.status_code == 201
    session_id, _ = run_script(client, [[user("Hi")], [user("Plan my day.")]], GREEDY, memory_namespace=ns)
    compact(client, session_id, keep_last_turns=0, write_back=True)
    summary_key = f"summary.{session_id}"
    record = client.get(f"/v1/memory/{ns}/{summary_key}").json()
    assert record["source"] == "summarizer" and record["version"] == 1

    forgot = client.delete(f"/v1/memory/{ns}/home").json()
    job = wait_job(client, forgot["forget_id"])
    assert job["status"] == "succeeded", job
    assert [(d["namespace"], d["key"]) for d in job["derived_memory"]] == [(ns, summary_key)]
    gone = client.get(f"/v1/memory/{ns}/{summary_key}")
    assert problem(gone, 404)["forgotten"] is True
    assert not [a for a in artifacts(client, session_id) if "Oslo" in a["content"]]


def test_a_token_budget_compacts_automatically(client: httpx.Client) -> None:
    policy = {"max_tokens": 64, "keep_last_turns": 1}
    script = [[user("I live in Lyon.")], [user("I like tea and long walks.")], [user("And I have a cat.")]]
    session_id, _ = run_script(client, script, GREEDY, compaction=policy)
    session = client.get(f"/v1/sessions/{session_id}").json()
    assert session["compaction"]["max_tokens"] == 64
    items = artifacts(client, session_id)
    summaries = [a for a in items if a["kind"] == "summary"]
    assert summaries and session["turns"] > 3  # a compaction transition followed a turn over the budget
    assert_tiles(items)
    problem(client.post("/v1/sessions", json={"compaction": {"max_tokens": 100, "write_back": True}}), 422)
