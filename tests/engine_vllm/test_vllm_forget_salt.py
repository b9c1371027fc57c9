"""After a forget, can any request still hit the prefix-cache blocks that held the target? Measured with vLLM's own
cached-token counts (`RequestOutput.num_cached_tokens`, the engine's `TokenUsage.reused`), on the real in-process
engine and model, with the runtime's salts (app/runtime/salts.py) and the calls the runtime makes (transition.py:
prefill observations + assistant header, generate, prefill end-of-turn; a forget crops to the checkpoint and replays
the suffix under the session's salt; a bumped generation moves the handle with transition.use_salt).

Each test runs the scenario twice: under the tenant salt the runtime used before (`legacy`: every session of a
tenant shares blocks, and a forget changes no salt), which shows the leak, and under the runtime's salts, which
closes it. A probe hits *tainted* blocks when it is served more than the full blocks that lie wholly before the
target (`clean_blocks`): a block holding any token of the target, and every block after it, chains from the target.
"""

from __future__ import annotations

import uuid

import pytest

from app.engine.protocol import CacheHandle
from app.engine.sampling import transition_seed
from app.engine.vllm_local import VLLMEngine
from app.runtime.engine_calls import use_salt
from app.runtime.salts import rotates, session_salt
from tests.engine_vllm.vllm_helpers import BLOCK, sampled

SEED = 99
SECRET = (
    "A private note for you: my locker code is 4471-ZQ, my cat is called Brindlewick, my bank PIN is 8203, "
    "my passport number is X7731902, my sister Margit lives at 14 Quai Voltaire in Lyon, my doctor is Dr. Olmsted, "
    "and my password hint is the name of my first boat, the Sea Lark, which I sold in 2011 to a man named Ferro."
)
CLEAN = {1: "Hi! Please help me plan my week.", 3: "Suggest a time for my morning runs."}
SCHEMES = ("legacy", "session")
SYSTEM = "You are a helpful assistant. Answer briefly." + " Be kind." * 60  # ~200 tokens: T1 ends past block 1


@pytest.fixture
def engine(batched_engine: VLLMEngine) -> VLLMEngine:
    return batched_engine


class Tenant:
    """One tenant's salts under a scheme: `legacy` is the runtime before this change (the tenant id, for every
    session and every generation); `session` is app.runtime.salts."""

    def __init__(self, scheme: str) -> None:
        self.scheme = scheme
        self.id = f"tenant-{uuid.uuid4().hex}"

    def salt(self, session_id: str, generation: int = 0) -> str:
        return self.id if self.scheme == "legacy" else session_salt(self.id, session_id, generation)


def observation(engine: VLLMEngine, index: int) -> list[int]:
    chat = engine.chat
    text = SECRET if index == 2 else CLEAN[index]
    return [*chat.render_block("user", text), *chat.assistant_header()]


async def transition(engine: VLLMEngine, handle: CacheHandle, index: int) -> list[int]:
    """One transition as the runtime runs it; returns the reply's tokens."""
    await engine.prefill(handle, observation(engine, index))
    reply = await engine.generate(handle, sampled(transition_seed(SEED, index), max_tokens=24))
    await engine.prefill(handle, engine.chat.end_of_turn())
    return reply.token_ids


async def session(engine: VLLMEngine, salt: str, key: str, indices: list[int]) -> tuple[CacheHandle, dict[int, int]]:
    """A session of `indices` transitions; the log offset where each transition starts."""
    handle = await engine.open(key, salt=salt)
    await engine.prefill(handle, engine.chat.render_block("system", SYSTEM))
    starts = {}
    for index in indices:
        starts[index] = len(handle.tokens)
        await transition(engine, handle, index)
    return handle, starts


async def probe(engine: VLLMEngine, handle: CacheHandle, legit: int, spans: bool = True) -> tuple[int, int]:
    """Send the forgotten message as the handle's next observation. `legit`: the tokens the probe may be served
    without touching the target (full blocks of a clean prefix, or of its own log). Returns (reused, tainted)."""
    await engine.prefill(handle, observation(engine, 2))
    usage = await engine.warm(handle)  # the request a turn would send (a prefill alone sends nothing)
    if spans:
        assert len(handle.tokens) - 1 >= legit + BLOCK, "the probe must span a full block past what it may reuse"
    return usage.reused, max(0, usage.reused - legit)


@pytest.mark.parametrize("scheme", SCHEMES)
async def test_after_a_forget_with_a_replay_no_probe_reaches_the_target_blocks(engine: VLLMEngine, scheme: str) -> None:
    """S = T1 T2 T3 with T2 the target; forget T2 (crop to the end of T1, replay T3). Probe (a): another session of
    the same tenant sends the exact forgotten prefix (the same system block and T1, then T2's message). Probe (b):
    S's own next turn sends T2's message again. The replay keeps S's salt (its log now differs from the old one
    inside itself), so it reuses its clean prefix, equals the counterfactual, and S's next turn reuses its cache."""
    assert engine.exactness == "batched"  # the default engine: these forgets run alone, so they are exact anyway
    tenant = Tenant(scheme)
    s, starts = await session(engine, tenant.salt("s"), "s", [1, 2, 3])
    target_start = checkpoint = starts[2]
    before = list(s.tokens)
    await engine.crop(s, checkpoint)
    await engine.prefill(s, observation(engine, 3))
    replay = await engine.generate(s, sampled(transition_seed(SEED, 3), max_tokens=24))
    await engine.prefill(s, engine.chat.end_of_turn())
    assert not rotates(before, s.tokens)  # the runtime keeps the salt: the replay reused the clean prefix
    assert replay.usage.reused == checkpoint // BLOCK * BLOCK

    counterfactual, _ = await session(engine, f"fresh-{uuid.uuid4().hex}", "cf", [1, 3])
    assert s.tokens == counterfactual.tokens  # the replayed T3 is the counterfactual's, token for token
    check = sampled(1234, max_tokens=8)
    assert await engine.sample_logprobs(s, check) == await engine.sample_logprobs(counterfactual, check)

    clean = target_start // BLOCK * BLOCK
    other = await engine.open("probe-a", salt=tenant.salt("probe-a"), tokens=before[:checkpoint])
    reused_a, tainted_a = await probe(engine, other, clean)
    logged = len(s.tokens)
    await engine.prefill(s, [*engine.chat.render_block("user", "Thanks!"), *engine.chat.assistant_header()])
    next_turn = await engine.warm(s)
    assert next_turn.reused == logged // BLOCK * BLOCK  # the session's own next turn reuses its whole cache
    reused_b, tainted_b = await probe(engine, s, len(s.tokens) // BLOCK * BLOCK, spans=False)
    print(
        f"[{scheme}] forget with replay: target at {target_start}, clean full blocks {clean}; "
        f"probe (a) other session reused {reused_a} (tainted {tainted_a}); own next turn reused {next_turn.reused}/"
        f"{logged}; probe (b) same session reused {reused_b} (tainted {tainted_b})"
    )
    assert tainted_b == 0  # a turn extends the rebuilt log, which differs from the old one before its end
    if scheme == "legacy":
        assert tainted_a > 0  # the leak: the tenant's other sessions reach the target's blocks
    else:
        assert reused_a == 0  # another session shares no block with S at all


@pytest.mark.parametrize("scheme", SCHEMES)
async def test_after_forgetting_the_last_turn_the_same_session_cannot_reach_its_blocks(
    engine: VLLMEngine, scheme: str
) -> None:
    """S = T1 T2 with T2 the target and the last transition: the forget crops to the end of T1 and replays nothing,
    so S's log is a prefix of the old one and S's next turn could send T2's message at the same position (probe (b)).
    The runtime bumps S's cache generation: the next turn prefills the whole log again (the cost), hitting nothing."""
    tenant = Tenant(scheme)
    s, starts = await session(engine, tenant.salt("s"), "s", [1, 2])
    target_start = checkpoint = starts[2]
    before = list(s.tokens)
    await engine.crop(s, checkpoint)
    assert rotates(before, s.tokens)
    misses = engine.cache_misses
    if scheme == "session":
        use_salt(engine, s, tenant.salt("s", generation=1))
    clean = target_start // BLOCK * BLOCK
    other = await engine.open("probe-a", salt=tenant.salt("probe-a"), tokens=list(s.tokens))
    reused_a, tainted_a = await probe(engine, other, clean)
    reused_b, tainted_b = await probe(engine, s, clean)  # S's own blocks before the target are all it may reuse
    print(
        f"[{scheme}] forget of the last turn: target at {target_start}, clean full blocks {clean}; "
        f"probe (a) other session reused {reused_a} (tainted {tainted_a}); "
        f"probe (b) same session's next turn reused {reused_b} (tainted {tainted_b}) of {len(s.tokens)}"
    )
    if scheme == "legacy":
        assert tainted_a > 0 and tainted_b > 0
    else:
        assert reused_a == 0 and reused_b == 0  # the next turn pays the whole log once: nothing under the new salt
        assert engine.cache_misses == misses  # a moved handle expects nothing cached, so no false eviction is counted
