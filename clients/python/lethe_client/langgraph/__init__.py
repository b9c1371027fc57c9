"""LangGraph backends over Lethe: `LetheSaver`, a checkpointer (docs/langgraph.md)."""

from lethe_client.langgraph.saver import LetheSaver as LetheSaver
from lethe_client.langgraph.saver import ThreadChanged as ThreadChanged
from lethe_client.langgraph.saver import ThreadDeleted as ThreadDeleted
from lethe_client.langgraph.saver import ThreadRewritten as ThreadRewritten
