"""The entry point `lethe eval` calls (app/cli.py stays a thin wrapper)."""

from __future__ import annotations

from pathlib import Path

from bench.eval.config import PROFILES, scaled
from bench.eval.main import DEFAULT_OUT, run


def run_profile(
    name: str, *, out: Path | None = None, url: str | None = None, api_key: str | None = None, engine: str = "hf",
    seed: int | None = None,
) -> Path:
    profile = PROFILES[name] if seed is None else scaled(PROFILES[name], seed=seed)
    return run(profile, out or DEFAULT_OUT / name, url=url, api_key=api_key, engine=engine)
