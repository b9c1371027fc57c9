"""How exact is a vLLM request that ran batched beside others? `python -m bench.vllm_batching [--trials 8]`
(needs `make install-vllm`).

The same seeded request (a prompt and its sampling, under a cache salt of its own so nothing is cached) is run alone,
alone again, and inside a batch of `--neighbours` other prompts of different lengths; vLLM's offline `LLM.generate`
always batches a list it is given, so the batch does not depend on timing. For each trial and temperature it
prints whether the tokens are equal and the largest logprob difference, then the counts. This is a measurement of
nondeterminism, kept out of the test suite on purpose: whether a *fleet* batches two requests depends on when they
arrive, so an assertion about it depends on the load of the machine (docs/engines.md, row 4).
"""

from __future__ import annotations

import argparse
import uuid
from pathlib import Path
from typing import Any

from app.engine.model_store import resolve_model
from app.engine.vllm_local import DEFAULT_KV_CACHE_BYTES
from bench.engine_hf import TEXT

PROMPT = "Write a long story about a sailor and the sea."


def run(llm: Any, prompts: list[str], temperature: float, seed: int, max_tokens: int) -> list[Any]:
    from vllm import SamplingParams

    params = SamplingParams(temperature=temperature, seed=seed, max_tokens=max_tokens, logprobs=0)
    salt = uuid.uuid4().hex  # every run computes every block itself
    return list(llm.generate([{"prompt": p, "cache_salt": salt} for p in prompts], params, use_tqdm=False))


def logprobs(output: Any) -> tuple[list[int], list[float]]:
    completion = output.outputs[0]
    ids = list(completion.token_ids)
    return ids, [step[token].logprob for token, step in zip(ids, completion.logprobs, strict=True)]


def main(trials: int, neighbours: int, max_tokens: int, cache_dir: Path) -> None:
    from vllm import LLM

    llm = LLM(
        model=str(resolve_model(None, cache_dir).path),
        dtype="float32",
        enforce_eager=True,
        kv_cache_memory_bytes=DEFAULT_KV_CACHE_BYTES,
        max_num_seqs=neighbours + 1,
        enable_prefix_caching=True,
    )
    others = [f"{TEXT[: 80 * (i + 1)]} Summarize this." for i in range(neighbours)]
    for temperature in (0.0, 0.7):
        equal_tokens = bit_equal = 0
        drifts: list[float] = []
        for trial in range(trials):
            seed = 1000 + trial
            alone = logprobs(run(llm, [PROMPT], temperature, seed, max_tokens)[0])
            again = logprobs(run(llm, [PROMPT], temperature, seed, max_tokens)[0])
            batched = logprobs(run(llm, [PROMPT, *others], temperature, seed, max_tokens)[0])
            assert alone == again, "the same request alone was not reproducible"
            same = batched[0] == alone[0]
            equal_tokens += same
            bit_equal += batched == alone
            n = min(len(alone[1]), len(batched[1]))
            drift = max((abs(a - b) for a, b in zip(alone[1][:n], batched[1][:n], strict=True)), default=0.0)
            drifts.append(drift)
            print(f"T={temperature} seed={seed}: tokens {'equal' if same else 'DIFFER'}, max |d logprob| {drift:.3g}")
        print(
            f"T={temperature}: batched with {neighbours} vs alone over {trials} trials: tokens equal {equal_tokens}/"
            f"{trials}, bit-equal {bit_equal}/{trials}, max |d logprob| {max(drifts):.3g}"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--neighbours", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--cache-dir", type=Path, default=Path(".lethe/models"))
    args = parser.parse_args()
    main(args.trials, args.neighbours, args.max_tokens, args.cache_dir)
