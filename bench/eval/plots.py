"""PNG plots of the sweeps (matplotlib, headless)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display on build machines

import matplotlib.pyplot as plt

from bench.eval.experiments import Pair, b5_prime


def _series(pairs: list[Pair], decoded: bool) -> dict[str, list[float]]:
    if decoded:
        return {"B5 full reset": [float(p.b5.decoded) for p in pairs],
                "B5' full reset + prefix cache": [float(p.b5.decoded) for p in pairs],
                "B7 selective replay": [float(p.b7.decoded) for p in pairs]}
    return {"B5 full reset": [float(p.b5.recomputed) for p in pairs],
            "B5' full reset + prefix cache": [float(b5_prime(p.b5, p.b7)) for p in pairs],
            "B7 selective replay": [float(p.b7.recomputed) for p in pairs]}


STYLE = {"B5 full reset": ("tab:red", "s"), "B5' full reset + prefix cache": ("tab:orange", "^"),
         "B7 selective replay": ("tab:blue", "o")}


def tau_plot(pairs: list[Pair], fit_b7: dict[str, float], out: Path) -> Path:
    """Recomputed tokens against τ, with the least-squares line of B7 against T - τ + 1."""
    pairs = sorted(pairs, key=lambda p: p.tau)
    taus = [p.tau for p in pairs]
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for label, ys in _series(pairs, decoded=False).items():
        color, marker = STYLE[label]
        ax.plot(taus, ys, marker=marker, color=color, label=label)
    if pairs and fit_b7.get("slope") == fit_b7.get("slope"):
        T = pairs[0].T
        line = [fit_b7["intercept"] + fit_b7["slope"] * (T - t + 1) for t in taus]
        ax.plot(taus, line, "--", color="gray",
                label=f"B7 fit: {fit_b7['slope']:.1f}·(T-τ+1) + {fit_b7['intercept']:.0f}, R²={fit_b7['r2']:.4f}")
    ax.set_xlabel("τ (transition where the target entered)")
    ax.set_ylabel("tokens recomputed by the forget (prefilled + decoded)")
    ax.set_title(f"Forget cost against τ (T = {pairs[0].T if pairs else '?'})")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def indep_plot(pairs: list[Pair], out: Path) -> Path:
    """Recomputed and decoded tokens against the fraction of post-target transitions independent of the target."""
    pairs = sorted(pairs, key=lambda p: p.x)
    xs = [p.x for p in pairs]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.2))
    for ax, decoded in zip(axes, (False, True), strict=True):
        for label, ys in _series(pairs, decoded).items():
            color, marker = STYLE[label]
            ax.plot(xs, ys, marker=marker, color=color, label=label)
        ax.set_xlabel("indep: fraction of post-target transitions independent of the target")
        ax.set_ylabel("tokens decoded" if decoded else "tokens recomputed (prefilled + decoded)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("Forget cost against the independent share of the post-target work")
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out
