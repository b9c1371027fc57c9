"""A LangGraph agent on Lethe end to end: `create_react_agent` with `LetheSaver` as its checkpointer, `LetheStore` as
its store, and the model Lethe serves through its OpenAI-compatible routes (`ChatOpenAI` with `base_url`).

The tiny model (greedy, temperature 0) may or may not call the tool, so what the test asserts is what every run does:
the pre-model hook writes the user's words to the store and searches it (LangGraph's own runtime hands the node the
store), the thread's checkpoints hold the run's messages, and a tool call, when the model makes one, is in the store
too. A second run on the thread finds the first run's messages in its checkpoint and its memory in the store.
"""

from __future__ import annotations

import uuid
from typing import Any

import httpx
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.config import get_store
from langgraph.prebuilt import create_react_agent
from lethe_client.langgraph import LetheSaver, LetheStore


def _served_model(lethe_url: str, lethe_key: str) -> str:
    answer = httpx.get(f"{lethe_url}/v1/models", headers={"Authorization": f"Bearer {lethe_key}"}, timeout=60)
    answer.raise_for_status()
    model: str = answer.json()["data"][0]["id"]
    return model


@tool
def remember(fact: str) -> str:
    """Save a fact about the user to long-term memory."""
    get_store().put(("facts",), uuid.uuid4().hex, {"text": fact})
    return "saved"


RECALLED: list[list[str]] = []
SYSTEM = "You are a helpful assistant. Use the remember tool to save facts the user tells you."


def _recall(state: dict[str, Any]) -> dict[str, Any]:
    """Before each model call: keep the user's latest words in the store and recall related ones. The system prompt
    stays the same: Lethe continues a chat only from a history whose replies it sampled, and a prompt that changed
    under an earlier reply is another history."""
    store = get_store()
    last = next(m for m in reversed(state["messages"]) if isinstance(m, HumanMessage))
    store.put(("said",), str(last.id), {"text": str(last.content)})
    RECALLED.append([str(item.value["text"]) for item in store.search(("said",), query=str(last.content), limit=3)])
    return {"llm_input_messages": [SystemMessage(SYSTEM), *state["messages"]]}


def test_a_react_agent_runs_on_lethe(lethe_url: str, lethe_key: str, unique: str) -> None:
    model = ChatOpenAI(base_url=f"{lethe_url}/v1", api_key=lethe_key,  # type: ignore[arg-type]
                       model=_served_model(lethe_url, lethe_key), temperature=0, max_tokens=32)  # type: ignore[call-arg]
    saver = LetheSaver(lethe_url, lethe_key)
    store = LetheStore(lethe_url, lethe_key, scope=(f"agent{unique}",), index={"fields": ["text"]})
    graph = create_react_agent(model, tools=[remember], pre_model_hook=_recall, checkpointer=saver, store=store)
    config: Any = {"configurable": {"thread_id": f"agent-{unique}"}, "recursion_limit": 8}

    first = "Remember that my favourite colour is green."
    graph.invoke({"messages": [HumanMessage(first)]}, config)

    # the thread's checkpoints hold the run: the user's message and the model's answer
    state = graph.get_state(config)
    messages = state.values["messages"]
    assert [m.content for m in messages if isinstance(m, HumanMessage)] == [first]
    assert isinstance(messages[-1], AIMessage)
    history = list(graph.get_state_history(config))
    assert len(history) >= 3  # input, pre-model hook, agent (and tools, if called)
    assert saver.get_tuple(config) is not None

    # the store holds what the run wrote: the hook's note, and each tool call's fact
    said = store.search(("said",))
    assert [item.value["text"] for item in said] == [first]
    facts = {str(item.value["text"]) for item in store.search(("facts",), limit=100)}
    called = [c["args"].get("fact") for m in messages if isinstance(m, AIMessage) for c in m.tool_calls]
    assert {str(f) for f in called if f} == facts
    assert len([m for m in messages if isinstance(m, ToolMessage)]) == len(called)

    # a second run continues the thread and recalls the first run's memory from the store
    second = "What is my favourite colour?"
    graph.invoke({"messages": [HumanMessage(second)]}, config)
    messages = graph.get_state(config).values["messages"]
    assert [m.content for m in messages if isinstance(m, HumanMessage)] == [first, second]
    assert store.search(("said",), query="favourite colour", limit=1)[0].value["text"] in {first, second}
    assert first in RECALLED[-1]  # the second run's hook recalled the first run's words from the store
    assert len(store.search(("said",))) == 2

    saver.close()
    store.close()
