"""`/mcp` and Chat Completions under `LETHE_HTTP_WORKERS=2`: every HTTP worker serves them itself and reaches the
engine process only for model work (a forget's replay, a completion), through its engine client."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.types import CallToolResult

from bench.serve import LetheServer
from tests.support import BOOTSTRAP_KEY, module_server


@pytest.fixture(scope="module")
def served(database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LetheServer]:
    with module_server(database_url, tmp_path_factory.mktemp("mcp-workers"), LETHE_HTTP_WORKERS="2") as server:
        yield server


async def test_a_forget_through_mcp_runs_on_a_worker(served: LetheServer) -> None:
    headers = {"Authorization": f"Bearer {BOOTSTRAP_KEY}"}
    async with httpx.AsyncClient(base_url=served.url, headers=headers, timeout=300) as native:
        session = (await native.post("/v1/sessions", json={"sampling": {"max_tokens": 2}})).json()["id"]
        turn = await native.post(f"/v1/sessions/{session}/turns",
                                 json={"inputs": [{"type": "user", "content": "My code is QZ-4417."}]})
        assert turn.status_code == 200, turn.text
        http = httpx2.AsyncClient(headers=headers, timeout=300)
        async with http, Client(streamable_http_client(served.url + "/mcp", http_client=http)) as client:
            done = await client.call_tool("forget_confirm", {"session_id": session, "text": "QZ-4417"})
        assert isinstance(done, CallToolResult) and not done.is_error, done
        assert done.structured_content is not None and done.structured_content["status"] == "succeeded"
        assert "QZ-4417" not in (await native.get(f"/v1/sessions/{session}/artifacts")).text


def test_chat_completions_run_on_a_worker(served: LetheServer) -> None:
    with httpx.Client(base_url=served.url, headers={"Authorization": f"Bearer {BOOTSTRAP_KEY}"}, timeout=300) as c:
        model = c.get("/v1/models").json()["data"][0]["id"]
        done = c.post("/v1/chat/completions", json={"model": model, "max_tokens": 2,
                                                    "messages": [{"role": "user", "content": "Hi"}]})
    assert done.status_code == 200, done.text
    assert done.json()["choices"][0]["message"]["role"] == "assistant"
