"""The vLLM engine tests run the real engines on the CPU with the tiny SmolLM2 (converted once into .lethe/models).

vLLM is part of what `make test` installs, so a missing vLLM fails the run here, at collection, instead of letting
the vLLM modules pass by skipping: a suite that silently stopped testing an engine would look green. One engine (or one
server) per module: an engine start costs ~35 s on 2 cores.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")  # no telemetry attempts: there is no network anyway
os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")  # the engine logs every step at INFO

try:
    import vllm  # noqa: F401
except ImportError as missing:
    raise RuntimeError(
        "vLLM is not installed, and the suite runs the vLLM engines for real: `make test` installs it "
        "(`make install-vllm`)"
    ) from missing
