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
    if settings.engine == EngineKind.VLLM:
        from app.engine.vllm_local import VLLMEngine  # imports vLLM only in start()

        return VLLMEngine(
            settings.model,
            settings.resolved_model_cache_dir,
            dtype=settings.vllm_dtype,
            kv_cache_bytes=settings.vllm_kv_cache_bytes,
            max_num_seqs=settings.vllm_max_num_seqs,
            block_size=settings.vllm_block_size,
            live_step_tokens=settings.vllm_live_step_tokens,
        )
    if settings.engine == EngineKind.VLLM_REMOTE:
        from app.engine.vllm_remote import VLLMRemoteEngine

        if not settings.vllm_url:
            raise RuntimeError("LETHE_ENGINE=vllm-remote needs LETHE_VLLM_URL (the base URL of a `vllm serve` fleet)")
        return VLLMRemoteEngine(
            settings.vllm_url,
            settings.model,
            settings.resolved_model_cache_dir,
            exactness=settings.vllm_remote_exactness,
            priority=settings.vllm_remote_priority,
        )
    raise RuntimeError(f"unknown engine {settings.engine!r}")
