"""Greedy verification on the in-process vLLM engine: a replay's recorded reply (the *draft*) checked in one request
instead of decoded again token by token (verify.py says why a decision must be certified, and how).

One request carries the log and the draft as its prompt, with `prompt_logprobs=2`: for each draft position vLLM
answers the two most likely tokens of the distribution that chose it, with their logprobs (a logprob gap is the logit
gap: log-softmax shifts a row by one constant). A decision is certified when the top two are further apart than
`verify.GREEDY_MARGIN`, the bound measured for the hf engine, which holds here with room to spare (docs/engines.md).
The draft is accepted while its decisions are certified and agree with it. The request's one generated token is the
decision after the whole draft, normally the reply's stop token, read with its top two logprobs too. A certified
disagreement, or a draft accepted whole whose next decision is no stop, decodes on from there in a second request,
every decision still certified (its prefix's KV came from a prefill, not decode steps). Anything uncertified answers
None, and the engine decodes the reply from the log as if there were no draft: the result is always decoding's.

vLLM turns prefix-cache reads off for a request that asks for prompt logprobs, which would be missing at cached
positions. This one needs them only past the log, so it turns reads back on (`skip_reading_prefix_cache=False`) and
checks that the cache served nothing past the log's last token: a decision whose logits were not computed cannot be
verified. The completions API of `vllm serve` has no such field, so a fleet would recompute the whole log for every
verification: the remote engine decodes instead.

Greedy only: a seeded vLLM sample comes from vLLM's own generator, whose stream a verification cannot keep aligned.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

from app.engine import verify
from app.engine.protocol import ChatTemplate, Generation, Sampling, TokenUsage
from app.engine.vllm_common import to_generation

TOP = 2  # logprobs per position: the chosen token and the one a perturbation could put above it

# (prompt token ids, max tokens, whether to ask prompt logprobs) -> vLLM's finished RequestOutput and the request's
# usage. The engine's own request: it accounts the usage and records what the cache now holds.
Request = Callable[[list[int], int, bool], Awaitable[tuple[Any, TokenUsage]]]


@dataclass(frozen=True)
class Verified:
    """A reply computed from a draft, in vLLM's terms (a stop token last, as a completion holds it)."""

    sampled: list[int]
    finish_reason: str | None
    stop_reason: int | str | None
    verified: int  # decisions accepted from the draft (its stop token included)
    decoded: int  # decisions decoded after the draft's end or a disagreement
    usages: list[TokenUsage]  # the requests', in order


def decision(row: Mapping[int, Any] | None) -> tuple[int, bool] | None:
    """The greedy choice of one position's top logprobs, and whether it is certified; None without logprobs."""
    if not row:
        return None
    ranked = sorted(row.items(), key=lambda item: item[1].rank)
    best, runner_up = ranked[0], ranked[1] if len(ranked) > 1 else None
    if best[1].rank != 1:
        return None
    gap = float("inf") if runner_up is None else float(best[1].logprob) - float(runner_up[1].logprob)
    return best[0], gap > verify.GREEDY_MARGIN


async def greedy(
    request: Request, sampling: Sampling, log_ids: list[int], draft: list[int] | None, room: int,
    stop_ids: Collection[int],
) -> Verified | None:
    """`draft` verified after `log_ids`, within `room` tokens. None, having asked nothing, without a draft or unless
    the sampling is greedy without stop strings (they end a reply mid-token); None, too, when a decision cannot be
    certified."""
    if not draft or sampling.temperature != 0 or sampling.stop:
        return None
    draft = draft[:room]
    first, usage = await request([*log_ids, *draft], 1, True)
    if int(first.num_cached_tokens or 0) > len(log_ids) - 1 or first.prompt_logprobs is None:
        return None  # a draft position's logits came from the cache, not from this request
    rows = [*first.prompt_logprobs[len(log_ids) :], _generated_row(first)]
    accepted = 0
    for position, row in enumerate(rows):
        if position == room:  # the whole room accepted: decoding would sample no more, not even a stop token
            return Verified(list(draft), "length", None, accepted, 0, [usage])
        decided = decision(row)
        if decided is None or not decided[1]:
            return None
        token = decided[0]
        if position == len(draft):  # the decision after the whole draft
            if token in stop_ids:
                return Verified([*draft, token], "stop", None, len(draft) + 1, 0, [usage])
            break
        if token != draft[position]:
            break
        accepted += 1
    return await _decode_on(request, log_ids, draft[:accepted], room, usage)


async def _decode_on(
    request: Request, log_ids: list[int], accepted: list[int], room: int, first: TokenUsage
) -> Verified | None:
    """Decode the rest after the accepted prefix, each decision certified."""
    rest, usage = await request([*log_ids, *accepted], room - len(accepted), False)
    completion = rest.outputs[0]
    for row in completion.logprobs or []:
        decided = decision(row)
        if decided is None or not decided[1]:
            return None
    sampled = list(completion.token_ids)
    return Verified(
        [*accepted, *sampled], completion.finish_reason, completion.stop_reason, len(accepted), len(sampled),
        [first, usage],
    )


def generation(chat: ChatTemplate, sampling: Sampling, done: Verified, drafted: int) -> Generation:
    """The `Generation` of a verified reply. `prefilled` leaves out the draft's positions (`drafted`), which the
    verification computed and `verified` counts, so prefilled + decoded + verified stays the work done."""
    computed = to_generation(chat, sampling, done.sampled, done.finish_reason, done.stop_reason, TokenUsage())
    prefilled = max(0, sum(u.prefilled for u in done.usages) - drafted)
    usage = TokenUsage(reused=done.usages[0].reused, prefilled=prefilled, decoded=done.decoded, verified=done.verified)
    return Generation(computed.token_ids, computed.text, computed.finish_reason, usage)


def _generated_row(output: Any) -> Mapping[int, Any] | None:
    completion = output.outputs[0]
    return completion.logprobs[0] if completion.logprobs else None
