"""The one interface every KV engine implements (hf, vllm, vllm-remote).

An engine knows token ids and cache handles, nothing of sessions' meaning. A handle owns the session's *token
log*: the exact token sequence its cache stands for. The cache is an optimisation over that log: an engine may
evict it and rebuild it by prefilling the log, so correctness never depends on cache residency.

Exactness contract (what forgetting relies on): if two handles hold the same log, built by the same sequence of
calls (same chunks), then `generate` with the same `Sampling` and seed returns the same tokens. The runtime keeps
every transition's work in the same chunks in a replay as in the original run: the closing tokens of a transition
are prefilled before the transition ends, so a checkpoint offset is always a chunk boundary, a point a replay
cropped there and making the original's calls again reproduces the original from.

An engine may defer a prefill's computation to its next request on the handle (the vLLM engines do: `prefill` only
appends, and `generate` sends the whole log in one request, so a transition is one request). The contract holds as
long as the deferral is itself a function of the calls: a replay that makes the original's calls then sends requests
of the original's shapes (the whole log so far, then sampling), and the engine must compute a log's KV the same way
whichever of its earlier requests left part of it cached (vLLM's prefill does: bit for bit on the Intel Xeon measured,
the same tokens with logprobs 4e-6 apart on an AMD EPYC, whose kernels sum other row counts in another order:
docs/engines.md, "Bit-equality across chunkings"). How far the contract holds beside other sessions' requests is the
engine's `exactness`.

Every call reports token accounting, measured, never estimated, by the call that did the work: a deferred prefill
reports `TokenUsage()` and the request that computes its tokens counts them (for one request,
`reused + prefilled` is its prompt's length).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable


@dataclass(frozen=True)
class TokenUsage:
    reused: int = 0  # tokens whose KV came from cache (including a prefix-cache hit)
    prefilled: int = 0  # prompt tokens whose KV was computed by this call
    decoded: int = 0  # tokens sampled by this call's decode steps (a stop token included)
    verified: int = 0  # tokens of a draft this call accepted without decoding them (a stop decision included)

    def __add__(self, other: TokenUsage) -> TokenUsage:
        return TokenUsage(
            self.reused + other.reused, self.prefilled + other.prefilled, self.decoded + other.decoded,
            self.verified + other.verified,
        )


@dataclass(frozen=True)
class Sampling:
    temperature: float = 0.0  # 0 means greedy
    top_p: float = 1.0
    max_tokens: int = 256
    stop: tuple[str, ...] = ()
    seed: int = 0  # the seed of *this generation*; the runtime derives it from (session seed, transition index)


TokenSink = Callable[[list[int]], None]

Exactness = Literal["exact", "unbatched", "batched", "batch-invariant"]  # KVEngine.exactness


@dataclass(frozen=True)
class Generation:
    token_ids: list[int]  # sampled tokens, stop/eos token excluded
    text: str
    finish_reason: Literal["stop", "length"]
    usage: TokenUsage


@dataclass
class CacheHandle:
    """A session's place in an engine. `tokens` is the log; engines keep their cache state in `state`."""

    session_key: str
    salt: str | None = None  # isolates cache blocks (vLLM cache_salt; per session: runtime/salts.py); None shares
    tokens: list[int] = field(default_factory=list)
    state: object | None = None


@runtime_checkable
class ChatTemplate(Protocol):
    """Renders chat messages one block at a time, so every artifact has an exact token span."""

    def encode(self, text: str) -> list[int]: ...

    def decode(self, token_ids: list[int]) -> str: ...

    def render_block(self, role: str, content: str) -> list[int]:
        """A complete message block (header, content, end-of-turn) for role system/user/assistant/tool."""
        ...

    def assistant_header(self) -> list[int]:
        """The tokens that open an assistant turn: the generation prompt."""
        ...

    def end_of_turn(self) -> list[int]:
        """The tokens that close a turn after generated content (e.g. `<|im_end|>` and a newline)."""
        ...

    @property
    def stop_token_ids(self) -> frozenset[int]: ...


@runtime_checkable
class KVEngine(Protocol):
    name: str
    model_id: str

    @property
    def chat(self) -> ChatTemplate:
        """The model's block renderer; available once `start` has loaded the tokenizer."""
        ...

    @property
    def exactness(self) -> str:
        """How exactly a replay reproduces the original run on this engine, as its configuration stands (forget
        receipts state it). One of:

        - ``"exact"``: one sequence at a time and a cache rebuilt chunk for chunk (hf): a replay equals the
          original bit for bit, whatever else the process runs;
        - ``"unbatched"``: vLLM running one sequence at a time (``max_num_seqs=1``): bit-exact while the blocks
          before the checkpoint stay cached (docs/engines.md, conditions a-c);
        - ``"batched"``: vLLM batching concurrent requests (the default): a replay that runs beside live traffic
          computes its logits in other batches than the original did, so they differ in the last float bits and a
          sampled token may flip at a near-tie (rare: docs/engines.md measures how rare);
        - ``"batch-invariant"``: vLLM with batch-invariant kernels (``VLLM_BATCH_INVARIANT=1``, supported GPUs
          only): batched and still bit-exact.
        """
        ...

    async def start(self) -> None:
        """Load weights / connect. Never blocks the event loop."""
        ...

    @property
    def ready(self) -> bool: ...

    @property
    def max_context_tokens(self) -> int | None:
        """The most tokens a handle's log may hold (None before start or when the model does not say)."""
        ...

    @property
    def records_chunks(self) -> bool:
        """Whether the engine's cache depends on how its log was chunked (hf: the same tokens split into other
        forward passes differ in the last float bits), so the runtime stores each transition's chunk sizes (its
        *recipe*, `chunks`) and rebuilds a cache along them. vLLM's prefix cache computes a log the same way however
        earlier requests chunked it: False."""
        ...

    @property
    def rereads_replies(self) -> bool:
        """Whether a transition's closing forwards its reply's sampled tokens again (hf leaves a reply pending, so the
        cache a transition leaves is one function of its tokens, decoded or verified: docs/engines.md). A reset then
        computes every reply twice, and the yardstick its receipts are measured against says so (forget/cost.py)."""
        ...

    async def close(self) -> None: ...

    async def open(
        self,
        session_key: str,
        *,
        salt: str | None = None,
        tokens: list[int] | None = None,
        chunks: list[int] | None = None,
    ) -> CacheHandle:
        """A handle whose log is `tokens` (empty by default). Builds no cache yet: the next call does, along `chunks`
        (a recipe `chunks()` reported for a prefix of `tokens`, e.g. stored across a restart) on an engine that
        `records_chunks`; the others ignore it."""
        ...

    def chunks(self, handle: CacheHandle) -> list[int]:
        """The chunk sizes the handle's cache was built in, covering a prefix of its log (empty on an engine that
        does not `records_chunks`)."""
        ...

    def resalt(self, handle: CacheHandle, salt: str | None) -> None:
        """Move the handle to another cache salt (a forget's new generation, runtime/salts.py). On a shared prefix
        cache (vLLM) nothing is computed under the new salt yet; an engine without one (hf) only relabels it."""
        ...

    async def prefill(self, handle: CacheHandle, token_ids: list[int]) -> TokenUsage:
        """Append `token_ids` to the log; the cache covers the whole log now or, on an engine that defers, from its
        next request on. The usage is what this call computed (zeros when it deferred everything)."""
        ...

    async def generate(
        self, handle: CacheHandle, sampling: Sampling, on_tokens: TokenSink | None = None,
        *, draft: list[int] | None = None,
    ) -> Generation:
        """Sample a continuation of the log and append it (stop token excluded) to the log; the usage counts the
        prompt tokens computed for it, deferred prefills included. `on_tokens`, when
        given, receives sampled token ids as they come (possibly from another thread; an engine that cannot stream
        calls it once with all of them).

        `draft`: the tokens a replay expects (the recorded reply of the transition it replays). It is a hint, never an
        input: the result is the generation decoding would return, token for token. An engine that can verify (hf)
        checks the draft in one forward pass and accepts the prefix whose every decision is certified
        (engine/verify.py), decoding from the first disagreement; it counts accepted tokens as `usage.verified`. An
        engine that cannot (the vLLM ones for now) ignores it and decodes."""
        ...

    async def crop(self, handle: CacheHandle, n_tokens: int) -> None:
        """Keep the first `n_tokens` of the log and of the cache. Exact per token; O(1) in tensor copies."""
        ...

    async def fork(self, handle: CacheHandle, session_key: str) -> CacheHandle:
        """A new handle with the same log (and, where the engine can, a shared or copied cache)."""
        ...

    async def release(self, handle: CacheHandle) -> None:
        """Drop the handle's cache (the log stays with the caller)."""
        ...
