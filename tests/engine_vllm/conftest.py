"""The vLLM engine tests run the real engines on the CPU with the tiny SmolLM2 (converted once into .lethe/models).

vLLM is part of what `make test` installs, so a missing vLLM fails the run here, at collection, instead of letting
the vLLM modules pass by skipping: a suite that silently stopped testing an engine would look green. An engine start
costs ~35 s on 2 cores: the modules that can share the default (batched) engine share `batched_engine`, one per
package; a module that needs another configuration starts its own.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator

import pytest_asyncio

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

# After the environment above: vLLM reads it when imported.
from app.engine.vllm_local import VLLMEngine
from tests.support import MODEL_CACHE

BATCHED_KV_CACHE_BYTES = 256 << 20  # ~5,800 float32 tokens of SmolLM2 blocks: small enough to fill on purpose


@pytest_asyncio.fixture(scope="package", loop_scope="session")
async def batched_engine() -> AsyncIterator[VLLMEngine]:
    """The default engine (batching up to 16 sequences, priority scheduling), with a small KV cache."""
    vllm = VLLMEngine(None, MODEL_CACHE, max_model_len=4096, kv_cache_bytes=BATCHED_KV_CACHE_BYTES)
    await vllm.start()
    yield vllm
    await vllm.close()
