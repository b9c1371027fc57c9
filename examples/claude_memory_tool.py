"""Claude's memory tool with its /memories tree in Lethe memory (docs/claude-memory-tool.md).

    pip install './clients/python[anthropic]'
    LETHE_BOOTSTRAP_API_KEY=dev-key-please-change lethe serve          # in another shell
    python examples/claude_memory_tool.py

With ANTHROPIC_API_KEY set, Claude runs the tool through the SDK's tool runner. Without it, the script plays the
model's part: it sends the tool the same commands Claude would, through the same entry point the runner uses.
"""

from __future__ import annotations

import os

from anthropic.lib.tools import ToolError
from lethe_client import Forgotten, LetheClient
from lethe_client.anthropic import LetheMemoryTool

LETHE_URL = os.environ.get("LETHE_URL", "http://127.0.0.1:8000")
LETHE_KEY = os.environ.get("LETHE_KEY", "dev-key-please-change")


def with_claude(tool: LetheMemoryTool) -> None:
    import anthropic

    runner = anthropic.Anthropic().beta.messages.tool_runner(
        model=os.environ.get("ANTHROPIC_MODEL", "claude-sonnet-4-5"),
        max_tokens=1024,
        tools=[tool],
        messages=[{"role": "user", "content": "I'm Ada and I take my tea without sugar. Remember that."}],
    )
    for message in runner:
        for block in message.content:
            print(f"[{block.type}]", getattr(block, "text", None) or getattr(block, "input", ""))


def by_hand(tool: LetheMemoryTool) -> None:
    commands = [
        {"command": "view", "path": "/memories"},
        {"command": "create", "path": "/memories/user.md", "file_text": "Name: Ada\nTea: two sugars\n"},
        {"command": "str_replace", "path": "/memories/user.md", "old_str": "two sugars", "new_str": "no sugar"},
        {"command": "insert", "path": "/memories/user.md", "insert_line": 2, "insert_text": "City: London"},
        {"command": "str_replace", "path": "/memories/user.md", "old_str": "Paris", "new_str": "Rome"},  # an error
        {"command": "view", "path": "/memories/../etc/passwd"},  # refused
        {"command": "rename", "old_path": "/memories/user.md", "new_path": "/memories/people/ada.md"},
        {"command": "view", "path": "/memories"},
        {"command": "view", "path": "/memories/people/ada.md"},
    ]
    for command in commands:
        print(f"> {command}")
        try:
            print(tool.call(command))  # what the SDK's tool runner calls with a tool_use block's input
        except ToolError as error:  # the runner sends it back to Claude as a tool_result with is_error: true
            print(f"error: {error}")


def main() -> None:
    with LetheClient(LETHE_URL, LETHE_KEY) as lethe:
        tool = LetheMemoryTool(lethe, namespace="example-claude-memories")
        tool.clear_all_memory()  # a fresh tree for each run
        if os.environ.get("ANTHROPIC_API_KEY"):
            with_claude(tool)
        else:
            by_hand(tool)
            # The rename forgot the old file: its key reads as forgotten and no version of it keeps a value.
            try:
                lethe.get(tool.namespace, "user.md")
            except Forgotten as gone:
                print(f"user.md: forgotten at version {gone.version}")
            print("its history:", [(v.version, v.op, v.value) for v in lethe.history(tool.namespace, "user.md")])


if __name__ == "__main__":
    main()
