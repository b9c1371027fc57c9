"""The hf engine's generation, run in steps on its worker thread: decoding, and verifying a replay's draft
(engine/verify.py) with a fallback to decoding (hf.py's module docstring says what the steps and pauses promise)."""

from __future__ import annotations

import threading
from typing import Any, Literal

import torch

from app.engine import hf_cache, verify
from app.engine.cache_pool import CachePool
from app.engine.hf_scheduler import Steps
from app.engine.hf_state import HandleState
from app.engine.protocol import CacheHandle, ChatTemplate, Generation, Sampling, TokenSink, TokenUsage
from app.engine.sampling import StopWatch
from app.engine.torch_sampling import make_generator, sample_token


class Generating:
    """HFEngine's generation steps (a mixin: the engine holds the model, the pool and the handles' states)."""

    _model: Any
    _pool: CachePool[HandleState]
    _max_positions: int | None
    _closing: threading.Event

    @property
    def chat(self) -> ChatTemplate:
        raise NotImplementedError

    def _session(self, handle: CacheHandle, closing: list[int] | None = None) -> HandleState:
        raise NotImplementedError

    def _generate(
        self, handle: CacheHandle, sampling: Sampling, on_tokens: TokenSink | None = None,
        cancelled: threading.Event | None = None, draft: list[int] | None = None,
    ) -> Steps[Generation]:
        """A generation in steps: it yields before each sampled token, where more urgent work may run (the scheduler
        decides). Everything it carries across a pause is its own (the generator, the stop watch, the handle's state,
        pinned in the pool), so a paused reply resumes bit for bit where it stopped.

        With a `draft`, the reply is first verified (`_verify`); a decision that cannot be certified restarts the
        generation from the prompt as plain decoding, so the result is always decoding's. Either way the generation
        ends with its reply *pending* (the cache is cut back to the prompt, a chunk boundary): the next prefill, the
        transition's closing, forwards the reply with the end of turn in one chunk. So the cache a transition leaves
        is one function of its tokens, whether they were decoded or verified, and a verified replay's cache is a
        decoded one's bit for bit. One exception, with the same bits: a verification forwards the draft *with* the
        end of turn, so when it accepts the draft whole its pass is exactly the closing's (the same tokens after the
        same cache) and is kept as that chunk, ahead of the log, for the closing to adopt instead of computing it
        again (hf.py `_session`); any other next call drops it."""
        state = self._session(handle)
        prefilled = hf_cache.make_resident(self._model, self._pool, state)
        pending = handle.tokens[len(state.covered) :]
        if pending:
            prefilled += hf_cache.forward(self._model, self._pool, state, pending)
        elif state.logits is None:
            if not state.chunks:
                raise ValueError("cannot generate from an empty log")
            # Re-running the last chunk on the same prefix reproduces its KV and logits exactly.
            last = state.covered[-state.chunks[-1] :]
            hf_cache.truncate(self._model, self._pool, state, len(state.covered) - len(last))
            prefilled += hf_cache.forward(self._model, self._pool, state, last)
        reused = len(handle.tokens) - prefilled
        room = sampling.max_tokens
        if self._max_positions is not None:
            room = min(room, self._max_positions - len(handle.tokens))
        prompt = len(handle.tokens)
        prompt_logits = state.logits
        # With a draft, tokens reach `on_tokens` once the result is known (a fallback restarts the reply).
        run = _Run(sampling, None if draft is not None else on_tokens)
        self._pool.pin(state)
        try:
            if draft is not None and verify.verifiable(sampling) and room > 0:
                yield from self._verify(handle, state, run, draft[:room], room, cancelled)
                if run.uncertified:
                    # Back to the prompt exactly as it was (its logits are the prompt chunk's), and decode.
                    hf_cache.truncate(self._model, self._pool, state, prompt)
                    del handle.tokens[prompt:]
                    state.logits = prompt_logits
                    run = _Run(sampling, None)
                    yield from self._decode(handle, state, run, room, cancelled, certify=False)
            else:
                yield from self._decode(handle, state, run, room, cancelled, certify=False)
        finally:
            self._pool.unpin(state)
            if run.closed_ahead and not run.uncertified:
                state.logits = None  # a pass over more rows than the closing's last one: never sampled from
            else:
                hf_cache.truncate(self._model, self._pool, state, prompt)  # the reply stays pending (docstring)
        if draft is not None and on_tokens is not None and run.token_ids:
            on_tokens(list(run.token_ids))
        text = self.chat.decode(run.token_ids)
        hf_cache.settle(self._pool, state)
        return Generation(
            token_ids=run.token_ids,
            text=text if run.stop_at is None else text[: run.stop_at],
            finish_reason=run.finish,
            usage=TokenUsage(reused=reused, prefilled=prefilled, decoded=run.decoded, verified=run.verified),
        )

    def _stopped(self, run: _Run, handle: CacheHandle, token: int) -> bool:
        """Take a sampled token: the reply ends on a stop token (not kept) or a stop string (kept, text cut)."""
        if token in self.chat.stop_token_ids:
            run.finish = "stop"
            return True
        run.token_ids.append(token)
        handle.tokens.append(token)
        if run.on_tokens is not None:
            run.on_tokens([token])
        if run.sampling.stop:
            if run.stops is None:
                run.stops = StopWatch(self.chat.decode, run.sampling.stop)
            run.stop_at = run.stops.check([token])
            if run.stop_at is not None:
                run.finish = "stop"
                return True
        return False

    def _halted(self, cancelled: threading.Event | None) -> bool:
        return self._closing.is_set() or (cancelled is not None and cancelled.is_set())

    def _decode(
        self, handle: CacheHandle, state: HandleState, run: _Run, room: int, cancelled: threading.Event | None,
        *, certify: bool,
    ) -> Steps[None]:
        """Decode step by step from `state.logits`. `certify`: each decision must be certified (decoding on a cache
        that a verification pass computed), else the run is marked uncertified and stops."""
        while len(run.token_ids) < room:
            yield  # more urgent work may run here; this handle's state waits as it is
            if self._halted(cancelled):
                break  # nobody waits for the rest (finish "length": the log holds what was sampled so far)
            assert state.logits is not None and state.cache is not None  # set by every pass; pinned meanwhile
            if certify:
                decision = verify.decide(state.logits, run.sampling, run.draw())
                if not decision.certified:
                    run.uncertified = True
                    return
                token = decision.token
            else:
                token = sample_token(state.logits, run.sampling, run.generator)
            run.decoded += 1
            if self._stopped(run, handle, token):
                break
            if len(run.token_ids) < room:
                hf_cache.forward(self._model, self._pool, state, [token])

    def _verify(
        self, handle: CacheHandle, state: HandleState, run: _Run, draft: list[int], room: int,
        cancelled: threading.Event | None,
    ) -> Steps[None]:
        """Verify `draft` in one forward pass after the prompt: each decision read off the pass's logits, one draw
        per decision as decoding draws, accepted while it is certified and agrees with the draft; a certified
        disagreement (or the draft's end without a stop) takes the sampler's token and decodes on from there, still
        certifying. The prompt's own logits decide the first token exactly (the chunk decoding starts from), so that
        decision needs no margin."""
        first = state.logits
        assert first is not None
        rows: list[torch.Tensor] = []
        # The end of turn rides along (its rows decide nothing): accepted whole, the pass is the closing's chunk.
        closing = self.chat.end_of_turn()
        if self._max_positions is not None and len(handle.tokens) + len(draft) + len(closing) > self._max_positions:
            closing = []
        if draft:
            yield
            if self._halted(cancelled):
                return
            rows = list(hf_cache.forward_all(self._model, self._pool, state, draft + closing))
        accepted = 0
        while len(run.token_ids) < room:
            decision = verify.decide(first if accepted == 0 else rows[accepted - 1], run.sampling, run.draw())
            if not decision.certified and accepted > 0:
                run.uncertified = True
                return
            token = decision.token
            if accepted < len(draft) and token == draft[accepted]:
                run.verified += 1
                accepted += 1
                if self._stopped(run, handle, token):
                    return
                continue
            # The draft ends here, or the sampler chooses otherwise.
            if accepted == len(draft) and token in self.chat.stop_token_ids:
                run.verified += 1  # the recorded reply's own end
                self._stopped(run, handle, token)
                run.closed_ahead = bool(draft and closing)
                return
            run.decoded += 1
            if self._stopped(run, handle, token) or len(run.token_ids) >= room:
                return
            if draft:
                hf_cache.cut_last_chunk(state, accepted)  # only the accepted tokens' KV stays before decoding on
            hf_cache.forward(self._model, self._pool, state, [token])
            yield from self._decode(handle, state, run, room, cancelled, certify=True)
            return
        # Cut by `max_tokens` inside the draft, every token of it accepted: the closing follows it as well.
        run.closed_ahead = bool(draft and closing) and accepted == len(draft) and run.stop_at is None


class _Run:
    """A generation's progress: what it sampled, how, and the generator whose stream it draws from."""

    def __init__(self, sampling: Sampling, on_tokens: TokenSink | None) -> None:
        self.sampling = sampling
        self.on_tokens = on_tokens
        self.generator = make_generator(sampling.seed)
        self.stops: StopWatch | None = None
        self.token_ids: list[int] = []
        self.decoded = 0
        self.verified = 0
        self.finish: Literal["stop", "length"] = "length"
        self.stop_at: int | None = None
        self.uncertified = False  # a decision of a verification could not be certified: decode from the prompt
        self.closed_ahead = False  # a verification accepted the draft whole: its pass holds the closing (`_generate`)

    def draw(self) -> float | None:
        """The uniform the sampler would draw for the next decision (as sample_token draws it; none when greedy)."""
        if self.sampling.temperature == 0:
            return None
        return float(torch.rand((), generator=self.generator, dtype=torch.float64).item())
