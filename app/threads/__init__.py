"""LangGraph threads: checkpoints, channel blobs and pending writes a LangGraph saver stores (lethe_client.langgraph),
with durable tombstones."""
