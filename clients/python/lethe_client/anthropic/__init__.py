"""Claude's memory tool over Lethe memory (`pip install ./clients/python[anthropic]`): see docs/claude-memory-tool.md.

from lethe_client import LetheClient
from lethe_client.anthropic import LetheMemoryTool
tool = LetheMemoryTool(LetheClient(url, key), namespace="user-42-memories")
client.beta.messages.tool_runner(model=..., max_tokens=..., messages=..., tools=[tool]).until_done()
"""

from lethe_client.anthropic.memory_tool import LetheMemoryTool

__all__ = ["LetheMemoryTool"]
