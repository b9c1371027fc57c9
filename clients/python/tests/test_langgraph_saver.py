"""LetheSaver against a live Lethe: LangGraph's official conformance suite (langgraph-checkpoint-conformance, run
unmodified through its own runner, every capability it defines), then what Lethe adds: a delete that late writers
cannot undo (langgraph#7206), a message forgotten from every checkpoint of a real graph, and bad input."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Annotated, Any, NamedTuple, TypedDict

import pytest
from langchain_core.messages import AIMessage, AnyMessage, BaseMessage, HumanMessage
from langgraph.checkpoint.base import BaseCheckpointSaver, empty_checkpoint
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import ALL_CAPABILITIES, Capability
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.types import Send
from lethe_client import PayloadTooLarge, ValidationError
from lethe_client.langgraph import LetheSaver, ThreadDeleted, ThreadRewritten
from lethe_client.langgraph._messages import _GONE, _without
from pydantic import BaseModel


@pytest.fixture
def saver(lethe_url: str, lethe_key: str) -> Iterator[LetheSaver]:
    s = LetheSaver(lethe_url, lethe_key)
    yield s
    s.close()


# ---- the conformance suite -----------------------------------------------------------------------------------------

def test_the_suite_defines_the_capabilities_run_here() -> None:
    """Every capability of the installed suite is run below; one added by a new suite version fails here first."""
    assert {c.value for c in ALL_CAPABILITIES} == {
        "put", "put_writes", "get_tuple", "list", "delete_thread", "delete_for_runs", "copy_thread", "prune",
    }


@pytest.mark.parametrize("capability", sorted(c.value for c in Capability))
async def test_conformance(capability: str, lethe_url: str, lethe_key: str) -> None:
    async def factory() -> AsyncIterator[BaseCheckpointSaver[Any]]:
        saver = LetheSaver(lethe_url, lethe_key)
        yield saver
        await saver.aclose()

    registered = checkpointer_test(name="LetheSaver")(factory)
    report = await validate(registered, capabilities={capability})
    result = report.results[capability]
    assert result.detected, f"{capability} is not implemented"
    assert result.passed is True and result.tests_failed == 0, result.failures
    assert result.tests_passed > 0


# ---- a deleted thread stays deleted (langgraph#7206) ----------------------------------------------------------------

class State(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]


def _chat_graph(saver: LetheSaver, node: Any = None) -> Any:
    """A StateGraph with `add_messages`: each super-step the bot answers the last message."""

    def bot(state: State) -> dict[str, list[AnyMessage]]:
        last = state["messages"][-1]
        return {"messages": [AIMessage(content=f"reply to {last.id}", id=f"ai-{last.id}")]}

    builder = StateGraph(State)
    builder.add_node("bot", node or bot)
    builder.add_edge(START, "bot")
    builder.add_edge("bot", END)
    return builder.compile(checkpointer=saver)


def test_a_put_in_flight_when_the_delete_returned_is_refused(saver: LetheSaver, unique: str) -> None:
    """The writer read its base, the delete returned, then the writer's put and put_writes arrive: both refused,
    and the thread shows nothing."""
    thread = f"t-{unique}"
    graph = _chat_graph(saver)
    config = {"configurable": {"thread_id": thread}}
    graph.invoke({"messages": [HumanMessage(content="hello", id="m1")]}, config)
    base = saver.get_tuple(config)  # the in-flight writer's base
    assert base is not None

    saver.delete_thread(thread)  # returns: the delete is committed

    nxt = empty_checkpoint()
    with pytest.raises(ThreadDeleted):
        saver.put(base.config, nxt, {"source": "loop", "step": 9, "parents": {}}, {})
    with pytest.raises(ThreadDeleted):
        saver.put_writes(base.config, [("messages", [AIMessage(content="late", id="late")])], "task-1")
    # the refused checkpoint is dead too: its own writes (which LangGraph may send before it) are refused
    with pytest.raises(ThreadDeleted):
        saver.put_writes({**base.config, "configurable": {**base.config["configurable"], "checkpoint_id": nxt["id"]}},
                         [("messages", [])], "task-2")
    assert saver.get_tuple(config) is None
    assert list(saver.list(config)) == []
    assert list(graph.get_state_history(config)) == []


def test_a_graph_running_when_the_thread_is_deleted_cannot_bring_it_back(saver: LetheSaver, unique: str) -> None:
    """A real run: the node blocks at a barrier while the thread is deleted; the run's next checkpoint is refused
    and the thread stays empty. The thread id then starts a new thread."""
    thread = f"t-{unique}"
    config = {"configurable": {"thread_id": thread}}
    entered, resume = threading.Event(), threading.Event()

    def slow_bot(state: State) -> dict[str, list[AnyMessage]]:
        entered.set()
        assert resume.wait(60), "the test never released the node"
        return {"messages": [AIMessage(content="late answer", id="ai-late")]}

    _chat_graph(saver).invoke({"messages": [HumanMessage(content="first", id="m1")]}, config)
    graph = _chat_graph(saver, slow_bot)
    failure: list[BaseException] = []

    def run() -> None:
        try:
            graph.invoke({"messages": [HumanMessage(content="second", id="m2")]}, config, durability="sync")
        except BaseException as error:
            failure.append(error)

    runner = threading.Thread(target=run)
    runner.start()
    assert entered.wait(60)
    saver.delete_thread(thread)
    resume.set()
    runner.join(60)
    assert failure and isinstance(failure[0], ThreadDeleted), failure
    assert saver.get_tuple(config) is None
    assert list(saver.list(config)) == []

    # A new run on the same id is a new thread, holding only what it was given.
    state = _chat_graph(saver).invoke({"messages": [HumanMessage(content="again", id="m3")]}, config)
    assert [m.id for m in state["messages"]] == ["m3", "ai-m3"]


async def test_async_delete_refuses_late_writes(lethe_url: str, lethe_key: str, unique: str) -> None:
    saver = LetheSaver(lethe_url, lethe_key)
    thread = f"t-{unique}"
    config = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
    first = empty_checkpoint()
    stored = await saver.aput(config, first, {"source": "input", "step": -1, "parents": {}}, {})
    await saver.adelete_thread(thread)
    with pytest.raises(ThreadDeleted):
        await saver.aput(stored, empty_checkpoint(), {"source": "loop", "step": 0, "parents": {}}, {})
    with pytest.raises(ThreadDeleted):
        await saver.aput_writes(stored, [("x", 1)], "task")
    assert await saver.aget_tuple(config) is None
    await saver.aclose()


# ---- list without a thread (LangGraph's list(None)) -----------------------------------------------------------------

def _ids(found: Any) -> list[tuple[str, str]]:
    return [(t.config["configurable"]["thread_id"], t.checkpoint["id"]) for t in found]


def test_list_without_a_thread_spans_the_tenants_threads(saver: LetheSaver, unique: str) -> None:
    """`list(None)` answers every thread's checkpoints newest first, as PostgresSaver's does; filter, before and
    limit narrow it as they do a thread's listing. (Another tenant's listing: tests/threads/test_threads_api.py.)"""
    made: list[tuple[str, str]] = []
    latest: dict[str, Any] = {}
    for thread in (f"la-{unique}", f"lb-{unique}", f"la-{unique}"):  # two steps each time: a, b, then a again
        config = latest.get(thread, {"configurable": {"thread_id": thread, "checkpoint_ns": ""}})
        for step in range(2):
            checkpoint = empty_checkpoint()
            config = saver.put(config, checkpoint, {"source": "loop", "step": step, "parents": {}, "run": unique}, {})
            made.append((thread, checkpoint["id"]))
        latest[thread] = config
    newest = made[::-1]
    mine = {"run": unique}
    assert _ids(saver.list(None, filter=mine)) == newest
    assert _ids(saver.list({"configurable": {}}, filter=mine)) == newest  # a config without a thread_id: the same
    assert _ids(saver.list(None, filter={**mine, "step": 1})) == [c for c in newest if made.index(c) % 2 == 1]
    assert _ids(saver.list(None, filter=mine, limit=3)) == newest[:3]
    before = {"configurable": {"thread_id": made[2][0], "checkpoint_id": made[2][1]}}
    assert _ids(saver.list(None, filter=mine, before=before)) == [made[1], made[0]]
    assert _ids(saver.list(None, filter={"run": f"none-{unique}"})) == []
    # each tuple is a whole checkpoint, addressable by its own config
    top = next(saver.list(None, filter=mine))
    assert saver.get_tuple(top.config) is not None and top.metadata["run"] == unique


async def test_alist_without_a_thread_pages_across_threads(lethe_url: str, lethe_key: str, unique: str) -> None:
    saver = LetheSaver(lethe_url, lethe_key)
    made: list[tuple[str, str]] = []
    for i in range(5):
        thread = f"l{i % 2}-{unique}"
        checkpoint = empty_checkpoint()
        await saver.aput({"configurable": {"thread_id": thread, "checkpoint_ns": f"ns{i}"}}, checkpoint,
                         {"source": "input", "step": -1, "parents": {}, "run": unique}, {})
        made.append((thread, checkpoint["id"]))
    listed = [t async for t in saver.alist(None, filter={"run": unique})]
    assert _ids(listed) == made[::-1]
    assert [t.config["configurable"]["checkpoint_ns"] for t in listed] == [f"ns{i}" for i in range(4, -1, -1)]
    assert _ids([t async for t in saver.alist({"configurable": {"checkpoint_ns": "ns3"}}, filter={"run": unique})]) \
        == [made[3]]
    assert _ids([t async for t in saver.alist(None, filter={"run": unique}, limit=2)]) == made[:-3:-1]
    await saver.aclose()


# ---- forget_message --------------------------------------------------------------------------------------------------

def _every_message_id(graph: Any, saver: LetheSaver, config: dict[str, Any]) -> set[str]:
    """Every message id the thread's history shows: states, and the pending writes of each checkpoint."""
    ids: set[str] = set()
    for snapshot in graph.get_state_history(config):
        ids |= {m.id for m in snapshot.values.get("messages", [])}
    for found in saver.list(config):
        for _, _, value in found.pending_writes or []:
            ids |= {m.id for m in _messages_in(value)}
    return ids


def _messages_in(value: Any) -> list[BaseMessage]:
    if isinstance(value, BaseMessage):
        return [value]
    if isinstance(value, list | tuple):
        return [m for v in value for m in _messages_in(v)]
    if isinstance(value, dict):
        return [m for v in value.values() for m in _messages_in(v)]
    return []


def test_forget_message_removes_it_from_every_checkpoint(saver: LetheSaver, unique: str) -> None:
    thread = f"t-{unique}"
    config = {"configurable": {"thread_id": thread}}
    graph = _chat_graph(saver)
    for i, text in enumerate(["my IBAN is UK123", "what is the weather", "thanks"]):
        graph.invoke({"messages": [HumanMessage(content=text, id=f"m{i}")]}, config)
    assert {"m0", "ai-m0", "m1"} <= _every_message_id(graph, saver, config)
    assert len(list(graph.get_state_history(config))) >= 6  # several super-steps, each checkpointed

    assert saver.forget_message(thread, "m0") is True

    ids = _every_message_id(graph, saver, config)
    assert "m0" not in ids
    assert {"ai-m0", "m1", "ai-m1", "m2", "ai-m2"} <= ids
    assert all("UK123" not in str(s.values) for s in graph.get_state_history(config))
    assert saver.forget_message(thread, "m0") is False  # nothing holds it any more
    # The thread goes on from the rewritten state.
    state = graph.invoke({"messages": [HumanMessage(content="bye", id="m3")]}, config)
    assert [m.id for m in state["messages"]] == ["ai-m0", "m1", "ai-m1", "m2", "ai-m2", "m3", "ai-m3"]


async def test_aforget_message_refuses_a_writer_that_read_before_it(
    lethe_url: str, lethe_key: str, unique: str
) -> None:
    """A run that read the thread before the message was forgotten still holds it: its next write is refused
    rather than writing the message back."""
    saver = LetheSaver(lethe_url, lethe_key)
    thread = f"t-{unique}"
    config = {"configurable": {"thread_id": thread}}
    graph = _chat_graph(saver)
    await graph.ainvoke({"messages": [HumanMessage(content="secret", id="m0")]}, config)
    base = await saver.aget_tuple(config)  # the in-flight writer's base, holding m0
    assert base is not None and any(m.id == "m0" for m in base.checkpoint["channel_values"]["messages"])

    assert await saver.aforget_message(thread, "m0") is True

    stale = dict(base.checkpoint, id=empty_checkpoint()["id"])
    with pytest.raises(ThreadRewritten):
        await saver.aput(base.config, stale, {"source": "loop", "step": 5, "parents": {}},
                         {"messages": saver.get_next_version(None, None)})
    with pytest.raises(ThreadRewritten):
        await saver.aput_writes(base.config, [("messages", base.checkpoint["channel_values"]["messages"])], "task")
    history = [s async for s in graph.aget_state_history(config)]
    assert history and all(m.id != "m0" for s in history for m in s.values.get("messages", []))
    await saver.aclose()


# ---- forget_message inside dataclass and pydantic states and Send arguments -------------------------------------

@dataclasses.dataclass
class DataState:
    messages: Annotated[list[AnyMessage], add_messages]
    note: str = ""


class ModelState(BaseModel):
    messages: Annotated[list[AnyMessage], add_messages]
    note: str = ""


@dataclasses.dataclass(frozen=True)
class Frozen:
    last: Any
    history: list[Any]
    count: int = dataclasses.field(default=0, init=False)


class Pair(NamedTuple):
    first: Any
    second: Any


def test_without_rebuilds_dataclasses_models_and_sends_of_the_same_type() -> None:
    secret, kept = HumanMessage(content="secret", id="m0"), AIMessage(content="kept", id="m1")
    frozen = Frozen(last=secret, history=[secret, kept])
    object.__setattr__(frozen, "count", 7)  # a field no constructor sets: kept as it was
    rebuilt = _without(frozen, "m0")
    assert type(rebuilt) is Frozen and rebuilt.last is None and rebuilt.history == [kept] and rebuilt.count == 7
    assert frozen.history == [secret, kept]  # the value read is left as it was

    model = _without(ModelState(messages=[secret, kept], note="n"), "m0")
    assert type(model) is ModelState and model.messages == [kept] and model.note == "n"

    send = _without(Send("worker", {"messages": [secret, kept], "n": 1}), "m0")
    assert isinstance(send, Send) and send.node == "worker" and send.arg == {"messages": [kept], "n": 1}
    assert _without(Send("worker", secret), "m0") is _GONE  # nothing but the message: the task goes with it
    assert _without([Send("worker", secret), Send("worker", kept)], "m0") == [Send("worker", kept)]
    nested = _without(
        {"state": DataState(messages=[kept, secret]), "sends": (Send("w", ModelState(messages=[secret])),)}, "m0"
    )
    assert nested["state"] == DataState(messages=[kept]) and nested["sends"][0].arg.messages == []
    pair = _without(Pair(secret, [kept, secret]), "m0")
    assert type(pair) is Pair and pair == Pair(None, [kept])
    untouched = DataState(messages=[kept])
    assert _without(untouched, "m0") is untouched and _without(Send("w", kept), "m0") is not _GONE


def _stored_text(saver: LetheSaver, config: dict[str, Any]) -> str:
    """Every value the thread stores, as text (reprs show dataclass, pydantic and Send contents)."""
    return " ".join(repr(found.checkpoint["channel_values"]) + repr(found.pending_writes)
                    for found in saver.list(config))


@pytest.mark.parametrize("schema", [DataState, ModelState])
def test_forget_message_reaches_a_dataclass_or_pydantic_state(saver: LetheSaver, unique: str, schema: Any) -> None:
    """The graph's input is stored as given, a state instance: the message is taken out of it, its type kept."""
    thread = f"t-{unique}"
    config = {"configurable": {"thread_id": thread}}

    def bot(state: Any) -> dict[str, Any]:
        return {"messages": [AIMessage(content=f"reply to {state.messages[-1].id}", id=f"ai-{state.messages[-1].id}")]}

    builder = StateGraph(schema)
    builder.add_node("bot", bot)
    builder.add_edge(START, "bot")
    builder.add_edge("bot", END)
    graph = builder.compile(checkpointer=saver)
    graph.invoke(schema(messages=[HumanMessage(content="my IBAN is UK123", id="m0")], note="first"), config)
    graph.invoke(schema(messages=[HumanMessage(content="thanks", id="m1")], note="second"), config)
    assert "UK123" in _stored_text(saver, config)
    assert any(isinstance(v, schema) for f in saver.list(config) for v in f.checkpoint["channel_values"].values())

    assert saver.forget_message(thread, "m0") is True

    assert "UK123" not in _stored_text(saver, config)
    inputs = [v for found in saver.list(config) for v in found.checkpoint["channel_values"].values()
              if isinstance(v, schema)]
    assert inputs and {v.note for v in inputs} <= {"first", "second"}  # still the state's type, other fields kept
    assert [m.id for m in graph.get_state(config).values["messages"]] == ["ai-m0", "m1", "ai-m1"]
    assert saver.forget_message(thread, "m0") is False


def test_forget_message_reaches_send_arguments(saver: LetheSaver, unique: str) -> None:
    """A map step: `Send` packets carry messages to a worker; each pending Send is rewritten (or, when it carried
    only the message, removed) with the rest of the thread."""
    thread = f"t-{unique}"
    config = {"configurable": {"thread_id": thread}}

    def fan_out(state: State) -> list[Send]:
        return [Send("worker", {"messages": [m]}) for m in state["messages"]] + [Send("worker", state["messages"][0])]

    def worker(arg: Any) -> dict[str, Any]:
        return {}

    builder = StateGraph(State)
    builder.add_node("worker", worker)
    builder.add_conditional_edges(START, fan_out, ["worker"])
    builder.add_edge("worker", END)
    graph = builder.compile(checkpointer=saver, interrupt_before=["worker"])
    messages = [HumanMessage(content="my IBAN is UK123", id="m0"), HumanMessage(content="hello", id="m1")]
    graph.invoke({"messages": messages}, config)  # stops before the workers: the Sends are pending
    pending = [v for found in saver.list(config) for _, _, v in found.pending_writes or [] if isinstance(v, Send)]
    assert len(pending) == 3 and "UK123" in _stored_text(saver, config)

    assert saver.forget_message(thread, "m0") is True

    assert "UK123" not in _stored_text(saver, config)
    pending = [v for found in saver.list(config) for _, _, v in found.pending_writes or [] if isinstance(v, Send)]
    assert sorted(repr(v.arg) for v in pending) == sorted([repr({"messages": []}), repr({"messages": [messages[1]]})])
    graph.invoke(None, config)  # the run goes on from the rewritten tasks


# ---- bad input ------------------------------------------------------------------------------------------------------

def test_an_oversized_checkpoint_answers_413(saver: LetheSaver, unique: str) -> None:
    config = {"configurable": {"thread_id": f"t-{unique}", "checkpoint_ns": ""}}
    checkpoint = empty_checkpoint()
    checkpoint["channel_values"] = {"big": "x" * 600_000}  # over the default 512 KiB, under the 1 MiB body limit
    checkpoint["channel_versions"] = {"big": 1}
    with pytest.raises(PayloadTooLarge):
        saver.put(config, checkpoint, {"source": "input", "step": -1, "parents": {}}, {"big": 1})
    assert saver.get_tuple(config) is None


def test_a_malformed_thread_id_answers_422(saver: LetheSaver) -> None:
    with pytest.raises(ValidationError):
        saver.put({"configurable": {"thread_id": "has space", "checkpoint_ns": ""}}, empty_checkpoint(),
                  {"source": "input", "step": -1, "parents": {}}, {})


def test_the_sync_extended_methods(saver: LetheSaver, unique: str) -> None:
    """The conformance suite drives the async methods; the sync twins of the extended ones, here."""
    source, target = f"s-{unique}", f"d-{unique}"
    config = {"configurable": {"thread_id": source, "checkpoint_ns": ""}}
    stored = []
    for step, run in enumerate(["run-a", "run-a", "run-b"]):
        checkpoint = empty_checkpoint()
        config = saver.put(config, checkpoint, {"source": "loop", "step": step, "parents": {}, "run_id": run}, {})
        stored.append(checkpoint["id"])
    saver.copy_thread(source, target)
    copied = [t.checkpoint["id"] for t in saver.list({"configurable": {"thread_id": target}})]
    assert copied == stored[::-1]
    saver.prune([target], strategy="keep_latest")
    assert [t.checkpoint["id"] for t in saver.list({"configurable": {"thread_id": target}})] == [stored[2]]
    saver.delete_for_runs(["run-a"])  # in every thread of the tenant
    assert [t.metadata["run_id"] for t in saver.list({"configurable": {"thread_id": source}})] == ["run-b"]
    saver.prune([source], strategy="delete")
    assert saver.get_tuple({"configurable": {"thread_id": source, "checkpoint_ns": ""}}) is None
