"""The embedded KV engine: transformers on CPU with one explicit `DynamicCache` per handle.

Exactness rests on one invariant: a handle's resident cache always equals what replaying its recorded *chunks* (the
sizes of the forward passes that built it, decode steps included as chunks of one) over its log would produce, bit
for bit. The same forward over the same cached prefix is deterministic, while the same tokens split into other
chunks differ in the last float bits (measured: KV differs by ~1e-5 between one 300-token pass and 100+200). Hence:

- an evicted cache is rebuilt by replaying the recorded chunks, not in one pass, so residency never changes a token;
- `crop` to a chunk boundary is a slice of every layer (views, no copies); `crop` inside a chunk keeps only the
  chunks before it, and the rest of the cut chunk becomes pending log tokens, prefilled (and counted) by the next call;
- logits missing after a crop are recomputed by re-running the last chunk on the same prefix, which reproduces them.

A generation that ends on `max_tokens` or a stop string leaves its last token pending (its KV is not needed to decide
anything yet); the next prefill forwards it together with the new tokens, in the same way in a run and in its replay.

All model work runs on one worker thread behind a lock, so `async` methods never block the loop and calls on
different handles serialize. The thread serves calls by the priority of the task that made them (a forget's replay
before live turns, app/engine/priority.py), and a generation yields between two decode steps to more urgent work,
resuming later exactly where it stopped (hf_scheduler.py says why that changes no token). A call whose caller is
cancelled still completes on the worker once started, so the handle stays consistent and only its answer is lost; a
cancelled *generation* stops sampling at its next token (a client that hung up, a shutdown), leaving the tokens
sampled so far on the log for the caller to crop. `close` stops a running generation the same way before it unloads,
so shutting down never waits for a long reply to finish.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from itertools import count
from pathlib import Path
from typing import Any, TypeVar

import torch

from app.engine import hf_cache
from app.engine.cache_pool import CachePool
from app.engine.chat import ChatMLTemplate
from app.engine.hf_generation import Generating
from app.engine.hf_load import load_full_attention_lm
from app.engine.hf_scheduler import PriorityWorker, Steps, Work
from app.engine.hf_state import HandleState
from app.engine.model_store import model_id_for
from app.engine.priority import Priority, current_priority, note_wait
from app.engine.protocol import CacheHandle, ChatTemplate, Exactness, Generation, Sampling, TokenSink, TokenUsage
from app.engine.sampling import validate

T = TypeVar("T")
log = logging.getLogger(__name__)

DEFAULT_MEMORY_BUDGET = 2 << 30  # bytes of resident KV; SmolLM2-135M holds ~46 KB per token, so ~46k tokens


class HFEngine(Generating):
    """KVEngine over a local transformers causal LM with a ChatML template (SmolLM2 by default)."""

    name = "hf"

    def __init__(
        self,
        model: str | None = None,
        cache_dir: Path = Path(".lethe/models"),
        *,
        memory_budget_bytes: int = DEFAULT_MEMORY_BUDGET,
        num_threads: int | None = None,
    ) -> None:
        self.model_id = model_id_for(model)
        self._model_arg = model
        self._cache_dir = cache_dir
        # All cores by default: the engine is the only heavy compute of the process (2 on the build machines).
        self._num_threads = num_threads or max(1, len(os.sched_getaffinity(0)))
        self._pool = CachePool[HandleState](memory_budget_bytes)
        self._worker = PriorityWorker("lethe-hf")
        self._lock = threading.Lock()
        self._serials = count(1)
        self._model: Any = None
        self._chat: ChatMLTemplate | None = None
        self._max_positions: int | None = None
        self._closed = False
        self._closing = threading.Event()  # set by close(): any running generation stops at its next token

    # -- lifecycle ------------------------------------------------------------------------------------------------

    @property
    def chat(self) -> ChatTemplate:
        if self._chat is None:
            # AttributeError, not RuntimeError: `isinstance(engine, KVEngine)` probes members with hasattr (3.11),
            # which must answer False for an unstarted engine rather than raise.
            raise AttributeError("the hf engine is not started: its tokenizer loads in start()")
        return self._chat

    @property
    def ready(self) -> bool:
        return self._model is not None and not self._closed

    @property
    def max_context_tokens(self) -> int | None:
        return self._max_positions

    @property
    def records_chunks(self) -> bool:
        return True  # module docstring: the same tokens in other chunks differ in the last float bits

    @property
    def rereads_replies(self) -> bool:
        return True  # a generation leaves its reply pending for the closing (hf_generation.py)

    @property
    def threads(self) -> int:
        """Threads of its forward passes (LETHE_HF_THREADS, else every core the process may run on)."""
        return self._num_threads

    @property
    def exactness(self) -> Exactness:
        return "exact"  # one forward at a time, caches rebuilt chunk for chunk (module docstring)

    @property
    def memory_budget_bytes(self) -> int:
        return self._pool.budget

    @memory_budget_bytes.setter
    def memory_budget_bytes(self, value: int) -> None:
        self._pool.budget = value  # takes effect at the next call that touches a cache

    async def start(self) -> None:
        if self._closed:
            raise RuntimeError("a closed engine cannot start again; build a new one")
        if self._model is None:
            await self._run(self._load, compute=False, priority=Priority.LIVE)

    async def close(self) -> None:
        if self._closed:
            return
        self._closing.set()
        # The least urgent, so queued calls finish first (a paused generation sees `_closing` and stops at once).
        await self._run(self._unload, compute=False, priority=Priority.LIVE)
        self._closed = True
        self._worker.shutdown()

    def _load(self) -> None:
        if self._model is not None:  # a second start() queued behind the first
            return
        started = time.perf_counter()
        torch.set_num_threads(self._num_threads)  # on the worker thread, where every forward runs
        loaded = load_full_attention_lm(self._model_arg, self._cache_dir)
        self._chat, self._max_positions, self.model_id = loaded.chat, loaded.max_positions, loaded.model_id
        self._model = loaded.model
        log.info(
            "hf engine ready: %s from %s in %.1f s (%d threads, %d MiB KV budget)",
            self.model_id,
            loaded.path,
            time.perf_counter() - started,
            self._num_threads,
            self._pool.budget >> 20,
        )

    def _unload(self) -> None:
        self._pool.evict_all()
        self._model = None

    async def _run(
        self, fn: Callable[[], T], *, handle: CacheHandle | None = None, compute: bool = True,
        priority: Priority | None = None,
    ) -> T:
        """`fn` on the worker thread, at the calling task's priority (or `priority`)."""
        level = current_priority() if priority is None else priority
        context = partial(self._step_context, compute)
        return await self._finished(self._worker.submit_call(fn, priority=level, key=handle, context=context))

    async def _run_steps(self, steps: Steps[T], handle: CacheHandle) -> T:
        """A call in steps (a generation) on the worker thread: it may pause between two for more urgent work."""
        context = partial(self._step_context, True)
        return await self._finished(self._worker.submit_steps(
            steps, priority=current_priority(), key=handle, context=context
        ))

    @staticmethod
    async def _finished(work: Work[T]) -> T:
        # A caller cancelled while the call is queued takes it out of the queue (the future is cancelled first).
        result = await asyncio.wrap_future(work.future)
        note_wait(work.waited_s)
        return result

    @contextmanager
    def _step_context(self, compute: bool) -> Iterator[None]:
        # Entered around every step, never across one: a paused generation must not leave inference mode (a
        # thread-local) on for the calls that run meanwhile. The lock guards the model and the caches against anyone
        # calling the worker functions directly; the one worker thread already serializes the engine's own calls.
        # Loading runs outside inference mode, so the weights stay ordinary tensors.
        with self._lock, torch.inference_mode(compute):
            yield

    # -- the KVEngine calls -----------------------------------------------------------------------------------------

    async def open(
        self,
        session_key: str,
        *,
        salt: str | None = None,
        tokens: list[int] | None = None,
        chunks: list[int] | None = None,
    ) -> CacheHandle:
        """`chunks` (an extension of the protocol): the recipe `chunks(handle)` reported for a prefix of `tokens`,
        e.g. stored across a restart; the cache is then rebuilt in those chunks, bit for bit. Without it the stored
        log is prefilled in one pass, which may differ in the last float bits from the run that built it."""
        # No cache is shared between handles except through fork, so the tenant salt has nothing to isolate here.
        handle = CacheHandle(session_key=session_key, salt=salt, tokens=list(tokens or []))
        if chunks:
            if any(size <= 0 for size in chunks) or sum(chunks) > len(handle.tokens):
                raise ValueError("chunks must be positive sizes covering at most the log")
            state = handle.state = HandleState(self, next(self._serials))
            state.chunks, state.covered = list(chunks), handle.tokens[: sum(chunks)]  # not resident: rebuilt on use
        return handle

    async def prefill(self, handle: CacheHandle, token_ids: list[int]) -> TokenUsage:
        return await self._run(partial(self._prefill, handle, list(token_ids)), handle=handle)

    async def generate(
        self, handle: CacheHandle, sampling: Sampling, on_tokens: TokenSink | None = None,
        *, draft: list[int] | None = None,
    ) -> Generation:
        validate(sampling)
        stop = threading.Event()
        try:
            steps = self._generate(handle, sampling, on_tokens, stop, None if draft is None else list(draft))
            return await self._run_steps(steps, handle)
        except asyncio.CancelledError:
            stop.set()  # the worker sees it at the next token; the caller crops what was sampled
            raise

    async def crop(self, handle: CacheHandle, n_tokens: int) -> None:
        if not 0 <= n_tokens <= len(handle.tokens):
            raise ValueError(f"crop to {n_tokens} tokens: the log holds {len(handle.tokens)}")
        await self._run(partial(self._crop, handle, n_tokens), handle=handle)

    async def fork(self, handle: CacheHandle, session_key: str) -> CacheHandle:
        return await self._run(partial(self._fork, handle, session_key), handle=handle)

    async def release(self, handle: CacheHandle) -> None:
        await self._run(partial(self._release, handle), handle=handle)

    # -- introspection (tests, benchmarks, metrics); call while no operation on the handle is in flight ------------

    def is_resident(self, handle: CacheHandle) -> bool:
        state = handle.state
        return isinstance(state, HandleState) and state.cache is not None

    def chunks(self, handle: CacheHandle) -> list[int]:
        state = handle.state
        return list(state.chunks) if isinstance(state, HandleState) else []

    def resalt(self, handle: CacheHandle, salt: str | None) -> None:
        handle.salt = salt  # no cache is shared between handles: the salt isolates nothing here

    def kv_tensors(self, handle: CacheHandle) -> list[tuple[torch.Tensor, torch.Tensor]]:
        state = handle.state
        if not isinstance(state, HandleState) or state.cache is None:
            raise ValueError("the handle has no resident cache")
        return [(layer.keys, layer.values) for layer in state.cache.layers]

    # -- worker-thread implementations ------------------------------------------------------------------------------

    def _session(self, handle: CacheHandle, closing: list[int] | None = None) -> HandleState:
        """The handle's state, its cache cut back to what the log still agrees on. `closing`: the tokens the caller is
        about to add, which a verification may have forwarded already (hf_generation.py: the closing computed ahead
        of the log); that chunk is kept when they are what comes next, and dropped by any other call."""
        if self._model is None:
            raise RuntimeError("the hf engine is not started")
        state = handle.state
        if state is None:  # a handle built by the caller from a stored log: everything is pending
            state = handle.state = HandleState(self, next(self._serials))
        if not isinstance(state, HandleState) or state.owner is not self:
            raise ValueError(f"handle {handle.session_key!r} belongs to another engine")
        n = len(state.covered)
        # Adopted only when the closing is exactly the chunk ahead: a longer one is one chunk with the reply.
        log = handle.tokens + closing if closing and n == len(handle.tokens) + len(closing) else handle.tokens
        if log[:n] != state.covered:
            # The caller edited the log: the cache may stand only for the part both still agree on.
            common = next((i for i, (a, b) in enumerate(zip(handle.tokens, state.covered, strict=False)) if a != b), n)
            hf_cache.truncate(self._model, self._pool, state, min(common, len(handle.tokens)))
        return state

    def _check_room(self, n_tokens: int) -> None:
        if self._max_positions is not None and n_tokens > self._max_positions:
            raise ValueError(f"the log would hold {n_tokens} tokens; the model's context is {self._max_positions}")

    def _prefill(self, handle: CacheHandle, token_ids: list[int]) -> TokenUsage:
        state = self._session(handle, closing=token_ids)
        self._check_room(len(handle.tokens) + len(token_ids))
        # A closing a verification computed ahead (`_session`) counts its own tokens here, as a closing does; the
        # reply before them was counted once, as verified.
        ahead = max(0, len(state.covered) - len(handle.tokens)) if state.cache is not None else 0
        prefilled = hf_cache.make_resident(self._model, self._pool, state)
        pending = (handle.tokens + token_ids)[len(state.covered) :]
        if pending:
            prefilled += hf_cache.forward(self._model, self._pool, state, pending)
        handle.tokens.extend(token_ids)
        hf_cache.settle(self._pool, state)
        computed = prefilled + ahead
        return TokenUsage(reused=len(handle.tokens) - computed, prefilled=computed)

    def _crop(self, handle: CacheHandle, n_tokens: int) -> None:
        state = self._session(handle)
        del handle.tokens[n_tokens:]
        hf_cache.truncate(self._model, self._pool, state, n_tokens)

    def _fork(self, handle: CacheHandle, session_key: str) -> CacheHandle:
        state = self._session(handle)
        twin = HandleState(self, next(self._serials))
        twin.chunks, twin.covered, twin.logits = list(state.chunks), list(state.covered), state.logits
        if state.cache is not None:
            # Layers never change a tensor in place (a pass concatenates, a crop slices), so the twin shares them.
            twin.cache = copy.copy(state.cache)
            twin.cache.layers = [copy.copy(layer) for layer in state.cache.layers]
        forked = CacheHandle(session_key=session_key, salt=handle.salt, tokens=list(handle.tokens), state=twin)
        if twin.cache is not None:
            hf_cache.settle(self._pool, twin)
        return forked

    def _release(self, handle: CacheHandle) -> None:
        state = handle.state
        if isinstance(state, HandleState) and state.owner is self:
            # The chunks stay: a handle used again after release rebuilds exactly the cache it had.
            self._pool.drop(state)
            state.evict()

