"""Streamed deltas come from incremental detokenization (app/engine/detokenize.py): together they are exactly the
reply's decoded text, multi-byte characters never split, and each token costs a decode of a short window, not of the
whole reply so far. Over the real tokenizer of the bundled model (byte-level BPE: an emoji spans several tokens)."""

from __future__ import annotations

import os

import pytest

from app.engine.chat import ChatMLTemplate, load_chat_template
from app.engine.detokenize import INCOMPLETE, IncrementalDetokenizer
from app.engine.model_store import resolve_model
from tests.support import MODEL_CACHE

os.environ.setdefault("HF_HUB_OFFLINE", "1")

MULTI_BYTE = "Hi 👋🏽 — 你好世界 Ünïcödé ✓ 🧑‍🚀 日本語のテキスト 🎉🎉 done."


@pytest.fixture(scope="module")
def chat() -> ChatMLTemplate:
    template, _ = load_chat_template(resolve_model(None, MODEL_CACHE).path)
    return template


class CountingDecode:
    """The template's decode, remembering how many tokens each call was given."""

    def __init__(self, chat: ChatMLTemplate) -> None:
        self.chat = chat
        self.lengths: list[int] = []

    def __call__(self, token_ids: list[int]) -> str:
        self.lengths.append(len(token_ids))
        return self.chat.decode(token_ids)


def stream(decode: CountingDecode, tokens: list[int], per_push: int = 1) -> list[str]:
    text = IncrementalDetokenizer(decode)
    deltas = [text.push(tokens[i : i + per_push]) for i in range(0, len(tokens), per_push)]
    return [d for d in [*deltas, text.flush()] if d]


@pytest.mark.parametrize("per_push", [1, 3, 1000])  # hf streams token by token; vLLM may send them all at once
def test_deltas_add_up_to_the_full_decode(chat: ChatMLTemplate, per_push: int) -> None:
    tokens = chat.encode(MULTI_BYTE)
    assert len(tokens) > len(MULTI_BYTE) // 2  # many characters span several tokens
    deltas = stream(CountingDecode(chat), tokens, per_push)
    assert "".join(deltas) == chat.decode(tokens) == MULTI_BYTE
    assert not any(INCOMPLETE in delta for delta in deltas)  # no character was ever sent in pieces


def test_a_character_split_across_tokens_is_held_back_until_complete(chat: ChatMLTemplate) -> None:
    tokens = chat.encode("🎉")
    assert len(tokens) > 1 and chat.decode(tokens[:1]).endswith(INCOMPLETE)
    text = IncrementalDetokenizer(chat.decode)
    assert [text.push([t]) for t in tokens] == [""] * (len(tokens) - 1) + ["🎉"]
    assert text.flush() == ""


def test_a_reply_cut_inside_a_character_ends_as_its_decode_does(chat: ChatMLTemplate) -> None:
    tokens = chat.encode("ok 🎉")[:-1]  # max_tokens stopped the reply inside the emoji
    deltas = stream(CountingDecode(chat), tokens)
    assert "".join(deltas) == chat.decode(tokens) and deltas[-1].endswith(INCOMPLETE)


def test_work_per_token_does_not_grow_with_the_reply(chat: ChatMLTemplate) -> None:
    short, long = chat.encode(MULTI_BYTE), chat.encode(MULTI_BYTE * 40)
    assert len(long) > 1000
    widest = []
    for tokens in (short, long):
        decode = CountingDecode(chat)
        assert "".join(stream(decode, tokens)) == chat.decode(tokens)
        assert len(decode.lengths) <= 2 * len(tokens) + 2  # two short decodes a token
        widest.append(max(decode.lengths))
    # The widest window is the longest run of tokens that make up one character (and the one before), the same
    # for a reply forty times as long; decoding the whole reply every time would give len(long).
    assert widest[1] == widest[0] < 10
