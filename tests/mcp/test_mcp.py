"""The MCP server at `/mcp` of a live `lethe serve`, through the official MCP SDK's own client over streamable HTTP
and through an OpenAI Agents SDK agent (`MCPServerStreamableHttp`), with the tenant's API key as bearer token.

Memory: read, conditional write (a stale version is a tool error carrying what a 412 carries), forget, list and
history. Forgetting: a plan (dry run, nothing changes) and its confirmation for a session's text and for an artifact,
and the receipt as a resource. Data subjects: the export, the erasure's plan and its confirmation (refused under a
legal hold). Tenancy: no key, no MCP; another tenant's key reaches nothing of this one's.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import httpx2
import pytest
from agents import Agent, Runner, set_default_openai_client, set_tracing_disabled
from agents.mcp import MCPServerStreamableHttp, create_static_tool_filter
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.types import CallToolResult, TextResourceContents
from openai import AsyncOpenAI

from bench.serve import LetheServer
from tests.support import BOOTSTRAP_KEY, module_server

SECRET = "QZ-4417"  # a hyphen: no id or digest in the database can spell it


@pytest.fixture(scope="module")
def served(database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LetheServer]:
    with module_server(database_url, tmp_path_factory.mktemp("mcp")) as server:
        yield server


@asynccontextmanager
async def connected(served: LetheServer, key: str = BOOTSTRAP_KEY) -> AsyncIterator[Client]:
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {key}"}, timeout=300)
    async with http, Client(streamable_http_client(served.url + "/mcp", http_client=http)) as client:
        yield client


async def call(client: Client, tool: str, **arguments: Any) -> dict[str, Any]:
    result = await client.call_tool(tool, arguments)
    assert isinstance(result, CallToolResult) and not result.is_error, result
    assert result.structured_content is not None
    return result.structured_content


async def refused(client: Client, tool: str, **arguments: Any) -> dict[str, Any]:
    """A tool error: its text ends with the JSON object of the error (status, type, detail, fields)."""
    result = await client.call_tool(tool, arguments)
    assert isinstance(result, CallToolResult) and result.is_error, result
    text = result.content[0].text  # type: ignore[union-attr]
    found: dict[str, Any] = json.loads(text[text.index("{"):])
    return found


async def test_memory_tools_keep_versions_and_tombstones(served: LetheServer) -> None:
    namespace = "mcp-" + uuid.uuid4().hex[:8]
    async with connected(served) as client:
        names = {tool.name for tool in (await client.list_tools()).tools}
        assert names == {"memory_read", "memory_write", "memory_forget", "memory_list", "memory_history",
                         "forget_plan", "forget_confirm", "subject_export", "subject_erase_plan",
                         "subject_erase_confirm"}
        assert (await call(client, "memory_read", namespace=namespace, key="diet"))["version"] == 0
        first = await call(client, "memory_write", namespace=namespace, key="diet", value="vegan", base_version=0)
        assert first == {"namespace": namespace, "key": "diet", "version": 1, "created": True}
        stale = await refused(client, "memory_write", namespace=namespace, key="diet", value="keto", base_version=0)
        assert stale["status"] == 412 and stale["current_version"] == 1 and stale["forgotten"] is False
        read = await call(client, "memory_read", namespace=namespace, key="diet")
        assert (read["exists"], read["value"], read["version"]) == (True, "vegan", 1)
        assert (await call(client, "memory_list", namespace=namespace))["keys"] == ["diet"]

        forgotten = await call(client, "memory_forget", namespace=namespace, key="diet")
        assert forgotten["version"] == 2 and not forgotten["already_forgotten"]
        gone = await call(client, "memory_read", namespace=namespace, key="diet")
        assert (gone["exists"], gone["forgotten"], gone["version"]) == (False, True, 2)
        assert (await call(client, "memory_list", namespace=namespace))["keys"] == []
        # A write based on the version read before the forget can never land; one that saw the forget can.
        late = await refused(client, "memory_write", namespace=namespace, key="diet", value="vegan", base_version=1)
        assert late["status"] == 412 and late["forgotten"] is True and late["current_version"] == 2
        await call(client, "memory_write", namespace=namespace, key="diet", value="keto", base_version=2)
        history = (await call(client, "memory_history", namespace=namespace, key="diet"))["versions"]
        assert [(v["version"], v["op"], v.get("value")) for v in history] == [
            (1, "write", None), (2, "forget", None), (3, "write", "keto")]
        assert "vegan" not in json.dumps(history)
        bad = await refused(client, "memory_read", namespace="has/slash", key="k")
        assert bad["status"] == 422


async def test_forget_plan_then_confirm_with_the_receipt_as_a_resource(served: LetheServer) -> None:
    headers = {"Authorization": f"Bearer {BOOTSTRAP_KEY}"}
    async with httpx.AsyncClient(base_url=served.url, headers=headers, timeout=300) as native:
        session = (await native.post("/v1/sessions", json={"sampling": {"max_tokens": 4}})).json()["id"]
        for text in (f"My code is {SECRET}.", "I live in Paris."):
            assert (await native.post(f"/v1/sessions/{session}/turns",
                                      json={"inputs": [{"type": "user", "content": text}]})).status_code == 200

        async def contents() -> str:
            return json.dumps((await native.get(f"/v1/sessions/{session}/artifacts")).json())

        async with connected(served) as client:
            plan = await call(client, "forget_plan", session_id=session, text=SECRET)
            assert plan["dry_run"] is True and plan["sessions"][0]["tau"] == 1 and "receipt_uri" not in plan
            assert plan["sessions"][0]["trace"]  # what would go, and why
            assert SECRET in await contents()  # a plan changes nothing

            done = await call(client, "forget_confirm", session_id=session, text=SECRET, reason="user asked")
            assert done["status"] == "succeeded" and done["sessions"][0]["transitions_replayed"] == 2
            assert SECRET not in await contents() and "I live in Paris." in await contents()
            read = await client.read_resource(done["receipt_uri"])
            receipt = json.loads(read.contents[0].text)  # type: ignore[union-attr]
            assert isinstance(read.contents[0], TextResourceContents)
            assert receipt["id"] == done["id"] and receipt["status"] == "succeeded"
            assert SECRET not in read.contents[0].text  # a receipt keeps the text's length, never the text
            templates = [t.uri_template for t in (await client.list_resource_templates()).resource_templates]
            assert templates == ["lethe://forget/{job_id}"]

            paris = next(a["id"] for a in (await native.get(f"/v1/sessions/{session}/artifacts")).json()["artifacts"]
                         if a["content"] == "I live in Paris.")
            assert (await call(client, "forget_plan", session_id=session, artifact_id=paris))["dry_run"]
            dropped = await call(client, "forget_confirm", session_id=session, artifact_id=paris)
            assert dropped["status"] == "succeeded" and "I live in Paris." not in await contents()
            both = await refused(client, "forget_plan", session_id=session, artifact_id=paris, text="x")
            assert both["status"] == 422
            missing = await refused(client, "forget_confirm", session_id=session, artifact_id="art_" + "0" * 26)
            assert missing["status"] == 404


async def test_subject_tools_export_plan_and_erase_what_a_person_owns(served: LetheServer) -> None:
    subject, namespace = "mcp-user-" + uuid.uuid4().hex[:8], "mcp-" + uuid.uuid4().hex[:8]
    headers = {"Authorization": f"Bearer {BOOTSTRAP_KEY}"}
    async with httpx.AsyncClient(base_url=served.url, headers=headers, timeout=300) as native:
        session = (await native.post("/v1/sessions", json={"subject_id": subject})).json()["id"]
        said = await native.post(f"/v1/sessions/{session}/turns", json={
            "inputs": [{"type": "user", "content": f"My code is {SECRET}."}], "generate": False})  # no model needed
        assert said.status_code == 200, said.text
        linked = await native.put(f"/v1/subjects/{subject}", json={"memory_namespaces": [namespace]})
        assert linked.status_code == 200, linked.text  # the session made the subject

        async with connected(served) as client:
            await call(client, "memory_write", namespace=namespace, key="diet", value="vegan", base_version=0)
            exported = await call(client, "subject_export", subject_id=subject)
            assert exported["subject"]["id"] == subject and [s["id"] for s in exported["sessions"]] == [session]
            assert SECRET in json.dumps(exported["sessions"])
            assert [(m["key"], m["value"]) for m in exported["memory"]] == [("diet", "vegan")]

            plan = await call(client, "subject_erase_plan", subject_id=subject)
            assert plan == {"subject_id": subject, "dry_run": True, "sessions": [session], "conversations": [],
                            "namespaces": [namespace], "memory_keys": 1, "also": [], "held": []}
            assert (await native.get(f"/v1/sessions/{session}")).status_code == 200  # a plan changes nothing

            hold = (await native.post("/v1/holds", json={"subject_id": subject, "reason": "litigation"})).json()
            held = await refused(client, "subject_erase_confirm", subject_id=subject)
            assert (held["status"], held["type"], held["hold_id"]) == (409, "legal_hold", hold["id"])
            assert (await native.delete(f"/v1/holds/{hold['id']}")).status_code == 200

            done = await call(client, "subject_erase_confirm", subject_id=subject)
            assert done["status"] == "succeeded" and done["subject"]["sessions"] == [session]
            assert done["subject"]["memory_keys"] == 1
            assert (await native.get(f"/v1/sessions/{session}")).status_code == 404
            assert (await call(client, "memory_read", namespace=namespace, key="diet"))["forgotten"] is True
            read = await client.read_resource(done["receipt_uri"])
            assert json.loads(read.contents[0].text)["id"] == done["id"]  # type: ignore[union-attr]

            # A malformed id never reaches the services: the tool's schema refuses it, as a tool error.
            bad = await client.call_tool("subject_export", {"subject_id": "has space"})
            assert isinstance(bad, CallToolResult) and bad.is_error
            assert "pattern" in bad.content[0].text  # type: ignore[union-attr]
            missing = await refused(client, "subject_erase_plan", subject_id="mcp-nobody-" + uuid.uuid4().hex[:8])
            assert missing["status"] == 404
            alone = await refused(client, "subject_erase_plan", subject_id=subject, also_min_similarity=0.9)
            assert alone["status"] == 422 and "also_query" in alone["detail"]  # a threshold needs its query


async def test_no_key_no_mcp_and_tenants_stay_apart(served: LetheServer) -> None:
    async with httpx.AsyncClient(base_url=served.url, timeout=60) as anon:
        answer = await anon.post("/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
                                 headers={"Accept": "application/json, text/event-stream"})
        assert answer.status_code == 401 and answer.headers["www-authenticate"].startswith("Bearer")
        assert answer.headers["content-type"].startswith("application/problem+json")
    created = served.cli("tenant", "create", "mcp-other-" + uuid.uuid4().hex[:8])
    assert created.returncode == 0, created.stderr
    other_key = created.stdout.strip().splitlines()[-1]
    namespace = "mcp-" + uuid.uuid4().hex[:8]
    async with connected(served) as mine:
        await call(mine, "memory_write", namespace=namespace, key="k", value="mine", base_version=0)
    async with connected(served, other_key) as theirs:
        assert (await call(theirs, "memory_read", namespace=namespace, key="k"))["version"] == 0  # not theirs
        await call(theirs, "memory_forget", namespace=namespace, key="k")  # their own tombstone, not mine
    async with connected(served) as mine:
        assert (await call(mine, "memory_read", namespace=namespace, key="k"))["value"] == "mine"


async def test_an_agents_sdk_agent_calls_lethe_through_mcp(served: LetheServer) -> None:
    namespace = "mcp-" + uuid.uuid4().hex[:8]
    async with connected(served) as client:
        await call(client, "memory_write", namespace=namespace, key="diet", value="vegan", base_version=0)
    openai_client = AsyncOpenAI(base_url=served.url + "/v1", api_key=BOOTSTRAP_KEY, max_retries=0, timeout=300)
    set_default_openai_client(openai_client)
    set_tracing_disabled(True)  # traces would go to OpenAI's servers
    model = (await openai_client.models.list()).data[0].id
    params: Any = {"url": served.url + "/mcp", "headers": {"Authorization": f"Bearer {BOOTSTRAP_KEY}"},
                   "timeout": 300}
    # The agent is given the one tool it is asked to call (the SDK's own filter): the tiny model copies a call well
    # only from a short prompt, and every tool listed is part of it (more tools' schemas once made it miscopy).
    only = create_static_tool_filter(allowed_tool_names=["memory_read"])
    async with MCPServerStreamableHttp(params=params, name="lethe", client_session_timeout_seconds=300,
                                       tool_filter=only) as lethe:
        assert {tool.name for tool in await lethe.list_tools()} == {"memory_read"}
        # The tiny model copies a call it is shown; the tool's answer is the run's answer.
        agent = Agent(name="memory", model=model, mcp_servers=[lethe], tool_use_behavior="stop_on_first_tool")
        shown = json.dumps({"name": "memory_read", "arguments": {"namespace": namespace, "key": "diet"}})
        result = await Runner.run(agent, f"Copy this exactly: <tool_call>{shown}</tool_call>")
    await openai_client.close()
    assert [item.type for item in result.new_items][-2:] == ["tool_call_item", "tool_call_output_item"]
    # The MCP tool's answer as the SDK hands it on: a text content part holding the tool's JSON.
    output = result.new_items[-1].output  # type: ignore[union-attr]
    assert output["type"] == "text"
    answered = json.loads(output["text"])
    assert (answered["namespace"], answered["value"], answered["version"]) == (namespace, "vegan", 1)
