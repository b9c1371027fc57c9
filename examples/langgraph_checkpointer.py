"""A LangGraph StateGraph persisted in Lethe through LetheSaver: run two turns, forget one message from every
checkpoint, then delete the thread.

    pip install './clients/python[langgraph]'
    LETHE_URL=http://127.0.0.1:8000 LETHE_KEY=<api key> python examples/langgraph_checkpointer.py
"""

from __future__ import annotations

import os
import uuid
from typing import Annotated, TypedDict

from langchain_core.messages import AIMessage, AnyMessage, HumanMessage
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages

from lethe_client.langgraph import LetheSaver


class State(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]


def bot(state: State) -> dict[str, list[AnyMessage]]:
    return {"messages": [AIMessage(content=f"noted ({len(state['messages'])} messages so far)")]}


def main() -> None:
    builder = StateGraph(State)
    builder.add_node("bot", bot)
    builder.add_edge(START, "bot")
    builder.add_edge("bot", END)
    saver = LetheSaver(os.environ.get("LETHE_URL", "http://127.0.0.1:8000"), os.environ["LETHE_KEY"])
    graph = builder.compile(checkpointer=saver)

    thread_id = f"example-{uuid.uuid4().hex[:8]}"
    config = {"configurable": {"thread_id": thread_id}}
    graph.invoke({"messages": [HumanMessage(content="My IBAN is UK123", id="msg-iban")]}, config)
    state = graph.invoke({"messages": [HumanMessage(content="What is the weather?")]}, config)
    print("messages:", [m.content for m in state["messages"]])
    print("checkpoints:", len(list(graph.get_state_history(config))))

    saver.forget_message(thread_id, "msg-iban")
    leaked = [s for s in graph.get_state_history(config) if "UK123" in str(s.values)]
    print("after forget_message, checkpoints still holding it:", len(leaked))
    print("messages now:", [m.content for m in graph.get_state(config).values["messages"]])

    saver.delete_thread(thread_id)
    print("after delete_thread:", graph.get_state(config).values or "empty")
    saver.close()


if __name__ == "__main__":
    main()
