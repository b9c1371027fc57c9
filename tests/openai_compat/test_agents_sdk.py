"""The OpenAI Agents SDK for Python (`openai-agents`, pinned in the `test` extra) against a live `lethe serve`, with the
SDK's defaults: its default Responses model over `set_default_openai_client(AsyncOpenAI(base_url=<lethe>/v1))`.

Covered: `Runner.run` and `Runner.run_streamed`; a function tool round trip (the SDK resends the history with the
model's call and the tool's output, and Lethe continues the session that sampled it); `conversation_id`;
`previous_response_id` (an older one branches); and `OpenAIConversationsSession`, the SDK's session store over the
Conversations API, where deleting an item (`conversations.items.delete`, `pop_item()`) is a Lethe forget: the next run
equals the run of a session that never had the item, token for token under seeded sampling (every transition's seed
derives from the session seed and its index).

The prompts are chosen for the tiny default model: it copies a call it is shown (README, "Sessions beyond API.md":
the call format), and a tool output that asks for words makes it stop calling. Greedy decoding makes every reply a
function of the prompt, so what these tests see is what every run sees.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from agents import (
    Agent,
    ModelSettings,
    OpenAIConversationsSession,
    RunItemStreamEvent,
    Runner,
    function_tool,
    set_default_openai_client,
    set_tracing_disabled,
)
from openai import AsyncOpenAI

from bench.serve import LetheServer
from tests.support import BOOTSTRAP_KEY, module_server, stored_artifacts

SECRET = "QZ-4417"  # a hyphen: no id or digest in the database can spell it
CALL = json.dumps({"name": "get_weather", "arguments": {"city": "Paris"}})
CALL_PROMPT = f"Write exactly this and nothing else: <tool_call>{CALL}</tool_call>"
SAMPLED = ModelSettings(temperature=0.7, top_p=0.95, max_tokens=64)
calls: list[str] = []


@function_tool
def get_weather(city: str) -> str:
    """Weather."""
    calls.append(city)
    return "Sunny. Reply to the user in plain words."


@pytest.fixture(scope="module")
def served(database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LetheServer]:
    with module_server(database_url, tmp_path_factory.mktemp("agents-sdk")) as server:
        yield server


@pytest.fixture
async def client(served: LetheServer) -> AsyncIterator[AsyncOpenAI]:
    # No retries: a 409 or a 5xx must reach the test as it happened.
    openai_client = AsyncOpenAI(base_url=served.url + "/v1", api_key=BOOTSTRAP_KEY, max_retries=0, timeout=300)
    set_default_openai_client(openai_client)
    set_tracing_disabled(True)  # traces would go to OpenAI's servers
    yield openai_client
    await openai_client.close()


@pytest.fixture
async def model(client: AsyncOpenAI) -> str:
    return (await client.models.list()).data[0].id


def texts(items: list[Any]) -> list[tuple[str, str]]:
    """(role or type, text) of session items, without ids: what a run reads back."""
    out = []
    for item in items:
        content = item.get("content")
        text = content if isinstance(content, str) else "".join(p.get("text", "") for p in content or [])
        out.append((item.get("role") or item["type"], text or item.get("output") or item.get("arguments") or ""))
    return out


async def test_run_and_run_streamed_with_the_sdks_defaults(client: AsyncOpenAI, model: str) -> None:
    agent = Agent(name="assistant", instructions="You are brief.", model=model)
    plain = await Runner.run(agent, "Hello")
    assert isinstance(plain.final_output, str) and plain.final_output
    assert plain.raw_responses[0].response_id and plain.context_wrapper.usage.output_tokens > 0

    streamed = Runner.run_streamed(agent, "Hello")
    deltas = [event.data.delta async for event in streamed.stream_events()
              if event.type == "raw_response_event" and event.data.type == "response.output_text.delta"]
    assert "".join(deltas) == streamed.final_output == plain.final_output  # greedy: the same reply


async def test_a_function_tool_round_trip(client: AsyncOpenAI, model: str) -> None:
    agent = Agent(name="weather", model=model, tools=[get_weather])
    calls.clear()
    result = await Runner.run(agent, CALL_PROMPT)
    assert calls == ["Paris"]
    kinds = [item.type for item in result.new_items]
    assert kinds.count("tool_call_item") == 1 and kinds.count("tool_call_output_item") == 1
    assert kinds[-1] == "message_output_item" and "tool_call" not in str(result.final_output)
    first, second = result.raw_responses
    # The second request resent the history with the call and its output; Lethe continued the session that sampled
    # the call (the history came from its cache) instead of refusing a history it cannot trust.
    assert second.usage.input_tokens_details.cached_tokens > first.usage.input_tokens

    calls.clear()
    streamed = Runner.run_streamed(agent, CALL_PROMPT)
    names, text = [], []
    async for event in streamed.stream_events():
        if isinstance(event, RunItemStreamEvent):
            names.append(event.name)
        elif event.type == "raw_response_event" and event.data.type == "response.output_text.delta":
            text.append(event.data.delta)
    assert calls == ["Paris"] and [n for n in names if n.startswith("tool")] == ["tool_called", "tool_output"]
    assert "tool_call>" not in "".join(text)  # the markup never arrives as text; the call came as a function_call
    assert streamed.final_output == result.final_output


async def test_conversation_id_and_previous_response_id(client: AsyncOpenAI, model: str) -> None:
    agent = Agent(name="assistant", instructions="Reply in one short sentence.", model=model)
    conversation = await client.conversations.create()
    await Runner.run(agent, "My name is Ada.", conversation_id=conversation.id)
    second = await Runner.run(agent, "What is my name?", conversation_id=conversation.id)
    items = [i.to_dict() async for i in client.conversations.items.list(conversation.id, order="asc")]
    assert [i.get("role") for i in items] == ["user", "assistant", "user", "assistant"]
    assert second.raw_responses[0].usage.input_tokens_details.cached_tokens > 0

    first = await Runner.run(agent, "My name is Ada.")
    chained = await Runner.run(agent, "What is my name?", previous_response_id=first.last_response_id)
    assert chained.raw_responses[0].usage.input_tokens_details.cached_tokens > 0
    # An older response still continues: from where it stood, in a branch (the chain above is untouched).
    branched = await Runner.run(agent, "What is my name?", previous_response_id=first.last_response_id)
    assert branched.final_output == chained.final_output
    ids = [(await client.responses.retrieve(r.last_response_id)).to_dict()["lethe_session_id"]
           for r in (first, chained, branched)]
    assert ids[0] == ids[1] != ids[2]


async def test_conversations_session_item_deletion_is_a_forget(
    client: AsyncOpenAI, model: str, served: LetheServer, database_url: str
) -> None:
    agent = Agent(name="assistant", instructions="Reply in one short sentence.", model=model, model_settings=SAMPLED)
    # `never` never had the code; `unanswered` never had it either, nor the reply `pop_item()` removes below.
    forgotten, never, unanswered = (OpenAIConversationsSession() for _ in range(3))
    await Runner.run(agent, [{"role": "user", "content": "My name is Ada."},
                             {"role": "user", "content": f"My code is {SECRET}."}], session=forgotten)
    for session in (never, unanswered):
        await Runner.run(agent, [{"role": "user", "content": "My name is Ada."}], session=session)
    for session in (forgotten, never, unanswered):
        await Runner.run(agent, "Thanks.", session=session)

    # Deleting the item through the SDK's client: a forget, answered once it succeeded.
    item = next(i for i in await forgotten.get_items() if SECRET in json.dumps(i))
    raw = await client.conversations.items.with_raw_response.delete(
        str(item["id"]), conversation_id=forgotten.session_id)  # type: ignore[typeddict-item]
    assert raw.status_code == 200 and raw.parse().to_dict()["lethe_forget"]["status"] == "succeeded"
    assert texts(await forgotten.get_items()) == texts(await never.get_items())  # replies regenerated, equal
    runs = [await Runner.run(agent, "What is my code?", session=s) for s in (forgotten, never)]
    assert runs[0].final_output == runs[1].final_output
    conversation = await client.conversations.retrieve(forgotten.session_id)
    session_id = conversation.to_dict()["lethe_session_id"]
    # What the database holds, opened through the key store (the text is sealed at rest): the secret in no artifact.
    stored = await asyncio.to_thread(stored_artifacts, database_url, "WHERE session_id = $1", session_id)
    assert stored and not [a for a in stored if SECRET in (a["content"] or "")]

    # pop_item() forgets the newest item, the last reply (a model item: it and what depended on it are deleted; a
    # replay from the same inputs would sample it again). The session that never had it: the question saved, no
    # reply, its transition empty (a forget leaves the transition's index, so the seeds line up).
    popped = await forgotten.pop_item()
    assert popped is not None and popped.get("role") == "assistant"  # type: ignore[union-attr]
    await unanswered.add_items([{"role": "user", "content": "What is my code?"}])
    unanswered_id = (await client.conversations.retrieve(unanswered.session_id)).to_dict()["lethe_session_id"]
    async with httpx.AsyncClient(base_url=served.url, headers={"Authorization": f"Bearer {BOOTSTRAP_KEY}"}) as h:
        empty = await h.post(f"/v1/sessions/{unanswered_id}/turns", json={"inputs": [], "generate": False},
                             timeout=60)
        assert empty.status_code == 200, empty.text
    assert texts(await forgotten.get_items()) == texts(await unanswered.get_items())
    again = [await Runner.run(agent, "Say it again.", session=s) for s in (forgotten, unanswered)]
    assert again[0].final_output == again[1].final_output
    assert texts(await forgotten.get_items()) == texts(await unanswered.get_items())

