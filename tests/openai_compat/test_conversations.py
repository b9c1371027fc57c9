"""Conversations through the real `openai` SDK: items, pagination, tenants, and deleting an item as a forget.

The central claim: after `conversations.items.delete`, the conversation is the one that never had the item. The
counterfactual is built through the same SDK (the same items without the deleted one, the same sampling; every
transition's seed derives from the session seed and its index), and its responses must equal the forgotten
conversation's, token for token, with seeded temperature sampling."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest

from tests.support import sql, stored_artifacts

SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
SAMPLING: dict[str, Any] = {"temperature": 0.8, "top_p": 0.95, "max_output_tokens": 8}
SECRET = "QZ-4417"  # a hyphen: no id or digest in the database can spell it, so the searches below are exact


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def texts(oai: openai.OpenAI, conversation_id: str) -> list[tuple[str, str]]:
    out = []
    for item in oai.conversations.items.list(conversation_id, order="asc", limit=100):
        data = item.to_dict()
        out.append((data.get("role", data["type"]), "".join(c["text"] for c in data.get("content", []))))
    return out


def test_deleting_an_item_leaves_the_conversation_that_never_had_it(
    oai: openai.OpenAI, model: str, database_url: str
) -> None:
    def converse(first: list[dict[str, str]]) -> tuple[str, list[openai.types.responses.Response]]:
        conv = oai.conversations.create(items=[SYSTEM])
        r1 = oai.responses.create(model=model, conversation=conv.id, input=first, **SAMPLING)
        r2 = oai.responses.create(model=model, conversation=conv.id, input="What is my code?", **SAMPLING)
        return conv.id, [r1, r2]

    forgotten, (f1, f2) = converse([user("My name is Ada."), user(f"My code is {SECRET}.")])
    never, (n1, n2) = converse([user("My name is Ada.")])
    assert f2.usage.input_tokens_details.cached_tokens > 0  # the second turn reused the first one's cache
    secret_item = next(i.id for i in oai.conversations.items.list(forgotten) if SECRET in json.dumps(i.to_dict()))

    plan = oai.conversations.items.with_raw_response.delete(
        secret_item, conversation_id=forgotten, extra_query={"lethe_dry_run": "true"}
    )
    assert plan.status_code == 200 and "Lethe-Forget-Id" not in plan.headers
    assert oai.conversations.items.retrieve(secret_item, conversation_id=forgotten).id == secret_item  # unchanged

    raw = oai.conversations.items.with_raw_response.delete(secret_item, conversation_id=forgotten)
    assert raw.status_code == 200
    conversation = raw.parse()
    job = conversation.to_dict()["lethe_forget"]
    assert job["status"] == "succeeded" and job["strategy"] == "selective_replay"
    assert raw.headers["Lethe-Forget-Id"] == job["id"]
    with pytest.raises(openai.NotFoundError):
        oai.conversations.items.retrieve(secret_item, conversation_id=forgotten)

    assert texts(oai, forgotten) == texts(oai, never)
    inputs = oai.responses.input_items.list(f1.id, order="asc").data
    assert [i.to_dict()["content"][0]["text"] for i in inputs] == ["My name is Ada."]
    # Responses are read from their transitions as they are now: the old ones answer as the counterfactual's did.
    for f, n in ((f1, n1), (f2, n2)):
        assert oai.responses.retrieve(f.id).output_text == oai.responses.retrieve(n.id).output_text
    later = [oai.responses.create(model=model, conversation=c, input="Say it again.", **SAMPLING)
             for c in (forgotten, never)]
    assert later[0].output_text == later[1].output_text
    assert later[0].usage.input_tokens == later[1].usage.input_tokens

    session = oai.conversations.retrieve(forgotten).to_dict()["lethe_session_id"]
    for response in (f1, f2, later[0]):
        assert SECRET not in oai.responses.retrieve(response.id).to_json()
    assert SECRET not in json.dumps([dict(r) for r in sql(
        database_url, "SELECT * FROM openai_responses WHERE session_id = $1", session)], default=str)
    assert not [a for a in stored_artifacts(database_url, "WHERE session_id = $1", session) if SECRET in a["content"]]


def test_items_paginate_in_both_orders_and_metadata_updates(oai: openai.OpenAI) -> None:
    conv = oai.conversations.create(items=[SYSTEM, user("one"), user("two"), user("three")], metadata={"k": "v"})
    assert conv.metadata == {"k": "v"}
    first = oai.conversations.items.list(conv.id, limit=2, order="asc")
    assert [i.to_dict()["content"][0]["text"] for i in first.data] == ["one", "two"] and first.has_more
    every = list(oai.conversations.items.list(conv.id, limit=2, order="asc"))  # the SDK follows `after`
    assert [i.to_dict()["content"][0]["text"] for i in every] == ["one", "two", "three"]
    newest = list(oai.conversations.items.list(conv.id, limit=1))  # desc by default
    assert [i.id for i in newest] == [i.id for i in reversed(every)]

    added = oai.conversations.items.create(conv.id, items=[user("four")])
    assert [i.to_dict()["content"][0]["text"] for i in added.data] == ["four"]
    assert oai.conversations.items.retrieve(added.data[0].id, conversation_id=conv.id).to_dict()["role"] == "user"
    with pytest.raises(openai.BadRequestError) as bad:
        oai.conversations.items.list(conv.id, after="art_" + "0" * 26)
    assert bad.value.param == "after"

    assert oai.conversations.update(conv.id, metadata={"topic": "numbers"}).metadata == {"topic": "numbers"}
    assert oai.conversations.retrieve(conv.id).metadata == {"topic": "numbers"}
    assert oai.conversations.delete(conv.id).deleted
    with pytest.raises(openai.NotFoundError):
        oai.conversations.retrieve(conv.id)


def test_another_tenant_can_neither_see_nor_delete_a_conversation(
    oai: openai.OpenAI, other_oai: openai.OpenAI, model: str
) -> None:
    conv = oai.conversations.create(items=[user("mine")])
    item = oai.conversations.items.list(conv.id).data[0].id
    response = oai.responses.create(model=model, conversation=conv.id, input="hi", max_output_tokens=2)
    attempts = [
        lambda: other_oai.conversations.retrieve(conv.id),
        lambda: other_oai.conversations.items.list(conv.id),
        lambda: other_oai.conversations.items.retrieve(item, conversation_id=conv.id),
        lambda: other_oai.conversations.items.delete(item, conversation_id=conv.id),
        lambda: other_oai.conversations.delete(conv.id),
        lambda: other_oai.responses.retrieve(response.id),
        lambda: other_oai.responses.create(model=model, conversation=conv.id, input="x"),
        lambda: other_oai.responses.create(model=model, previous_response_id=response.id, input="x"),
    ]
    for attempt in attempts:
        with pytest.raises(openai.NotFoundError):
            attempt()
    assert oai.conversations.items.retrieve(item, conversation_id=conv.id).id == item  # still there
