"""One real engine for the engine tests: the tiny SmolLM2 on transformers, loaded once per run.

The converted weights live in the checkout's .lethe/models (tests/support.py), so only the first run on a
machine pays for the GGUF conversion.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator

import pytest_asyncio

from app.engine.hf import HFEngine
from tests.support import MODEL_CACHE

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest_asyncio.fixture(scope="session")
async def engine() -> AsyncIterator[HFEngine]:
    hf = HFEngine(None, MODEL_CACHE)
    await hf.start()
    yield hf
    await hf.close()
