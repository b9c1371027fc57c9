"""The hf engine's seeded sampler: one `torch.Generator` per generation, seeded from `Sampling.seed` (sampling.py).

Sampling draws one float64 uniform per token and inverts the cumulative distribution over the probabilities sorted
in a fixed (stable) order, rather than calling `torch.multinomial`: the result then depends only on the logits and the
generator's stream, not on a kernel's internal strategy. Nothing here reads a global RNG.
"""

from __future__ import annotations

import torch

from app.engine.protocol import Sampling
from app.engine.sampling import SEED_SPACE


def make_generator(seed: int) -> torch.Generator:
    generator = torch.Generator(device="cpu")
    generator.manual_seed(seed % SEED_SPACE)  # negative or huge seeds map into the range manual_seed accepts
    return generator


def sample_token(logits: torch.Tensor, sampling: Sampling, generator: torch.Generator) -> int:
    """The next token from the last position's logits (1-D, vocabulary-sized)."""
    if sampling.temperature == 0:
        return int(torch.argmax(logits).item())  # ties resolve to the lowest id, deterministically
    probs = torch.softmax(logits.to(torch.float64) / sampling.temperature, dim=-1)
    sorted_probs, order = torch.sort(probs, descending=True, stable=True)
    cumulative = torch.cumsum(sorted_probs, dim=-1)
    if sampling.top_p < 1:
        # The nucleus: the fewest most-likely tokens whose mass reaches top_p (the first token always stays).
        keep = int(torch.searchsorted(cumulative, torch.tensor([sampling.top_p], dtype=torch.float64)).item()) + 1
        cumulative = cumulative[: min(keep, cumulative.numel())]
    draw = torch.rand((), generator=generator, dtype=torch.float64) * cumulative[-1]
    index = min(int(torch.searchsorted(cumulative, draw.reshape(1), right=True).item()), cumulative.numel() - 1)
    return int(order[index].item())
