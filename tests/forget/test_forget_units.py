"""Pure parts of forgetting and tools: targets, closure traces, restore points, call parsing, the built-in
environment and who answers a call (the sink policy, the ledger, a replay's suppression)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import pytest

from app.forget.closure import closure_of, restore_point
from app.forget.cost import Yardstick
from app.forget.jobs import erasure_of
from app.forget.locate import Target, locate_in
from app.forget.receipts import JobReceipt
from app.runtime.checkpoints import manifest_sha256
from app.runtime.tool_catalog import call_id, execute_builtin, normalize, parse_calls
from app.runtime.tool_loop import ReplayTools, ToolContext, ToolStep, _answer
from app.tool_calls import INITIAL_STATE, ToolCall


def art(id: str, kind: str, turn: int, content: str = "", start: int = 0, end: int = 0) -> Any:
    return SimpleNamespace(
        id=id, kind=kind, turn=turn, content=content, token_start=start, token_end=end, meta={}, archived_by=None
    )


ROWS = [
    art("s", "system", 0, "sys", 0, 5),
    art("u1", "user", 1, "hello", 5, 10),
    art("a1", "assistant", 1, "hi", 10, 15),
    art("u2", "user", 2, "my IBAN is X1 ok", 15, 25),
    art("d2", "document", 2, "X1", 25, 30),
    art("a2", "assistant", 2, "noted X1", 30, 40),
    art("a3", "assistant", 3, "bye", 40, 45),
]


def test_text_targets_sanitize_observations_only() -> None:
    located = locate_in(Target(session_id="ses", text="X1"), ROWS)
    assert located is not None and located.tau == 2
    assert located.edits == {"u2": "my IBAN is  ok", "d2": None}  # left empty: dropped
    only_outputs = locate_in(Target(session_id="ses", text="noted"), ROWS)
    assert only_outputs is not None and only_outputs.edits == {} and only_outputs.sources == ["a2"]
    assert locate_in(Target(session_id="ses", text="absent"), ROWS) is None


def test_closure_trace_says_why() -> None:
    edges = [("u2", "a2"), ("d2", "a2"), ("a1", "a2"), ("a2", "a3")]
    trace = closure_of(["d2"], edges, ROWS)
    assert [(t.artifact_id, t.why) for t in trace] == [
        ("d2", "target"), ("a2", "context held d2"), ("a3", "context held a2")
    ]


def test_restore_point_skips_checkpoints_whose_prefix_changed() -> None:
    good = SimpleNamespace(id="c1", turn=1, token_offset=15, manifest_sha256=manifest_sha256(
        [("s", 0, 5), ("u1", 5, 10), ("a1", 10, 15)]))
    stale = SimpleNamespace(id="c1b", turn=1, token_offset=15, manifest_sha256="0" * 64)
    start = SimpleNamespace(id="c0", turn=0, token_offset=5, manifest_sha256=manifest_sha256([("s", 0, 5)]))
    assert restore_point([start, good], ROWS, 2).checkpoint_id == "c1"
    assert restore_point([start, stale], ROWS, 2).checkpoint_id == "c0"
    assert restore_point([start, good], ROWS, 0).turn == -1


def test_the_yardstick_counts_each_reply_again_where_the_engine_rereads_it() -> None:
    rows = [SimpleNamespace(kind="user", token_ids=[1] * 9, meta={}),
            SimpleNamespace(kind="assistant", token_ids=[2] * 10, meta={"finish_reason": "stop"}),
            SimpleNamespace(kind="tool_call", token_ids=[3] * 7, meta={"finish_reason": "length"})]
    # Every token once, plus each reply's last sampled token decoded and then prefilled.
    assert Yardstick().run(100, rows) == 102  # type: ignore[arg-type]
    # hf forwards a reply's sampled tokens again at its closing: 10 - 5 and 7 - 5 of them (5: header, end of turn);
    # the reply cut by max_tokens sampled no stop token.
    assert Yardstick(rereads_replies=True, frame=5).run(100, rows) == 101 + 5 + 2  # type: ignore[arg-type]


def test_scrubbed_targets_keep_no_text() -> None:
    target = Target(session_id="ses", text="secret words")
    assert target.scrubbed() == {"session_id": "ses", "text": None, "text_length": 12}
    assert Target.from_dict(target.to_dict()) == target


def test_calls_parse_with_deterministic_ids() -> None:
    text = 'ok <tool_call>{"name": "transfer", "arguments": {"to": "A", "amount": 1}}</tool_call> and ' \
           '<tool_call>{"name": "get_balance"}</tool_call> <tool_call>not json</tool_call>'
    calls = parse_calls(3, text)
    assert [(c.name, c.arguments) for c in calls] == [("transfer", {"to": "A", "amount": 1}), ("get_balance", {})]
    assert calls[0].id == call_id(3, 0, "transfer", {"amount": 1, "to": "A"})  # key order does not matter
    assert calls[0].id != call_id(4, 0, "transfer", {"amount": 1, "to": "A"})


def test_builtin_environment_is_pure() -> None:
    call = ToolCall("call_1", "transfer", {"to": "B", "amount": 30})
    state, text = execute_builtin(INITIAL_STATE, call)
    assert text == "sent 30.00 EUR; balance 970.00" and INITIAL_STATE["bank"]["balance"] == 1000.0
    too_much = ToolCall("c", "transfer", {"to": "B", "amount": 10_000})
    assert execute_builtin(state, too_much)[1] == "error: insufficient funds"
    assert execute_builtin(state, ToolCall("c", "get_balance", {}))[1] == "balance: 970.00 EUR"


def test_tool_declarations_normalize() -> None:
    tools = normalize([{"name": "transfer", "builtin": True}, {"name": "ask"}])
    assert tools[0]["kind"] == "consequential" and tools[1] == {"name": "ask", "kind": "read_only", "builtin": False}
    with pytest.raises(ValueError):
        normalize([{"name": "transfer", "builtin": True, "kind": "read_only"}])


def context(**kw: Any) -> ToolContext:
    tools = normalize([{"name": "transfer", "builtin": True}, {"name": "pay_client", "kind": "consequential"}])
    return ToolContext("ses", tools, dict(INITIAL_STATE), kw.pop("fired", set()), **kw)


def test_who_answers_a_call() -> None:
    call = ToolCall("call_t", "transfer", {"to": "B", "amount": 1})
    step = ToolStep()
    assert _answer(context(flagged=frozenset({"src"})), call, step, frozenset({"src", "other"}))[0] == (
        "blocked: the call's context holds a flagged source (sink policy)"
    )
    live = context()
    assert _answer(live, call, step, frozenset()) == ("sent 1.00 EUR; balance 999.00", True)
    assert step.fired_now == [call]
    replaying = context(replay=ReplayTools(recorded={"call_t": "sent (recorded)"}), fired={"call_t"})
    assert _answer(replaying, call, ToolStep(), frozenset()) == ("sent (recorded)", True)
    assert replaying.env["bank"]["balance"] == 999.0  # the effect is re-applied to the shadow environment
    fresh = context(replay=ReplayTools())
    assert _answer(fresh, call, ToolStep(), frozenset()) == (None, False)
    assert fresh.replay is not None and fresh.replay.suppressed == [call]
    assert _answer(context(), ToolCall("c", "nope", {}), ToolStep(), frozenset())[0] == "error: no tool named 'nope'"


def test_an_erasure_at_rest_still_pending_past_its_horizon_is_overdue() -> None:
    """The receipt says when the promise is broken: the horizon runs from the forget's success, and a shred that
    completed is never overdue, however late."""
    now = datetime.now(UTC)
    receipt = JobReceipt(erasure_horizon_s=300)

    def erasure(finished_ago_s: float, shredded: bool) -> Any:
        job = SimpleNamespace(status="succeeded", shred_leaves=[7], created_at=now - timedelta(seconds=900),
                              finished_at=now - timedelta(seconds=finished_ago_s),
                              shredded_at=now if shredded else None)
        return erasure_of(job, receipt)  # type: ignore[arg-type]

    assert erasure(10, shredded=False).overdue is False
    assert erasure(301, shredded=False).overdue is True
    assert erasure(301, shredded=True).overdue is False
    late = erasure(301, shredded=False)
    assert late.at_rest == "pending" and late.horizon_s == 300
