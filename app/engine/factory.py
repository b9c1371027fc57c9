"""Builds the KV engine that settings name; the lifespan calls it once and owns what it returns."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from app.engine.protocol import KVEngine
from app.registry import Registry
from app.settings import EngineKind, Settings


@dataclass(frozen=True)
class EngineBuilder:
    name: str  # an EngineKind value, what LETHE_ENGINE says
    build: Callable[[Settings], KVEngine]


def _hf(settings: Settings) -> KVEngine:
    from app.engine.hf import HFEngine  # imports torch: only when this engine is the one asked for

    return HFEngine(
        settings.model, settings.resolved_model_cache_dir, memory_budget_bytes=settings.kv_memory_bytes,
        num_threads=settings.hf_threads,
    )


def _vllm(settings: Settings) -> KVEngine:
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


def _vllm_remote(settings: Settings) -> KVEngine:
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


ENGINES: Final[Registry[EngineBuilder]] = Registry(
    "engine",
    EngineBuilder(EngineKind.HF.value, _hf),
    EngineBuilder(EngineKind.VLLM.value, _vllm),
    EngineBuilder(EngineKind.VLLM_REMOTE.value, _vllm_remote),
)


def build_engine(settings: Settings) -> KVEngine:
    return ENGINES.named(settings.engine.value).build(settings)
