"""Receipts are typed, and the JSON jobs stored before they were still loads (forget_jobs.receipt is JSON)."""

from __future__ import annotations

from typing import Any

from app.forget.receipts import JobReceipt

# A finished job's receipt as the service stored it when receipts were plain dicts.
STORED = {
    "sessions": [{
        "session_id": "ses_1", "tau": 3, "T": 5, "transitions_replayed": 3,
        "checkpoint": {"turn": 2, "token_offset": 80}, "closure": ["art_1", "art_2"], "epoch_before": 0,
        "epoch_after": 1, "state_sha256_before": "a", "state_sha256_after": "b",
        "tokens": {"reused": 80, "prefilled": 40, "decoded": 12, "full_reset_estimate": 140},
    }],
    "suppressed_side_effects": [{"session_id": "ses_1", "tool_call_id": "call_1", "name": "send_email"}],
    "committed_side_effects": [],
    "derived_memory": [{"namespace": "n", "key": "k", "tombstone_version": 2, "forget_id": "fgt_2"}],
    "duration_ms": 1234,
}
# A job parked for input, and a cascade job before it ran.
PARKED = {"sessions": [], "inputs": {"call_2": "42"}, "pending": {
    "session_id": "ses_1", "tool_call": {"id": "call_3", "name": "lookup", "arguments": {}}}}
CASCADE = {"memory": {"namespace": "n", "key": "k", "tombstone_version": 3}}


def test_stored_receipts_load_and_keep_their_shape() -> None:
    receipt = JobReceipt.load(STORED)
    entry = receipt.sessions[0]
    assert entry.checkpoint is not None and entry.checkpoint.turn == 2 and entry.tokens.prefilled == 40
    assert receipt.suppressed_side_effects[0]["name"] == "send_email"
    assert receipt.done("ses_1") and not receipt.done("ses_2")
    again = receipt.stored()
    for key, value in STORED.items():
        if key != "sessions":
            assert again[key] == value
    assert _without_nulls(again["sessions"][0]) == STORED["sessions"][0]  # nulls: fields this entry does not use


def _without_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    return value


def test_client_answers_keep_their_stored_key() -> None:
    parked = JobReceipt.load(PARKED)
    assert parked.provided == {"call_2": "42"} and parked.pending is not None
    assert parked.stored()["inputs"] == {"call_2": "42"}
    cascade = JobReceipt.load(CASCADE)
    assert cascade.memory is not None and cascade.memory.tombstone_version == 3 and cascade.sessions == []
    assert JobReceipt.load(None) == JobReceipt()
