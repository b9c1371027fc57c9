"""The OpenMP spin count is set before torch loads libgomp, whatever the process imports first (the reason and the
measurement: app/engine/__init__.py, bench/omp_contention.py). libgomp reads its environment once, when loaded, so
what counts is the variable's value at the moment torch is first imported; an import hook records it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from app.engine import OPENMP_SPIN_COUNT

PROBE = """
import importlib.abc, os, sys
seen = []
class Watch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "torch" and not seen:
            seen.append(os.environ.get("GOMP_SPINCOUNT", "unset"))
        return None
sys.meta_path.insert(0, Watch())
{imports}
import torch
print(seen[0])
"""


def spins_when_torch_loads(imports: str, env_spins: str | None = None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "GOMP_SPINCOUNT"}
    if env_spins is not None:
        env["GOMP_SPINCOUNT"] = env_spins
    done = subprocess.run([sys.executable, "-c", PROBE.format(imports=imports)], env=env, capture_output=True,
                          text=True, check=True)
    return done.stdout.strip().splitlines()[-1]


@pytest.mark.parametrize("imports", [
    "from app.main import create_app",  # what `lethe serve` and its engine process build
    "from app.engine.hf import HFEngine",
    "import bench.engine_hf",
])
def test_the_spin_count_is_set_before_torch_loads(imports: str) -> None:
    assert spins_when_torch_loads(imports) == OPENMP_SPIN_COUNT


def test_an_operators_spin_count_wins() -> None:
    assert spins_when_torch_loads("from app.engine.hf import HFEngine", env_spins="500") == "500"


def test_without_the_engine_package_torch_would_load_untuned() -> None:
    """The probe itself can tell the difference (so the tests above can fail)."""
    assert spins_when_torch_loads("") == "unset"
