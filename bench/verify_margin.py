"""How far a multi-token forward pass and single-token decode steps disagree on the same positions (the hf engine).

    python -m bench.verify_margin [--prompts 8] [--reply 48] [--threads N]

A verified replay (app/engine/verify.py) reads each decision of a recorded reply off one forward pass over the reply,
where decoding computed it with one forward step per token; the two compute the same logits up to float noise
(batched matrix products sum in another order). Certification assumes a bound on that noise (`verify.PERTURBATION`);
this measures it on our model. For each of `--prompts` conversations of growing length, on one prefix cache:

1. decode a greedy reply of up to `--reply` tokens step by step, keeping each step's logits (the reference);
2. on the same prefix, one pass over the whole reply: logits at every position against the reference's;
3. on the same prefix, one pass over the reply's first k tokens (k = 1, 4, 16, ...), then decoding the rest step by
   step on that cache (a verification that decodes on after a disagreement): those steps' logits against the
   reference's.

Prints the largest |logit difference| of each kind, over every position and the whole vocabulary, the smallest greedy
top-1/top-2 gap met, how many decisions a margin δ = 2 * PERTURBATION leaves uncertified, and the margin's ratio to
the measured maximum. Writes bench/results/verify_margin.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
from pathlib import Path
from typing import Any

import torch

from app.engine import hf_cache, verify
from app.engine.hf import HFEngine
from app.engine.hf_state import HandleState

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parent.parent

TOPICS = [
    "the sea", "mountains", "a library", "bread baking", "trains", "the moon", "gardening", "chess", "rain",
    "a market", "old maps", "bicycles",
]


def prompt(engine: HFEngine, index: int) -> list[int]:
    chat = engine.chat
    tokens = chat.render_block("system", "You are a helpful assistant.")
    for turn in range(index + 1):  # longer conversations for later prompts
        topic = TOPICS[(index + turn) % len(TOPICS)]
        tokens += chat.render_block("user", f"Tell me something about {topic}, in two sentences.")
        tokens += chat.render_block("assistant", f"{topic.capitalize()} is a fine subject. There is much to say.")
    tokens += chat.render_block("user", f"Now describe {TOPICS[index % len(TOPICS)]} in detail.")
    return tokens + chat.assistant_header()


def measure(engine: HFEngine, prompts: int, reply: int) -> dict[str, Any]:
    model, pool = engine._model, engine._pool
    worst_pass = worst_after = 0.0
    gaps: list[float] = []
    positions = 0
    for index in range(prompts):
        tokens = prompt(engine, index)
        base = HandleState(engine, -1 - index)
        base.cache = hf_cache.new_cache(model)
        hf_cache.forward(model, pool, base, tokens)
        prefix_logits = base.logits
        assert prefix_logits is not None

        def fresh(tokens: list[int] = tokens) -> HandleState:
            state = HandleState(engine, 0)
            state.cache = hf_cache.new_cache(model)
            hf_cache.forward(model, pool, state, tokens)
            return state

        state = fresh()
        reference: list[torch.Tensor] = [prefix_logits]
        generated: list[int] = []
        for _ in range(reply):
            logits = state.logits
            assert logits is not None
            token = int(torch.argmax(logits))
            if token in engine.chat.stop_token_ids:
                break
            generated.append(token)
            hf_cache.forward(model, pool, state, [token])
            reference.append(state.logits)  # type: ignore[arg-type]
        for logits in reference:
            top = torch.topk(logits.to(torch.float64), 2).values
            gaps.append(float(top[0] - top[1]))
        positions += len(generated)
        if not generated:
            continue
        state = fresh()
        rows = hf_cache.forward_all(model, pool, state, generated)
        for i, row in enumerate(rows):
            worst_pass = max(worst_pass, float((row - reference[i + 1]).abs().max()))
        for k in sorted({1, 4, 16, len(generated) // 2}):
            if k >= len(generated):
                continue
            state = fresh()
            hf_cache.forward_all(model, pool, state, generated[:k])
            for i in range(k, len(generated)):
                hf_cache.forward(model, pool, state, [generated[i]])
                worst_after = max(worst_after, float((state.logits - reference[i + 1]).abs().max()))  # type: ignore[operator]
    worst = max(worst_pass, worst_after)
    return {
        "model": engine.model_id,
        "threads": torch.get_num_threads(),
        "cpu": platform.processor() or platform.machine(),
        "prompts": prompts,
        "positions": positions,
        "max_abs_logit_diff_pass_vs_decode": worst_pass,
        "max_abs_logit_diff_decode_after_pass": worst_after,
        "max_abs_logit_diff": worst,
        "perturbation_assumed": verify.PERTURBATION,
        "greedy_margin": verify.GREEDY_MARGIN,
        "margin_over_measured": (verify.GREEDY_MARGIN / (2 * worst)) if worst else None,
        "smallest_greedy_gap": min(gaps) if gaps else None,
        "decisions": len(gaps),
        "uncertified_greedy_decisions": sum(1 for g in gaps if g <= verify.GREEDY_MARGIN),
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--reply", type=int, default=48)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    engine = HFEngine(None, ROOT / ".lethe" / "models", num_threads=args.threads)
    await engine.start()
    try:
        result = await engine._run(lambda: measure(engine, args.prompts, args.reply))
    finally:
        await engine.close()
    out = ROOT / "bench" / "results" / "verify_margin.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    asyncio.run(main())
