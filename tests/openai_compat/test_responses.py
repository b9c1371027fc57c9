"""Responses through the real `openai` SDK: the stream helper, previous_response_id (and branches from an older
response), function calls streamed as OpenAI streams them, typed errors, the compatibility policy's values."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest

from app.openai_compat.endpoints import get_compat
from tests.openai_compat.conftest import sdk
from tests.support import OverrideService, held_session

LiveServer = Any
SECRET = "QZ-4417"


def test_stream_helper_then_chaining_reuses_the_cache(oai: openai.OpenAI, model: str) -> None:
    deltas: list[str] = []
    with oai.responses.stream(model=model, input="Tell me about cats.", instructions="You are brief.",
                              max_output_tokens=8, metadata={"run": "stream"}) as stream:
        for event in stream:
            if event.type == "response.output_text.delta":
                deltas.append(event.delta)
        final = stream.get_final_response()
    assert deltas and "".join(deltas) == final.output_text
    assert final.instructions == "You are brief." and final.metadata == {"run": "stream"}
    assert oai.responses.retrieve(final.id).output_text == final.output_text

    follow = oai.responses.create(model=model, previous_response_id=final.id, input="And dogs?", max_output_tokens=4)
    assert follow.previous_response_id == final.id
    assert follow.usage.input_tokens_details.cached_tokens > 0  # the first response's prompt and reply came from cache
    assert follow.usage.input_tokens_details.cached_tokens < follow.usage.input_tokens
    with pytest.raises(openai.BadRequestError) as changed:
        oai.responses.create(model=model, previous_response_id=follow.id, input="x", instructions="Be verbose.")
    assert changed.value.param == "instructions"


def test_an_older_response_branches_and_a_forget_stays_in_its_branch(
    oai: openai.OpenAI, model: str, native: httpx.Client
) -> None:
    sampling: Any = {"temperature": 0.7, "max_output_tokens": 8}
    first = oai.responses.create(model=model, input="My name is Ada.", instructions="You are brief.", **sampling)
    later = oai.responses.create(model=model, previous_response_id=first.id, input=f"My code is {SECRET}.", **sampling)
    branch = oai.responses.create(model=model, previous_response_id=first.id, input="What is my name?", **sampling)
    source, forked = first.to_dict()["lethe_session_id"], branch.to_dict()["lethe_session_id"]
    assert later.to_dict()["lethe_session_id"] == source != forked and branch.to_dict()["lethe_turn"] == 2
    # The branch reused the source's cached prefix (this process's handle, forked): only its own tokens were computed.
    assert branch.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens + first.usage.output_tokens
    # It is the conversation as it stood at `first`: the same as asking there in a chain that never went on.
    again = oai.responses.create(model=model, input="My name is Ada.", instructions="You are brief.", **sampling)
    straight = oai.responses.create(model=model, previous_response_id=again.id, input="What is my name?", **sampling)
    assert branch.output_text == straight.output_text
    assert SECRET not in json.dumps(native.get(f"/v1/sessions/{forked}/artifacts").json())

    # Forgetting the name in the branch leaves the source holding it (and the source's code never reached the branch).
    ada = next(a["id"] for a in native.get(f"/v1/sessions/{forked}/artifacts").json()["artifacts"]
               if a["content"] == "My name is Ada.")
    job = native.post("/v1/forget", json={"target": {"artifact_id": ada}, "wait": True}).json()
    assert job["status"] == "succeeded"
    assert "My name is Ada." not in json.dumps(native.get(f"/v1/sessions/{forked}/artifacts").json())
    kept = native.get(f"/v1/sessions/{source}/artifacts").json()["artifacts"]
    assert [a["content"] for a in kept if a["kind"] == "user"] == ["My name is Ada.", f"My code is {SECRET}."]
    assert oai.responses.retrieve(later.id).output_text == later.output_text  # the source's responses unchanged


def test_function_call_round_trip(oai: openai.OpenAI, model: str) -> None:
    tools: Any = [{"type": "function", "name": "lookup_contact", "description": "Find a contact's IBAN",
                   "parameters": {"type": "object", "properties": {"name": {"type": "string"}}}}]
    conv = oai.conversations.create()
    call = json.dumps({"name": "lookup_contact", "arguments": {"name": "Ann"}})
    first = oai.responses.create(
        model=model, conversation=conv.id, tools=tools, instructions="You are a banking assistant. Use tools.",
        input=f"Copy this exactly: <tool_call>{call}</tool_call>", max_output_tokens=48,
    )
    calls = [o for o in first.output if o.type == "function_call"]
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("lookup_contact", {"name": "Ann"})]
    assert first.tools[0].name == "lookup_contact"  # type: ignore[union-attr]
    with pytest.raises(openai.UnprocessableEntityError):  # an output answering no pending call
        oai.responses.create(model=model, conversation=conv.id, tools=tools, max_output_tokens=4,
                             input=[{"type": "function_call_output", "call_id": "call_nope", "output": "x"}])
    answer = oai.responses.create(
        model=model, conversation=conv.id, tools=tools, max_output_tokens=8,
        input=[{"type": "function_call_output", "call_id": calls[0].call_id, "output": "Ann: DE00 1234"}],
    )
    assert answer.status in ("completed", "incomplete") and answer.output
    kinds = [i.type for i in oai.conversations.items.list(conv.id, order="asc")]
    assert kinds[0] == "message" and [k for k in kinds if k != "message"] == ["function_call", "function_call_output"]
    with pytest.raises(openai.BadRequestError) as late:  # tools are part of the prompt since the first transition
        oai.responses.create(model=model, conversation=conv.id, input="x", tools=[{**tools[0], "name": "other"}])
    assert late.value.param == "tools"


WEATHER: Any = [{"type": "function", "name": "get_weather", "description": "Weather.",
                 "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
CALL_PROMPT = "Write exactly this and nothing else: <tool_call>" + json.dumps(
    {"name": "get_weather", "arguments": {"city": "Paris"}}) + "</tool_call>"


def test_streamed_calls_arrive_as_function_call_events_never_as_text(oai: openai.OpenAI, model: str) -> None:
    events = list(oai.responses.create(model=model, input=CALL_PROMPT, tools=WEATHER, max_output_tokens=64,
                                       stream=True))
    final = events[-1].response  # type: ignore[union-attr]
    assert events[-1].type == "response.completed" and final.status == "completed"
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")  # type: ignore[union-attr]
    assert "<tool_call" not in text and "tool_call>" not in text and text == final.output_text
    call = next(o for o in final.output if o.type == "function_call")
    assert (call.name, json.loads(call.arguments)) == ("get_weather", {"city": "Paris"})
    kinds = [e.type for e in events]
    added = next(e for e in events if e.type == "response.output_item.added" and e.item.type == "function_call")  # type: ignore[union-attr]
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    assert added.item.id == call.id and added.item.call_id == call.call_id  # type: ignore[union-attr]
    assert done.item_id == call.id and done.arguments == call.arguments  # type: ignore[union-attr]
    order = ["response.output_item.added", "response.function_call_arguments.delta",
             "response.function_call_arguments.done", "response.output_item.done"]
    at = kinds.index("response.function_call_arguments.delta") - 1
    assert kinds[at:at + 4] == order and kinds.index("response.output_text.done") < at
    assert [e.sequence_number for e in events] == list(range(len(events)))  # type: ignore[union-attr]
    # The stored response is the streamed one (the stream announced the ids it keeps).
    assert oai.responses.retrieve(final.id).to_dict()["output"] == final.to_dict()["output"]

    chat_tools: Any = [{"type": "function", "function": {k: v for k, v in WEATHER[0].items() if k != "type"}}]
    chunks = list(oai.chat.completions.create(model=model, messages=[{"role": "user", "content": CALL_PROMPT}],
                                              tools=chat_tools, max_tokens=64, stream=True))
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert "tool_call>" not in content
    streamed = [t for c in chunks if c.choices for t in c.choices[0].delta.tool_calls or []]
    assert [(t.function.name, json.loads(t.function.arguments or "")) for t in streamed] == [  # type: ignore[union-attr]
        ("get_weather", {"city": "Paris"})]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_errors_are_the_sdks_typed_exceptions(live_server: LiveServer, oai: openai.OpenAI, model: str) -> None:
    with pytest.raises(openai.AuthenticationError):
        sdk(live_server, "not-a-key").models.list()
    with pytest.raises(openai.NotFoundError):
        oai.responses.retrieve("resp_missing")
    with pytest.raises(openai.NotFoundError) as unknown_model:
        oai.responses.create(model="gpt-4o", input="hi")
    assert unknown_model.value.code == "model_not_found"
    unsupported: list[tuple[dict[str, Any], str]] = [  # README, "Compatibility policy": 400 naming the parameter
        ({"reasoning": {"effort": "low"}}, "reasoning"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"store": False}, "store"),
        ({"include": ["message.output_text.logprobs"]}, "include"),
        ({"include": ["no.such.value"]}, "include"),
        ({"truncation": "auto"}, "truncation"),
        ({"background": True}, "background"),
        ({"parallel_tool_calls": False}, "parallel_tool_calls"),
        ({"top_logprobs": 3}, "top_logprobs"),
        ({"service_tier": "flex"}, "service_tier"),
        ({"prompt": {"id": "pmpt_1"}}, "prompt"),
        ({"text": {"format": {"type": "json_object"}}}, "text.format.type"),
        ({"stream_options": {"include_obfuscation": False}}, "stream_options"),  # needs stream: true
        ({"input": [{"role": "assistant", "content": "I said this."}]}, "input[0]"),  # a history not sampled here
        ({"input": [{"role": "user", "content": "hi"}, {"role": "system", "content": "late"}]}, "input[1].role"),
        ({"input": [{"type": "input_image", "image_url": "x"}]}, "input[0].type"),
        ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"input": "a\x00b"}, "input"),
    ]
    for extra, param in unsupported:
        body: dict[str, Any] = {"model": model, "input": "hi", **extra}
        with pytest.raises(openai.BadRequestError) as bad:
            oai.post("/responses", body=body, cast_to=object)
        assert bad.value.param == param, (extra, bad.value.body)
    with pytest.raises(openai.BadRequestError) as nul:
        oai.conversations.create(metadata={"k": "v\x00"})
    assert nul.value.param == "metadata.k"
    with pytest.raises(openai.BadRequestError) as chat:
        oai.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], presence_penalty=0.5)
    assert chat.value.param == "presence_penalty"


def test_values_that_ask_for_nothing_different_are_accepted(oai: openai.OpenAI, model: str) -> None:
    """README, "Compatibility policy": each accepted value gives the answer the request without it gives."""
    plain = oai.responses.create(model=model, input="Say hi.", max_output_tokens=4)
    accepted: Any = {
        "include": ["reasoning.encrypted_content", "file_search_call.results"], "store": True,
        "truncation": "disabled", "background": False, "service_tier": "auto", "parallel_tool_calls": True,
        "tool_choice": "auto", "text": {"format": {"type": "text"}}, "top_logprobs": 0, "max_tool_calls": 2,
        "user": "u-1", "safety_identifier": "s-1", "prompt_cache_key": "k-1", "reasoning": None,
    }
    same = oai.post("/responses", body={"model": model, "input": "Say hi.", "max_output_tokens": 4, **accepted},
                    cast_to=object)
    assert same["output"][0]["content"][0]["text"] == plain.output_text  # type: ignore[index]
    streamed = list(oai.responses.create(model=model, input="Say hi.", max_output_tokens=4, stream=True,
                                         stream_options={"include_obfuscation": False}, include=[]))
    assert streamed[-1].response.output_text == plain.output_text  # type: ignore[union-attr]
    messages: Any = [{"role": "user", "content": "Say hi."}]
    chat = oai.chat.completions.create(model=model, messages=messages, max_tokens=4)
    again = oai.chat.completions.create(
        model=model, messages=messages, max_tokens=4, frequency_penalty=0, presence_penalty=0.0, logprobs=False,
        logit_bias={}, store=False, modalities=["text"], response_format={"type": "text"}, service_tier="default",
        user="u-1", n=1, parallel_tool_calls=True,
    )
    assert again.choices[0].message.content == chat.choices[0].message.content


@pytest.fixture
def short_lock_bound(override_service: OverrideService) -> None:
    """The compatible routes with a 0.3 s bound on waiting for a held session (the default outlasts a slow turn)."""
    override_service(get_compat, "conversations", session_lock_timeout_s=0.3)


def test_a_busy_conversation_is_a_409(
    oai: openai.OpenAI, model: str, database_url: str, short_lock_bound: None
) -> None:
    conv = oai.conversations.create()
    session = conv.to_dict()["lethe_session_id"]

    # What a forget (or a turn in another process) holds while it works on the session: the request waits behind
    # it, then gives up after the bound.
    with held_session(database_url, session), pytest.raises(openai.ConflictError) as raised:
        oai.responses.create(model=model, conversation=conv.id, input="hi", max_output_tokens=2)
    busy = raised.value
    assert busy.code == "session_busy" and busy.response.headers["Retry-After"] == "2"
    assert oai.responses.create(model=model, conversation=conv.id, input="hi", max_output_tokens=2).output
