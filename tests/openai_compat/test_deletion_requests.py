"""A deletion request in plain words ("Forget that I live in Paris") is honoured the same at every front door: the
native turn, Responses and Chat Completions all answer it with a stored plan (decided by one service,
app/forget/proposals.py) and run nothing; the request is never a message of the session; the plan is confirmed with
`POST /v1/forget {"plan_id": ...}`, and the conversation then goes on from where it was."""

from __future__ import annotations

from typing import Any

import httpx
import openai

SAMPLING = {"temperature": 0, "max_tokens": 8, "seed": 3}
FACT, REQUEST = "I live in Paris.", "Forget that I live in Paris"


def _artifacts(native: httpx.Client, session_id: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = native.get(f"/v1/sessions/{session_id}/artifacts").json()["artifacts"]
    return items


def _confirm(native: httpx.Client, plan: dict[str, Any], session_id: str) -> None:
    assert plan["status"] == "planned" and plan["sessions"][0]["session_id"] == session_id
    done = native.post("/v1/forget", json={"plan_id": plan["id"], "wait": True})
    assert done.status_code in (200, 202), done.text
    job = done.json()
    while job["status"] not in ("succeeded", "failed"):
        job = native.get(f"/v1/forget/{plan['id']}").json()
    assert job["status"] == "succeeded", job
    assert "Paris" not in str(_artifacts(native, session_id))


def test_the_native_turn_and_responses_answer_with_the_same_plan(
    oai: openai.OpenAI, model: str, native: httpx.Client
) -> None:
    conversation = oai.conversations.create(items=[{"type": "message", "role": "user", "content": FACT}])
    session_id = conversation.model_extra["lethe_session_id"]  # type: ignore[index]
    before = _artifacts(native, session_id)

    answer = oai.responses.create(model=model, conversation=conversation.id, input=REQUEST, max_output_tokens=8)
    plan = answer.model_extra["lethe_forget_plan"]  # type: ignore[index]
    assert plan["id"] in answer.output_text and "confirm" in answer.output_text
    assert _artifacts(native, session_id) == before  # nothing ran, nothing was stored
    again = oai.responses.retrieve(answer.id)
    assert again.output_text == answer.output_text  # the answer is kept, the request is not
    assert all(REQUEST not in str(i) for i in oai.conversations.items.list(conversation.id).data)

    native_answer = native.post(f"/v1/sessions/{session_id}/turns", json={"inputs": [{"type": "user",
                                                                                       "content": REQUEST}]}).json()
    native_plan = native_answer["forget_plan"]
    assert native_answer["reply"]["artifact_id"] is None
    assert [s["closure"] for s in native_plan["sessions"]] == [s["closure"] for s in plan["sessions"]]

    _confirm(native, plan, session_id)
    follow = oai.responses.create(model=model, previous_response_id=answer.id, input="What is my name?",
                                  max_output_tokens=4)
    assert follow.status in ("completed", "incomplete")  # the conversation goes on from where it was


def test_a_streamed_response_carries_the_plan(oai: openai.OpenAI, model: str, native: httpx.Client) -> None:
    conversation = oai.conversations.create(items=[{"type": "message", "role": "user", "content": FACT}])
    with oai.responses.stream(model=model, conversation=conversation.id, input=REQUEST) as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert "".join(deltas) == final.output_text and "confirm" in final.output_text


def test_chat_completions_answer_with_a_plan_and_the_history_goes_on(
    oai: openai.OpenAI, model: str, native: httpx.Client
) -> None:
    history: list[Any] = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": FACT}]
    first = oai.chat.completions.create(model=model, messages=history, max_tokens=8, seed=3, temperature=0)
    session_id = first.model_extra["lethe_session_id"]  # type: ignore[index]
    history += [{"role": "assistant", "content": first.choices[0].message.content},
                {"role": "user", "content": REQUEST}]
    before = _artifacts(native, session_id)

    planned = oai.chat.completions.create(model=model, messages=history, max_tokens=8)
    plan = planned.model_extra["lethe_forget_plan"]  # type: ignore[index]
    text = planned.choices[0].message.content or ""
    assert plan["id"] in text and planned.model_extra["lethe_session_id"] == session_id  # type: ignore[index]
    assert _artifacts(native, session_id) == before

    streamed = list(oai.chat.completions.create(model=model, messages=history, max_tokens=8, stream=True))
    assert "confirm" in "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)

    # the client resends the exchange: the session goes on, and the request and the plan's reply are not in it
    history += [{"role": "assistant", "content": text}, {"role": "user", "content": "Thanks."}]
    goes_on = oai.chat.completions.create(model=model, messages=history, max_tokens=4)
    assert goes_on.model_extra["lethe_session_id"] == session_id  # type: ignore[index]
    assert all(REQUEST not in a["content"] and plan["id"] not in a["content"] for a in _artifacts(native, session_id))
    _confirm(native, plan, session_id)
