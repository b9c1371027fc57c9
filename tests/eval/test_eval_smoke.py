"""`lethe eval --smoke` end to end: it starts its own `lethe serve` (embedded PostgreSQL, the tiny model), runs
every phase at a small size, and writes a report whose numbers are checked here, not just its existence."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench.eval.cli import run_profile


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    out = tmp_path_factory.mktemp("eval-smoke")
    report = run_profile("smoke", out=out)
    return report, json.loads((out / "results.json").read_text())


def test_the_report_holds_the_papers_tables_and_the_plots(smoke: tuple[Path, dict[str, Any]]) -> None:
    report, results = smoke
    text = report.read_text()
    for heading in ("## Table 1", "## Table 2", "## Table 3", "## Table 4", "## Exactness", "T - τ + 1"):
        assert heading in text, heading
    assert "weak evidence" in text  # the honest reading of a tiny model's leakage figures
    assert (report.parent / "tau_sweep.png").stat().st_size > 1000
    assert (report.parent / "indep_sweep.png").stat().st_size > 1000
    assert results["errors"] == []


def test_selective_replay_equals_the_full_reset_and_the_twin_token_for_token(
    smoke: tuple[Path, dict[str, Any]],
) -> None:
    report, results = smoke
    pairs = results["exact"] + results["sweep"] + results["indep"]
    assert len(pairs) >= 5
    for p in pairs:
        assert p["equal_tokens"] and p["equal_artifacts"], p
        assert p["equal_counterfactual"] in (True, None), p
    assert any(p["equal_counterfactual"] is True for p in pairs)
    assert f"**{len(pairs)}/{len(pairs)} (100%)**" in report.read_text()


def test_recomputed_tokens_follow_the_suffix_length(smoke: tuple[Path, dict[str, Any]]) -> None:
    _, results = smoke
    sweep = sorted(results["sweep"], key=lambda p: p["tau"])
    b7 = [p["b7"]["prefilled"] + p["b7"]["decoded"] for p in sweep]
    b5 = [p["b5"]["prefilled"] + p["b5"]["decoded"] for p in sweep]
    assert b7 == sorted(b7, reverse=True) and b7[0] > b7[-1]  # later target, less to recompute
    assert all(s >= r for s, r in zip(b5, b7, strict=True))
    # The estimate is the engine's yardstick (app/forget/cost.py): what a cold full reset that decodes every reply
    # computes, to the token (tests/forget/test_forget_exactness.py). A reset pays every log token wherever the target
    # sits, but forwards a reply its verification accepted whole only once (docs/engines.md, "What it costs"): the
    # replies before the target always are, so it pays the estimate at τ = 1 and less wherever a reply precedes it.
    estimates = [p["b7"]["full_reset_estimate"] for p in sweep]
    assert b5[0] <= estimates[0] and sweep[0]["tau"] == 1
    assert all(s < e for s, e in zip(b5[1:], estimates[1:], strict=True))
    xs = [float(p["T"] - p["tau"] + 1) for p in sweep]
    n, mx, my = len(xs), sum(xs) / len(xs), sum(b7) / len(b7)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, b7, strict=True)) / sum((x - mx) ** 2 for x in xs)
    residual = sum((y - (my + slope * (x - mx))) ** 2 for x, y in zip(xs, b7, strict=True))
    r2 = 1 - residual / sum((y - my) ** 2 for y in b7)
    assert slope > 5 and r2 > 0.98, (slope, r2, n)
    indep = sorted(results["indep"], key=lambda p: p["x"])
    assert indep[0]["b7"]["decoded"] > indep[-1]["b7"]["decoded"]  # independent work is prefilled, not decoded


def test_what_each_method_leaves_in_the_state(smoke: tuple[Path, dict[str, Any]]) -> None:
    """Model-independent: B0 leaves the state as it was; B5 and B7 end in one and the same state, without the
    target; every method started from the same contaminated state; every probe saw the same post-forget state."""
    _, results = smoke
    episodes = results["episodes"]
    after: dict[str, dict[str, str]] = {}
    for run in results["runs"]:
        assert run["error"] is None, run
        forgot = run["forgot"]
        after.setdefault(run["episode"], {})[run["method"]] = forgot["state_after"]
        if run["method"] == "B0":
            assert forgot["state_after"] == forgot["state_before"]
        else:
            assert episodes[run["episode"]]["leak"] not in run["state"], run["method"]
        assert set(run["answers"]) >= {"task", "direct", "think", "introspect", "enumerate", "cued", "utility"}
        assert run["isolated"], run["notes"]
    for states in after.values():
        assert states["B7"] == states["B5"] != states["B0"]
    befores: dict[str, set[str]] = {run["episode"]: set() for run in results["runs"]}
    for run in results["runs"]:
        befores[run["episode"]].add(run["forgot"]["state_before"])
    assert all(len(v) == 1 for v in befores.values())  # every method forgot from the same contaminated state
