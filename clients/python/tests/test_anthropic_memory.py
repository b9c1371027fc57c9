"""Claude's memory tool over Lethe memory, driven as the anthropic SDK drives it, against a live server.

The SDK runs a memory tool by `tool.call(<the tool_use block's input>)` (its tool runner's `_run_tool`), which
builds the command model and dispatches it; a ToolError becomes a `tool_result` with `is_error: true`. Most tests
call that entry point directly; one runs the SDK's own `tool_runner` loop, with Anthropic's API replaced by a
scripted transport (there is no network to Anthropic here), to show the dispatch end to end.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx2
import pytest
from anthropic.lib.tools import ToolError
from lethe_client import Forgotten, LetheClient
from lethe_client.anthropic import LetheMemoryTool, paths


@pytest.fixture
def lethe(lethe_url: str, lethe_key: str) -> Iterator[LetheClient]:
    with LetheClient(lethe_url, lethe_key) as client:
        yield client


@pytest.fixture
def tool(lethe: LetheClient, unique: str) -> LetheMemoryTool:
    return LetheMemoryTool(lethe, f"claude-{unique}")


def call(tool: LetheMemoryTool, **command: Any) -> str:
    result = tool.call(command)
    assert isinstance(result, str)
    return result


def error(tool: LetheMemoryTool, **command: Any) -> str:
    with pytest.raises(ToolError) as raised:
        tool.call(command)
    return str(raised.value)


def assert_forgotten(lethe: LetheClient, namespace: str, rel: str, text: str) -> None:
    """The key reads 404 forgotten, and no version in its history holds a value any more."""
    with pytest.raises(Forgotten) as gone:
        lethe.get(namespace, paths.key(rel))
    assert gone.value.status == 404 and gone.value.problem["forgotten"] is True
    history = lethe.history(namespace, paths.key(rel))
    assert history[-1].op == "forget"
    assert all(entry.value is None for entry in history), history
    assert text not in json.dumps([entry.value for entry in history])


def test_files_round_trip_as_the_sdk_formats_them(tool: LetheMemoryTool, lethe: LetheClient) -> None:
    empty = call(tool, command="view", path="/memories")
    assert empty.endswith("\n0B\t/memories")

    assert call(tool, command="create", path="/memories/notes/todo.md", file_text="buy milk\nwalk dog\n") == (
        "File created successfully at: /memories/notes/todo.md"
    )
    call(tool, command="create", path="/memories/prefs.md", file_text="tea, no sugar")
    # The file is one Lethe key, its text the value.
    assert lethe.get(tool.namespace, "notes%2Ftodo.md").value == "buy milk\nwalk dog\n"

    listing = call(tool, command="view", path="/memories")
    assert listing.splitlines()[1:] == [
        "31B\t/memories", "18B\t/memories/notes/", "18B\t/memories/notes/todo.md", "13B\t/memories/prefs.md",
    ]
    assert call(tool, command="view", path="/memories/notes/todo.md").splitlines()[1:] == [
        "     1\tbuy milk", "     2\twalk dog", "     3\t",
    ]
    assert call(tool, command="view", path="/memories/notes/todo.md", view_range=[2, 2]).splitlines()[1:] == [
        "     2\twalk dog",
    ]

    edited = call(tool, command="str_replace", path="/memories/notes/todo.md", old_str="milk", new_str="oat milk")
    assert "     1\tbuy oat milk" in edited
    assert call(tool, command="insert", path="/memories/notes/todo.md", insert_line=1, insert_text="call mum\n") == (
        "The file /memories/notes/todo.md has been edited."
    )
    assert lethe.get(tool.namespace, "notes%2Ftodo.md").value == "buy oat milk\ncall mum\nwalk dog\n"
    # Paths are normalised: one file, one key, whichever way the model spells it.
    assert "buy oat milk" in call(tool, command="view", path="/memories//notes/./todo.md")


def test_bad_input_answers_the_sdks_errors(tool: LetheMemoryTool) -> None:
    call(tool, command="create", path="/memories/a.md", file_text="one\ntwo\none\n")
    call(tool, command="create", path="/memories/dir/b.md", file_text="b")

    for bad in ("/memories/../etc/passwd", "/memories/dir/../../x", "/memories/dir/../a.md"):
        assert "would escape /memories directory" in error(tool, command="view", path=bad)
    assert error(tool, command="view", path="/etc/passwd") == "Path must start with /memories, got: /etc/passwd"
    assert "must start with /memories" in error(tool, command="create", path="/memoriesX/a", file_text="x")
    assert "control characters" in error(tool, command="create", path="/memories/a\nb", file_text="x")
    assert "too long" in error(tool, command="create", path="/memories/" + "x" * 201, file_text="x")

    missing = "/memories/missing.md"
    assert error(tool, command="view", path=missing) == (
        f"The path {missing} does not exist. Please provide a valid path."
    )
    assert "does not exist" in error(tool, command="str_replace", path=missing, old_str="a", new_str="b")
    assert "does not exist" in error(tool, command="insert", path=missing, insert_line=0, insert_text="x")
    assert error(tool, command="delete", path=missing) == f"The path {missing} does not exist"
    assert error(tool, command="rename", old_path=missing, new_path="/memories/z.md") == (
        f"The path {missing} does not exist"
    )

    assert error(tool, command="str_replace", path="/memories/a.md", old_str="three", new_str="3") == (
        "No replacement was performed, old_str `three` did not appear verbatim in /memories/a.md."
    )
    assert error(tool, command="str_replace", path="/memories/a.md", old_str="one", new_str="1") == (
        "No replacement was performed. Multiple occurrences of old_str `one` in lines: 1, 3. Please ensure it is unique"
    )
    assert "is not a file" in error(tool, command="str_replace", path="/memories/dir", old_str="b", new_str="c")

    for line in (-1, 4):
        assert error(tool, command="insert", path="/memories/a.md", insert_line=line, insert_text="x") == (
            f"Invalid `insert_line` parameter: {line}. It should be within the range [0, 3]."
        )
    for view_range in ([0, 2], [5, -1], [3, 2], [1, 9], [1]):
        assert "Invalid `view_range` parameter" in error(
            tool, command="view", path="/memories/a.md", view_range=view_range
        )

    assert error(tool, command="create", path="/memories/a.md", file_text="x") == "File /memories/a.md already exists"
    assert "is a directory" in error(tool, command="create", path="/memories/dir", file_text="x")
    assert "is a file, not a directory" in error(tool, command="create", path="/memories/a.md/c", file_text="x")
    assert error(tool, command="delete", path="/memories") == "Cannot delete the /memories directory itself"
    assert error(tool, command="rename", old_path="/memories", new_path="/memories/x") == (
        "Cannot rename the /memories directory itself"
    )
    assert error(tool, command="rename", old_path="/memories/a.md", new_path="/memories/dir/b.md") == (
        "The destination /memories/dir/b.md already exists"
    )
    assert "into itself" in error(tool, command="rename", old_path="/memories/dir", new_path="/memories/dir/sub")
    # Nothing above changed the files.
    assert "     2\ttwo" in call(tool, command="view", path="/memories/a.md")
    assert call(tool, command="view", path="/memories/dir/b.md").endswith("     1\tb")


def test_delete_and_rename_forget_the_old_content(tool: LetheMemoryTool, lethe: LetheClient) -> None:
    ns = tool.namespace
    call(tool, command="create", path="/memories/secret.md", file_text="PIN 4711")
    call(tool, command="str_replace", path="/memories/secret.md", old_str="4711", new_str="4712")
    assert call(tool, command="delete", path="/memories/secret.md") == "Successfully deleted /memories/secret.md"
    assert_forgotten(lethe, ns, "secret.md", "471")
    assert "does not exist" in error(tool, command="view", path="/memories/secret.md")
    # Created again, the file starts afresh on the tombstone (the writer proved it saw the forget).
    call(tool, command="create", path="/memories/secret.md", file_text="new")
    assert lethe.get(ns, "secret.md").value == "new"

    call(tool, command="create", path="/memories/old/a.md", file_text="alpha")
    call(tool, command="create", path="/memories/old/deep/b.md", file_text="beta")
    assert call(tool, command="rename", old_path="/memories/old", new_path="/memories/new") == (
        "Successfully renamed /memories/old to /memories/new"
    )
    assert_forgotten(lethe, ns, "old/a.md", "alpha")
    assert_forgotten(lethe, ns, "old/deep/b.md", "beta")
    assert lethe.get(ns, "new%2Fa.md").value == "alpha"
    assert lethe.get(ns, "new%2Fdeep%2Fb.md").value == "beta"
    assert "does not exist" in error(tool, command="view", path="/memories/old")

    call(tool, command="delete", path="/memories/new")  # a directory: every file below it is forgotten
    assert_forgotten(lethe, ns, "new/a.md", "alpha")
    assert_forgotten(lethe, ns, "new/deep/b.md", "beta")
    assert sorted(lethe.list(ns).keys) == ["secret.md"]

    assert tool.clear_all_memory() == "All memory cleared"
    assert_forgotten(lethe, ns, "secret.md", "new")
    assert lethe.list(ns).keys == []


def test_namespaces_keep_trees_apart(lethe: LetheClient, unique: str) -> None:
    mine, theirs = LetheMemoryTool(lethe, f"claude-a-{unique}"), LetheMemoryTool(lethe, f"claude-b-{unique}")
    call(mine, command="create", path="/memories/x.md", file_text="mine")
    assert "does not exist" in error(theirs, command="view", path="/memories/x.md")
    assert call(theirs, command="view", path="/memories").endswith("\n0B\t/memories")


class GatedClient(LetheClient):
    """A real client whose writes wait on a gate first: the only way to hold a tool between its read and its
    write, so a race is forced rather than hoped for."""

    def __init__(self, url: str, key: str, *, before_put: Any = None, before_forget: Any = None) -> None:
        super().__init__(url, key)
        self.before_put, self.before_forget = before_put, before_forget

    def put(self, *args: Any, **kwargs: Any) -> Any:
        if self.before_put is not None:
            self.before_put()
        return super().put(*args, **kwargs)

    def forget(self, *args: Any, **kwargs: Any) -> Any:
        if self.before_forget is not None:
            self.before_forget()
        return super().forget(*args, **kwargs)


def test_two_agents_editing_one_file_cannot_lose_an_update(lethe_url: str, lethe_key: str, unique: str) -> None:
    ns = f"claude-race-{unique}"
    LetheMemoryTool(LetheClient(lethe_url, lethe_key), ns).call(
        {"command": "create", "path": "/memories/todo.md", "file_text": "milk\n"}
    )
    both_read = threading.Barrier(2, timeout=60)  # each agent has read version 1 before either writes
    agents = [
        LetheMemoryTool(GatedClient(lethe_url, lethe_key, before_put=both_read.wait), ns) for _ in range(2)
    ]
    outcomes: dict[str, str] = {}

    def edit(agent: LetheMemoryTool, new: str) -> None:
        try:
            outcomes[new] = str(agent.call(
                {"command": "str_replace", "path": "/memories/todo.md", "old_str": "milk", "new_str": new}
            ))
        except ToolError as refused:
            outcomes[new] = f"ToolError: {refused}"

    edits = zip(agents, ("oat milk", "soy milk"), strict=True)
    threads = [threading.Thread(target=edit, args=edit_args) for edit_args in edits]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    refused = [n for n, o in outcomes.items() if o.startswith("ToolError")]
    assert len(refused) == 1, outcomes
    assert "was changed by another writer" in outcomes[refused[0]] and "nothing was written" in outcomes[refused[0]]
    (won,) = set(outcomes) - set(refused)
    with LetheClient(lethe_url, lethe_key) as lethe:
        record = lethe.get(ns, "todo.md")
    assert (record.value, record.version) == (f"{won}\n", 2)


def test_an_edit_racing_a_rename_is_reported_not_lost_silently(lethe_url: str, lethe_key: str, unique: str) -> None:
    ns = f"claude-rename-{unique}"
    editor = LetheMemoryTool(LetheClient(lethe_url, lethe_key), ns)
    editor.call({"command": "create", "path": "/memories/a.md", "file_text": "v1"})
    about_to_forget, edited = threading.Event(), threading.Event()

    def hold_forget() -> None:  # the rename has read a.md and copied it; the edit lands before its forget
        about_to_forget.set()
        assert edited.wait(60)

    renamer = LetheMemoryTool(GatedClient(lethe_url, lethe_key, before_forget=hold_forget), ns)
    result: list[str] = []

    def rename() -> None:
        try:
            renamer.call({"command": "rename", "old_path": "/memories/a.md", "new_path": "/memories/b.md"})
            result.append("ok")
        except ToolError as reported:
            result.append(str(reported))

    thread = threading.Thread(target=rename)
    thread.start()
    assert about_to_forget.wait(60)
    editor.call({"command": "str_replace", "path": "/memories/a.md", "old_str": "v1", "new_str": "v2"})
    edited.set()
    thread.join()

    assert "changed while it was renamed" in result[0], result
    with LetheClient(lethe_url, lethe_key) as lethe:
        assert_forgotten(lethe, ns, "a.md", "v2")
        assert lethe.get(ns, "b.md").value == "v1"


def test_the_sdks_tool_runner_dispatches_to_lethe(tool: LetheMemoryTool, lethe: LetheClient) -> None:
    """`client.beta.messages.tool_runner(tools=[tool])`, the SDK's loop, with the API's replies scripted."""
    replies: list[list[dict[str, Any]]] = [
        [
            {"type": "tool_use", "id": "toolu_1", "name": "memory",
             "input": {"command": "create", "path": "/memories/user.md", "file_text": "Name: Ada\n"}},
            {"type": "tool_use", "id": "toolu_2", "name": "memory",
             "input": {"command": "str_replace", "path": "/memories/user.md", "old_str": "Bob", "new_str": "X"}},
        ],
        [
            {"type": "tool_use", "id": "toolu_3", "name": "memory",
             "input": {"command": "view", "path": "/memories/../../etc/passwd"}},
            {"type": "tool_use", "id": "toolu_4", "name": "memory",
             "input": {"command": "rename", "old_path": "/memories/user.md", "new_path": "/memories/people/ada.md"}},
        ],
        [{"type": "text", "text": "Saved."}],
    ]
    requests: list[dict[str, Any]] = []

    def anthropic_api(request: httpx2.Request) -> httpx2.Response:
        requests.append(json.loads(request.content))
        content = replies[len(requests) - 1]
        stop = "tool_use" if content[0]["type"] == "tool_use" else "end_turn"
        return httpx2.Response(200, json={
            "id": f"msg_{len(requests)}", "type": "message", "role": "assistant", "model": "claude-scripted",
            "content": content, "stop_reason": stop, "stop_sequence": None,
            "usage": {"input_tokens": 1, "output_tokens": 1},
        })

    client = anthropic.Anthropic(
        api_key="scripted", base_url="http://anthropic.invalid",
        http_client=httpx2.Client(transport=httpx2.MockTransport(anthropic_api)),
    )
    final = client.beta.messages.tool_runner(
        model="claude-scripted", max_tokens=256, tools=[tool],
        messages=[{"role": "user", "content": "Remember my name is Ada."}],
    ).until_done()

    assert [b.text for b in final.content if b.type == "text"] == ["Saved."]
    assert requests[0]["tools"] == [{"type": "memory_20250818", "name": "memory"}]
    results = [requests[1]["messages"][-1]["content"], requests[2]["messages"][-1]["content"]]
    by_id = {r["tool_use_id"]: r for turn in results for r in turn}
    assert by_id["toolu_1"]["content"] == "File created successfully at: /memories/user.md"
    assert by_id["toolu_1"].get("is_error") is not True
    assert by_id["toolu_2"]["is_error"] is True and "did not appear verbatim" in by_id["toolu_2"]["content"]
    assert by_id["toolu_3"]["is_error"] is True and "would escape /memories" in by_id["toolu_3"]["content"]
    assert by_id["toolu_4"]["content"] == "Successfully renamed /memories/user.md to /memories/people/ada.md"
    assert lethe.get(tool.namespace, "people%2Fada.md").value == "Name: Ada\n"
    assert_forgotten(lethe, tool.namespace, "user.md", "Ada")
