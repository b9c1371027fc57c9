"""The examples under examples/ run as written, as a new user runs them: `python examples/<name>.py` with the
framework's extra installed and LETHE_URL / LETHE_KEY pointing at a live Lethe, no other set-up. Each must exit 0,
so an example that no longer matches the API or the framework (a renamed route, a changed signature) fails here.

No ANTHROPIC_API_KEY reaches them: the Claude example then plays the model's part itself, with no network.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
PYTHON_EXAMPLES = sorted(path.name for path in EXAMPLES.glob("*.py"))


def test_the_examples_are_here() -> None:
    assert {"langgraph_checkpointer.py", "langgraph_store.py", "crewai_memory.py", "claude_memory_tool.py"} <= set(
        PYTHON_EXAMPLES
    )


@pytest.mark.parametrize("example", PYTHON_EXAMPLES)
def test_an_example_runs_as_written(lethe_url: str, lethe_key: str, example: str, tmp_path: Path) -> None:
    env = {key: value for key, value in os.environ.items() if not key.startswith(("ANTHROPIC_", "OPENAI_"))}
    env |= {"LETHE_URL": lethe_url, "LETHE_KEY": lethe_key, "HOME": str(tmp_path)}  # CrewAI writes under HOME
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / example)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stdout[-8000:] + done.stderr[-8000:]
