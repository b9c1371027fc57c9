"""The model's tokenizer without torch: the Rust `tokenizers` library over the model directory's `tokenizer.json`.

Every process that renders blocks needs the tokenizer: the engine process, and each HTTP worker, which tokenizes a
turn's blocks itself before it asks the engine to prefill them (as vLLM's API servers tokenize for their engine
core). transformers' `AutoTokenizer` imports torch (about 300 MB and 8 s per process), so the workers load the same
`tokenizer.json` through `tokenizers` directly, and so does every engine: one implementation, hence the same ids in
every process by construction. `tests/engine/test_tokenizer.py` checks it against transformers' tokenizer on the
bundled model (what the sessions stored so far were encoded with).

A model directory without `tokenizer.json` (a slow, SentencePiece-only tokenizer) falls back to transformers.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Protocol


class TextTokenizer(Protocol):
    """What the chat template needs of a tokenizer."""

    @property
    def eos_token_id(self) -> int | None: ...

    @property
    def unk_token_id(self) -> int | None: ...

    def encode(self, text: str) -> list[int]:
        """Plain text to ids: no BOS or other tokens added, and control-token strings stay text (a user who types
        `<|im_end|>` gets those characters, never the control token)."""
        ...

    def decode(self, token_ids: list[int]) -> str:
        """Ids to text with control tokens visible and spaces untouched: decode(encode(text)) == text."""
        ...

    def token_id(self, token: str) -> int | None:
        """The id of a vocabulary token (None when the vocabulary lacks it)."""
        ...

    def __len__(self) -> int:
        """Vocabulary size, added tokens included: the bound on valid ids."""
        ...


class FastTokenizer:
    """`tokenizers.Tokenizer` with the conventions above (torch-free)."""

    def __init__(self, model_dir: Path) -> None:
        from tokenizers import Tokenizer

        self._tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        # What transformers' `split_special_tokens=True` does for a fast tokenizer: control tokens in the input are
        # matched as text, not as the special tokens they spell.
        self._tokenizer.encode_special_tokens = True
        config = _json(model_dir / "tokenizer_config.json")
        self._eos = self._named(config.get("eos_token"))
        self._unk = self._named(config.get("unk_token"))

    def _named(self, entry: Any) -> int | None:
        name = entry.get("content") if isinstance(entry, dict) else entry
        return self.token_id(name) if isinstance(name, str) else None

    @property
    def eos_token_id(self) -> int | None:
        return self._eos

    @property
    def unk_token_id(self) -> int | None:
        return self._unk

    def encode(self, text: str) -> list[int]:
        return list(self._tokenizer.encode(text, add_special_tokens=False).ids)

    def decode(self, token_ids: list[int]) -> str:
        return str(self._tokenizer.decode(token_ids, skip_special_tokens=False))

    def token_id(self, token: str) -> int | None:
        found = self._tokenizer.token_to_id(token)
        return None if found is None else int(found)

    def __len__(self) -> int:
        return int(self._tokenizer.get_vocab_size(with_added_tokens=True))


class TransformersTokenizer:
    """transformers' tokenizer (imports torch): for model directories without a `tokenizer.json`."""

    def __init__(self, model_dir: Path) -> None:
        from transformers import AutoTokenizer

        self._tokenizer = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)

    @property
    def eos_token_id(self) -> int | None:
        eos = getattr(self._tokenizer, "eos_token_id", None)
        return eos if isinstance(eos, int) else None

    @property
    def unk_token_id(self) -> int | None:
        unk = getattr(self._tokenizer, "unk_token_id", None)
        return unk if isinstance(unk, int) else None

    def encode(self, text: str) -> list[int]:
        ids = self._tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]
        return [int(i) for i in ids]

    def decode(self, token_ids: list[int]) -> str:
        return str(self._tokenizer.decode(token_ids, skip_special_tokens=False, clean_up_tokenization_spaces=False))

    def token_id(self, token: str) -> int | None:
        found = self._tokenizer.convert_tokens_to_ids(token)
        return found if isinstance(found, int) else None  # the unknown token's id for a missing one, as transformers

    def __len__(self) -> int:
        return len(self._tokenizer)


def load_tokenizer(model_dir: Path) -> TextTokenizer:
    if (model_dir / "tokenizer.json").is_file():
        return FastTokenizer(model_dir)
    return TransformersTokenizer(model_dir)


def generation_eos_ids(model_dir: Path) -> frozenset[int]:
    """The model's end-of-sequence ids from `generation_config.json` (none when the file is absent)."""
    eos = _json(model_dir / "generation_config.json").get("eos_token_id")
    if isinstance(eos, int):
        return frozenset([eos])
    return frozenset(int(e) for e in eos) if isinstance(eos, list) else frozenset()


def _json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    loaded = json.loads(path.read_text())
    return loaded if isinstance(loaded, dict) else {}
