"""A Responses `input` that resends a history (a client keeping its own transcript, the Agents SDK's tool loop and its
session store): which session holds that history, and what the request adds to it.

The history is the input up to its last model item (an assistant message or a `function_call`); what follows is the
request's own. Lethe continues only histories whose model items it sampled itself (as Chat Completions do, chat.py):
the item ids the client echoes (`art_...`, or an `item_reference`) find the session, and the history must then equal
that session's live items in order and content, whole transitions at a time (a history cut inside a transition names
no state the session ever had). What follows the history becomes:

- the transition's observations, when the session holds nothing after the history;
- nothing new, when the session's items after the history are exactly those items: a client that saves its input to
  a conversation before it asks for the reply (the Agents SDK's `OpenAIConversationsSession` does) gets the reply
  sampled after them, as a transition of its own;
- the observations of a *branch* holding the history's transitions (app/sessions/branching.py), when the session
  went on differently since: the client continues from where its history ends, and the session stays as it was.

The same matching tells whether items a client adds to a conversation are ones this server sampled (the Agents SDK
saves a response's output to its conversation): see `tail_of` and `adoptable`.

Clients do not always echo ids: the Agents SDK strips them from the assistant messages it resends and from every
item it saves to a conversation ("stale provider ids"). So each response also leaves a *head*: the SHA-256 of its
session's items up to its reply, in this canonical form, pointing at the session (the table Chat Completions use,
`openai_chat_heads`, under a digest of its own). A history, or a conversation's items plus what a client saves,
without ids is looked up by that digest; the content is then compared all the same. A head dies with the reply
artifact it ends on, so a forget that regenerates or deletes the reply takes the digest with it; it is ignored once
the session's epoch moved on.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from app.db.models import Artifact
from app.ids import has_prefix
from app.openai_compat.errors import BadParameter
from app.openai_compat.items import item_of, message_text
from app.tool_calls import canonical

Canon = tuple[str, ...]
MODEL_ITEMS = ("assistant", "function_call")


@dataclass(frozen=True)
class Given:
    """One input item as the client sent it: its canonical content (None: an `item_reference`), the id it carries."""

    index: int
    canon: Canon | None
    id: str | None
    raw: dict[str, Any]

    @property
    def is_model(self) -> bool:
        return self.canon is None or self.canon[0] in MODEL_ITEMS  # an item_reference names one of ours


@dataclass(frozen=True)
class Held:
    """One live item of a session: its canonical content, id and transition."""

    canon: Canon
    id: str
    turn: int
    item: dict[str, Any]


@dataclass(frozen=True)
class Match:
    """Where a history sits in a session: it ends with transition `turn`; `rest` is what the session holds after."""

    turn: int
    rest: list[Held]


def given(items: Sequence[Any], param: str, offset: int = 0) -> list[Given]:
    """Input items in canonical form (400 naming the first one this server cannot take)."""
    return [_given(item, f"{param}[{i}]", i) for i, item in enumerate(items, start=offset)]


def _given(item: Any, where: str, index: int) -> Given:
    if not isinstance(item, dict):
        raise BadParameter(where, f"{where} must be an object")
    kind = item.get("type", "message" if "role" in item else None)
    ident = item.get("id") if isinstance(item.get("id"), str) and has_prefix(item["id"], "art") else None
    if kind == "item_reference":
        if not isinstance(item.get("id"), str):
            raise BadParameter(f"{where}.id", "an item_reference needs the id of an item this server holds")
        return Given(index, None, item["id"], item)
    if kind == "message":
        extra = set(item) - {"type", "role", "content", "id", "status"}
        if extra:
            raise BadParameter(f"{where}.{sorted(extra)[0]}", "unsupported message field")
        role = item.get("role")
        if role == "user":
            return Given(index, ("user", message_text(item.get("content"), f"{where}.content")), ident, item)
        if role == "assistant":
            text = message_text(item.get("content"), f"{where}.content", output=True)
            return Given(index, ("assistant", text), ident, item)
        raise BadParameter(f"{where}.role", f"role {role!r} cannot appear here: system and developer messages open "
                           "the input (or go in `instructions`)")
    if kind == "function_call":
        call_id, name, arguments = item.get("call_id"), item.get("name"), item.get("arguments")
        if not (isinstance(call_id, str) and isinstance(name, str) and isinstance(arguments, str)):
            raise BadParameter(where, "a function_call needs string call_id, name and arguments")
        try:
            parsed = json.loads(arguments)
        except ValueError:
            raise BadParameter(f"{where}.arguments", "arguments must be a JSON document") from None
        return Given(index, ("function_call", call_id, name, canonical(parsed)), ident, item)
    if kind == "function_call_output":
        call_id, output = item.get("call_id"), item.get("output")
        if not isinstance(call_id, str) or not call_id or len(call_id) > 64:
            raise BadParameter(f"{where}.call_id", "call_id must be the id of a function_call (≤ 64 characters)")
        text = output if isinstance(output, str) else message_text(output, f"{where}.output")
        return Given(index, ("function_call_output", call_id, text), ident, item)
    raise BadParameter(f"{where}.type", f"unsupported item type {kind!r}: messages, function_call, "
                       "function_call_output and item_reference only")


def canon_of(item: dict[str, Any]) -> Canon:
    """A session item (items.item_of) in the canonical form of `given`."""
    kind = item["type"]
    if kind == "message":
        return (item["role"], "".join(part["text"] for part in item["content"]))
    if kind == "function_call":
        return ("function_call", item["call_id"], item["name"], canonical(json.loads(item["arguments"])))
    return ("function_call_output", item["call_id"], item["output"])


def held(rows: Sequence[Artifact]) -> list[Held]:
    out = []
    for row in rows:
        item = item_of(row) if row.archived_by is None else None
        if item is not None:
            out.append(Held(canon_of(item), row.id, row.turn, item))
    return out


def history_end(items: Sequence[Given]) -> int:
    """How many leading items make the history: up to and including the last model item (0: none)."""
    return max((g.index - items[0].index + 1 for g in items if g.is_model), default=0) if items else 0


def anchor(items: Sequence[Given]) -> str | None:
    """An id that finds the session holding the history: the newest the client echoed."""
    return next((g.id for g in reversed(items) if g.id is not None), None)


def _same(g: Given, h: Held) -> bool:
    if g.canon is None:  # an item_reference: the item it names, here
        return g.id == h.id
    return g.canon == h.canon and (g.id is None or g.id == h.id)


def match(history: Sequence[Given], session_items: Sequence[Held]) -> Match | None:
    """The history as the session's first items, whole transitions (None: the session does not hold it)."""
    k = len(history)
    if k == 0 or len(session_items) < k:
        return None
    if not all(_same(g, h) for g, h in zip(history, session_items, strict=False)):
        return None
    turn = session_items[k - 1].turn
    rest = list(session_items[k:])
    if rest and rest[0].turn == turn:
        return None  # the history stops inside a transition
    return Match(turn, rest)


def already_added(new: Sequence[Given], rest: Sequence[Held]) -> bool:
    """The session's items after the history are exactly the request's new items (saved ahead of the reply)."""
    return bool(rest) and len(rest) == len(new) and all(_same(g, h) for g, h in zip(new, rest, strict=True))


def tail_of(items: Sequence[Given], session_items: Sequence[Held]) -> list[Held] | None:
    """Items a client adds to a conversation that are already its newest items (a response's output, saved by the
    client after the response ran in the conversation's session): the held items; None otherwise."""
    n = len(items)
    if n == 0 or len(session_items) < n:
        return None
    tail = list(session_items[-n:])
    return tail if all(_same(g, h) for g, h in zip(items, tail, strict=True)) else None


def adoptable(current: Sequence[Held], added: Sequence[Given], other: Sequence[Held]) -> list[Held] | None:
    """A conversation whose session holds only observations (`current`), to which a client adds a response's output
    (`added`) sampled in the response's own session (`other`): when `other` holds exactly the conversation's items
    followed by the added ones, the conversation can take `other` as its session. The held items added, or None."""
    if any(h.canon[0] in MODEL_ITEMS for h in current) or len(other) != len(current) + len(added):
        return None
    if [h.canon for h in other[: len(current)]] != [h.canon for h in current]:
        return None
    tail = list(other[len(current):])
    return tail if all(_same(g, h) for g, h in zip(added, tail, strict=True)) else None


def digest(canons: Sequence[Canon | None]) -> str | None:
    """The head digest of items in canonical form (None when one is an item_reference: it has no content here)."""
    if any(c is None for c in canons):
        return None
    text = json.dumps(["responses", *canons], separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()
