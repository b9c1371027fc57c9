"""Torch's CPU threads when another process holds a core: `python -m bench.omp_contention [--spins 300000 10000]`.

For each OpenMP spin count (libgomp's `GOMP_SPINCOUNT`; 300,000 is libgomp's own default, 10,000 Lethe's, see
`app/engine/__init__.py`) a fresh process loads the embedded tiny model and times a 300-token prefill and single-token
decode steps over a growing cache, once on an idle machine and once beside a busy loop (one process spinning in
Python, standing for a neighbour on a shared machine). One thread is measured too: the floor when a core is taken.
Everything runs side by side in one invocation, so the ratios hold even when the machine's absolute speed does not.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

LIBGOMP_DEFAULT_SPINS = "300000"
PROMPT_TOKENS = 300
DECODE_STEPS = 30


def measure(threads: int, repeats: int) -> dict[str, float]:
    """In this process (its OpenMP environment already fixed): median prefill and per-token decode milliseconds."""
    import torch

    from app.engine.hf_load import load_full_attention_lm  # GOMP_SPINCOUNT came from the parent, set explicitly

    torch.set_num_threads(threads)
    with tempfile.TemporaryDirectory() as cache:
        model = load_full_attention_lm(None, Path(cache)).model
    ids = torch.randint(100, 1000, (1, PROMPT_TOKENS))
    prefill, decode = [], []
    with torch.no_grad():
        model(ids)  # warm-up: first-call allocations
        for _ in range(repeats):
            start = time.perf_counter()
            out = model(ids, use_cache=True)
            prefill.append(time.perf_counter() - start)
            cache_kv, token = out.past_key_values, ids[:, -1:]
            start = time.perf_counter()
            for _ in range(DECODE_STEPS):
                cache_kv = model(token, past_key_values=cache_kv, use_cache=True).past_key_values
            decode.append((time.perf_counter() - start) / DECODE_STEPS)
    return {"prefill_ms": statistics.median(prefill) * 1e3, "decode_ms": statistics.median(decode) * 1e3}


def child(spins: str, threads: int, repeats: int) -> dict[str, float]:
    env = {**os.environ, "GOMP_SPINCOUNT": spins}
    cmd = [sys.executable, "-m", "bench.omp_contention", "--child", str(threads), "--repeats", str(repeats)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


@contextmanager
def busy_neighbour(on: bool) -> Iterator[None]:
    if not on:
        yield
        return
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield
    finally:
        hog.kill()
        hog.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spins", nargs="+", default=[LIBGOMP_DEFAULT_SPINS, "10000"])
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(measure(args.child, args.repeats)))
        return
    rows = [(f"{args.threads} threads, {spins} spins", spins, args.threads) for spins in args.spins]
    rows.append(("1 thread", LIBGOMP_DEFAULT_SPINS, 1))
    print(f"tiny model, {PROMPT_TOKENS}-token prefill and {DECODE_STEPS} decode steps, median of {args.repeats}")
    print(f"{'':28s} {'idle: prefill':>14s} {'decode/token':>13s} {'busy core: prefill':>19s} {'decode/token':>13s}")
    results: dict[tuple[str, bool], dict[str, float]] = {}
    for contended in (False, True):
        with busy_neighbour(contended):
            for label, spins, threads in rows:
                results[label, contended] = child(spins, threads, args.repeats)
    for label, _, _ in rows:
        idle, busy = results[label, False], results[label, True]
        print(f"{label:28s} {idle['prefill_ms']:11.0f} ms {idle['decode_ms']:10.1f} ms "
              f"{busy['prefill_ms']:16.0f} ms {busy['decode_ms']:10.1f} ms")


if __name__ == "__main__":
    main()
