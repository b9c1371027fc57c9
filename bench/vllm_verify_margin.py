"""How far vLLM's prompt logprobs (one verifying request) and its decode logprobs disagree on the same positions.

    python -m bench.vllm_verify_margin [--prompts 8] [--reply 40]

The in-process vLLM engine verifies a greedy replay's recorded reply from the prompt logprobs of one request over the
log and the reply (app/engine/vllm_verify.py), where decoding computed each decision in a decode step. Certification
assumes the two differ by less than `verify.PERTURBATION` per logit. For each of `--prompts` conversations on one
prefix cache, this decodes a greedy reply with the top two logprobs of every decision, then asks the verifying request
for the same positions' top two, and reports the largest |logprob difference| (a logprob difference of one token is
its logit difference minus the row's normalizer difference, so twice it bounds what a gap can move), the smallest
greedy gap met, and how many decisions the margin δ = 2 * PERTURBATION would leave uncertified. Writes
bench/results/vllm_verify_margin.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

from app.engine import verify  # after the environment above: vLLM reads it when imported
from app.engine.protocol import Sampling
from app.engine.vllm_local import VLLMEngine
from app.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
QUESTIONS = [
    "Which box holds 21 apples?", "What is my name?", "Summarize the boxes in one sentence.",
    "How many apples are there in boxes 3 and 4 together?", "Write a short poem about apples.",
    "List three boxes and their apples.", "Which box holds the most apples?", "Say hello in French.",
]


def _top(row: Any) -> list[tuple[int, float]]:
    return [(token, float(entry.logprob)) for token, entry in sorted(row.items(), key=lambda kv: kv[1].rank)][:2]


async def measure(prompts: int, reply: int) -> dict[str, Any]:
    settings = Settings()
    engine = VLLMEngine(settings.model, settings.resolved_model_cache_dir, max_model_len=4096)
    await engine.start()
    chat = engine.chat
    listing = " ".join(f"Box {i} holds {i * 7} apples." for i in range(25))
    context = [*chat.render_block("system", "You are a helpful assistant."),
               *chat.render_block("user", f"My name is Ada. {listing}")]
    worst, smallest_gap, decisions, uncertified = 0.0, float("inf"), 0, 0
    try:
        for i in range(prompts):
            handle = await engine.open(f"margin-{i}", salt=f"margin-{i}")
            log = [*context, *chat.render_block("user", QUESTIONS[i % len(QUESTIONS)]), *chat.assistant_header()]
            params = engine._params(Sampling(temperature=0, max_tokens=reply), reply)
            params.logprobs = 2
            decoded = (await engine._request(handle, log, params)).outputs[0]
            tokens = list(decoded.token_ids)
            check = engine._params(Sampling(temperature=0, max_tokens=1), 1)
            check.prompt_logprobs, check.skip_reading_prefix_cache, check.detokenize = 2, False, False
            verifying = await engine._request(handle, [*log, *tokens], check)
            rows = verifying.prompt_logprobs[len(log) :]
            for position, token in enumerate(tokens):
                by_decode, by_prompt = dict(_top(decoded.logprobs[position])), dict(_top(rows[position]))
                for t in by_decode.keys() & by_prompt.keys():
                    worst = max(worst, abs(by_decode[t] - by_prompt[t]))
                top = _top(decoded.logprobs[position])
                if top[0][0] != token or len(top) < 2:
                    continue
                gap = top[0][1] - top[1][1]
                decisions += 1
                smallest_gap = min(smallest_gap, gap)
                uncertified += gap <= verify.GREEDY_MARGIN
    finally:
        await engine.close()
    return {
        "machine": platform.processor() or platform.machine(), "prompts": prompts, "reply": reply,
        "max_abs_logprob_diff": worst, "greedy_margin": verify.GREEDY_MARGIN, "decisions": decisions,
        "smallest_gap": smallest_gap, "uncertified_at_margin": uncertified,
        "margin_over_twice_max_diff": verify.GREEDY_MARGIN / (2 * worst) if worst else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--reply", type=int, default=40)
    args = parser.parse_args()
    result = asyncio.run(measure(args.prompts, args.reply))
    out = ROOT / "bench" / "results" / "vllm_verify_margin.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
