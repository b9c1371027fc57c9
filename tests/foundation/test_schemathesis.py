"""Schemathesis over openapi.yaml against the live server: every operation, every check that applies.

The run is schemathesis' own engine (what `st run` drives) on a fixed seed with derandomized generation and a small
budget per operation, so it is the same run every time and fits a busy 2-core machine. It fails on any 5xx, any
answer the spec does not declare (status, content type, headers, body, SSE events), any schema-valid request refused
and any schema-violating one accepted. A summary (operations, requests, failures by check) is printed (`-s`).

What the generated data is steered by, and why (`before_call` hook, positive cases only unless said otherwise):
- cost: a created session samples at most TOKEN_CAP tokens per reply and keeps a short prompt (any mode), turn
  inputs are cut to TEXT_CAP characters, OpenAI-compatible requests ask for at most TOKEN_CAP tokens of the served
  model, so generations on the real tiny model stay cheap; tool names in a session are made unique (the schema
  cannot say "unique by name": a repeated one answers 422);
- a listing's `cursor` is left out: it is an opaque token the API hands out (a string of the right alphabet the API
  did not issue answers 422, which no schema can tell apart);
- a session takes at most SESSION_TURNS turns; later ones go to an id no session has (404): the stateful phase
  follows the spec's links into the same session again and again, and near the model's 8k context each turn costs
  about a minute of prefill on a busy CPU (one seed grew a session to 8,199 tokens over 129 turns);
- turns carry no `tool_result` input: in a session with tools one must answer a pending call of the session (422
  otherwise, README), state no schema holds;
- a session's seed drawn as an integral float rounded past 2^63 - 1 is brought back into range;
- `PUT /v1/memory/{namespace}/{key}` sends If-Match or If-None-Match, not both (422: OpenAPI cannot say "one of two
  headers");
- detector webhooks are signed with the tenant's secret, so their bodies reach validation;
- a subject erasure carries no `also`: with a generated word (`"0"`) it queues a selective replay in every session
  of the tenant holding it, which the tiny model then works through for many minutes (tests/subjects covers it).
Text with a NUL or an unpaired surrogate is refused (422) on every field (README, Hardening) and is not generated.
"""

from __future__ import annotations

import base64
import collections
import hashlib
import hmac
import json
import time
from collections.abc import Iterator, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from schemathesis.config import SchemathesisConfig
from schemathesis.engine import events, from_schema
from schemathesis.generation.case import Case
from schemathesis.generation.modes import GenerationMode
from schemathesis.hooks import GLOBAL_HOOK_DISPATCHER, HookContext

from tests.support import BOOTSTRAP_KEY, ROOT, WEBHOOK_SECRET

SEED = 18
MAX_EXAMPLES = 4  # per operation and phase
GENERATING_EXAMPLES = 2  # for the operations that run the model (turns, compaction)
STATEFUL_STEPS = 4
TOKEN_CAP = 4
SESSION_TURNS = 8
UNKNOWN_SESSION = "ses_" + "0" * 26
TEXT_CAP = 64  # characters of a prompt's text (system prompt, tool descriptions, turn inputs)
CHECKS = (
    "not_a_server_error", "status_code_conformance", "content_type_conformance", "response_schema_conformance",
    "response_headers_conformance", "negative_data_rejection", "positive_data_acceptance", "missing_required_header",
    "unsupported_method", "allow_header_conformance", "use_after_free", "ensure_resource_availability",
    "ignored_auth",
)
# Business answers to a schema-valid request: unknown ids, busy sessions, memory preconditions (412/428). The
# OpenAI-compatible routes answer OpenAI's 400 to what they do not support (README: never a silent ignore).
ACCEPTED = ["2XX", 401, 404, 409, 412, 428]
COMPAT = r"^/v1/(models|conversations|responses|chat/completions)"


@dataclass
class Summary:
    operations: set[str] = field(default_factory=set)
    requests: collections.Counter[str] = field(default_factory=collections.Counter)
    elapsed: collections.Counter[str] = field(default_factory=collections.Counter)
    slowest: list[tuple[float, str]] = field(default_factory=list)
    failures: collections.Counter[str] = field(default_factory=collections.Counter)
    details: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def report(self) -> str:
        lines = [
            f"schemathesis {schemathesis.__version__ if hasattr(schemathesis, '__version__') else ''} seed={SEED}: "
            f"{len(self.requests)}/{len(self.operations)} operations, {sum(self.requests.values())} requests, "
            f"{sum(self.failures.values())} failures in {self.seconds:.0f} s",
            "failures by check: " + (", ".join(f"{k} {v}" for k, v in sorted(self.failures.items())) or "none"),
            *[f"  {n:4d} {self.elapsed[label]:6.1f} s  {label}" for label, n in sorted(self.requests.items())],
        ]
        slow = [f"  slow: {seconds:5.1f} s  {what}" for seconds, what in sorted(self.slowest, reverse=True)[:5]]
        return "\n".join(lines + slow + self.details + self.errors)


def _sign(body: bytes) -> dict[str, str]:
    msg_id, timestamp = "msg_" + hashlib.sha256(body).hexdigest()[:24], str(int(time.time()))
    key = base64.b64decode(WEBHOOK_SECRET.split("_", 1)[1])
    mac = hmac.new(key, f"{msg_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    signature = "v1," + base64.b64encode(mac).decode()
    return {"webhook-id": msg_id, "webhook-timestamp": timestamp, "webhook-signature": signature}


def _capped(body: dict[str, Any], names: tuple[str, ...], default: str) -> None:
    """Lower a token budget the schema allows (1-4096) to TOKEN_CAP; add one when none is given."""
    present = [n for n in names if type(body.get(n)) is int and 1 <= body[n] <= 4096]
    for name in present:
        body[name] = min(body[name], TOKEN_CAP)
    if not present and not any(n in body for n in names):
        body[default] = TOKEN_CAP


def _small_session(body: dict[str, Any]) -> None:
    """Any mode (a session a negative case manages to create must not cost much later): a reply samples at most
    TOKEN_CAP tokens, and the prompt stays short (a prompt near the 8k context takes tens of seconds to prefill on a
    busy CPU). Tool names are made unique: the schema cannot say "unique by name" (a repeated one answers 422)."""
    sampling = body.get("sampling", {})
    if isinstance(sampling, dict):
        _capped(sampling, ("max_tokens",), "max_tokens")
        body["sampling"] = sampling
    if isinstance(body.get("system_prompt"), str):
        body["system_prompt"] = body["system_prompt"][:TEXT_CAP]
    tools = body.get("tools")
    if isinstance(tools, list):
        seen: set[object] = set()
        kept = []
        for tool in tools:
            name = tool.get("name") if isinstance(tool, dict) else None
            if isinstance(name, str):
                if name in seen:
                    continue
                seen.add(name)
            if isinstance(tool, dict):
                if isinstance(tool.get("description"), str):
                    tool["description"] = tool["description"][:TEXT_CAP]
                if "parameters" in tool and len(json.dumps(tool["parameters"], default=str)) > TEXT_CAP:
                    tool["parameters"] = {"type": "object"}
            kept.append(tool)
        body["tools"] = kept[:2]


def steer(model: str) -> Any:
    """The `before_call` hook: what the module docstring lists, on positive cases only."""

    turns: collections.Counter[str] = collections.Counter()

    def before_call(context: HookContext, case: Case, kwargs: dict[str, Any]) -> None:
        path, method, body = case.operation.path, case.method.upper(), case.body
        if path == "/v1/sessions/{id}/turns" and isinstance(case.path_parameters, MutableMapping):
            session = str(case.path_parameters.get("id"))
            turns[session] += 1
            if turns[session] > SESSION_TURNS:
                case.path_parameters["id"] = UNKNOWN_SESSION
        if path == "/v1/sessions" and method == "POST" and isinstance(body, dict):
            _small_session(body)
        if case.meta is None or case.meta.generation.mode is not GenerationMode.POSITIVE:
            return
        if isinstance(case.query, MutableMapping):
            case.query.pop("cursor", None)
        if path == "/v1/memory/{namespace}/{key}" and method == "PUT" and isinstance(case.headers, MutableMapping):
            names = {n.lower(): n for n in case.headers}
            if "if-match" in names and "if-none-match" in names:
                del case.headers[names["if-none-match"]]
        if not isinstance(body, dict):
            return
        if path == "/v1/sessions" and method == "POST" and isinstance(body.get("sampling"), dict):
            seed = body["sampling"].get("seed")
            if isinstance(seed, float):  # an integral float the generator rounded past 2^63 - 1
                body["sampling"]["seed"] = min(int(seed), 2**63 - 1)
        if path == "/v1/sessions/{id}/turns" and isinstance(body.get("inputs"), list):
            inputs = [i for i in body["inputs"] if not (isinstance(i, dict) and i.get("type") == "tool_result")]
            for item in inputs:
                if isinstance(item, dict) and isinstance(item.get("content"), str):
                    item["content"] = item["content"][:TEXT_CAP]
            body["inputs"] = inputs
        elif path == "/v1/responses":
            body["model"] = model
            _capped(body, ("max_output_tokens",), "max_output_tokens")
        elif path == "/v1/chat/completions":
            body["model"] = model
            _capped(body, ("max_tokens", "max_completion_tokens"), "max_tokens")
        elif path.endswith("/erase") and path.startswith("/v1/subjects/"):
            body.pop("also", None)
            # The erasure is a job queued behind the replays other calls queued: answered at once (202), not
            # waited for (up to LETHE_FORGET_WAIT_S a call).
            body["wait"] = False
        elif path == "/v1/webhooks/detector":
            raw = json.dumps(body).encode()
            kwargs["data"] = raw
            headers = {n: v for n, v in (case.headers or {}).items() if not n.lower().startswith("webhook-")}
            case.headers = {**headers, **_sign(raw)}

    return before_call


def config(base_url: str) -> SchemathesisConfig:
    checks: dict[str, Any] = {name: {"enabled": True} for name in CHECKS}
    checks["positive_data_acceptance"] = {"enabled": True, "expected-statuses": ACCEPTED}
    # A schema-violating request is refused with a 4xx: 413 for a body over LETHE_MAX_BODY_BYTES.
    checks["negative_data_rejection"] = {"enabled": True, "expected-statuses": [400, 401, 404, 405, 413, 422, 428]}
    compat_checks = {**checks, "positive_data_acceptance": {"enabled": True, "expected-statuses": [*ACCEPTED, 400]}}
    return SchemathesisConfig.from_dict({
        "seed": SEED,
        "base-url": base_url,
        "headers": {"Authorization": f"Bearer {BOOTSTRAP_KEY}"},
        "workers": 1,
        "request-timeout": 300,  # a turn queued behind a forget's replay on 2 busy cores
        "suppress-health-check": ["too_slow", "filter_too_much", "data_too_large"],
        "generation": {
            "deterministic": True, "max-examples": MAX_EXAMPLES, "database": "none", "allow-x00": False,
            "codec": "utf-8",
        },
        "checks": {"enabled": True, **checks},
        "phases": {
            "examples": {"enabled": True}, "coverage": {"enabled": True}, "fuzzing": {"enabled": True},
            # The spec's own links only (sessions, turns, forget jobs, memory records): inferred ones also send a
            # conversation's id to the native turn route, where a reply samples the conversation's 256 tokens.
            "stateful": {"enabled": True, "max-steps": STATEFUL_STEPS, "inference": {"algorithms": []}},
        },
        "operations": [
            {"include-path-regex": COMPAT, "checks": compat_checks},
            {"include-path-regex": r"/(turns|compact)$", "generation": {"max-examples": GENERATING_EXAMPLES}},
        ],
    })


def run(base_url: str, model: str, spec: Path = ROOT / "openapi.yaml") -> Summary:
    """The whole run against the server at `base_url` (another spec file: to compare with an older one)."""
    schema = schemathesis.openapi.from_path(spec, config=config(base_url))
    summary = Summary(operations={op.ok().label for op in schema.get_all_operations()})
    hook = schemathesis.hook("before_call")(steer(model))
    started = time.monotonic()
    try:
        for event in from_schema(schema).execute():
            if isinstance(event, events.ScenarioFinished | events.FuzzScenarioFinished):
                _record(summary, event.recorder)
            elif isinstance(event, events.NonFatalError):
                summary.errors.append(f"error in {event.label}: {event.value!r}"[:2000])
            elif isinstance(event, events.FatalError):
                summary.errors.append(f"fatal: {event.exception!r}"[:2000])
    finally:
        GLOBAL_HOOK_DISPATCHER.unregister(hook)
        summary.seconds = time.monotonic() - started
    return summary


def _record(summary: Summary, recorder: Any) -> None:
    for case_id, interaction in recorder.interactions.items():
        node = recorder.cases.get(case_id)
        label = node.value.operation.label if node else recorder.label
        summary.requests[label] += 1
        if interaction.response is not None:
            summary.elapsed[label] += interaction.response.elapsed
            if interaction.response.elapsed > 5:
                request = interaction.request
                status = interaction.response.status_code
                sent = f"{request.method} {request.uri} {(request.body or b'')[:300]!r} -> {status}"
                summary.slowest.append((interaction.response.elapsed, sent))
    for case_id, checks in recorder.checks.items():
        for check in checks:
            if check.failure_info is None:
                continue
            summary.failures[check.name] += 1
            interaction = recorder.interactions.get(case_id)
            answer = interaction.response.content[:300] if interaction and interaction.response else b""
            summary.details.append(
                f"[{check.name}] {check.failure_info.failure.title}\n    {check.failure_info.code_sample[:1500]}"
                f"\n    => {answer!r}"
            )


@pytest.fixture
def served_model(client: httpx.Client) -> Iterator[str]:
    yield client.get("/v1/models").json()["data"][0]["id"]


def test_the_service_obeys_openapi_yaml(live_server: Any, served_model: str) -> None:
    summary = run(live_server.base_url, served_model)
    print("\n" + summary.report())
    assert not summary.errors, summary.errors
    assert not summary.failures, summary.report()
    untested = summary.operations - set(summary.requests)
    assert not untested, f"operations no request reached: {sorted(untested)}"
