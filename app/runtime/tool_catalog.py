"""Session tools: how the model calls them, how calls are named, and the built-in environment that answers some.

Call format (documented in README and in the prompt the model sees): anywhere in its reply the model writes

    <tool_call>{"name": "get_balance", "arguments": {}}</tool_call>

one block per call. Each parsed call becomes a `tool_call` artifact right after the reply (a zero-length token span:
the call's tokens are the reply's), with a deterministic id, `call_` + the first 24 hex digits of
SHA-256(transition, index, name, canonical arguments). A replay that makes the identical call at the same transition
therefore gets the same id, which is what deduplicates consequential calls across replays (the ledger is per
session, so ids need not differ between sessions; that they do not lets a counterfactual session be compared with
a forgotten one token for token).

Who answers a call:
- a *built-in* tool (`builtin: true`; names in BUILTINS) is executed by the server against the session's
  environment (a bank account and a calendar), deterministically, and its result is appended in the same transition
  as a `tool_result` observation; the environment's state is snapshotted at the end of every transition that
  changed it, so a replay restores exactly the state a call saw;
- any other declared tool is the client's: the call is pending (`pending_tool_calls`) until a `tool_result` input
  with its id arrives;
- an undeclared name is answered by the server with an error result, so the model sees its mistake.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

from app.registry import Registry
from app.tool_calls import ToolCall, canonical

ToolKind = Literal["read_only", "consequential"]

_CALL = re.compile(r"<tool_call>\s*(\{.*?\})\s*</tool_call>", re.DOTALL)
MAX_CALLS = 8  # per reply; more are ignored (a small model can loop)


def call_id(turn: int, index: int, name: str, arguments: Mapping[str, Any]) -> str:
    digest = hashlib.sha256(f"{turn}\n{index}\n{name}\n{canonical(arguments)}".encode()).hexdigest()
    return "call_" + digest[:24]


def parse_calls(turn: int, text: str) -> list[ToolCall]:
    """The calls in a reply, in order; a block that is not a JSON object with a string `name` is not a call."""
    calls: list[ToolCall] = []
    for match in _CALL.finditer(text):
        try:
            body = json.loads(match.group(1))
        except ValueError:
            continue
        if not isinstance(body, dict) or not isinstance(body.get("name"), str):
            continue
        arguments = body.get("arguments", {})
        if not isinstance(arguments, dict):
            arguments = {"value": arguments}
        index = len(calls)
        calls.append(ToolCall(call_id(turn, index, body["name"], arguments), body["name"], arguments))
        if len(calls) == MAX_CALLS:
            break
    return calls


def preamble(tools: Sequence[Mapping[str, Any]]) -> str:
    """The instruction block that tells the model its tools and the call format (transition 0)."""
    lines = ["You can call these tools. To call one, write exactly:",
             '<tool_call>{"name": "<tool name>", "arguments": {...}}</tool_call>', "Tools:"]
    for tool in tools:
        parameters = canonical(tool.get("parameters") or {"type": "object"})
        lines.append(f"- {tool['name']}: {tool.get('description', '')} Parameters: {parameters}")
    return "\n".join(lines)


# -- the built-in environment ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Builtin:
    name: str
    kind: ToolKind
    description: str
    parameters: dict[str, Any]


_NO_PARAMETERS: Final[dict[str, Any]] = {"type": "object", "properties": {}}
BUILTINS: Final[Registry[Builtin]] = Registry(
    "built-in tool",
    Builtin("get_balance", "read_only", "The account balance.", _NO_PARAMETERS),
    Builtin("list_transfers", "read_only", "Transfers made so far.", _NO_PARAMETERS),
    Builtin(
        "transfer", "consequential", "Send money from the account.",
        {"type": "object", "properties": {"to": {"type": "string"}, "amount": {"type": "number"}},
         "required": ["to", "amount"]},
    ),
    Builtin("list_events", "read_only", "Calendar events.", _NO_PARAMETERS),
    Builtin(
        "add_event", "consequential", "Add a calendar event.",
        {"type": "object", "properties": {"title": {"type": "string"}, "date": {"type": "string"}},
         "required": ["title", "date"]},
    ),
)


def execute_builtin(state: Mapping[str, Any], call: ToolCall) -> tuple[dict[str, Any], str]:
    """Run a built-in tool: (the new environment state, the result text). Pure and deterministic."""
    new = copy.deepcopy(dict(state))
    bank, calendar = new["bank"], new["calendar"]
    args = call.arguments
    if call.name == "get_balance":
        return new, f"balance: {bank['balance']:.2f} {bank['currency']}"
    if call.name == "list_transfers":
        return new, canonical(bank["transfers"])
    if call.name == "list_events":
        return new, canonical(calendar["events"])
    if call.name == "transfer":
        to, amount = args.get("to"), args.get("amount")
        if not isinstance(to, str) or not isinstance(amount, int | float) or amount <= 0:
            return new, "error: transfer needs a string `to` and a positive number `amount`"
        if amount > bank["balance"]:
            return new, "error: insufficient funds"
        bank["balance"] = round(bank["balance"] - float(amount), 2)
        bank["transfers"].append({"to": to, "amount": float(amount), "call_id": call.id})
        return new, f"sent {float(amount):.2f} {bank['currency']}; balance {bank['balance']:.2f}"
    if call.name == "add_event":
        title, date = args.get("title"), args.get("date")
        if not isinstance(title, str) or not isinstance(date, str):
            return new, "error: add_event needs string `title` and `date`"
        calendar["events"].append({"title": title, "date": date, "call_id": call.id})
        return new, f"added {title!r} on {date}"
    return new, f"error: unknown tool {call.name!r}"


def declared(tools: Sequence[Mapping[str, Any]], name: str) -> Mapping[str, Any] | None:
    return next((t for t in tools if t.get("name") == name), None)


def normalize(tools: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Declared tools as stored: a built-in takes its kind, description and parameters from BUILTINS (a declared
    kind that contradicts the built-in's is an error); any other tool defaults to read_only. ValueError on misuse."""
    out: list[dict[str, Any]] = []
    names: set[str] = set()
    for tool in tools:
        spec = dict(tool)
        name = str(spec["name"])
        if name in names:
            raise ValueError(f"tool {name!r} is declared twice")
        names.add(name)
        if spec.get("builtin"):
            if name not in BUILTINS:
                raise ValueError(f"no built-in tool {name!r}; built-ins: {', '.join(sorted(BUILTINS.names))}")
            builtin = BUILTINS.named(name)
            kind, description, parameters = builtin.kind, builtin.description, copy.deepcopy(builtin.parameters)
            if spec.get("kind") not in (None, kind):
                raise ValueError(f"the built-in {name!r} is {kind}")
            spec["kind"] = kind
            spec["description"] = spec.get("description") or description
            if spec.get("parameters") in (None, {"type": "object"}):
                spec["parameters"] = parameters
        else:
            spec["kind"] = spec.get("kind") or "read_only"
            spec["builtin"] = False
        out.append(spec)
    return out
