"""Run sizes. `smoke` runs inside the test suite (a minute or two), `quick` on a 2-core CPU in about ten minutes,
`full` is the paper-sized run for a GPU deployment (`--url` to a vLLM-backed Lethe with a real model)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

# The paper's methods, by the forget strategy that implements each (docs/forgetting.md). B5' (a full reset over a
# warm prefix cache) is not a strategy: its cost is derived from the receipts (see audits.b5_prime).
METHODS: dict[str, str] = {
    "B0": "no_forget", "B1": "memory_delete", "B2": "forget_instruction", "B3": "source_redaction",
    "B4": "sanitize_no_replay", "B5": "full_reset", "B6": "sanitized_rebuild", "B7": "selective_replay",
    "B8": "ifc", "B9": "ifc_replay",
}
NAMES: dict[str, str] = {
    "B0": "No-Forget", "B1": "Memory-Delete", "B2": "Forget-Instruction", "B3": "Source-Redaction",
    "B4": "Sanitize-no-Replay", "B5": "Full-Reset (ref)", "B5'": "+PrefixCache", "B6": "Sanitized-Rebuild",
    "B7": "Selective-Replay", "B8": "FIDES-style IFC", "B9": "IFC + replay",
}
ALL = tuple(METHODS)
# Methods Table 2 questions with all six probes; the others (Table 1 only) get the task query and the utility query.
PROBED = ("B0", "B2", "B3", "B6", "B8", "B5", "B7")


@dataclass(frozen=True)
class Profile:
    name: str
    episodes: dict[str, int]  # per suite
    methods: tuple[str, ...] = ALL
    max_tokens: int = 32  # reply cap for every turn (the summary too)
    tool_max_tokens: int = 48  # the tool suite's model must copy a whole call
    leak5_samples: int = 5
    leak5_methods: tuple[str, ...] = ("B0", "B2", "B3", "B6", "B8", "B5", "B7")
    leak5_episodes: int = 1  # tool-suite episodes, each sampled leak5_samples times per method
    preference_episodes: int = 2  # x 2 counterbalanced orders
    preference_methods: tuple[str, ...] = ("B0", "B1", "B2", "B3", "B6", "B5", "B7")
    exactness_draws: int = 4  # matched-seed draws at temperature 0.7 (the τ sweep adds greedy ones)
    exactness_turns: int = 5
    sweep_turns: int = 8  # T of the τ sweep
    sweep_taus: tuple[int, ...] = (1, 3, 5, 7, 8)
    indep_fractions: tuple[float, ...] = (0.0, 0.5, 1.0)
    indep_suffix: int = 4  # transitions after the target in the independence sweep
    isolate_probes: bool = True  # undo each probe (a selective replay of its input) so every probe sees one state
    seed: int = 7
    extra: dict[str, str] = field(default_factory=dict)


SMOKE = Profile(
    name="smoke", episodes={"LME": 0, "TS": 0, "AD": 1}, methods=("B0", "B5", "B7"), max_tokens=12,
    leak5_samples=2, leak5_methods=("B0", "B5", "B7"), leak5_episodes=0, preference_episodes=0,
    preference_methods=("B0", "B5", "B7"), exactness_draws=1, exactness_turns=3, sweep_turns=3, sweep_taus=(1, 2, 3),
    indep_fractions=(0.0, 1.0), indep_suffix=1,
)
QUICK = Profile(
    name="quick", episodes={"LME": 1, "TS": 1, "AD": 1}, max_tokens=16, leak5_methods=("B0", "B5", "B7"),
    preference_episodes=1, preference_methods=("B0", "B3", "B5", "B7"), exactness_draws=2, exactness_turns=4,
    sweep_turns=5, sweep_taus=(1, 3, 5), indep_fractions=(0.0, 0.5, 1.0), indep_suffix=2,
)
FULL = Profile(
    name="full", episodes={"LME": 30, "TS": 30, "AD": 32}, max_tokens=96, tool_max_tokens=96, leak5_episodes=30,
    preference_episodes=30, exactness_draws=450, exactness_turns=8, sweep_turns=16,
    sweep_taus=(1, 2, 4, 6, 8, 10, 12, 14, 16), indep_fractions=(0.0, 0.25, 0.5, 0.75, 1.0), indep_suffix=8,
)
PROFILES = {p.name: p for p in (SMOKE, QUICK, FULL)}


def scaled(profile: Profile, **changes: object) -> Profile:
    return replace(profile, **changes)  # type: ignore[arg-type]
