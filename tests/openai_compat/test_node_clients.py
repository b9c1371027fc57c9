"""Node clients against a live `lethe serve`, with their default settings: the OpenAI Agents SDK for JavaScript
(`@openai/agents`) and the Vercel AI SDK (`ai` with `@ai-sdk/openai`, its Responses and Chat models).

The clients run in `node` (node/clients.mjs); the versions are those of node/package-lock.json, installed by
`make test` (`npm ci`), so nothing is fetched while the suite runs. A checkout where `make test` has not installed
them fails here with that instruction, rather than skipping: these clients are part of what the suite claims.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench.serve import LetheServer
from tests.support import BOOTSTRAP_KEY, module_server

NODE = Path(__file__).parent / "node"


@pytest.fixture(scope="module")
def served(database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LetheServer]:
    with module_server(database_url, tmp_path_factory.mktemp("node-clients")) as server:
        yield server


def clients(served: LetheServer, which: str) -> dict[str, Any]:
    node = shutil.which("node")
    if node is None or not (NODE / "node_modules").is_dir():
        pytest.fail("the Node clients are not installed: `make test` installs them (npm ci in tests/openai_compat/node,"
                    " Node 20 and npm needed)")
    env = {**os.environ, "LETHE_URL": served.url, "LETHE_API_KEY": BOOTSTRAP_KEY}
    done = subprocess.run([node, "clients.mjs", which], cwd=NODE, env=env, capture_output=True, text=True,
                          timeout=1200, check=False)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-4000:], served.log_tail())
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_openai_agents_js(served: LetheServer) -> None:
    seen = clients(served, "agents")
    assert seen["plain"] and seen["streamed"] == seen["deltas"] == seen["plain"]  # greedy: one reply, streamed or not
    assert seen["calls"] == ["Paris"]  # the tool ran once, with the model's arguments
    assert seen["tool_items"][-3:] == ["tool_call_item", "tool_call_output_item", "message_output_item"]
    assert seen["tool_final"] and "tool_call" not in seen["tool_final"]
    assert seen["chained"] and seen["chained_cached"] > 0  # previousResponseId continued the session from its cache


@pytest.mark.parametrize("which", ["ai-responses", "ai-chat"])
def test_vercel_ai_sdk(served: LetheServer, which: str) -> None:
    seen = clients(served, which)
    assert seen["plain"] and seen["streamed"] == seen["plain"]
    assert seen["calls"] == ["Paris", "Paris"]  # generateText's and streamText's tool steps each ran the tool once
    assert [step["calls"] for step in seen["steps"]] == [[["get_weather", {"city": "Paris"}]], []]
    assert seen["round_text"] == seen["steps"][-1]["text"] and "tool_call" not in seen["streamed_round_text"]
    # The streamed run's text is its steps' text: the call's markup never arrived as a text delta.
    assert seen["streamed_round_text"] == "".join(step["text"] for step in seen["steps"])
    assert seen["second"] and seen["second_cached"] > 0  # the resent history continued its session
