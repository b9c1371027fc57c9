"""What a branch costs: `previous_response_id` of an older response against resending the same history cold.

`python -m bench.branch_bench [--words 600] [--turns 3] [--repeats 3]`

Against a `lethe serve` it starts (bench/serve.py, the default `hf` engine): a chain of `--turns` responses under a
long system prompt (`--words` words), then per repeat, side by side in one run:
- a branch: `previous_response_id` of the chain's first response (no longer the newest), which copies the session's
  first transition into a new session and, in this process, forks the cached prefix (app/sessions/branching.py);
- the same request cold: a fresh chain of one response with the same instructions and first input, then the same
  follow-up (what a server without branches makes a client do: replay the history into a new conversation),
  counting both of its requests.
Reports tokens (deterministic) and wall times (medians; the machine is shared, compare the ratio of one run).
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import openai

from bench.serve import serving

KEY = "bench-branch-key-" + "7" * 24


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--words", type=int, default=600)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    instructions = "You are a helpful assistant. " + " ".join(
        f"Rule {i}: answer kindly and briefly." for i in range(args.words // 6))
    sampling: dict[str, Any] = {"max_output_tokens": 8, "temperature": 0.0}
    with serving(LETHE_BOOTSTRAP_API_KEY=KEY) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=600)
        model = client.models.list().data[0].id
        first = client.responses.create(model=model, instructions=instructions, input="My name is Ada.", **sampling)
        last = first
        for turn in range(args.turns - 1):
            last = client.responses.create(model=model, previous_response_id=last.id, input=f"Fact {turn}.",
                                           **sampling)
        branch_s, cold_s, rows = [], [], []
        for _ in range(args.repeats):
            started = time.perf_counter()
            branch = client.responses.create(model=model, previous_response_id=first.id, input="What is my name?",
                                             **sampling)
            branch_s.append(time.perf_counter() - started)
            started = time.perf_counter()
            fresh = client.responses.create(model=model, instructions=instructions, input="My name is Ada.",
                                            **sampling)
            cold = client.responses.create(model=model, previous_response_id=fresh.id, input="What is my name?",
                                           **sampling)
            cold_s.append(time.perf_counter() - started)
            assert branch.output_text == cold.output_text, "a branch answers as the history it holds"
            rows.append((branch.usage, fresh.usage, cold.usage))
    usage, fresh_usage, cold_usage = rows[-1]
    computed = usage.input_tokens_details.cache_write_tokens  # type: ignore[attr-defined]
    cold_computed = (fresh_usage.input_tokens_details.cache_write_tokens  # type: ignore[attr-defined]
                     + cold_usage.input_tokens_details.cache_write_tokens)  # type: ignore[attr-defined]
    print(f"branch prompt {usage.input_tokens} tokens: reused {usage.input_tokens_details.cached_tokens}, "
          f"prefilled {computed}; the cold replay prefilled {cold_computed} and decoded "
          f"{fresh_usage.output_tokens} more")
    print(f"wall, median of {args.repeats}: branch {statistics.median(branch_s):.2f} s, cold replay "
          f"{statistics.median(cold_s):.2f} s ({statistics.median(cold_s) / statistics.median(branch_s):.1f}x)")


if __name__ == "__main__":
    main()
