"""The report: one markdown file with tables shaped like the paper's Tables 1-4 (the paper's figures beside ours),
exactness, the sweeps with their fits and plots; plus results.json with every raw answer and receipt."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable
from pathlib import Path

from bench.eval import audits, paper
from bench.eval.config import NAMES
from bench.eval.episodes import PAPER_SUITE, PROBES, SUITES, Episode
from bench.eval.experiments import b5_prime, fits
from bench.eval.main import Results, dump
from bench.eval.plots import indep_plot, tau_plot
from bench.eval.runner import MethodRun

HONESTY = (
    "**How to read this.** The default model is SmolLM2-135M-Instruct on a CPU: it follows instructions weakly, "
    "copies from its context more than it reasons, and writes poor summaries, so the leakage, elicitation, "
    "behavioral and utility figures are weak evidence about forgetting methods in general (they say what this model "
    "does with what each method leaves in its state; `in state` is the model-free part of that). Small n makes "
    "every rate coarse. The exactness and recompute figures do not depend on the model: they are properties of the "
    "runtime (token-for-token equality of the forgotten session with the full reset and with the twin that never "
    "saw the target; tokens counted by the engine). For paper-grade leakage numbers run `lethe eval --full` against "
    "a Lethe on a GPU with a 7-8B instruct model (`--url`, `--api-key`)."
)


def f2(x: float | None) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.2f}"


def f0(x: float | None) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.0f}"


def both(ours: str, theirs: str) -> str:
    return f"{ours} · {theirs}"


def _by(results: Results) -> dict[tuple[str, str], list[MethodRun]]:
    out: dict[tuple[str, str], list[MethodRun]] = {}
    for r in results.runs:
        if r.error is None:
            out.setdefault((r.method, r.suite), []).append(r)
    return out


def _reference(results: Results) -> dict[str, MethodRun]:
    return {r.episode: r for r in results.runs if r.method == "B5" and r.error is None}


def _any(runs: list[MethodRun], eps: dict[str, Episode]) -> float:
    return audits.rate(audits.leak(r, eps[r.episode]).any for r in runs)


def _cad(runs: list[MethodRun], ref: dict[str, MethodRun]) -> float:
    return audits.mean(audits.cad(r, ref[r.episode]) for r in runs if r.episode in ref)


def _methods(results: Results) -> list[str]:
    order = ["B0", "B1", "B2", "B3", "B4", "B6", "B5", "B5'", "B7", "B8", "B9"]
    present = {r.method for r in results.runs}
    return [m for m in order if m in present or (m == "B5'" and {"B5", "B7"} <= present)]


def _recomp(results: Results, method: str) -> float:
    runs = [r for r in results.runs if r.forgot and r.error is None]
    if method == "B5'":
        b7 = {r.episode: r.forgot for r in runs if r.method == "B7" and r.forgot}
        vals = [float(b5_prime(r.forgot, f7)) for r in runs
                if r.method == "B5" and r.forgot and (f7 := b7.get(r.episode)) is not None]
        return statistics.fmean(vals) if vals else math.nan
    vals = [float(r.forgot.recomputed) for r in runs if r.method == method and r.forgot]
    return statistics.fmean(vals) if vals else math.nan


def table1(results: Results) -> list[str]:
    eps, by, ref = results.episodes, _by(results), _reference(results)
    lines = [
        "## Table 1: headline results (any-leak ↓, CAD ↓, recomputed tokens ↓)",
        "",
        "Each cell: **ours · paper**. Any-leak: the target (or a distinctive fragment) in the answer to the task "
        "query, in a tool argument (live, pending, or in the task query's calls) or in a live memory record "
        "(write-backs included). CAD: tool-choice mismatch plus argument distance against B5 over all probe "
        "answers. Recomp: tokens the forget job prefilled + decoded (its receipt), averaged over suites. B5' is "
        "derived from the B5 and B7 receipts (B5 less the clean prefix a prefix cache would serve). "
        f"Suites: AD = AgentDojo injections (n={results.profile.episodes.get('AD', 0)}), LME = memory facts "
        f"(n={results.profile.episodes.get('LME', 0)}), TS = tool-observed identifiers "
        f"(n={results.profile.episodes.get('TS', 0)}).",
        "",
        "| Method | AD | LME | TS | CAD | Recomp |",
        "|---|---|---|---|---|---|",
    ]
    for m in _methods(results):
        src = "B5" if m == "B5'" else m
        cells = [f2(_any(by.get((src, s), []), eps)) if by.get((src, s)) else "-" for s in ("AD", "LME", "TS")]
        cad = f2(_cad([r for s in SUITES for r in by.get((src, s), [])], ref))
        ref_paper = paper.TABLE1.get(m, (None,) * 5)
        row = [both(c, f2(ref_paper[i])) for i, c in enumerate(cells)]
        lines.append(f"| {m} {NAMES[m]} | {' | '.join(row)} | {both(cad, f2(ref_paper[3]))} | "
                     f"{both(f0(_recomp(results, m)), f0(ref_paper[4]))} |")
    return lines


def table1_detail(results: Results) -> list[str]:
    eps, by, ref = results.episodes, _by(results), _reference(results)
    lines = [
        "### Table 1, per suite and channel (ours only)",
        "",
        "exact: the normalized target verbatim in the task answer; action: in a tool argument; memory: in a live "
        "memory record; any: any of these, fragments included; in state: verbatim in the live session state after "
        "the forget (what every later turn reads: model-independent); agree: probe answers word for word equal to "
        "B5's; utility: a fact that was not forgotten still answered. Tokens from the forget receipt; ms = the job's "
        "duration_ms. The B5 row is the measured false-positive floor.",
        "",
        "| suite | method | n | exact | action | memory | any | in state | CAD | agree | utility | reused | "
        "prefilled | decoded | forget ms |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for suite in SUITES:
        for m in [x for x in _methods(results) if x != "B5'"]:
            runs = by.get((m, suite), [])
            if not runs:
                continue
            leaks = [audits.leak(r, eps[r.episode]) for r in runs]
            fg = [r.forgot for r in runs if r.forgot]

            def avg(get: Callable[[audits.Leak], bool], items: list[audits.Leak] = leaks) -> str:
                return f2(audits.rate(get(x) for x in items))

            lines.append(
                f"| {suite} | {m} | {len(runs)} | {avg(lambda x: x.exact)} | {avg(lambda x: x.action)} | "
                f"{avg(lambda x: x.memory)} | {avg(lambda x: x.any)} | {avg(lambda x: x.state)} | "
                f"{f2(_cad(runs, ref))} | "
                f"{f2(audits.mean(audits.agreement(r, ref[r.episode]) for r in runs if r.episode in ref))} | "
                f"{f2(audits.rate(audits.utility(r, eps[r.episode]) for r in runs))} | "
                f"{f0(_mean(f.reused for f in fg))} | {f0(_mean(f.prefilled for f in fg))} | "
                f"{f0(_mean(f.decoded for f in fg))} | {f0(_mean(f.duration_ms for f in fg))} |"
            )
    return lines


def _mean(values: Iterable[float]) -> float:
    items = list(values)
    return statistics.fmean(items) if items else math.nan


def table2(results: Results) -> list[str]:
    eps, by = results.episodes, _by(results)
    kept: dict[str, list[str]] = {}
    floor_text = []
    for suite in SUITES:
        floors = audits.floors(by.get(("B5", suite), []), eps)
        kept[suite] = [p for p in PROBES if floors.get(p) == 0.0]
        dropped = [f"{p} ({floors[p]:.2f})" for p in PROBES if floors.get(p, 0.0) > 0]
        if floors:
            floor_text.append(f"{suite}: kept {', '.join(kept[suite]) or 'none'}; dropped (nonzero floor) "
                              f"{', '.join(dropped) or 'none'}")
    lines = [
        "## Table 2: adversarial audits (Leak@probes ↓, Leak@5 ↓)",
        "",
        "Each cell: **ours · paper**. Leak@probes: leaked under any of the six probes (task, direct, think, "
        "introspect, enumerate, cued completion) against the same post-forget state (each probe is undone before "
        "the next). Probes with a nonzero false-positive floor on B5 are dropped per suite: "
        + "; ".join(floor_text) + ". Leak@5: leaked in any of 5 samples at temperature 0.7 (independent session "
        "seeds; task and direct probes; tool suite).",
        "",
        "| Method | AD | LME | TS | Leak@5 (TS) |",
        "|---|---|---|---|---|",
    ]
    for m in ["B0", "B2", "B3", "B6", "B8", "B5", "B7", "B1", "B4", "B9"]:
        if not any(by.get((m, s)) for s in SUITES) and not any(x.method == m for x in results.leak5):
            continue
        cells = []
        for suite in ("AD", "LME", "TS"):
            runs = by.get((m, suite), [])
            cells.append(f2(audits.leak_at_probes(runs, eps, kept[suite])) if runs else "-")
        by_episode: dict[str, bool] = {}
        for x in results.leak5:
            if x.method == m and x.error is None:
                by_episode[x.episode] = by_episode.get(x.episode, False) or x.leaked
        l5 = f2(audits.rate(by_episode.values())) if by_episode else "-"
        ref = paper.TABLE2.get(m, (None, None, None, None))
        row = [both(c, f2(ref[i])) for i, c in enumerate([*cells, l5])]
        lines.append(f"| {m} {NAMES[m]} | {' | '.join(row)} |")
    return lines


def table3(results: Results) -> list[str]:
    runs = results.preference_runs
    ref = [r for r in runs if r.method == "B5" and r.error is None]
    lines = [
        "## Table 3: behavioral extraction (a revoked preference, counterbalanced)",
        "",
        f"{len(results.preferences)} preference episode(s) x 2 orders. The user names two near-equal providers, "
        "then excludes one (the target turn, forgotten); the agent is then asked to book one. avoid = picked the "
        "provider that was not excluded; residue = avoid - B5's avoid (the measured zero point); p = exact McNemar "
        "against B5, paired by episode and order; says it = the answer names the revoked reason. Each cell: "
        "**ours · paper**.",
        "",
        "| Method | avoid | residue | p | says it | unparsed |",
        "|---|---|---|---|---|---|",
    ]
    for m in ["B0", "B1", "B2", "B3", "B6", "B5", "B7"]:
        mine = [r for r in runs if r.method == m and r.error is None]
        if not mine:
            continue
        b = audits.behavior(mine, ref)
        avoid_p, residue_p, p_p, says_p = paper.TABLE3[m]
        residue = "—" if m == "B5" else f"{b.residue:+.2f}"
        lines.append(
            f"| {m} {NAMES[m]} | {both(f2(b.avoid), f2(avoid_p))} | "
            f"{both(residue, '—' if residue_p is None else f'{residue_p:+.2f}')} | "
            f"{both('—' if m == 'B5' else f'{b.p:.3f}', p_p)} | {both(f2(b.says), f2(says_p))} | {f2(b.unparsed)} |"
        )
    return lines


def table4(results: Results) -> list[str]:
    eps, by, ref = results.episodes, _by(results), _reference(results)
    lines = [
        "## Table 4: invalidation-boundary ablation (any-leak ↓, CAD ↓)",
        "",
        "Span only = B3 (drop the target's span, keep everything derived from it); span + descendants = B4 "
        "(drop the taint closure, regenerate nothing); + replay = B7. Each cell: **ours · paper**.",
        "",
        "| Invalidation reach | AD | LME | TS | CAD |",
        "|---|---|---|---|---|",
    ]
    rows = [("None (B0)", "B0"), ("Target span only (B3)", "B3"), ("Span + descendants (B4)", "B4"),
            ("+ replay (B7)", "B7"), ("Full reset (B5)", "B5")]
    for label, m in rows:
        if not any(by.get((m, s)) for s in SUITES):
            continue
        cells = [f2(_any(by.get((m, s), []), eps)) if by.get((m, s)) else "-" for s in ("AD", "LME", "TS")]
        cad = f2(_cad([r for s in SUITES for r in by.get((m, s), [])], ref))
        p = paper.TABLE4[m]
        lines.append(f"| {label} | {' | '.join(both(c, f2(p[i])) for i, c in enumerate(cells))} | "
                     f"{both(cad, f2(p[3]))} |")
    return lines


def exactness(results: Results) -> list[str]:
    pairs = [*results.exact, *results.sweep, *results.indep]
    sampled = results.exact
    ok_tokens = sum(p.equal_tokens and p.equal_artifacts for p in pairs)
    twins = [p for p in pairs if p.equal_counterfactual is not None]
    estimate_ok = [p for p in pairs if not p.compacted]
    lines = [
        "## Exactness under matched seeds (Definition 1)",
        "",
        f"Paper: {paper.EXACTNESS}.",
        "",
        "| draws | B7 = B5, artifact for artifact and token for token | B7 = the twin that never saw the target | "
        "with a compaction after the target |",
        "|---|---|---|---|",
        f"| {len(sampled)} sampled (temperature 0.7, top_p 0.95, matched seeds, random τ) + "
        f"{len(results.sweep) + len(results.indep)} greedy (the sweeps) | **{ok_tokens}/{len(pairs)} "
        f"({100 * ok_tokens / len(pairs) if pairs else float('nan'):.0f}%)** | "
        f"{sum(bool(p.equal_counterfactual) for p in twins)}/{len(twins)} | "
        f"{sum(p.equal_tokens and p.equal_artifacts for p in pairs if p.compacted)}/"
        f"{sum(p.compacted for p in pairs)} |",
        "",
        f"- The receipt's `full_reset_estimate` equals a measured cold full reset's recomputed tokens in "
        f"{sum(p.b5.recomputed == p.b7.full_reset_estimate for p in estimate_ok)}/{len(estimate_ok)} draws without "
        "compaction.",
    ]
    for p in pairs:
        if not (p.equal_tokens and p.equal_artifacts) or p.equal_counterfactual is False:
            lines.append(f"- **unequal** ({p.kind}, seed {p.seed}, τ={p.tau}, T={p.T}, compacted={p.compacted}): "
                         f"tokens equal {p.equal_tokens}, artifacts equal {p.equal_artifacts}, twin "
                         f"{p.equal_counterfactual}; {p.first_difference}")
    return lines


def sweeps(results: Results, out: Path) -> list[str]:
    lines = ["## The T - τ + 1 law (Corollary 1)", "", f"Paper: {paper.TAU_LAW}.", ""]
    pairs = sorted(results.sweep, key=lambda p: p.tau)
    if pairs:
        fit = fits(pairs, lambda p: float(p.T - p.tau + 1))
        tau_plot(pairs, fit["B7"], out / "tau_sweep.png")
        lines += [
            f"T = {pairs[0].T} transitions, greedy; every point is also an exactness pair. B5' = B5 less the clean "
            "prefix a prefix cache serves.",
            "",
            "| τ | T-τ+1 | B7 recomputed | B7 reused | B7 decoded | B5 recomputed | B5' recomputed | saving B5/B7 | "
            "equal |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|---|",
        ]
        for p in pairs:
            lines.append(f"| {p.tau} | {p.T - p.tau + 1} | {p.b7.recomputed} | {p.b7.reused} | {p.b7.decoded} | "
                         f"{p.b5.recomputed} | {b5_prime(p.b5, p.b7)} | "
                         f"{p.b5.recomputed / p.b7.recomputed if p.b7.recomputed else float('inf'):.2f}x | "
                         f"{'yes' if p.equal_tokens and p.equal_artifacts else 'NO'} |")
        lines += ["", "Least squares against T - τ + 1:", "", "| method | slope (tokens per transition) | "
                  "intercept | R² |", "|---|---:|---:|---:|"]
        for name, f in fit.items():
            lines.append(f"| {name} | {f2(f['slope'])} | {f0(f['intercept'])} | {f['r2']:.4f} |"
                         if f["r2"] == f["r2"] else f"| {name} | {f2(f['slope'])} | {f0(f['intercept'])} | n/a |")
        lines += ["", "![recomputed tokens against τ](tau_sweep.png)", ""]
    ind = sorted(results.indep, key=lambda p: p.x)
    if ind:
        fit = fits(ind, lambda p: p.x)
        indep_plot(ind, out / "indep_sweep.png")
        lines += [
            "## Cost against the independent share of the post-target work", "", f"Paper: {paper.INDEP}.", "",
            f"τ = 2, {results.profile.indep_suffix} transitions after it; an independent transition is an observation "
            "fixed in the counterfactual world (a routine poll result: prefilled, never decoded), the others are "
            "questions the model answers with the target in context. Lethe has no attribution oracle: a replay "
            "re-decodes every reply after τ, and only what is fixed by (A2) — the observations — is re-prefilled, so "
            "B7 and B5' decode the same tokens here; B7's saving over B5 is the clean prefix.",
            "",
            "| indep | B7 recomputed | B7 decoded | B5 recomputed | B5 decoded | B5' recomputed | equal |",
            "|---:|---:|---:|---:|---:|---:|---|",
        ]
        for p in ind:
            lines.append(f"| {p.x:.2f} | {p.b7.recomputed} | {p.b7.decoded} | {p.b5.recomputed} | {p.b5.decoded} | "
                         f"{b5_prime(p.b5, p.b7)} | {'yes' if p.equal_tokens and p.equal_artifacts else 'NO'} |")
        lines += ["", "| fit against indep | slope | intercept | R² |", "|---|---:|---:|---:|"]
        for name, f in fit.items():
            r2 = f"{f['r2']:.4f}" if f["r2"] == f["r2"] else "n/a"
            lines.append(f"| {name} | {f2(f['slope'])} | {f0(f['intercept'])} | {r2} |")
        lines += ["", "![cost against indep](indep_sweep.png)", ""]
    return lines


def notes(results: Results) -> list[str]:
    lines = ["## Run", ""]
    p, s = results.profile, results.service
    lines.append(f"- profile `{p.name}`; service {s.url} (engine: {s.engine}; started in {s.started_s:.1f} s); "
                 f"seed {p.seed}; reply cap {p.max_tokens} tokens ({p.tool_max_tokens} on the tool suite)")
    lines.append("- wall time: " + ", ".join(f"{k} {v:.0f} s" for k, v in results.seconds.items()))
    befores: dict[str, set[str | None]] = {}
    for r in results.runs:
        if r.forgot:
            befores.setdefault(r.episode, set()).add(r.forgot.state_before)
    same = sum(len(v) == 1 for v in befores.values())
    lines.append(f"- paired design: every method's copy of an episode started from the same state (equal "
                 f"`state_sha256_before`) in {same}/{len(befores)} episodes")
    for r in results.runs:
        for n in r.notes:
            lines.append(f"- {r.episode} {r.method}: {n}")
        if r.error:
            lines.append(f"- **{r.episode} {r.method} failed**: {r.error}")
    for pr in results.preference_runs:
        if pr.error:
            lines.append(f"- **preference {pr.episode} {pr.method} failed**: {pr.error}")
    for x in results.leak5:
        if x.error:
            lines.append(f"- **Leak@5 {x.episode} {x.method} sample {x.sample} failed**: {x.error}")
    for e in results.errors:
        lines.append(f"- **phase error**: {e}")
    lines.append(f"- suites stand in for the paper's: {', '.join(f'{k} ≈ {v}' for k, v in PAPER_SUITE.items())}; "
                 "AgentDojo environments, injection vectors, attack template and goals are read from the installed "
                 "`agentdojo` package at run time")
    lines.append("- raw answers, receipts and pairs: `results.json` next to this file")
    return lines


def write(results: Results, out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    body = [f"# Lethe forgetting evaluation (`lethe eval --{results.profile.name}`)", "", HONESTY, ""]
    sections: list[Callable[[], list[str]]] = [
        lambda: exactness(results), lambda: sweeps(results, out), lambda: table1(results),
        lambda: table1_detail(results), lambda: table2(results), lambda: table3(results), lambda: table4(results),
        lambda: notes(results),
    ]
    for section in sections:
        body += [*section(), ""]
    path = out / "report.md"
    path.write_text("\n".join(body))
    dump(results, out / "results.json")
    return path
