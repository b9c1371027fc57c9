"""Builds the KV engine that settings name; the lifespan calls it once and owns what it returns."""

from __future__ import annotations

from app.engine.protocol import KVEngine
from app.settings import EngineKind, Settings


def build_engine(settings: Settings) -> KVEngine:
    if settings.engine == EngineKind.HF:
        from app.engine.hf import HFEngine  # imports torch: only when this engine is the one asked for

        return HFEngine(
            settings.model, settings.resolved_model_cache_dir, memory_budget_bytes=settings.kv_memory_bytes
        )
    if settings.engine in (EngineKind.VLLM, EngineKind.VLLM_REMOTE):
        raise RuntimeError(f"LETHE_ENGINE={settings.engine.value}: this engine is not built yet; use LETHE_ENGINE=hf")
    raise RuntimeError(f"unknown engine {settings.engine!r}")
