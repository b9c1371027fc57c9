"""A CrewAI crew whose memory lives in Lethe, with the model Lethe serves (docs/crewai.md).

    pip install './clients/python[crewai]'
    LETHE_BOOTSTRAP_API_KEY=dev-key-please-change lethe serve          # in another shell
    python examples/crewai_memory.py
"""

from __future__ import annotations

import os

# No network needed: CrewAI's telemetry and tracing off (its documented variables), set before it is imported.
os.environ.update(
    CREWAI_DISABLE_TELEMETRY="true", CREWAI_DISABLE_TRACKING="true", OTEL_SDK_DISABLED="true",
    CREWAI_TRACING_ENABLED="false",
)

import httpx
from crewai import LLM, Agent, Crew, Memory, Task
from lethe_client import Forgotten, LetheClient
from lethe_client.crewai import HashEmbedder, LetheStorage

LETHE_URL = os.environ.get("LETHE_URL", "http://127.0.0.1:8000")
LETHE_KEY = os.environ.get("LETHE_KEY", "dev-key-please-change")


def main() -> None:
    model = httpx.get(f"{LETHE_URL}/v1/models", headers={"Authorization": f"Bearer {LETHE_KEY}"}).json()["data"][0]
    llm = LLM(model=f"openai/{model['id']}", base_url=f"{LETHE_URL}/v1", api_key=LETHE_KEY, max_tokens=48)
    with LetheClient(LETHE_URL, LETHE_KEY) as lethe:
        storage = LetheStorage(lethe, namespace="example-crew-memory")
        # HashEmbedder: deterministic and offline; give Memory a real embedder where meaning matters.
        memory = Memory(storage=storage, llm=llm, embedder=HashEmbedder())
        memory.reset()  # a fresh memory for each run (a reset is a forget of every record)

        fact = memory.remember("The launch code word is ZEBRA-42.", scope="/facts", categories=["facts"],
                               importance=0.9)
        assert fact is not None
        print("stored in Lethe:", lethe.get(storage.namespace, fact.id).value["content"])

        agent = Agent(role="Archivist", goal="Answer from memory", backstory="You keep facts.", llm=llm, max_iter=1)
        task = Task(description="What is the launch code word?", expected_output="The code word.", agent=agent)
        print("crew:", Crew(agents=[agent], tasks=[task], memory=memory).kickoff())
        memory.drain_writes()
        for record in memory.list_records():
            print(f"memory {record.scope}: {record.content[:80]!r}")

        # Forget what holds the code word: the fact and what the crew derived from it.
        doomed = [r.id for r in memory.list_records() if "ZEBRA-42" in r.content]
        print("forgotten:", memory.forget(record_ids=doomed))
        try:
            lethe.get(storage.namespace, fact.id)
        except Forgotten as gone:
            print(f"the fact's key: forgotten at version {gone.version}; history values:",
                  [v.value for v in lethe.history(storage.namespace, fact.id)])
        print("recall now:", [m.record.content for m in memory.recall("launch code word", depth="shallow")])


if __name__ == "__main__":
    main()
