from __future__ import annotations

from pathlib import Path

import pytest

from app.engine.factory import build_engine
from app.engine.hf import HFEngine
from app.settings import EngineKind, Settings


def settings(tmp_path: Path, engine: EngineKind) -> Settings:
    return Settings(_env_file=None, data_dir=tmp_path, engine=engine)  # type: ignore[call-arg]


def test_hf_is_built_unstarted(tmp_path: Path) -> None:
    engine = build_engine(settings(tmp_path, EngineKind.HF))
    assert isinstance(engine, HFEngine)
    assert not engine.ready and engine.model_id == "SmolLM2-135M-Instruct"
    with pytest.raises(AttributeError, match="not started"):
        _ = engine.chat


def test_vllm_is_built_unstarted_without_importing_vllm(tmp_path: Path) -> None:
    engine = build_engine(settings(tmp_path, EngineKind.VLLM))
    assert engine.name == "vllm" and not engine.ready


def test_vllm_remote_is_built_unstarted_and_needs_a_url(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="LETHE_VLLM_URL"):
        build_engine(settings(tmp_path, EngineKind.VLLM_REMOTE))
    remote = Settings(  # type: ignore[call-arg]
        _env_file=None, data_dir=tmp_path, engine=EngineKind.VLLM_REMOTE, vllm_url="http://127.0.0.1:9"
    )
    engine = build_engine(remote)
    assert engine.name == "vllm-remote" and not engine.ready
