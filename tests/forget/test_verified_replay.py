"""Verified replay (LETHE_REPLAY_VERIFY, app/engine/verify.py): a forget whose replay verifies the recorded replies
leaves the same session as one whose replay decodes them again, and as the session that never saw the target, token
for token, greedy and with seeded temperature-0.7 sampling; its receipt counts what it verified and what it decoded.

The script is built so that forgetting the target changes some replies after it (they mention it) and leaves others
as they were: the replay verifies the unchanged ones whole, and decodes the changed ones from their first
disagreement. (The other forget tests, tool calls, compactions and memory cascades included, run with verification on:
it is the default.)"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from app.forget.executor import ForgetExecutor
from tests.forget.forget_helpers import Script, artifacts, assert_tiles, forget, run_script, shape, user, wait_job

GREEDY = {"temperature": 0, "max_tokens": 24, "seed": 7}
SEEDED = {"temperature": 0.7, "top_p": 1.0, "max_tokens": 24, "seed": 11}  # a nucleus is decoded: top_p 1 verifies

SCRIPT: Script = [
    [user("Hi! I am planning a quiet weekend.")],
    [user("My bank PIN is 4921, keep it in mind.")],
    [user("What is my PIN?")],
    [user("Name a fruit that is red.")],
    [user("Name a color of the sky.")],
    [user("Say hello in French.")],
]
TARGET_TURN = 2  # the PIN message (transition 0 is the system block)


@pytest.fixture
def executor(live_server: Any) -> Iterator[ForgetExecutor]:
    """The live server's forget executor; its `replay_verify` is given back as it was after the test."""
    found = live_server.app.state.container.services.forget_executor
    assert isinstance(found, ForgetExecutor)
    before = found.replay_verify
    yield found
    found.replay_verify = before


def _forget(client: httpx.Client, artifact_id: str) -> dict[str, Any]:
    job = wait_job(client, forget(client, {"artifact_id": artifact_id})["id"])
    assert job["status"] == "succeeded", job
    receipt: dict[str, Any] = job["sessions"][0]
    return receipt


@pytest.mark.parametrize("sampling", [GREEDY, SEEDED], ids=["greedy", "seeded-t0.7"])
def test_verified_replay_equals_decoded_replay_and_the_counterfactual(
    client: httpx.Client, database_url: str, executor: ForgetExecutor, sampling: dict[str, Any]
) -> None:
    verified_id, verified_ids = run_script(client, SCRIPT, sampling)
    decoded_id, decoded_ids = run_script(client, SCRIPT, sampling)
    executor.replay_verify = True
    on = _forget(client, verified_ids[TARGET_TURN - 1][0])
    executor.replay_verify = False
    off = _forget(client, decoded_ids[TARGET_TURN - 1][0])
    counterfactual = [t if i != TARGET_TURN - 1 else [] for i, t in enumerate(SCRIPT)]
    reference_id, _ = run_script(client, counterfactual, sampling)

    reference = shape(artifacts(client, reference_id), database_url)
    after = artifacts(client, verified_id)
    assert shape(after, database_url) == reference
    assert shape(artifacts(client, decoded_id), database_url) == reference
    assert_tiles(after)
    assert on["state_sha256_after"] == off["state_sha256_after"]

    # The same replay, counted two ways: every token the decoded replay sampled was verified or decoded by the other.
    assert off["tokens"]["verified"] == 0 and set(off["replay_modes"].values()) == {"decoded"}
    assert on["tokens"]["verified"] > 0
    assert on["tokens"]["verified"] + on["tokens"]["decoded"] == off["tokens"]["decoded"]
    assert on["tokens"]["prefilled"] == off["tokens"]["prefilled"] and on["tokens"]["reused"] == off["tokens"]["reused"]
    assert on["transitions_replayed"] == off["transitions_replayed"] == len(SCRIPT) - TARGET_TURN + 1
    # Every replayed reply has a mode; some reply kept a verified prefix, and the reply that answered from the PIN
    # changed, so some reply was decoded at least in part.
    replies = {str(turn) for turn in range(TARGET_TURN + 1, len(SCRIPT) + 1)}
    assert set(on["replay_modes"]) == replies == set(off["replay_modes"])
    modes = set(on["replay_modes"].values())
    assert modes & {"verified", "verified+decoded"} and modes & {"decoded", "verified+decoded"}
