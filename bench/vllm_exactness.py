"""How often does a replay batched beside live traffic reproduce the replay run alone, token for token?
`python -m bench.vllm_exactness [--trials 20] [--max-num-seqs 16]` (needs `make install-vllm`).

This is the question the engine's `exactness = "batched"` leaves open (docs/engines.md, "Batched replays"). On the
in-process engine as Lethe runs it (`VLLMEngine`: AsyncLLM, float32, eager, batching up to `--max-num-seqs`), each
trial takes one seeded request, a short chat session's log, and samples `--max-tokens` tokens from it:

- alone, under a cache salt of its own (so it computes every block itself, as the original run did);
- again, under another fresh salt, while 3 to 7 other sessions (prompts of other lengths, replies of 16 to 64 tokens,
  their own salts) generate at the same time: the engine batches them with it, and the batch changes as they finish.

It counts the trials whose batched tokens equal the solo tokens, those whose logprobs are also bit-equal, and the
largest logprob difference, at temperature 0 and at seeded temperature 0.7. The first trial also runs the request
alone twice, which must agree bit for bit (vLLM is deterministic alone: docs/engines.md row 1). How many neighbours a
trial gets is drawn from a seeded generator, so a run is repeatable up to the machine's scheduling (which decides
exactly when each neighbour joins and leaves the batch). A measurement, not a test: the outcome depends on timing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

from app.engine.protocol import Sampling
from app.engine.vllm_local import VLLMEngine

SYSTEM = "You are a helpful personal assistant. Answer in a few sentences."
QUESTIONS = [
    "Plan a three-day trip to Lisbon for someone who loves food.", "Explain how a bicycle gear works.",
    "Write a short poem about the sea at night.", "What should I pack for a week of hiking in the rain?",
    "Summarize the plot of a detective story you invent.", "Give me three tips for learning the guitar.",
    "Why is the sky blue? Explain it to a child.", "Describe a quiet morning in a mountain village.",
    "How do I make a simple tomato sauce?", "Suggest a weekly running plan for a beginner.",
    "Tell me a story about a lighthouse keeper and a storm.", "What are good habits for sleeping well?",
    "Compare trains and planes for a 600 km journey.", "Write a letter thanking a neighbour for their help.",
    "How do bees make honey?", "Invent a board game and explain its rules.",
    "What questions should I ask at a job interview?", "Describe the smell of a bakery at dawn.",
    "How can I keep basil alive on a windowsill?", "Write a dialogue between a cat and a dog about dinner.",
]
NEIGHBOURS = [
    "Count slowly from one to thirty in words.", "List ten fruits and one fact about each of them.",
    "Write a long story about a sailor and the sea.", "Explain photosynthesis step by step.",
    "Describe your ideal house, room by room.", "What is the history of the printing press?",
    "Give me a recipe for bread with every step.", "Write a song about a train crossing the desert.",
]


@dataclass
class Trial:
    temperature: float
    seed: int
    neighbours: int
    tokens_equal: bool
    bit_equal: bool
    max_logprob_diff: float
    first_difference: int | None  # index of the first differing token (None: equal)


def chat_log(engine: VLLMEngine, user: str, padding: int = 0) -> list[int]:
    chat = engine.chat
    system = SYSTEM + " Be kind and precise." * padding
    return [*chat.render_block("system", system), *chat.render_block("user", user), *chat.assistant_header()]


async def sample_fresh(engine: VLLMEngine, log: list[int], sampling: Sampling) -> tuple[list[int], list[float]]:
    """The request under a salt nobody used: every block computed by this request alone."""
    handle = await engine.open("probe", salt=uuid.uuid4().hex, tokens=log)
    return await engine.sample_logprobs(handle, sampling)


async def one_trial(
    engine: VLLMEngine, index: int, temperature: float, max_tokens: int, rng: random.Random, check_alone: bool
) -> Trial:
    seed = 1000 + index
    sampling = Sampling(temperature=temperature, top_p=1.0, max_tokens=max_tokens, seed=seed)
    log = chat_log(engine, QUESTIONS[index % len(QUESTIONS)], padding=index % 5)
    alone = await sample_fresh(engine, log, sampling)
    if check_alone:
        again = await sample_fresh(engine, log, sampling)
        assert again == alone, "the same request alone was not reproducible: the measurement would be meaningless"
    count = rng.randint(3, 7)
    others = []
    for k in range(count):
        text = NEIGHBOURS[(index + k) % len(NEIGHBOURS)]
        other = chat_log(engine, text, padding=rng.randint(0, 12))
        other_sampling = Sampling(temperature=0.7, max_tokens=rng.choice([16, 32, 48, 64]), seed=rng.randrange(1 << 30))
        others.append(sample_fresh(engine, other, other_sampling))
    # All submitted in one loop tick: the scheduler takes them into one batch, which shrinks as neighbours finish.
    batched, *_ = await asyncio.gather(sample_fresh(engine, log, sampling), *others)
    n = min(len(alone[1]), len(batched[1]))
    diff = max((abs(a - b) for a, b in zip(alone[1][:n], batched[1][:n], strict=True)), default=0.0)
    first = next((i for i, (a, b) in enumerate(zip(alone[0], batched[0], strict=False)) if a != b), None)
    if first is None and len(alone[0]) != len(batched[0]):
        first = n
    return Trial(temperature, seed, count, batched[0] == alone[0], batched == alone, diff, first)


async def main(trials: int, max_tokens: int, max_num_seqs: int, cache_dir: Path) -> list[Trial]:
    started = time.perf_counter()
    engine = VLLMEngine(None, cache_dir, max_num_seqs=max_num_seqs)
    await engine.start()
    print(f"engine ready in {time.perf_counter() - started:.0f} s: exactness {engine.exactness!r}", flush=True)
    rng = random.Random(20261202)
    results: list[Trial] = []
    try:
        for temperature in (0.0, 0.7):
            for index in range(trials):
                trial = await one_trial(engine, index, temperature, max_tokens, rng, check_alone=index == 0)
                results.append(trial)
                print(
                    f"T={temperature} seed={trial.seed} neighbours={trial.neighbours}: tokens "
                    f"{'equal' if trial.tokens_equal else f'DIFFER at {trial.first_difference}'}, "
                    f"{'bit-equal' if trial.bit_equal else 'logprobs differ'}, max |d logprob| "
                    f"{trial.max_logprob_diff:.3g}",
                    flush=True,
                )
    finally:
        await engine.close()
    print()
    for temperature in (0.0, 0.7):
        rows = [t for t in results if t.temperature == temperature]
        print(
            f"T={temperature}: replay batched with 3-7 others vs alone, {len(rows)} trials, {max_tokens} tokens: "
            f"tokens equal {sum(t.tokens_equal for t in rows)}/{len(rows)}, bit-equal {sum(t.bit_equal for t in rows)}/"
            f"{len(rows)}, max |d logprob| {max(t.max_logprob_diff for t in rows):.3g}"
        )
    print(f"whole run {time.perf_counter() - started:.0f} s, max_num_seqs {max_num_seqs}")
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=20, help="per temperature")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--max-num-seqs", type=int, default=16)
    parser.add_argument("--cache-dir", type=Path, default=Path(".lethe/models"))
    parser.add_argument("--out", type=Path, default=None, help="write every trial as JSON here")
    args = parser.parse_args()
    measured = asyncio.run(main(args.trials, args.max_tokens, args.max_num_seqs, args.cache_dir))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps([asdict(t) for t in measured], indent=2) + "\n")
