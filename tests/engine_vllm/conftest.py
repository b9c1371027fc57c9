"""The vLLM engine tests run the real engines on the CPU with the tiny SmolLM2 (converted once into .lethe/models).

Every test module here starts with `pytest.importorskip("vllm")`: without vLLM installed (`make install-vllm`) the
modules are reported as skipped with that reason and the rest of the suite stays green. One engine (or one server)
per module: an engine start costs ~35 s on 2 cores.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")  # no telemetry attempts: there is no network anyway
os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")  # the engine logs every step at INFO
