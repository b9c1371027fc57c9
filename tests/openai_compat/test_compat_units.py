"""Pure pieces of the compatible layer, without a server: the streamed visible text (markup.py), how a resent history
is matched (history.py), the compatibility policy's `include` values, and a branch's id remapping
(app/sessions/branching.py)."""

from __future__ import annotations

import random
from typing import Any

import pytest

from app.openai_compat import history
from app.openai_compat.compatibility import REFUSED_INCLUDES, VACUOUS_INCLUDES, check_include
from app.openai_compat.errors import BadParameter
from app.openai_compat.markup import VisibleStream, visible_text
from app.runtime.checkpoints import manifest_sha256
from app.sessions import branching
from app.sessions.branching import Transitions

REPLIES = [
    "Hello!", "  Hi there  ", 'A <tool_call>{"name": "x"}</tool_call> B', 'Call:\n<tool_call>{"a": 1}</tool_call>\n',
    "<tool_call>{}</tool_call>", 'cut short <tool_call>{"name": "get_', "a < b <tool_ x", "x</tool_call>y",
    "<tool_call>x</tool_call><tool_call>y</tool_call>z", "<tool_cal", "ab\n\n<tool_call>1</tool_call>\n\ncd  ", "",
]


@pytest.mark.parametrize("reply", REPLIES)
def test_the_stream_shows_exactly_the_visible_text_however_it_is_cut(reply: str) -> None:
    rng = random.Random(reply)
    for _ in range(200):
        cuts = sorted(rng.sample(range(len(reply) + 1), min(len(reply) + 1, rng.randint(0, 8))))
        pieces = [reply[a:b] for a, b in zip([0, *cuts], [*cuts, len(reply)], strict=True)]
        stream = VisibleStream()
        shown = [stream.push(piece) for piece in pieces] + [stream.finish()]
        assert "".join(shown) == visible_text(reply)
        assert not any("<tool_call>" in s or "</tool_call>" in s for s in shown if "<tool_call>" in reply)
    assert "tool_call" not in visible_text(reply) or "<tool_call>" not in reply


def held(items: list[tuple[str, ...]], turns: list[int]) -> list[history.Held]:
    return [history.Held(canon, f"art_{i}", turn, {}) for i, (canon, turn) in enumerate(zip(items, turns, strict=True))]


def given(raw: list[dict[str, Any]]) -> list[history.Given]:
    return history.given(raw, "input")


def test_a_history_matches_whole_transitions_in_order() -> None:
    user = {"role": "user", "content": "hi"}
    reply = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "hello"}]}
    session = held([("user", "hi"), ("assistant", "hello"), ("user", "more")], [1, 1, 2])
    found = history.match(given([user, reply]), session)
    assert found is not None and found.turn == 1 and [h.id for h in found.rest] == ["art_2"]
    assert history.already_added(given([{"role": "user", "content": "more"}]), found.rest)
    assert not history.already_added(given([{"role": "user", "content": "other"}]), found.rest)
    assert history.match(given([user]), session) is None  # cut inside transition 1
    assert history.match(given([{**reply, "id": "art_9"}]), session) is None  # an id is checked when given
    assert history.match(given([{"role": "user", "content": "hi"}, {**reply, "content": "other"}]), session) is None
    assert history.history_end(given([user, reply, {"role": "user", "content": "new"}])) == 2
    assert history.history_end(given([user])) == 0
    # The same content with and without ids has one digest: a client that strips ids still finds its session.
    assert history.digest([g.canon for g in given([user, reply])]) == history.digest([h.canon for h in session[:2]])


def test_output_saved_to_a_conversation_is_adopted_only_when_it_follows_its_items() -> None:
    current = held([("user", "hi")], [1])
    other = held([("user", "hi"), ("assistant", "hello")], [1, 1])
    saved = given([{"type": "message", "role": "assistant", "content": "hello"}])
    assert [h.id for h in history.adoptable(current, saved, other) or []] == ["art_1"]
    assert history.adoptable(held([("user", "bye")], [1]), saved, other) is None
    assert history.tail_of(saved, other) is not None and history.tail_of(saved, current) is None


def test_include_values_follow_the_policy() -> None:
    check_include([])
    check_include(list(VACUOUS_INCLUDES))
    for value in [*REFUSED_INCLUDES, "anything.else"]:
        with pytest.raises(BadParameter) as refused:
            check_include([value])
        assert refused.value.extra["param"] == "include"


def test_a_branch_copies_transitions_under_new_ids() -> None:
    def art(i: str, turn: int, start: int, end: int, **extra: Any) -> dict[str, Any]:
        return {"id": i, "turn": turn, "token_start": start, "token_end": end, "archived_by": None, "meta": {},
                "source_ids": [i], "kind": "user", "token_ids": list(range(start, end)), "created_at": None, **extra}

    arts = [art("a0", 0, 0, 3), art("a1", 1, 3, 5), art("a2", 1, 5, 9, kind="assistant", source_ids=["a1"]),
            art("a3", 2, 9, 12, meta={"copy_of": "a1"})]
    good = {"turn": 1, "token_offset": 9, "env_snapshot_id": None, "id": "ckp_1", "session_id": "s",
            "manifest_sha256": manifest_sha256((a["id"], a["token_start"], a["token_end"]) for a in arts[:3])}
    stale = {**good, "turn": 0, "id": "ckp_0", "manifest_sha256": "0" * 64}
    rows = Transitions(artifacts=arts[:3], edges=[{"session_id": "s", "parent_id": "a1", "child_id": "a2", "turn": 1}],
                       checkpoints=[stale, good], environments=[], fired=[])
    session, copied = branching._copy({"tenant_id": "t"}, {"seed": 3, "per_turn": {"1": {"a": 1}, "2": {"b": 2}}},
                                      ["a1", "a3"], rows, 1, "ses_b")
    ids = {a["id"] for a in copied.artifacts}
    assert len(ids) == 3 and not ids & {"a0", "a1", "a2"}
    assert all(a["session_id"] == "ses_b" and "created_at" not in a for a in copied.artifacts)
    reply = copied.artifacts[2]
    assert reply["source_ids"] == [copied.artifacts[1]["id"]]
    assert copied.edges == [{"session_id": "ses_b", "parent_id": copied.artifacts[1]["id"], "child_id": reply["id"],
                             "turn": 1}]
    assert [c["turn"] for c in copied.checkpoints] == [1]  # the stale one is not copied
    assert copied.checkpoints[0]["manifest_sha256"] == manifest_sha256(
        (a["id"], a["token_start"], a["token_end"]) for a in copied.artifacts)
    assert session["turns"] == 1 and session["token_count"] == 9 and session["epoch"] == 0
    assert session["sampling"] == {"seed": 3, "per_turn": {"1": {"a": 1}}}
    assert session["flagged_sources"] == [copied.artifacts[1]["id"]]
