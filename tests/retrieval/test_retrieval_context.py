"""The retrieval context policy (DeLLM) through HTTP: a reply's context is the retrieved messages and exactly those
are its provenance parents; options a retrieval session cannot honour are refused."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.forget.forget_helpers import artifacts
from tests.retrieval.retrieval_helpers import PERSONA, descendants, retrieval_session, say
from tests.support import problem, stored_artifacts


def test_reply_parents_are_exactly_the_retrieved_messages(client: httpx.Client, database_url: str) -> None:
    session_id, ids = retrieval_session(client, PERSONA, top_k=2)
    items = {a["id"]: a for a in artifacts(client, session_id)}
    system = next(a["id"] for a in items.values() if a["kind"] == "system")
    home, music = items[ids["home.reply"]], items[ids["music.reply"]]
    # Each reply: the system prompt, what retrieval picked (at most top_k), its own question.
    for reply, question in ((home, ids["home"]), (music, ids["music"])):
        assert reply["parents"][0] == system and reply["parents"][-1] == question
        assert len(reply["parents"]) <= 2 + 2
    assert ids["paris"] in home["parents"]
    assert ids["guitar"] in music["parents"] and ids["paris"] not in music["parents"]
    # Dep(m) over the stored edges: the home reply depends on Paris, the music reply does not.
    dep = descendants(client, session_id, ids["paris"])
    assert ids["home.reply"] in dep and ids["music.reply"] not in dep
    # Every message carries its 384-dimension embedding; the system prompt (always in context) needs none.
    rows = stored_artifacts(database_url, "WHERE session_id = $1", session_id)
    dims = {r["kind"]: None if r["embedding"] is None else len(r["embedding"]) for r in rows}
    assert dims == {"system": None, "user": 384, "assistant": 384}


def test_similarity_floor_and_top_k_bound_the_context(client: httpx.Client) -> None:
    strict, ids = retrieval_session(client, PERSONA, top_k=5, min_similarity=0.99)
    items = {a["id"]: a for a in artifacts(client, strict)}
    system = next(a["id"] for a in items.values() if a["kind"] == "system")
    for name in ("paris", "guitar", "home", "music"):  # nothing is that similar: only the question itself
        assert items[ids[f"{name}.reply"]]["parents"] == [system, ids[name]]
    one, ids = retrieval_session(client, PERSONA, top_k=1, min_similarity=-1.0)
    items = {a["id"]: a for a in artifacts(client, one)}
    assert [len(items[ids[f"{n}.reply"]]["parents"]) for n in ("paris", "guitar", "home", "music")] == [2, 3, 3, 3]


def test_cache_holds_only_the_preamble_between_replies(client: httpx.Client) -> None:
    """The system block is computed once; every later reply reuses it and prefills only its own context."""
    session_id, _ = retrieval_session(client, PERSONA[:1], top_k=2)
    system = next(a for a in artifacts(client, session_id) if a["kind"] == "system")
    preamble = system["token_span"][1]
    turn = say(client, session_id, "Where do I live?")
    assert turn["usage"]["reused_tokens"] == preamble
    assert turn["usage"]["prompt_tokens"] > preamble


def test_stored_log_tiles_and_replies_are_deterministic(client: httpx.Client) -> None:
    a, _ = retrieval_session(client, PERSONA, top_k=2)
    b, _ = retrieval_session(client, PERSONA, top_k=2)
    first, second = artifacts(client, a), artifacts(client, b)
    offset = 0
    for item in first:
        assert item["token_span"][0] == offset
        offset = item["token_span"][1]
    assert [(x["kind"], x["content"]) for x in first] == [(x["kind"], x["content"]) for x in second]


@pytest.mark.parametrize(
    ("body", "word"),
    [
        ({"context_policy": "retrieval", "tools": [{"name": "get_balance", "kind": "read_only"}]}, "tools"),
        ({"context_policy": "retrieval", "compaction": {"max_tokens": 500}}, "compaction"),
        ({"context_policy": "retrieval", "retrieval": {"top_k": 0}}, "top_k"),
        ({"context_policy": "retrieval", "retrieval": {"min_similarity": 2}}, "min_similarity"),
        ({"context_policy": "nearest"}, "context_policy"),
    ],
)
def test_bad_retrieval_options_answer_422(client: httpx.Client, body: dict[str, Any], word: str) -> None:
    response = client.post("/v1/sessions", json={"system_prompt": "Hi.", **body})
    problem(response, 422)
    assert word in response.text


def test_generate_false_stores_embedded_messages_retrieved_later(client: httpx.Client) -> None:
    session_id, _ = retrieval_session(client, [], top_k=3)
    stored = client.post(
        f"/v1/sessions/{session_id}/turns",
        json={"inputs": [{"type": "document", "content": "The office wifi password is on the fridge."}],
              "generate": False},
    )
    assert stored.status_code == 200 and stored.json()["reply"] is None
    document = stored.json()["inputs"][0]["artifact_id"]
    reply = say(client, session_id, "Where is the wifi password?")
    item = next(a for a in artifacts(client, session_id) if a["id"] == reply["reply"]["artifact_id"])
    assert document in item["parents"]
