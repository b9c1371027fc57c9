"""CrewAI's unified memory over Lethe memory (`pip install ./clients/python[crewai]`): see docs/crewai.md.

from crewai import Memory
from lethe_client import LetheClient
from lethe_client.crewai import HashEmbedder, LetheStorage
memory = Memory(storage=LetheStorage(LetheClient(url, key), "crew-research"), embedder=HashEmbedder(), llm=llm)
"""

from lethe_client.crewai.embedder import HashEmbedder
from lethe_client.crewai.storage import LetheStorage

__all__ = ["HashEmbedder", "LetheStorage"]
