"""The harness's command line: `python -m bench.eval`, which `lethe eval` runs from the checkout (app/cli.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

from bench.eval.config import PROFILES, scaled
from bench.eval.main import DEFAULT_OUT, run


def run_profile(
    name: str, *, out: Path | None = None, url: str | None = None, api_key: str | None = None, engine: str = "hf",
    seed: int | None = None,
) -> Path:
    profile = PROFILES[name] if seed is None else scaled(PROFILES[name], seed=seed)
    return run(profile, out or DEFAULT_OUT / name, url=url, api_key=api_key, engine=engine)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.eval", description=__doc__)
    parser.add_argument("--profile", choices=sorted(PROFILES), default="quick")
    parser.add_argument("--url", help="A running Lethe (any engine); default: start one.")
    parser.add_argument("--api-key", help="An API key of that Lethe (with --url).")
    parser.add_argument("--engine", default="hf", help="LETHE_ENGINE of the Lethe it starts (without --url).")
    parser.add_argument("--out", type=Path, help=f"Results directory (default {DEFAULT_OUT}/<profile>).")
    parser.add_argument("--seed", type=int, help="Seed of the episodes and sessions.")
    args = parser.parse_args(argv)
    report = run_profile(args.profile, out=args.out, url=args.url, api_key=args.api_key, engine=args.engine,
                         seed=args.seed)
    print(f"report: {report}")
