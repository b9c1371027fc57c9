"""Certified verification of a draft: would the sampler choose this token, whatever float noise the logits carry?

A replay verifies a transition's recorded reply (the *draft*) in one multi-token forward pass instead of decoding it
again step by step. The pass computes the same logits as the decode steps up to float noise: batched matrix products
sum in another order (bench/verify_margin.py measures how far apart they come on our model; docs/engines.md records
it). So a decision read off the pass's logits is accepted only when it is *certified*: no perturbation of every logit
by at most `PERTURBATION` could change what `torch_sampling.sample_token` chooses.

- greedy: the gap between the top two logits exceeds `GREEDY_MARGIN` (twice the perturbation: both may move);
- seeded sampling (top_p = 1): the draw lies inside the chosen token's interval of the cumulative distribution
  whatever the perturbation does to it: tokens within twice the perturbation of the chosen one may swap places with
  it, and every sum of probabilities moves by at most a factor e^(±2η), η = perturbation / temperature;
- a nucleus (top_p < 1) is not certified: its cut moves with the probabilities, and the engine decodes instead.

Everything here is pure arithmetic on a logits row and a draw; the engine keeps its generator's stream aligned (one
draw per decision, as decode draws).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from app.engine.protocol import Sampling

# The largest |logit difference| certification assumes between a multi-token pass and single-token decode steps at
# the same positions. Measured on SmolLM2-135M (float32, CPU): at most 6.3e-5 (docs/engines.md, "Verified replay");
# this is ~16x that (a greedy gap must clear 2e-3: ~16x the largest gap change, 1.26e-4, measured).
PERTURBATION = 1e-3
GREEDY_MARGIN = 2 * PERTURBATION  # δ: the top-1 minus top-2 logit gap a greedy decision needs
_ROUNDING = 1e-12  # float64 slack on cumulative sums


@dataclass(frozen=True)
class Decision:
    token: int
    certified: bool  # the sampler chooses `token` under any admissible perturbation of the logits


def verifiable(sampling: Sampling) -> bool:
    """Whether decisions under this sampling can be certified at all (a nucleus cannot: module docstring)."""
    return sampling.temperature == 0 or sampling.top_p >= 1


def decide(
    logits: torch.Tensor, sampling: Sampling, draw: float | None, perturbation: float | None = None
) -> Decision:
    """What `sample_token` chooses from `logits` (1-D) with the uniform `draw` it would take (None for greedy), and
    whether that choice is certified against a perturbation of each logit by up to `perturbation` (default
    `PERTURBATION`)."""
    bound = PERTURBATION if perturbation is None else perturbation
    if sampling.temperature == 0:
        top = torch.topk(logits.to(torch.float64), 2)
        token = int(torch.argmax(logits).item())  # as sample_token: ties resolve to the lowest id
        gap = float(top.values[0] - top.values[1])
        return Decision(token, gap > 2 * bound)
    if draw is None:
        raise ValueError("a sampled decision needs the generator's draw")
    scaled = logits.to(torch.float64) / sampling.temperature
    probs = torch.softmax(scaled, dim=-1)
    sorted_probs, order = torch.sort(probs, descending=True, stable=True)
    cumulative = torch.cumsum(sorted_probs, dim=-1)
    total = float(cumulative[-1])
    target = torch.tensor([draw * total], dtype=torch.float64)
    index = min(int(torch.searchsorted(cumulative, target, right=True).item()), cumulative.numel() - 1)
    token = int(order[index].item())
    if sampling.top_p < 1:
        return Decision(token, False)
    eta = bound / sampling.temperature
    # The chosen token's interval [lo, hi) of the cumulative distribution, as fractions of the mass. Tokens whose
    # scaled logits lie within 2η of the chosen one may swap places with it under the perturbation (ties included):
    # they may or may not come before it, so lo can reach the mass above it plus theirs, and hi can shrink to the mass
    # of the tokens surely above it plus its own. Each such sum moves by at most a factor e^(±2η).
    chosen = scaled[token]
    above = float(probs[scaled - chosen > 2 * eta].sum()) / total
    ambiguous_mask = (scaled - chosen).abs() <= 2 * eta
    ambiguous_mask[token] = False
    ambiguous = float(probs[ambiguous_mask].sum()) / total
    own = float(probs[token]) / total
    grow, shrink = math.exp(min(2 * eta, 50.0)), math.exp(-min(2 * eta, 50.0))
    lo = above + ambiguous
    lo_max = min(lo * grow, 1 - (1 - lo) * shrink) if lo > 0 else 0.0
    hi = above + own
    hi_min = max(hi * shrink, 1 - (1 - hi) * grow)
    certified = (lo == 0 or draw > lo_max + _ROUNDING) and draw < hi_min - _ROUNDING
    return Decision(token, certified)
