"""Token-sequence helpers every layer above the engine may use."""

from __future__ import annotations

from collections.abc import Sequence


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens `a` and `b` share."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:  # the usual case (a log and its cache agree), compared in C
        return n
    return next(i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y)
