"""What both vLLM engines need and nothing of vLLM itself: the cache salt and seed as vLLM takes them, and turning a
finished completion into a `Generation` with the hf engine's conventions.
The in-process engine (vllm_local.py) and the remote one (vllm_remote.py, a `vllm serve` fleet over HTTP) share it."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Collection, Sequence
from typing import Any, Literal

from app.engine.protocol import ChatTemplate, Generation, Sampling, TokenUsage
from app.engine.sampling import find_stop

_SEED_SPACE = 1 << 63  # vLLM (and its HTTP API) take a signed 64-bit seed

# The entry of vLLM's `additional_config` (`--additional-config` of `vllm serve`) that vllm_scheduler.py reads: the
# most tokens a step may schedule while only live work is in the engine.
LIVE_STEP_TOKENS_KEY = "lethe_live_step_tokens"


def cache_salt(salt: str | None) -> str | None:
    """The vLLM `cache_salt` for a handle's salt (per session in the runtime: runtime/salts.py): a fixed-length digest.

    vLLM accepts at most 128 characters without '/', '@', '\\' or NUL; a digest satisfies that for any salt and
    keeps tenant and session identifiers out of a remote fleet's logs. None stays None: handles without a salt share
    blocks.
    """
    if salt is None:
        return None
    return "lethe-" + hashlib.sha256(salt.encode()).hexdigest()[:40]


def batch_invariant_requested() -> bool:
    """Whether `VLLM_BATCH_INVARIANT` asks vLLM for batch-invariant kernels, read as vLLM reads it (an integer)."""
    try:
        return bool(int(os.environ.get("VLLM_BATCH_INVARIANT", "0")))
    except ValueError:
        return False  # vLLM itself would refuse to start on such a value


def vllm_seed(seed: int) -> int:
    """Sampling.seed mapped into vLLM's signed 64-bit range, as sampling.make_generator maps it into torch's."""
    return seed % _SEED_SPACE


def check_ids(token_ids: Sequence[int], vocab_size: int) -> None:
    if token_ids and (min(token_ids) < 0 or max(token_ids) >= vocab_size):
        raise ValueError(f"token ids must lie in [0, {vocab_size})")


def sampling_params(sampling: Sampling, stop_token_ids: Collection[int], max_tokens: int | None = None) -> Any:
    """vLLM's SamplingParams for `sampling` (the in-process engine; the remote one sends the same fields as JSON)."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    return SamplingParams(
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        max_tokens=max_tokens or sampling.max_tokens,
        stop=list(sampling.stop) or None,
        stop_token_ids=sorted(stop_token_ids),
        seed=vllm_seed(sampling.seed),
        skip_special_tokens=False,  # stop strings are matched on the same text ChatMLTemplate.decode gives
        output_kind=RequestOutputKind.FINAL_ONLY,  # one result per request, not one per token
    )


def to_generation(
    chat: ChatTemplate,
    sampling: Sampling,
    sampled: list[int],
    finish_reason: str | None,
    stop_reason: int | str | None,
    usage: TokenUsage,
) -> Generation:
    """A `Generation` from vLLM's completion, with the hf engine's conventions.

    vLLM keeps the stop *token* (EOS or a stop_token_id) at the end of `token_ids`; the protocol excludes it from the
    result and the log. A stop *string* keeps its tokens (they are in the log, as in hf) but is cut from the text.
    """
    if finish_reason not in ("stop", "length"):
        raise RuntimeError(f"vllm finished the request with {finish_reason!r}")
    finish: Literal["stop", "length"] = "stop" if finish_reason == "stop" else "length"
    token_ids = list(sampled)
    if finish == "stop" and not isinstance(stop_reason, str) and token_ids and token_ids[-1] in chat.stop_token_ids:
        token_ids.pop()
    text = chat.decode(token_ids)
    stop_at = find_stop(text, sampling.stop) if sampling.stop else None
    return Generation(
        token_ids=token_ids,
        text=text if stop_at is None else text[:stop_at],
        finish_reason=finish,
        usage=TokenUsage(reused=usage.reused, prefilled=usage.prefilled, decoded=len(sampled)),
    )


def queue_wait(output: Any) -> float | None:
    """Seconds a finished in-process request waited in vLLM's queue before the step that first scheduled it (the
    engine core's timestamps, kept by vllm_stats.py); None where vLLM kept none."""
    stats = getattr(output, "metrics", None)
    queued, scheduled = getattr(stats, "queued_ts", 0.0), getattr(stats, "scheduled_ts", 0.0)
    if not queued or not scheduled:
        return None
    return max(0.0, float(scheduled) - float(queued))
