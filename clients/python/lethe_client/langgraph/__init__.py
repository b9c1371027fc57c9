"""LangGraph backends over Lethe: `LetheSaver`, a checkpointer, and `LetheStore`, a store (docs/langgraph.md)."""

from lethe_client.langgraph.saver import LetheSaver as LetheSaver
from lethe_client.langgraph.saver import ThreadChanged as ThreadChanged
from lethe_client.langgraph.saver import ThreadDeleted as ThreadDeleted
from lethe_client.langgraph.saver import ThreadRewritten as ThreadRewritten
from lethe_client.langgraph.store import DeletedWhileWriting as DeletedWhileWriting
from lethe_client.langgraph.store import LetheStore as LetheStore
from lethe_client.langgraph.store import StoreIndex as StoreIndex
