"""Chat Completions: stateless requests whose resent history continues the session that holds it (its cache), over
the real `openai` SDK and LangChain's `ChatOpenAI` (no network: the server is the loopback one); LangChain's
`ChatOpenAI(use_responses_api=True)` over Responses the same way (a resent history, system message first)."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage
from langchain_openai import ChatOpenAI

from tests.support import BOOTSTRAP_KEY

LiveServer = Any
SYSTEM = {"role": "system", "content": "You are a helpful assistant."}


def test_a_resent_history_continues_its_session(oai: openai.OpenAI, model: str, native: httpx.Client) -> None:
    first_raw = oai.chat.completions.with_raw_response.create(
        model=model, messages=[SYSTEM, {"role": "user", "content": "My dog is called Rex."}], max_tokens=6, seed=3,
        temperature=0.7,
    )
    first = first_raw.parse()
    assert first.usage is not None and first.usage.prompt_tokens_details is not None
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    reply = first.choices[0].message.content or ""
    history: list[Any] = [SYSTEM, {"role": "user", "content": "My dog is called Rex."},
                          {"role": "assistant", "content": reply}, {"role": "user", "content": "What is his name?"}]
    second_raw = oai.chat.completions.with_raw_response.create(model=model, messages=history, max_tokens=6)
    second = second_raw.parse()
    assert second_raw.headers["Lethe-Session-Id"] == first_raw.headers["Lethe-Session-Id"]
    assert second.usage is not None and second.usage.prompt_tokens_details is not None
    # Everything before the new user message came from the session's cache.
    assert second.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens + first.usage.completion_tokens
    # The session is an ordinary one for the native API; the per-transition sampling stays internal.
    state = native.get(f"/v1/sessions/{second_raw.headers['Lethe-Session-Id']}")
    assert state.status_code == 200 and state.json()["turns"] == 2
    assert state.json()["sampling"]["seed"] == 0 and "per_turn" not in state.json()["sampling"]
    assert native.get("/v1/sessions").status_code == 200
    with pytest.raises(openai.BadRequestError) as unknown:  # an answer this server never gave
        oai.chat.completions.create(model=model, max_tokens=2, messages=[
            {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Made up."},
            {"role": "user", "content": "Go on"}])
    assert unknown.value.param == "messages"
    with pytest.raises(openai.BadRequestError) as n:
        oai.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}], n=2)
    assert n.value.param == "n"


def test_streaming_matches_the_plain_answer(oai: openai.OpenAI, model: str) -> None:
    messages: Any = [SYSTEM, {"role": "user", "content": "Name a colour."}]
    plain = oai.chat.completions.create(model=model, messages=messages, max_tokens=6)
    chunks = list(oai.chat.completions.create(model=model, messages=messages, max_tokens=6, stream=True,
                                              stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == plain.choices[0].message.content
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == plain.usage.completion_tokens  # type: ignore[union-attr]


def test_langchain_chat_openai_runs_against_it(live_server: LiveServer, model: str) -> None:
    llm = ChatOpenAI(base_url=live_server.base_url + "/v1", api_key=BOOTSTRAP_KEY, model=model,  # type: ignore[arg-type]
                     max_tokens=6, temperature=0, max_retries=0)  # type: ignore[call-arg]
    history: list[Any] = [SystemMessage("You are a helpful assistant."), HumanMessage("I live in Paris.")]
    first = llm.invoke(history)
    assert isinstance(first, AIMessage) and first.content
    second = llm.invoke([*history, first, HumanMessage("Where do I live?")])
    usage = second.response_metadata["token_usage"]
    assert usage["prompt_tokens_details"]["cached_tokens"] > 0  # LangChain's resent history hit the session
    streamed = "".join(str(chunk.content) for chunk in llm.stream(history))
    assert streamed == first.content


def test_langchain_chat_openai_on_the_responses_api(live_server: LiveServer, model: str) -> None:
    llm = ChatOpenAI(base_url=live_server.base_url + "/v1", api_key=BOOTSTRAP_KEY, model=model,  # type: ignore[arg-type]
                     use_responses_api=True, max_tokens=6, temperature=0, max_retries=0)  # type: ignore[call-arg]
    history: list[Any] = [SystemMessage("You are a helpful assistant."), HumanMessage("I live in Paris.")]
    first = llm.invoke(history)
    assert isinstance(first, AIMessage) and first.text and first.response_metadata["id"].startswith("resp_")
    second = llm.invoke([*history, first, HumanMessage("Where do I live?")])
    assert second.text
    # LangChain resent the whole history (its system message as the first input item): Lethe found the session that
    # sampled `first` and prefilled only the new message.
    assert second.usage_metadata is not None
    assert second.usage_metadata["input_token_details"].get("cache_read", 0) > 0
    assert "".join(chunk.text for chunk in llm.stream(history)) == first.text
