"""Responses through the real `openai` SDK: the stream helper, previous_response_id, function calls, typed errors."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from app.api.deps import ContainerDep
from app.openai_compat.endpoints import get_compat
from app.openai_compat.service import CompatService
from tests.openai_compat.conftest import sdk
from tests.support import held_session, rewired

LiveServer = Any


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
    with pytest.raises(openai.BadRequestError) as branch:  # Lethe continues a session from its end only
        oai.responses.create(model=model, previous_response_id=final.id, input="Or birds?")
    assert branch.value.param == "previous_response_id"
    with pytest.raises(openai.BadRequestError) as changed:
        oai.responses.create(model=model, previous_response_id=follow.id, input="x", instructions="Be verbose.")
    assert changed.value.param == "instructions"


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


def test_errors_are_the_sdks_typed_exceptions(live_server: LiveServer, oai: openai.OpenAI, model: str) -> None:
    with pytest.raises(openai.AuthenticationError):
        sdk(live_server, "not-a-key").models.list()
    with pytest.raises(openai.NotFoundError):
        oai.responses.retrieve("resp_missing")
    with pytest.raises(openai.NotFoundError) as unknown_model:
        oai.responses.create(model="gpt-4o", input="hi")
    assert unknown_model.value.code == "model_not_found"
    unsupported: list[tuple[dict[str, Any], str]] = [
        ({"reasoning": {"effort": "low"}}, "reasoning"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"store": False}, "store"),
        ({"input": [{"role": "assistant", "content": "I said this."}]}, "input[0].role"),
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


@pytest.fixture
def short_lock_bound(live_server: LiveServer) -> Iterator[None]:
    """The compatible routes with a 0.3 s bound on waiting for a held session (the default outlasts a slow turn)."""

    def compat(container: ContainerDep) -> CompatService:
        compat: CompatService = rewired(container, session_lock_timeout_s=0.3).services.conversations
        return compat

    overrides = live_server.app.dependency_overrides
    overrides[get_compat] = compat
    yield
    overrides.pop(get_compat, None)


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
