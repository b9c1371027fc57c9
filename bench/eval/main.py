"""`lethe eval`: run the paper's experiments against Lethe over HTTP and write the report.

    lethe eval --smoke | --quick | --full  [--url URL --api-key KEY] [--engine hf|vllm] [--out DIR] [--seed N]

Without --url it starts its own `lethe serve` (embedded PostgreSQL, the tiny model) and stops it at the end."""

from __future__ import annotations

import json
import os
import platform
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tqdm import tqdm

from bench.eval import audits
from bench.eval.api import JobFailed, Lethe
from bench.eval.config import METHODS, PROBED, Profile
from bench.eval.episodes import SUITES, Episode, Preference, preference_episode, suite_episodes
from bench.eval.experiments import Pair, exactness_draws, indep_sweep, tau_sweep
from bench.eval.runner import MethodRun, PreferenceRun, run_method, run_preference
from bench.eval.server import Service, service
from bench.forget_bench import finite

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OUT = ROOT / "bench" / "results" / "eval"


@dataclass
class Leak5:
    method: str
    episode: str
    sample: int
    leaked: bool
    error: str | None = None


@dataclass
class Results:
    profile: Profile
    service: Service
    run_id: str
    episodes: dict[str, Episode] = field(default_factory=dict)
    runs: list[MethodRun] = field(default_factory=list)
    leak5: list[Leak5] = field(default_factory=list)
    preferences: list[Preference] = field(default_factory=list)
    preference_runs: list[PreferenceRun] = field(default_factory=list)
    exact: list[Pair] = field(default_factory=list)
    sweep: list[Pair] = field(default_factory=list)
    indep: list[Pair] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)


def units(p: Profile) -> int:
    suites = sum(p.episodes.values()) * len(p.methods)
    leak5 = p.leak5_episodes * p.leak5_samples
    return (suites + leak5 * len(p.leak5_methods) + p.preference_episodes * len(p.preference_methods)
            + p.exactness_draws + len(p.sweep_taus) + len(p.indep_fractions))


def run(profile: Profile, out: Path, url: str | None = None, api_key: str | None = None, engine: str = "hf") -> Path:
    """Everything, then the report; returns the report's path."""
    started = time.monotonic()
    with service(url, api_key, engine) as svc, Lethe(svc.url, svc.api_key) as lethe:
        results = Results(profile, svc, run_id=f"{int(time.time()):x}")
        results.seconds["startup"] = svc.started_s
        with tqdm(total=units(profile), desc=f"lethe eval --{profile.name}", unit="run", dynamic_ncols=True) as bar:
            tick: Callable[[], None] = lambda: bar.update(1)  # noqa: E731 - a callback, named for the type
            _phase(results, "sweeps", lambda: _sweeps(lethe, results, tick))
            _phase(results, "exactness", lambda: _exactness(lethe, results, tick))
            _phase(results, "suites", lambda: _suites(lethe, results, tick))
            _phase(results, "leak5", lambda: _leak5(lethe, results, tick))
            _phase(results, "behavior", lambda: _behavior(lethe, results, tick))
        results.seconds["total"] = time.monotonic() - started
    from bench.eval.report import write  # matplotlib only once there is something to plot

    return write(results, out)


def _phase(results: Results, name: str, body: Callable[[], None]) -> None:
    start = time.monotonic()
    try:
        body()
    except (JobFailed, RuntimeError, OSError) as exc:  # recorded in the report; the other phases still run
        results.errors.append(f"{name}: {type(exc).__name__}: {exc}"[:1000])
    results.seconds[name] = time.monotonic() - start


def _sweeps(lethe: Lethe, r: Results, tick: Callable[[], None]) -> None:
    p = r.profile
    r.sweep = tau_sweep(lethe, p.sweep_taus, p.sweep_turns, p.max_tokens, p.seed, tick)
    r.indep = indep_sweep(lethe, p.indep_fractions, p.indep_suffix, p.max_tokens, p.seed, tick)


def _exactness(lethe: Lethe, r: Results, tick: Callable[[], None]) -> None:
    p = r.profile
    r.exact = exactness_draws(lethe, p.exactness_draws, p.exactness_turns, p.max_tokens, p.seed, tick)


def _sampling(p: Profile, suite: str, temperature: float = 0.0, seed: int | None = None) -> dict[str, Any]:
    tokens = p.tool_max_tokens if suite == "TS" else p.max_tokens
    return {"temperature": temperature, "top_p": 0.95 if temperature else 1.0, "max_tokens": tokens,
            "seed": p.seed if seed is None else seed}


def _suites(lethe: Lethe, r: Results, tick: Callable[[], None]) -> None:
    p = r.profile
    for suite in SUITES:
        for episode in suite_episodes(suite, p.episodes.get(suite, 0), p.seed):
            r.episodes[episode.name] = episode
            every = {**episode.probes, "utility": episode.utility_query}
            for method in p.methods:
                ns = f"eval-{r.run_id}-{episode.name}-{method}"
                # Table 1-only methods need the task answer (leakage, CAD) and the utility answer, not the audits.
                probes = every if method in PROBED else {k: every[k] for k in ("task", "utility")}
                r.runs.append(run_method(lethe, episode, method, METHODS[method], _sampling(p, suite), ns, probes,
                                         p.isolate_probes))
                tick()


def _leak5(lethe: Lethe, r: Results, tick: Callable[[], None]) -> None:
    """Five samples at temperature 0.7 (independent session seeds) of the task and direct probes (tool suite)."""
    p = r.profile
    for episode in suite_episodes("TS", p.leak5_episodes, p.seed):
        r.episodes.setdefault(episode.name, episode)
        probes = {k: episode.probes[k] for k in ("task", "direct")}
        for method in p.leak5_methods:
            for k in range(p.leak5_samples):
                ns = f"eval-{r.run_id}-{episode.name}-{method}-s{k}"
                sampling = _sampling(p, "TS", temperature=0.7, seed=p.seed + 101 * (k + 1))
                got = run_method(lethe, episode, method, METHODS[method], sampling, ns, probes, p.isolate_probes)
                leaked = any(audits.probe_leaks(got, episode).values()) or audits.leak(got, episode).action
                r.leak5.append(Leak5(method, episode.name, k, leaked, got.error))
                tick()


def _behavior(lethe: Lethe, r: Results, tick: Callable[[], None]) -> None:
    p = r.profile
    for i in range(p.preference_episodes):
        episode = preference_episode(i, p.seed)
        r.preferences.append(episode)
        for method in p.preference_methods:
            sampling = {"temperature": 0, "max_tokens": p.max_tokens, "seed": p.seed}
            r.preference_runs.append(run_preference(lethe, episode, method, METHODS[method], sampling,
                                                    p.isolate_probes))
            tick()


def dump(results: Results, path: Path) -> None:
    payload = {
        "profile": asdict(results.profile), "service": asdict(results.service), "run_id": results.run_id,
        "host": {"node": platform.node(), "cpus": os.cpu_count()}, "seconds": results.seconds,
        "errors": results.errors, "episodes": {k: asdict(v) for k, v in results.episodes.items()},
        "runs": [asdict(x) for x in results.runs], "leak5": [asdict(x) for x in results.leak5],
        "preferences": [asdict(x) for x in results.preferences],
        "preference_runs": [asdict(x) for x in results.preference_runs],
        "exact": [asdict(x) for x in results.exact], "sweep": [asdict(x) for x in results.sweep],
        "indep": [asdict(x) for x in results.indep],
    }
    path.write_text(json.dumps(finite(payload), indent=1, default=str) + "\n")
