"""POST/GET /v1/forget: validation, tenancy, dry runs, idempotency, the baselines' effects, metrics."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.forget.forget_helpers import (
    artifacts,
    assert_tiles,
    forget,
    post_turn,
    run_script,
    shape,
    user,
)
from tests.support import problem

FAST = {"temperature": 0, "max_tokens": 8, "seed": 3}
SECRET = "PIN 4417"



SCRIPT = [
    [user("Hello there.")],
    [user(f"Remember my {SECRET} please."), {"type": "document", "content": "Weather: sunny.", "source": "w"}],
    [user("What is the weather?")],
]


@pytest.fixture
def session(client: httpx.Client) -> tuple[str, list[list[str]]]:
    return run_script(client, SCRIPT, FAST)


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"target": {}},
        {"target": {"artifact_id": "art_x", "text": "y", "session_id": "ses_x"}},
        {"target": {"text": "no session"}},
        {"target": {"query": "no session"}},
        {"target": {"artifact_id": "art_x", "min_similarity": 0.5}},
        {"target": {"artifact_id": "art_x"}, "strategy": "burn_it_all"},
        {"target": {"artifact_id": "art_x"}, "dry_run": "maybe"},
        {"target": {"artifact_id": "art_x"}, "unknown": 1},
        {"target": {"memory": {"namespace": "", "key": "k"}}},
        {"target": {"query": "x", "session_id": "ses_x", "min_similarity": 2}},
    ],
)
def test_bad_requests_are_422_problems(client: httpx.Client, body: dict[str, Any]) -> None:
    problem(client.post("/v1/forget", json=body), 422)


def test_a_422_does_not_echo_the_text(client: httpx.Client) -> None:
    r = client.post("/v1/forget", json={"target": {"text": SECRET}})
    assert SECRET not in problem(r, 422).__repr__()


def test_unknown_and_foreign_ids_are_404(
    client: httpx.Client, other_tenant: httpx.Client, session: tuple[str, list[list[str]]]
) -> None:
    session_id, ids = session
    problem(client.post("/v1/forget", json={"target": {"artifact_id": "art_nope"}}), 404)
    problem(client.post("/v1/forget", json={"target": {"session_id": "ses_nope", "text": "x"}}), 404)
    problem(client.get("/v1/forget/fgt_nope"), 404)
    # another tenant can neither forget nor see this tenant's artifacts and jobs
    problem(other_tenant.post("/v1/forget", json={"target": {"artifact_id": ids[1][0]}}), 404)
    problem(other_tenant.post("/v1/forget", json={"target": {"session_id": session_id, "text": "x"}}), 404)
    job = forget(client, {"session_id": session_id, "text": "not in there"}, strategy="no_forget")
    problem(other_tenant.get(f"/v1/forget/{job['id']}"), 404)
    # an artifact of another session than the one named
    other_id, _ = run_script(client, [], FAST)
    problem(client.post("/v1/forget", json={"target": {"artifact_id": ids[1][0], "session_id": other_id}}), 404)


def test_dry_run_plans_with_a_trace_and_changes_nothing(
    client: httpx.Client, session: tuple[str, list[list[str]]]
) -> None:
    session_id, ids = session
    before = artifacts(client, session_id)
    r = client.post("/v1/forget", json={"target": {"artifact_id": ids[1][0]}, "dry_run": True})
    assert r.status_code == 200 and "location" not in r.headers
    plan = r.json()
    assert plan["dry_run"] is True
    entry = plan["sessions"][0]
    assert (entry["tau"], entry["T"], entry["transitions_replayed"]) == (2, 3, 2)
    assert entry["checkpoint"]["turn"] == 1
    why = {t["artifact_id"]: t["why"] for t in entry["trace"]}
    assert why[ids[1][0]] == "target"
    replies = [a["id"] for a in before if a["kind"] == "assistant"]
    assert why[replies[1]] == f"context held {ids[1][0]}"
    assert why[replies[2]] == f"context held {replies[1]}"
    assert replies[0] not in why and ids[1][1] not in why  # before τ, and a sibling observation: not tainted
    assert set(entry["closure"]) == set(why) == {ids[1][0], replies[1], replies[2]}
    tokens = entry["tokens"]
    assert 0 < tokens["recompute_estimate"] < tokens["full_reset_estimate"]
    assert artifacts(client, session_id) == before
    assert client.get(f"/v1/sessions/{session_id}").json()["epoch"] == 0
    problem(client.get(f"/v1/forget/{plan['id']}"), 404)


def test_forget_is_idempotent(client: httpx.Client, session: tuple[str, list[list[str]]]) -> None:
    session_id, ids = session
    first = forget(client, {"artifact_id": ids[1][0]}, wait=True)
    assert first["status"] == "succeeded", first
    again = client.post("/v1/forget", json={"target": {"artifact_id": ids[1][0]}})
    assert again.status_code == 200 and again.json()["id"] == first["id"]
    state = artifacts(client, session_id)
    # the same text twice: the second finds nothing to forget and changes nothing
    text_job = forget(client, {"session_id": session_id, "text": SECRET}, wait=True)
    assert text_job["status"] == "succeeded" and text_job["sessions"] == []
    assert artifacts(client, session_id) == state


def test_a_model_output_cannot_be_replayed_away_but_delete_dependents_removes_it(
    client: httpx.Client, session: tuple[str, list[list[str]]]
) -> None:
    session_id, _ = session
    before = artifacts(client, session_id)
    reply = [a for a in before if a["kind"] == "assistant"][1]
    body = problem(client.post("/v1/forget", json={"target": {"artifact_id": reply["id"]}}), 422)
    assert "delete_dependents" in body["detail"]
    job = forget(client, {"artifact_id": reply["id"]}, strategy="delete_dependents", wait=True)
    assert job["status"] == "succeeded", job
    after = artifacts(client, session_id)
    gone = set(job["sessions"][0]["closure"])
    assert reply["id"] in gone
    assert [(a["id"], a["content"]) for a in before if a["id"] not in gone] == [(a["id"], a["content"]) for a in after]
    assert_tiles(after)
    assert job["sessions"][0]["tokens"]["decoded"] == 0


def test_full_reset_reaches_the_same_state_without_reusing_anything(
    client: httpx.Client, database_url: str
) -> None:
    a_id, a_ids = run_script(client, SCRIPT, FAST)
    b_id, b_ids = run_script(client, SCRIPT, FAST)
    replay = forget(client, {"artifact_id": a_ids[1][0]}, wait=True)
    reset = forget(client, {"artifact_id": b_ids[1][0]}, strategy="full_reset", wait=True)
    assert replay["status"] == reset["status"] == "succeeded"
    assert shape(artifacts(client, a_id), database_url) == shape(artifacts(client, b_id), database_url)
    r, f = replay["sessions"][0], reset["sessions"][0]
    assert f["tokens"]["reused"] == 0 and f["checkpoint"] is None and f["transitions_replayed"] == 3
    assert r["tokens"]["reused"] > 0 and r["transitions_replayed"] == 2
    assert r["tokens"]["prefilled"] + r["tokens"]["decoded"] < f["tokens"]["prefilled"] + f["tokens"]["decoded"]
    assert r["state_sha256_after"] == f["state_sha256_after"]


def test_baselines_leave_what_the_paper_says_they_leave(client: httpx.Client) -> None:
    results: dict[str, list[dict[str, Any]]] = {}
    for strategy in ("no_forget", "source_redaction", "sanitized_rebuild", "forget_instruction", "sanitize_no_replay"):
        session_id, _ = run_script(client, SCRIPT, FAST)
        job = forget(client, {"session_id": session_id, "text": SECRET}, strategy=strategy, wait=True)
        assert job["status"] == "succeeded", (strategy, job)
        results[strategy] = artifacts(client, session_id)
        assert_tiles(results[strategy])
    holds = {s: [a["kind"] for a in arts if SECRET in a["content"]] for s, arts in results.items()}
    assert holds["no_forget"] and "user" in holds["no_forget"]
    assert "user" not in holds["source_redaction"]  # the source is redacted, derived artifacts are kept as they were
    assert holds["sanitized_rebuild"] == []
    assert holds["forget_instruction"][-1] == "user"
    assert len(results["forget_instruction"]) == len(results["no_forget"]) + 1
    assert holds["sanitize_no_replay"] == []
    # B4 removed every reply from τ on and regenerated none
    replies = [a for a in results["sanitize_no_replay"] if a["kind"] == "assistant"]
    assert [a["turn"] for a in replies] == [1]


def test_a_turn_after_a_forget_continues_from_the_new_state(
    client: httpx.Client, session: tuple[str, list[list[str]]]
) -> None:
    session_id, ids = session
    assert forget(client, {"artifact_id": ids[1][0]}, wait=True)["status"] == "succeeded"
    r = client.post(f"/v1/sessions/{session_id}/turns", json={"inputs": [user("Thanks!")]})
    assert r.status_code == 200, r.text
    body = r.json()
    assert (body["turn"], body["epoch"]) == (4, 1)
    assert body["usage"]["reused_tokens"] > 0  # the replay left the cache at the new state
    assert_tiles(artifacts(client, session_id))


def test_forget_metrics_are_exported(client: httpx.Client, session: tuple[str, list[list[str]]]) -> None:
    _, ids = session
    assert forget(client, {"artifact_id": ids[1][0]}, wait=True)["status"] == "succeeded"
    body = client.get("/metrics").text
    for name in (
        'lethe_forget_jobs_total{status="succeeded",strategy="selective_replay"}',
        "lethe_forget_duration_seconds_bucket",
        "lethe_forget_transitions_replayed_bucket",
        'lethe_forget_tokens_total{kind="reused",strategy="selective_replay"}',
        "lethe_forget_full_reset_estimate_tokens_total",
        "lethe_forget_queue_depth",
        'lethe_forget_engine_wait_seconds_count{priority="forget"}',  # the hf engine measures its queue
    ):
        assert name in body, name


def test_query_target_forgets_observations_similar_to_a_description(client: httpx.Client) -> None:
    script = [
        [user("I live at 4 Privet Drive in Little Whinging.")],
        [user("What is a good recipe for pancakes?")],
    ]
    session_id, ids = run_script(client, script, FAST)
    plan = client.post("/v1/forget", json={
        "target": {"query": "my home address, where I live", "session_id": session_id, "min_similarity": 0.2},
        "dry_run": True,
    }).json()
    assert plan["sessions"][0]["closure"][0] == ids[0][0]
    assert ids[1][0] not in plan["sessions"][0]["closure"]
    job = forget(client, {"query": "my home address, where I live", "session_id": session_id, "min_similarity": 0.2},
                 wait=True)
    assert job["status"] == "succeeded", job
    after = artifacts(client, session_id)
    assert not [a for a in after if "Privet" in a["content"]]
    assert [a["id"] for a in after if a["kind"] == "user"] == [ids[1][0]]


def test_turn_with_only_the_target_becomes_an_empty_transition(client: httpx.Client) -> None:
    session_id, ids = run_script(client, [[user("one")], [user(SECRET)], [user("three")]], FAST)
    assert forget(client, {"artifact_id": ids[1][0]}, wait=True)["status"] == "succeeded"
    after = artifacts(client, session_id)
    assert [a["turn"] for a in after if a["kind"] != "system"] == [1, 1, 3, 3]
    post_turn(client, session_id, [user("four")])
    assert client.get(f"/v1/sessions/{session_id}").json()["turns"] == 4
