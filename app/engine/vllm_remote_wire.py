"""What a `vllm serve` fleet answers, read: its HTTP errors as Lethe's, a completion's choice and usage, and a
verifying completion in the shapes `vllm_verify.greedy` reads off an in-process `RequestOutput`.

A verifying completion (vllm_verify.py) asks `prompt_logprobs` and the top two `logprobs` of each sampled token, with
token ids instead of strings (`return_tokens_as_token_ids`), and `lethe_read_prefix_cache` in `vllm_xargs`: with
Lethe's vLLM plugin installed beside the fleet's vLLM (vllm_plugin.py) the request still reads the prefix cache, so
only the draft and the log's uncached tail are computed. `usage.prompt_tokens_details.cached_tokens` says how much
the cache served, which is the check vllm_verify makes: no draft position may come from it.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from app.engine.protocol import TokenUsage
from app.engine.vllm_plugin import READ_PREFIX_CACHE
from app.engine.vllm_verify import TOP
from app.errors import EngineUnavailable

log = logging.getLogger(__name__)

# What a 503 asks a client to wait: about what vllm-router takes to drop a dead worker with the health settings the
# README gives (a check per second, two failures), after which the retry lands on a worker that lives.
RETRY_AFTER_S = 2
_TOKEN_ID = "token_id:"  # how `return_tokens_as_token_ids` names a token in `top_logprobs`


class RemoteEngineError(RuntimeError):
    """The fleet answered, but not with a usable completion."""


async def send(request: Awaitable[httpx.Response]) -> httpx.Response:
    """The fleet's answer. A connection that fails or breaks (a worker or the router died under the request, or
    never answered within the timeout) raises EngineUnavailable."""
    try:
        return await request
    except httpx.TransportError as exc:
        raise EngineUnavailable(
            f"the vllm fleet went away under the request ({type(exc).__name__})", retry_after_s=RETRY_AFTER_S
        ) from exc


async def answer(response: httpx.Response) -> dict[str, Any]:
    """The JSON object a fleet request answered. A 5xx (the router found no live worker, or lost the one it sent the
    request to) raises EngineUnavailable; a 4xx is a request the fleet rejects (ValueError)."""
    if response.status_code >= 400:
        detail = response.text[:500]
        if response.status_code < 500:
            raise ValueError(f"the vllm fleet rejected the request ({response.status_code}): {detail}")
        # The router's text names its workers' addresses: it goes to the log, not to the client.
        log.warning("the vllm fleet failed a request (%s): %s", response.status_code, detail)
        raise EngineUnavailable(
            f"the vllm fleet failed the request ({response.status_code})", retry_after_s=RETRY_AFTER_S
        )
    body = response.json()
    if not isinstance(body, dict):
        raise RemoteEngineError("the vllm fleet answered with something other than a JSON object")
    return body


def first_choice(body: dict[str, Any]) -> dict[str, Any]:
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise RemoteEngineError("the vllm fleet returned no choice")
    return choices[0]


def usage_of(body: dict[str, Any], prompt: int) -> TokenUsage:
    """What the fleet computed and reused of a `prompt`-token request: `reused + prefilled == prompt` always (a fleet
    that reports more cached tokens than the prompt holds is taken at the prompt's length, never a negative)."""
    reused = min(prompt, _cached(body))
    return TokenUsage(reused=reused, prefilled=prompt - reused)


def verifying(ask_prompt: bool) -> dict[str, Any]:
    """The fields a verifying completion adds to a greedy one (`ask_prompt`: the prompt's logprobs too)."""
    fields: dict[str, Any] = {"logprobs": TOP, "return_tokens_as_token_ids": True}
    if ask_prompt:
        fields |= {"prompt_logprobs": TOP, "vllm_xargs": {READ_PREFIX_CACHE: 1}}
    return fields


@dataclass(frozen=True)
class Logprob:
    rank: int
    logprob: float


Row = Mapping[int, Logprob]


@dataclass(frozen=True)
class Completion:
    token_ids: list[int]
    logprobs: list[Row] | None
    finish_reason: str | None
    stop_reason: int | str | None


@dataclass(frozen=True)
class Output:
    """A verifying completion as vllm_verify reads a `RequestOutput`."""

    num_cached_tokens: int
    prompt_logprobs: list[Row | None] | None
    outputs: list[Completion]


def output(body: dict[str, Any]) -> Output:
    choice = first_choice(body)
    sampled = choice.get("token_ids")
    if not isinstance(sampled, list):
        raise RemoteEngineError("the fleet returned no token_ids: it must support return_token_ids")
    prompt = choice.get("prompt_logprobs")
    tops = (choice.get("logprobs") or {}).get("top_logprobs")
    completion = Completion(
        [int(t) for t in sampled], None if tops is None else [_ranked(top or {}) for top in tops],
        choice.get("finish_reason"), choice.get("stop_reason"),
    )
    return Output(
        _cached(body),
        None if prompt is None else [None if row is None else _prompt_row(row) for row in prompt],
        [completion],
    )


def _cached(body: dict[str, Any]) -> int:
    details = (body.get("usage") or {}).get("prompt_tokens_details") or {}
    return max(0, int(details.get("cached_tokens") or 0))


def _prompt_row(row: Mapping[str, Any]) -> Row:
    """One prompt position's logprobs as vLLM answers them: {"<id>": {"logprob", "rank", ...}}."""
    return {int(token): Logprob(int(entry["rank"]), float(entry["logprob"])) for token, entry in row.items()}


def _ranked(top: Mapping[str, float]) -> Row:
    """A sampled token's `top_logprobs` ({"token_id:<id>": logprob}, the sampled token among them): ranked by
    logprob, as the top `TOP` of the distribution are."""
    ordered = sorted(((int(name.removeprefix(_TOKEN_ID)), float(lp)) for name, lp in top.items()),
                     key=lambda item: -item[1])
    return {token: Logprob(rank, lp) for rank, (token, lp) in enumerate(ordered, start=1)}
