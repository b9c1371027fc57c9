"""The hf engine's speeds, measured side by side in one run: `python -m bench.engine_hf [--prompt-tokens 500]`.

Prints cold prefill tokens/s, decode tokens/s, crop latency, and the time of a turn that reuses a cached prefix
against the same prompt prefilled cold (what crop-and-replay saves over a full reset). Medians over `--repeats`.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path

from app.engine.hf import HFEngine
from app.engine.protocol import Sampling

TEXT = (
    "The harbour wakes before the town does. Fishing boats slip their moorings in the blue half-light, gulls argue "
    "over the nets, and the smell of salt and diesel drifts up the narrow streets where the bakers are already at "
    "work. By seven the market stalls are open: crates of mackerel and crab, baskets of lemons, bunches of thyme. "
)


def prompt_tokens(engine: HFEngine, n_tokens: int) -> list[int]:
    """About `n_tokens` of real chat: a system block, user turns of prose, and an assistant header at the end."""
    chat = engine.chat
    tokens = chat.render_block("system", "You are a helpful assistant who writes vivid, detailed prose.")
    header = chat.assistant_header()
    while len(tokens) + len(header) < n_tokens:
        tokens += chat.render_block("user", TEXT)
    ask = chat.render_block("user", "Continue the story of the harbour at length.")
    tokens = tokens[: max(0, n_tokens - len(ask) - len(header))]
    return tokens + ask + header


async def timed(fn: Callable[[], Awaitable[object]]) -> float:
    start = time.perf_counter()
    await fn()
    return time.perf_counter() - start


async def main(n_tokens: int, decode_tokens: int, repeats: int, cache_dir: Path) -> None:
    engine = HFEngine(None, cache_dir)
    start_s = await timed(engine.start)
    prompt = prompt_tokens(engine, n_tokens)
    tail = max(1, len(prompt) // 10)  # a new turn's worth of tokens after a cached prefix
    head = prompt[:-tail]

    cold: list[float] = []
    reuse: list[float] = []
    crop: list[float] = []
    decode_rates: list[float] = []
    decoded: list[int] = []
    for r in range(repeats):
        fresh = await engine.open(f"cold-{r}")
        cold.append(await timed(partial(engine.prefill, fresh, prompt)))
        await engine.release(fresh)

        warm = await engine.open(f"warm-{r}")
        await engine.prefill(warm, head)
        await engine.prefill(warm, prompt[len(head) :])
        crop.append(await timed(partial(engine.crop, warm, len(head))))
        reuse.append(await timed(partial(engine.prefill, warm, prompt[len(head) :])))

        sampling = Sampling(temperature=0.7, top_p=0.95, max_tokens=decode_tokens, seed=r)
        start = time.perf_counter()
        generation = await engine.generate(warm, sampling)
        decode_rates.append(generation.usage.decoded / (time.perf_counter() - start))
        decoded.append(generation.usage.decoded)
        await engine.release(warm)
    await engine.close()

    cold_s, reuse_s = statistics.median(cold), statistics.median(reuse)
    import torch  # here, not at the top, where the import order would load it before app.engine tunes OpenMP

    print(f"hf engine, {engine.model_id}, {torch.get_num_threads()} torch threads, median of {repeats} runs")
    print(f"  start (load weights)        {start_s:8.2f} s")
    print(f"  prompt                      {len(prompt):8d} tokens, {len(head)} cached + {tail} new on reuse")
    print(f"  cold prefill                {cold_s * 1e3:8.1f} ms   {len(prompt) / cold_s:8.0f} tokens/s")
    decode_rate = statistics.median(decode_rates)
    print(f"  decode                      {decode_rate:8.1f} tokens/s ({min(decoded)}-{max(decoded)} sampled per run)")
    print(f"  crop {len(prompt)}->{len(head)}              {statistics.median(crop) * 1e3:8.3f} ms")
    print(f"  reuse prefill ({tail} new)      {reuse_s * 1e3:8.1f} ms")
    print(f"  reuse / cold time           {reuse_s / cold_s:8.3f}  ({cold_s / reuse_s:.1f}x faster)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompt-tokens", type=int, default=500)
    parser.add_argument("--decode-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--cache-dir", type=Path, default=Path(".lethe/models"))
    args = parser.parse_args()
    asyncio.run(main(args.prompt_tokens, args.decode_tokens, args.repeats, args.cache_dir))
