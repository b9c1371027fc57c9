"""Selective replay is exact: after a forget the session equals, token for token, the session run from the same turn
script without the target, greedy and with seeded temperature-0.7 sampling, for an artifact target and for a text
span inside a document. The target is then in no live artifact, no table, no log record and no receipt, and replay
recomputes T - τ + 1 transitions, reusing the clean prefix from the cache."""

from __future__ import annotations

import logging
from typing import Any

import httpx
import pytest

from tests.conftest import LiveServer
from tests.forget.forget_helpers import (
    Script,
    artifacts,
    assert_tiles,
    forget,
    run_script,
    shape,
    tables_holding,
    user,
    wait_job,
)

ADDRESS = "12 Rue Cler"
IBAN = "UK12345678901234567890"
BILL = f"Car Rental 98.70\nTotal 98.70\nPlease pay by bank transfer to IBAN: {IBAN}\nThank you!"

GREEDY = {"temperature": 0, "max_tokens": 24, "seed": 7}
SEEDED = {"temperature": 0.7, "top_p": 0.95, "max_tokens": 24, "seed": 11}



ADDRESS_SCRIPT: Script = [
    [user("Hi! Please help me plan my week.")],
    [user("I like jogging in the morning.")],
    [user(f"My home address is {ADDRESS}, Paris.")],
    [user("Suggest a place for a morning run near my home.")],
    [user("And where should I have breakfast after it?")],
]
BILL_SCRIPT: Script = [
    [user("Can you read my latest bill and tell me what to do?"),
     {"type": "document", "content": BILL, "source": "file://bill.txt"}],
    [user("Which account should the money go to?")],
    [user("Summarize what we discussed.")],
]


class Records(logging.Handler):
    """Every log record of the app, with its extra fields, as text."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.texts: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.texts.append(repr(record.__dict__))


@pytest.fixture
def log_records() -> Any:
    handler = Records()
    root = logging.getLogger()
    previous = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        yield handler
    finally:
        root.removeHandler(handler)
        root.setLevel(previous)


@pytest.mark.parametrize("sampling", [GREEDY, SEEDED], ids=["greedy", "seeded-t0.7"])
def test_artifact_target_equals_the_session_that_never_saw_it(
    client: httpx.Client, database_url: str, sampling: dict[str, Any], log_records: Records
) -> None:
    session_id, ids = run_script(client, ADDRESS_SCRIPT, sampling)
    target = ids[2][0]  # entered at transition 3 (transition 0 is the system block)
    job = wait_job(client, forget(client, {"artifact_id": target})["id"])
    assert job["status"] == "succeeded", job

    after = artifacts(client, session_id)
    counterfactual = [t if i != 2 else [] for i, t in enumerate(ADDRESS_SCRIPT)]
    reference_id, _ = run_script(client, counterfactual, sampling)
    assert shape(after, database_url) == shape(artifacts(client, reference_id), database_url)
    assert_tiles(after)
    # untouched observations keep their ids; the target is gone, not flagged
    kept = {a["id"] for a in after}
    assert {ids[0][0], ids[1][0], ids[3][0], ids[4][0]} <= kept and target not in kept

    receipt = job["sessions"][0]
    assert (receipt["tau"], receipt["T"]) == (3, 5)
    assert receipt["transitions_replayed"] == receipt["T"] - receipt["tau"] + 1
    assert receipt["checkpoint"]["turn"] == 2
    assert receipt["tokens"]["reused"] == receipt["checkpoint"]["token_offset"] > 0
    spent = receipt["tokens"]["prefilled"] + receipt["tokens"]["decoded"]
    assert 0 < spent < receipt["tokens"]["full_reset_estimate"]
    assert (receipt["epoch_before"], receipt["epoch_after"]) == (0, 1)
    assert receipt["state_sha256_before"] != receipt["state_sha256_after"]
    assert receipt["exactness"] == "exact"  # the hf engine: bit for bit
    assert target in receipt["closure"]
    session = client.get(f"/v1/sessions/{session_id}").json()
    assert session["epoch"] == 1 and session["turns"] == 5

    assert not tables_holding(database_url, ADDRESS)
    assert not [t for t in log_records.texts if ADDRESS in t]


@pytest.mark.parametrize("sampling", [GREEDY, SEEDED], ids=["greedy", "seeded-t0.7"])
def test_text_span_inside_a_document_is_removed_and_nothing_else(
    client: httpx.Client, database_url: str, sampling: dict[str, Any], log_records: Records
) -> None:
    session_id, ids = run_script(client, BILL_SCRIPT, sampling)
    job = forget(client, {"session_id": session_id, "text": IBAN}, wait=True)
    if job["status"] not in ("succeeded", "failed"):
        job = wait_job(client, job["id"])
    assert job["status"] == "succeeded", job
    assert job["target"] == {"session_id": session_id, "text": None, "text_length": len(IBAN)}

    after = artifacts(client, session_id)
    counterfactual = [
        [BILL_SCRIPT[0][0], {"type": "document", "content": BILL.replace(IBAN, ""), "source": "file://bill.txt"}],
        BILL_SCRIPT[1],
        BILL_SCRIPT[2],
    ]
    reference_id, _ = run_script(client, counterfactual, sampling)
    assert shape(after, database_url) == shape(artifacts(client, reference_id), database_url)
    assert_tiles(after)
    document = next(a for a in after if a["kind"] == "document")
    assert document["content"] == BILL.replace(IBAN, "") and document["source"] == "file://bill.txt"
    assert document["id"] != ids[0][1]  # the sanitized observation is a new artifact; the user message is kept
    assert after[1]["id"] == ids[0][0]

    receipt = job["sessions"][0]
    assert (receipt["tau"], receipt["transitions_replayed"]) == (1, 3)
    # transition 0 (the system block) is a chunk of its own, so even a target in the first turn reuses it
    assert receipt["checkpoint"] == {"turn": 0, "token_offset": after[0]["token_span"][1]}
    assert receipt["tokens"]["reused"] == after[0]["token_span"][1]
    assert not [a for a in after if IBAN.lower() in a["content"].lower()]
    assert not tables_holding(database_url, IBAN)
    assert not [t for t in log_records.texts if IBAN in t]
    assert IBAN not in str(client.get(f"/v1/forget/{job['id']}").json())


@pytest.mark.parametrize("policy", ["session_start", "before_injections"])
def test_coarser_checkpoints_are_as_exact_and_replay_more(
    client: httpx.Client, database_url: str, policy: str
) -> None:
    """The paper's granularity ablation: restoring an earlier boundary re-prefills the clean gap along its recorded
    chunks and replays the rest: the same state, more transitions recomputed."""
    session_id, ids = run_script(client, ADDRESS_SCRIPT, GREEDY, checkpoint_policy=policy)
    job = wait_job(client, forget(client, {"artifact_id": ids[2][0]})["id"])
    assert job["status"] == "succeeded", job
    counterfactual = [t if i != 2 else [] for i, t in enumerate(ADDRESS_SCRIPT)]
    reference_id, _ = run_script(client, counterfactual, GREEDY, checkpoint_policy=policy)
    after = artifacts(client, session_id)
    assert shape(after, database_url) == shape(artifacts(client, reference_id), database_url)
    receipt = job["sessions"][0]
    if policy == "session_start":
        assert receipt["checkpoint"]["turn"] == 0 and receipt["transitions_replayed"] == 5
    else:  # no injection before τ: no checkpoint at all, the whole log is replayed from nothing
        assert receipt["checkpoint"] is None and receipt["transitions_replayed"] == 6


def test_a_full_reset_computes_exactly_the_yardstick(client: httpx.Client, live_server: LiveServer) -> None:
    """The receipts' `full_reset_estimate` is what a cold full reset on this engine computes when it decodes every
    reply, to the token (hf forwards each reply again at its closing: app/forget/cost.py), so every saving a receipt
    states is measured against work a reset really does. A reply that verification accepts whole is not forwarded
    again (its pass was the closing: docs/engines.md), and saves exactly its sampled tokens."""
    session_id, ids = run_script(client, ADDRESS_SCRIPT, GREEDY)
    job = wait_job(client, forget(client, {"artifact_id": ids[2][0]}, strategy="full_reset")["id"])
    assert job["status"] == "succeeded", job
    receipt = job["sessions"][0]
    tokens = receipt["tokens"]
    assert tokens["reused"] == 0
    chat = live_server.app.state.container.engine.engine.chat
    frame = len(chat.assistant_header()) + len(chat.end_of_turn())
    replies = {a["turn"]: a["token_span"] for a in artifacts(client, session_id) if a["kind"] == "assistant"}
    whole = [int(t) for t, mode in receipt["replay_modes"].items() if mode == "verified"]
    assert whole, receipt["replay_modes"]  # at least the replies before the target come out the same
    saved = sum(replies[t][1] - replies[t][0] - frame for t in whole)
    # Verified tokens were computed too, in the pass that checked the recorded replies (docs/engines.md).
    assert tokens["prefilled"] + tokens["decoded"] + tokens["verified"] + saved == tokens["full_reset_estimate"], (
        tokens, saved,
    )
