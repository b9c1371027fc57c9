"""Deletion requests in plain words: recognised in a turn, answered with a stored plan, never stored as a message, and
run only when the client confirms the plan through POST /v1/forget."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from app.forget.plain_words import DeletionRequest, parse
from tests.forget.forget_helpers import artifacts, forget, run_script, tables_holding, user, wait_job
from tests.retrieval.retrieval_helpers import PERSONA, retrieval_session, say
from tests.support import problem


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        ("Forget that I live in Paris.", DeletionRequest("meaning", "I live in Paris")),
        ("please forget about my job", DeletionRequest("meaning", "my job")),
        ('Delete "I live in Paris"', DeletionRequest("text", "I live in Paris")),
        ("Remove \u201cmy code 4417\u201d", DeletionRequest("text", "my code 4417")),
        ("Delete message 3", DeletionRequest("id", "3")),
        ("forget message art_0123", DeletionRequest("id", "art_0123")),
        ("Forget everything about the guitar", DeletionRequest("keyword", "the guitar")),
        ("Erase what I told you about Paris!", DeletionRequest("keyword", "Paris")),
        ("Delete that my dog is called Rex", DeletionRequest("meaning", "my dog is called Rex")),
        # Tasks and chat, not requests to forget.
        ("Delete that event", None),
        ("Remove the meeting from my calendar", None),
        ("I forgot my keys again.", None),
        ("What does forgetting mean?", None),
        ("", None),
    ],
)
def test_requests_are_recognised_narrowly(message: str, expected: DeletionRequest | None) -> None:
    assert parse(message) == expected


def test_a_request_is_answered_with_a_plan_and_stores_nothing(client: httpx.Client, database_url: str) -> None:
    session_id, ids = retrieval_session(client, PERSONA, top_k=2)
    before = artifacts(client, session_id)
    turns = client.get(f"/v1/sessions/{session_id}").json()["turns"]

    answer = say(client, session_id, "Forget that I live in Paris.")
    plan = answer["forget_plan"]
    assert answer["reply"]["artifact_id"] is None and plan["id"] in answer["reply"]["content"]
    assert answer["inputs"] == [] and answer["turn"] == turns
    assert plan["status"] == "planned" and plan["strategy"] == "selective_replay"
    trace = {t["artifact_id"]: t["why"] for t in plan["sessions"][0]["trace"]}
    assert trace[ids["paris"]] == "target" and ids["home.reply"] in trace and ids["music.reply"] not in trace
    # Nothing was deleted, and the request itself is in no artifact and no table.
    assert artifacts(client, session_id) == before
    assert client.get(f"/v1/sessions/{session_id}").json()["turns"] == turns
    assert tables_holding(database_url, "Forget that I live") == []
    assert client.get(f"/v1/forget/{plan['id']}").json()["status"] == "planned"

    confirmed = client.post("/v1/forget", json={"plan_id": plan["id"], "strategy": "delete_dependents", "wait": True})
    assert confirmed.status_code in (200, 202), confirmed.text
    job = wait_job(client, plan["id"])
    assert job["status"] == "succeeded" and job["strategy"] == "delete_dependents", job
    live = {a["id"] for a in artifacts(client, session_id)}
    assert ids["paris"] not in live and ids["home.reply"] not in live and ids["music.reply"] in live
    assert tables_holding(database_url, "live in Paris", within=session_id) == []

    again = client.post("/v1/forget", json={"plan_id": plan["id"]})  # a retried confirmation runs nothing twice
    assert again.status_code in (200, 202) and again.json()["id"] == plan["id"]
    assert again.json()["status"] == "succeeded"
    problem(client.post("/v1/forget", json={"plan_id": plan["id"], "dry_run": True}), 409)


@pytest.mark.parametrize(
    ("request_text", "matched"),
    [
        ("Delete message 2", "guitar"),
        ('Delete "every evening"', "guitar"),
        ("Forget everything about guitars", "guitar"),
        ("Forget that I play the guitar", "guitar"),
    ],
)
def test_each_request_shape_matches_its_message(client: httpx.Client, request_text: str, matched: str) -> None:
    session_id, ids = retrieval_session(client, PERSONA[:2], top_k=2)
    plan = say(client, session_id, request_text)["forget_plan"]
    targets = {t["artifact_id"] for t in plan["sessions"][0]["trace"] if t["why"] == "target"}
    assert targets == {ids[matched]}


def test_nothing_matching_makes_no_plan(client: httpx.Client) -> None:
    session_id, _ = retrieval_session(client, PERSONA[:2], top_k=2)
    answer = say(client, session_id, "Forget that I own a sailing boat.")
    assert answer["forget_plan"] is None and answer["reply"]["artifact_id"] is None
    assert "nothing" in answer["reply"]["content"].lower()


def test_a_full_context_session_takes_requests_too(client: httpx.Client) -> None:
    session_id, ids = run_script(client, [[user("My locker code is 4417.")], [user("What is my code?")]],
                                 {"temperature": 0, "max_tokens": 8, "seed": 1})
    plan = say(client, session_id, "Forget that my locker code is 4417")["forget_plan"]
    assert plan["sessions"][0]["tau"] == 1 and plan["sessions"][0]["checkpoint"]["turn"] == 0
    job = forget_plan(client, plan["id"])
    assert job["status"] == "succeeded" and job["sessions"][0]["transitions_replayed"] == 2
    assert not any("4417" in a["content"] for a in artifacts(client, session_id))
    assert ids[0][0] not in {a["id"] for a in artifacts(client, session_id)}


def forget_plan(client: httpx.Client, plan_id: str, **options: Any) -> dict[str, Any]:
    response = client.post("/v1/forget", json={"plan_id": plan_id, **options})
    assert response.status_code in (200, 202), response.text
    return wait_job(client, plan_id)


@pytest.mark.parametrize(
    "body",
    [
        {"plan_id": "fgt_nope"},
        {"plan_id": "fgt_x", "target": {"artifact_id": "art_x"}},
        {},
        {"target": {"session_id": "ses_x", "keyword": "a", "query": "b"}},
        {"target": {"keyword": "guitar"}},
        {"target": {"artifact_ids": [], "session_id": "ses_x"}},
    ],
)
def test_bad_plan_and_target_requests(client: httpx.Client, body: dict[str, Any]) -> None:
    response = client.post("/v1/forget", json=body)
    problem(response, 404 if body == {"plan_id": "fgt_nope"} else 422)


def test_artifact_ids_target_forgets_a_set(client: httpx.Client) -> None:
    session_id, ids = retrieval_session(client, PERSONA, top_k=2)
    job = forget(client, {"session_id": session_id, "artifact_ids": [ids["paris"], ids["guitar"], "art_gone"]},
                 strategy="delete_dependents", wait=True)
    assert job["status"] == "succeeded", job
    live = {a["id"] for a in artifacts(client, session_id)}
    assert not {ids["paris"], ids["guitar"], ids["home.reply"], ids["music.reply"]} & live
    assert {ids["home"], ids["music"]} <= live
