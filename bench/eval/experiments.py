"""Exactness under matched seeds, and the two cost sweeps (against τ, and against the fraction of post-target work
that is independent of the target).

A pair is two sessions built by the same script with the same seed, one forgotten with `selective_replay` (B7), one
with `full_reset` (B5); exactness is checked artifact for artifact (kind, transition, content, token span) and token
for token (the receipts' `state_sha256_after`, a digest of every artifact's token ids), and against a third session
built by hand without the target (an empty transition where it was: the counterfactual twin of Definition 1)."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

from bench.eval.api import Json, Lethe
from bench.eval.episodes import Step
from bench.eval.runner import Forgot, forgot_from, run_steps
from bench.forget_bench import CLEAN, SYSTEM, fit

FACTS = ["my locker code is {n}-ZQ", "my cat is called Brindle{w}", "my door PIN is {n}", "I live at {n} Quillon Road"]
WORDS = ["wick", "moss", "thorn", "vale", "crest"]


def target_message(rng: random.Random) -> str:
    fact = rng.choice(FACTS).format(n=rng.randint(1000, 9999), w=rng.choice(WORDS))
    return f"A private note for you: {fact}."


def chat_script(rng: random.Random, turns: int, tau: int, compact_after: int | None) -> tuple[list[Step], str]:
    """T user turns (one of them, at tau, the target) and optionally a compaction after transition `compact_after`."""
    pool = rng.sample(CLEAN, k=min(len(CLEAN), turns))
    messages = [pool[i % len(pool)] for i in range(turns - 1)]
    target = target_message(rng)
    messages.insert(tau - 1, target)
    steps: list[Step] = []
    for i, text in enumerate(messages, start=1):
        steps.append(Step([{"type": "user", "content": text}], acquisition=i == tau))
        if compact_after == i:
            steps.append(Step(compact=True))
    return steps, target


def counterfactual(steps: list[Step]) -> list[Step]:
    """The same script without the target: its transition stays, empty (API.md: what a forget leaves)."""
    return [Step([], generate=False) if s.acquisition else s for s in steps]


Shape = list[tuple[str, int, str, list[int]]]


def shape(lethe: Lethe, session_id: str) -> Shape:
    return [(a["kind"], a["turn"], a["content"], list(a["token_span"])) for a in lethe.artifacts(session_id)]


@dataclass
class Pair:
    kind: str  # "sampled" (temperature 0.7, matched seeds), "greedy" (a τ-sweep point), "indep"
    seed: int
    T: int
    tau: int
    compacted: bool
    b7: Forgot
    b5: Forgot
    equal_artifacts: bool
    equal_tokens: bool  # state_sha256_after equal
    equal_counterfactual: bool | None  # B7's state equals the hand-built twin (None: not built)
    first_difference: str | None = None
    x: float = 0.0  # the sweep's x (indep fraction), if any
    extra: dict[str, int] = field(default_factory=dict)


def pair(
    lethe: Lethe, steps: list[Step], sampling: Json, *, kind: str, tau: int, twin: bool, x: float = 0.0
) -> Pair:
    built = {m: run_steps(lethe, system_prompt=SYSTEM, tools=[], memory={}, steps=steps, sampling=sampling,
                          namespace=None) for m in ("selective_replay", "full_reset")}
    forgot: dict[str, Forgot] = {}
    for strategy, session in built.items():
        job, seconds = lethe.forget({"artifact_id": session.acquisition_ids[0]}, strategy)
        forgot[strategy] = forgot_from(job, session.session_id, seconds)
    a, b = (shape(lethe, built[m].session_id) for m in ("selective_replay", "full_reset"))
    twin_equal: bool | None = None
    if twin:
        ref = run_steps(lethe, system_prompt=SYSTEM, tools=[], memory={}, steps=counterfactual(steps),
                        sampling=sampling, namespace=None)
        twin_equal = shape(lethe, ref.session_id) == a
        _drop(lethe, ref.session_id)
    difference = None
    if a != b:
        at = next((i for i, (p, q) in enumerate(zip(a, b, strict=False)) if p != q), min(len(a), len(b)))
        difference = f"artifact {at}: {a[at] if at < len(a) else None!r} vs {b[at] if at < len(b) else None!r}"[:400]
    for m in built.values():
        _drop(lethe, m.session_id)
    b7, b5 = forgot["selective_replay"], forgot["full_reset"]
    return Pair(kind, int(sampling["seed"]), b7.T or 0, tau, any(s.compact for s in steps), b7, b5, a == b,
                b7.state_after == b5.state_after, twin_equal, difference, x)


def _drop(lethe: Lethe, session_id: str) -> None:
    lethe.http.delete(f"/v1/sessions/{session_id}", headers=lethe.auth)


def exactness_draws(
    lethe: Lethe, draws: int, turns: int, max_tokens: int, seed: int, tick: Callable[[], None]
) -> list[Pair]:
    """Matched seeds at temperature 0.7: a random τ, and a compaction after the target in every other draw."""
    out = []
    for d in range(draws):
        rng = random.Random(f"exact-{seed}-{d}")
        tau = rng.randint(1, turns)
        compact_after = rng.randint(tau, turns) if d % 2 == 1 else None
        steps, _ = chat_script(rng, turns, tau, compact_after)
        sampling = {"temperature": 0.7, "top_p": 0.95, "max_tokens": max_tokens, "seed": 1000 + d}
        out.append(pair(lethe, steps, sampling, kind="sampled", tau=tau, twin=True))
        tick()
    return out


def tau_sweep(
    lethe: Lethe, taus: tuple[int, ...], turns: int, max_tokens: int, seed: int, tick: Callable[[], None]
) -> list[Pair]:
    out = []
    for tau in taus:
        rng = random.Random(f"sweep-{seed}")  # the same clean messages at every τ: only the target moves
        steps, _ = chat_script(rng, turns, tau, None)
        out.append(pair(lethe, steps, {"temperature": 0, "max_tokens": max_tokens, "seed": seed}, kind="greedy",
                        tau=tau, twin=False))
        tick()
    return out


POLL = "Routine status poll #{i}: all systems nominal, no new messages, queue empty, next poll in 5 minutes."


def indep_script(rng: random.Random, suffix: int, fraction: float) -> list[Step]:
    """τ = 2, then `suffix` transitions of which a `fraction` are independent of the target: observations fixed in
    the counterfactual world (a routine poll result; A2), prefilled and never decoded; the rest are questions the
    model answers with the target in its context, which a replay must decode again."""
    steps = [Step([{"type": "user", "content": rng.choice(CLEAN)}]),
             Step([{"type": "user", "content": target_message(rng)}], acquisition=True)]
    for j in range(suffix):
        independent = int((j + 1) * fraction) - int(j * fraction) == 1
        if independent:
            steps.append(Step([{"type": "document", "content": POLL.format(i=j), "source": "poller"}], generate=False))
        else:
            steps.append(Step([{"type": "user", "content": CLEAN[(j + 3) % len(CLEAN)]}]))
    return steps


def indep_sweep(
    lethe: Lethe, fractions: tuple[float, ...], suffix: int, max_tokens: int, seed: int, tick: Callable[[], None]
) -> list[Pair]:
    out = []
    for f in fractions:
        steps = indep_script(random.Random(f"indep-{seed}"), suffix, f)
        out.append(pair(lethe, steps, {"temperature": 0, "max_tokens": max_tokens, "seed": seed}, kind="indep",
                        tau=2, twin=False, x=f))
        tick()
    return out


def fits(pairs: list[Pair], x: Callable[[Pair], float]) -> dict[str, dict[str, float]]:
    """Least-squares lines of recomputed (and decoded) tokens per method: B7, B5 (measured, cold) and B5' (a full
    reset over a warm prefix cache: B5 less the clean prefix B7 reused)."""
    xs = [x(p) for p in pairs]
    return {
        "B7": fit(xs, [float(p.b7.recomputed) for p in pairs]),
        "B5": fit(xs, [float(p.b5.recomputed) for p in pairs]),
        "B5'": fit(xs, [float(b5_prime(p.b5, p.b7)) for p in pairs]),
        "B7 decoded": fit(xs, [float(p.b7.decoded) for p in pairs]),
        "B5 decoded": fit(xs, [float(p.b5.decoded) for p in pairs]),
    }


def b5_prime(b5: Forgot, b7: Forgot) -> int:
    """A full reset whose engine keeps a prefix cache: the clean prefix before τ (what B7 reused) comes from the
    cache, everything after it is prefilled and decoded again. On hf a full reset runs cold, so this is derived from
    the two receipts; on vLLM the full reset's own receipt already counts the cache hits as `reused`."""
    return max(0, b5.recomputed - max(0, b7.reused - b5.reused))
