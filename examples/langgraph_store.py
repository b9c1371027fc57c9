"""LangGraph long-term memory in Lethe through LetheStore: a graph node writes memories and searches them by meaning,
one expires, one is deleted (a forget) and written again.

    pip install './clients/python[langgraph]'
    LETHE_URL=http://127.0.0.1:8000 LETHE_KEY=<api key> python examples/langgraph_store.py
"""

from __future__ import annotations

import os
import uuid
from typing import Annotated, TypedDict

from langchain_core.messages import AIMessage, AnyMessage, HumanMessage
from langgraph.config import get_store
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from lethe_client.langgraph import LetheStore


class State(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]


def remember(state: State) -> dict[str, list[AnyMessage]]:
    """Keep what the user said, then answer with the closest memory."""
    store = get_store()
    said = str(state["messages"][-1].content)
    store.put(("user", "memories"), uuid.uuid4().hex, {"text": said})
    best = store.search(("user", "memories"), query=said, limit=1)
    return {"messages": [AIMessage(content=f"closest memory: {best[0].value['text']}")]}


def main() -> None:
    url, key = os.environ["LETHE_URL"], os.environ["LETHE_KEY"]
    store = LetheStore(url, key, scope=("example", uuid.uuid4().hex[:8]), index={"fields": ["text"]})
    builder = StateGraph(State)
    builder.add_node("remember", remember)
    builder.add_edge(START, "remember")
    builder.add_edge("remember", END)
    graph = builder.compile(store=store)

    for text in ("I have a golden retriever called Max", "My favourite dish is carbonara"):
        graph.invoke({"messages": [HumanMessage(text)]})
    ranked = store.search(("user", "memories"), query="what pet do I have?")
    print("search 'what pet do I have?':", [(round(r.score or 0, 3), r.value["text"]) for r in ranked])

    # a TTL in minutes: 0 expires at once, and the expired item is forgotten, not merely hidden
    store.put(("user", "session"), "scratch", {"text": "temporary"}, ttl=0)
    print("expired item:", store.get(("user", "session"), "scratch"))

    # delete is a forget: a tombstone, the value erased from the key's history too
    store.put(("user", "profile"), "diet", {"text": "vegan"})
    store.delete(("user", "profile"), "diet")
    print("after delete:", store.get(("user", "profile"), "diet"))
    # a put issued after the delete re-establishes the key (one that had read it before the delete would raise
    # DeletedWhileWriting instead: docs/langgraph.md, Store)
    store.put(("user", "profile"), "diet", {"text": "vegetarian"})
    item = store.get(("user", "profile"), "diet")
    print("re-established:", item.value if item else None)
    store.close()


if __name__ == "__main__":
    main()
