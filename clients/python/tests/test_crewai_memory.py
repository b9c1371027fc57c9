"""CrewAI's unified memory over Lethe memory (`LetheStorage`), against a live server, with the model Lethe serves.

CrewAI's own code runs: `Memory` (its encoding and recall flows) and a `Crew` whose agent recalls before its task
and saves what it did after. The tiny model's prose is not asserted, only what is deterministic: what the storage
was handed and what it returned, what Lethe holds, and that a forgotten memory is gone from Lethe (404 forgotten,
no value left in its history) and from CrewAI's recall. CrewAI's structured-output calls (memory extraction and
analysis) are refused by Lethe's Chat Completions (no `response_format` but text), so CrewAI takes its documented
fallbacks: the whole task result is stored as one memory, with default scope and importance.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

# No network here: CrewAI's telemetry and tracing are switched off by its documented variables, before it loads.
os.environ.update(
    CREWAI_DISABLE_TELEMETRY="true", CREWAI_DISABLE_TRACKING="true", OTEL_SDK_DISABLED="true",
    CREWAI_TRACING_ENABLED="false",
)

import httpx
import pytest
from crewai import LLM, Agent, Crew, Memory, Task
from crewai.memory.types import MemoryRecord
from lethe_client import Forgotten, LetheClient, PreconditionFailed
from lethe_client.crewai import HashEmbedder, LetheStorage

FACT = "The launch code word is ZEBRA-42."


@pytest.fixture(autouse=True)
def _crewai_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """CrewAI writes its own files (task outputs, settings) under these: a throwaway directory, not $HOME."""
    home = tmp_path_factory.mktemp("crewai")
    monkeypatch.setenv("CREWAI_STORAGE_DIR", str(home))
    monkeypatch.setenv("XDG_DATA_HOME", str(home))


@pytest.fixture
def lethe(lethe_url: str, lethe_key: str) -> Iterator[LetheClient]:
    with LetheClient(lethe_url, lethe_key) as client:
        yield client


@pytest.fixture(scope="module")
def llm(lethe_url: str, lethe_key: str) -> LLM:
    """CrewAI's LLM on Lethe's OpenAI-compatible endpoint, the model id from Lethe's model list."""
    listed = httpx.get(f"{lethe_url}/v1/models", headers={"Authorization": f"Bearer {lethe_key}"})
    model = listed.json()["data"][0]["id"]
    return LLM(model=f"openai/{model}", base_url=f"{lethe_url}/v1", api_key=lethe_key, temperature=0.0, max_tokens=32)


class RecordingStorage(LetheStorage):
    """The real storage, noting what CrewAI hands it and what it answers."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.saved: list[MemoryRecord] = []
        self.found: list[list[tuple[MemoryRecord, float]]] = []
        self.deleted: list[tuple[dict[str, Any], int]] = []

    def save(self, records: list[MemoryRecord]) -> None:
        super().save(records)
        self.saved.extend(records)

    def search(self, *args: Any, **kwargs: Any) -> list[tuple[MemoryRecord, float]]:
        result = super().search(*args, **kwargs)
        self.found.append(result)
        return result

    def delete(self, *args: Any, **kwargs: Any) -> int:
        count = super().delete(*args, **kwargs)
        self.deleted.append((kwargs, count))
        return count


def memory_over(storage: LetheStorage, llm: LLM) -> Memory:
    return Memory(storage=storage, llm=llm, embedder=HashEmbedder())


def assert_forgotten(lethe: LetheClient, namespace: str, record_id: str, text: str) -> None:
    with pytest.raises(Forgotten) as gone:
        lethe.get(namespace, record_id)
    assert gone.value.status == 404 and gone.value.problem["forgotten"] is True
    history = lethe.history(namespace, record_id)
    assert history[-1].op == "forget" and all(entry.value is None for entry in history)
    assert text not in str([entry.value for entry in history])


def test_a_crew_remembers_and_forgets(lethe: LetheClient, llm: LLM, unique: str) -> None:
    storage = RecordingStorage(lethe, f"crew-{unique}")
    memory = memory_over(storage, llm)
    fact = memory.remember(FACT, scope="/facts", categories=["facts"], importance=0.9)
    assert fact is not None
    stored = lethe.get(storage.namespace, fact.id).value
    assert (stored["content"], stored["scope"], stored["categories"]) == (FACT, "/facts", ["facts"])
    assert len(stored["embedding"]) == 256  # CrewAI's vector travels with the record, and is forgotten with it

    def kickoff() -> None:
        agent = Agent(role="Archivist", goal="Answer from memory", backstory="You keep facts.", llm=llm, max_iter=1)
        task = Task(description="What is the launch code word?", expected_output="The code word.", agent=agent)
        Crew(agents=[agent], tasks=[task], memory=memory).kickoff()
        memory.drain_writes()  # the crew saves in the background

    storage.saved.clear()
    kickoff()
    # Before its task the agent recalled: the storage's search returned the fact.
    assert any(r.id == fact.id for found in storage.found for r, _ in found)
    # After it, the crew saved what it did (CrewAI's fallback: the whole task result, under its task's words).
    assert storage.saved and all(r.content.startswith("Task: What is the launch code word?") for r in storage.saved)
    for record in storage.saved:
        assert lethe.get(storage.namespace, record.id).value["content"] == record.content

    # Forget every memory holding the code word: the fact and what the crew derived from it.
    doomed = [r.id for r in memory.list_records() if "ZEBRA-42" in r.content]
    assert fact.id in doomed and len(doomed) >= 2
    assert memory.forget(record_ids=doomed) == len(doomed)
    assert storage.deleted[-1] == ({"scope_prefix": None, "categories": None, "record_ids": doomed,
                                    "older_than": None, "metadata_filter": None}, len(doomed))
    for record_id in doomed:
        assert_forgotten(lethe, storage.namespace, record_id, "ZEBRA-42")
    assert memory.forget(record_ids=doomed) == 0  # already forgotten: nothing counted twice

    # Gone from CrewAI's recall, shallow and deep, and from what the next crew's agent is shown.
    assert not [m for m in memory.recall("launch code word", depth="shallow") if "ZEBRA" in m.record.content]
    assert not [m for m in memory.recall("launch code word") if "ZEBRA" in m.record.content]
    storage.found.clear()
    kickoff()
    assert storage.found and not any("ZEBRA" in r.content for found in storage.found for r, _ in found)
    assert not any(r.id in doomed for r in memory.list_records())


def test_scopes_categories_and_filters(lethe: LetheClient, llm: LLM, unique: str) -> None:
    storage = LetheStorage(lethe, f"crew-scopes-{unique}")
    memory = memory_over(storage, llm)
    old = memory.remember("Alpha team ships on Mondays.", scope="/org/alpha", categories=["process"],
                          metadata={"team": "alpha"}, importance=0.4)
    memory.remember("Beta team ships on Fridays.", scope="/org/beta", categories=["process", "beta"],
                     metadata={"team": "beta"}, importance=0.4)
    memory.remember("Orgchart lives in the wiki.", scope="/orgchart", categories=["docs"], importance=0.4)
    assert old is not None

    assert memory.list_scopes("/") == ["/org", "/orgchart"]
    assert memory.list_scopes("/org") == ["/org/alpha", "/org/beta"]  # path prefixes: /orgchart is not under /org
    info = memory.info("/org")
    assert (info.record_count, info.categories, info.child_scopes) == (2, ["beta", "process"], ["/org/alpha",
                                                                                                  "/org/beta"])
    assert memory.list_categories("/org") == {"process": 2, "beta": 1}
    assert storage.count() == 3 and storage.count("/org") == 2
    assert [r.content for r in memory.list_records("/org", limit=1)] == ["Beta team ships on Fridays."]
    assert [r.content for r in memory.list_records("/org", limit=1, offset=1)] == ["Alpha team ships on Mondays."]

    hits = memory.recall("When does the beta team ship?", scope="/org", depth="shallow")
    assert hits[0].record.content == "Beta team ships on Fridays."
    assert all(h.record.scope.startswith("/org/") for h in hits)
    assert [h.record.content for h in memory.recall("ships", categories=["beta"], depth="shallow")] == [
        "Beta team ships on Fridays."
    ]

    assert memory.forget(scope="/org", metadata_filter={"team": "alpha"}) == 1
    assert_forgotten(lethe, storage.namespace, old.id, "Alpha")
    assert memory.forget(older_than=datetime.utcnow() - timedelta(days=1)) == 0
    assert memory.forget(categories=["docs"]) == 1
    memory.reset("/org")
    assert storage.count() == 0 and lethe.list(storage.namespace).keys == []


def test_updates_are_conditional_and_never_resurrect(lethe: LetheClient, llm: LLM, unique: str) -> None:
    ns = f"crew-update-{unique}"
    mine, theirs = LetheStorage(lethe, ns), LetheStorage(lethe, ns)  # two crews (or processes) on one memory
    record = memory_over(mine, llm).remember("Budget is 10k.", scope="/plan", categories=["budget"], importance=0.5)
    assert record is not None
    seen_by_them = theirs.get_record(record.id)
    assert seen_by_them is not None

    updated = memory_over(mine, llm).update(record.id, content="Budget is 12k.")
    assert lethe.get(ns, record.id).value["content"] == "Budget is 12k." == updated.content
    # Their update rests on the version they read, before ours: refused, and ours stands.
    with pytest.raises(PreconditionFailed):
        theirs.update(seen_by_them.model_copy(update={"content": "Budget is 8k."}))
    assert lethe.get(ns, record.id).value["content"] == "Budget is 12k."

    stale = theirs.get_record(record.id)
    assert stale is not None
    assert mine.delete(record_ids=[record.id]) == 1
    with pytest.raises(PreconditionFailed) as refused:
        theirs.update(stale.model_copy(update={"content": "Budget is 9k."}))
    assert refused.value.forgotten
    with pytest.raises(Forgotten):  # never read by this storage: the tombstone is found, and kept
        LetheStorage(lethe, ns).update(stale)
    assert_forgotten(lethe, ns, record.id, "Budget")
    assert theirs.get_record(record.id) is None


def test_save_creates_only(lethe: LetheClient, unique: str) -> None:
    storage = LetheStorage(lethe, f"crew-save-{unique}")
    record = MemoryRecord(content="one", embedding=[1.0, 0.0])
    storage.save([record])
    with pytest.raises(PreconditionFailed):  # an id that exists is not overwritten by a save
        storage.save([MemoryRecord(content="new", embedding=[0.0, 1.0]), record.model_copy(update={"content": "x"})])
    assert [r.content for r in storage.list_records()] == ["one"]  # the atomic batch wrote nothing
    assert storage.search([1.0, 0.0])[0] == (storage.get_record(record.id), 1.0)


def test_a_scan_is_one_request_a_page(lethe_url: str, lethe_key: str, unique: str) -> None:
    """Search, list and count read the namespace a page of records at a time, values included: one request a page
    of 100, never one a record."""
    requests: list[httpx.Request] = []
    with LetheClient(lethe_url, lethe_key, http=httpx.Client(
        base_url=lethe_url, timeout=60.0, event_hooks={"request": [requests.append]},
    )) as counted:
        storage = LetheStorage(counted, f"crew-scan-{unique}")
        storage.save([MemoryRecord(content=f"fact {i}", embedding=[1.0, float(i)]) for i in range(150)])
        requests.clear()
        assert storage.count() == 150
        assert [r.method for r in requests] == ["GET", "GET"]  # two pages: 100 records, then 50
        assert all(r.url.params.get("values") == "true" for r in requests)
        requests.clear()
        found = storage.search([1.0, 0.0], limit=3)
        assert len(found) == 3 and len(requests) == 2


def test_async_half(lethe: LetheClient, unique: str) -> None:
    storage = LetheStorage(lethe, f"crew-async-{unique}")

    async def run() -> tuple[list[tuple[MemoryRecord, float]], int]:
        await storage.asave([MemoryRecord(content="async", scope="/a", embedding=[0.6, 0.8])])
        found = await storage.asearch([0.6, 0.8], scope_prefix="/a")
        return found, await storage.adelete(scope_prefix="/a")

    found, deleted = asyncio.run(run())
    assert [(r.content, round(s, 6)) for r, s in found] == [("async", 1.0)]
    assert deleted == 1 and storage.count() == 0
