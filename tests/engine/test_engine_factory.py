from __future__ import annotations

import os
from pathlib import Path

import pytest
from pydantic import ValidationError

from app.engine.factory import build_engine
from app.engine.hf import HFEngine
from app.engine.vllm_local import VLLMEngine
from app.engine.vllm_remote import VLLMRemoteEngine
from app.settings import EngineKind, Settings


def settings(tmp_path: Path, engine: EngineKind) -> Settings:
    return Settings(_env_file=None, data_dir=tmp_path, engine=engine)  # type: ignore[call-arg]


def test_hf_is_built_unstarted(tmp_path: Path) -> None:
    engine = build_engine(settings(tmp_path, EngineKind.HF))
    assert isinstance(engine, HFEngine)
    assert not engine.ready and engine.model_id == "SmolLM2-135M-Instruct" and engine.exactness == "exact"
    with pytest.raises(AttributeError, match="not started"):
        _ = engine.chat


def test_hf_takes_every_core_unless_told_how_many_threads(tmp_path: Path) -> None:
    cores = len(os.sched_getaffinity(0))
    every = build_engine(settings(tmp_path, EngineKind.HF).model_copy(update={"hf_threads": None}))
    one = build_engine(settings(tmp_path, EngineKind.HF).model_copy(update={"hf_threads": 1}))
    assert isinstance(every, HFEngine) and isinstance(one, HFEngine)
    assert (every.threads, one.threads) == (cores, 1)


def test_vllm_is_built_unstarted_without_importing_vllm(tmp_path: Path) -> None:
    engine = build_engine(settings(tmp_path, EngineKind.VLLM))
    assert engine.name == "vllm" and not engine.ready


def test_vllm_batches_by_default_and_takes_its_settings_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("VLLM_BATCH_INVARIANT", raising=False)
    engine = build_engine(settings(tmp_path, EngineKind.VLLM))
    assert isinstance(engine, VLLMEngine) and engine.exactness == "batched"
    assert engine._options["max_num_seqs"] == 16 and engine._options["dtype"] == "float32"
    assert engine._options["kv_cache_memory_bytes"] == 1 << 30 and "block_size" not in engine._options
    assert engine._options["additional_config"] == {"lethe_live_step_tokens": 256}
    monkeypatch.setenv("LETHE_VLLM_MAX_NUM_SEQS", "1")
    monkeypatch.setenv("LETHE_VLLM_DTYPE", "bfloat16")
    monkeypatch.setenv("LETHE_VLLM_KV_CACHE_BYTES", str(256 << 20))
    monkeypatch.setenv("LETHE_VLLM_BLOCK_SIZE", "32")
    monkeypatch.setenv("LETHE_VLLM_LIVE_STEP_TOKENS", "0")
    unbatched = build_engine(settings(tmp_path, EngineKind.VLLM))
    assert isinstance(unbatched, VLLMEngine) and unbatched.exactness == "unbatched"
    assert unbatched._options["dtype"] == "bfloat16" and unbatched._options["kv_cache_memory_bytes"] == 256 << 20
    assert unbatched._options["block_size"] == 32
    assert unbatched._options["additional_config"] == {"lethe_live_step_tokens": 0}  # vLLM's own step budget
    monkeypatch.setenv("VLLM_BATCH_INVARIANT", "1")  # what the operator asks; start() confirms it on the platform
    assert build_engine(settings(tmp_path, EngineKind.VLLM)).exactness == "batch-invariant"
    monkeypatch.setenv("LETHE_VLLM_MAX_NUM_SEQS", "0")
    with pytest.raises(ValidationError):
        settings(tmp_path, EngineKind.VLLM)


def test_vllm_remote_is_built_unstarted_and_needs_a_url(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="LETHE_VLLM_URL"):
        build_engine(settings(tmp_path, EngineKind.VLLM_REMOTE))
    remote = Settings(  # type: ignore[call-arg]
        _env_file=None, data_dir=tmp_path, engine=EngineKind.VLLM_REMOTE, vllm_url="http://127.0.0.1:9"
    )
    engine = build_engine(remote)
    assert engine.name == "vllm-remote" and not engine.ready and engine.exactness == "batched"
    declared = remote.model_copy(update={"vllm_remote_exactness": "unbatched"})
    assert build_engine(declared).exactness == "unbatched"
    for mode in ("auto", "on", "off"):  # request priorities: probed at start (tests/fleet/test_fleet_priority.py)
        configured = build_engine(remote.model_copy(update={"vllm_remote_priority": mode}))
        assert isinstance(configured, VLLMRemoteEngine) and configured._priority_mode == mode
    with pytest.raises(ValueError, match="cannot be 'exact'"):
        VLLMRemoteEngine("http://127.0.0.1:9", exactness="exact")
