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


@pytest.mark.parametrize("kind", [EngineKind.VLLM, EngineKind.VLLM_REMOTE])
def test_vllm_engines_are_not_built_yet(tmp_path: Path, kind: EngineKind) -> None:
    with pytest.raises(RuntimeError, match="not built yet"):
        build_engine(settings(tmp_path, kind))
