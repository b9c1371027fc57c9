"""Loading the hf engine's model: local files only, and only a model whose cache the engine can crop exactly."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.engine.chat import ChatMLTemplate, load_chat_template
from app.engine.model_store import resolve_model


@dataclass(frozen=True)
class LoadedModel:
    model: Any
    chat: ChatMLTemplate
    max_positions: int | None
    model_id: str
    path: Path


def load_full_attention_lm(model_arg: str | None, cache_dir: Path) -> LoadedModel:
    """The causal LM and its ChatML template (the model's EOS ids as extra stops), in eval mode."""
    from transformers import AutoModelForCausalLM, DynamicCache
    from transformers.cache_utils import DynamicLayer

    resolved = resolve_model(model_arg, cache_dir)
    model: Any = AutoModelForCausalLM.from_pretrained(str(resolved.path), local_files_only=True)
    model.eval()
    layers = DynamicCache(config=model.config).layers
    if not layers or any(type(layer) is not DynamicLayer for layer in layers):
        # Sliding-window or linear-attention layers cannot be cropped back to an arbitrary token.
        raise RuntimeError(f"{resolved.path}: the hf engine needs a model whose layers all use full attention")
    chat, _ = load_chat_template(resolved.path)
    max_positions = getattr(model.config, "max_position_embeddings", None)
    return LoadedModel(model, chat, max_positions, resolved.model_id, resolved.path)
