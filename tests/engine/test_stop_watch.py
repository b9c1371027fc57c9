"""Stop strings are found while a reply is sampled without decoding the whole reply for every token (StopWatch), at
exactly the position `find_stop(decode(all tokens so far))` gives, at the same token: the hf engine's replies, and so
every replay of them, stop where they always did. Over the real tokenizer of the bundled model (multi-byte
characters span several tokens, so the text lags behind the tokens)."""

from __future__ import annotations

import os
import random

import pytest

from app.engine.chat import ChatMLTemplate, load_chat_template
from app.engine.model_store import resolve_model
from app.engine.sampling import StopWatch, find_stop
from tests.support import MODEL_CACHE

os.environ.setdefault("HF_HUB_OFFLINE", "1")

TEXT = "Plan: 👋🏽 step one — 你好. END_ Then END, then 🧑‍🚀 STOP here; Ünïcödé ✓ and more text follows STOP."
STOPS = [("STOP",), ("END",), ("END,", "🚀"), ("ünï", "follows S"), ("never there",), ("E", "P")]


@pytest.fixture(scope="module")
def chat() -> ChatMLTemplate:
    template, _ = load_chat_template(resolve_model(None, MODEL_CACHE).path)
    return template


@pytest.mark.parametrize("stops", STOPS)
def test_stop_found_at_the_same_token_and_position_as_decoding_everything(
    chat: ChatMLTemplate, stops: tuple[str, ...]
) -> None:
    tokens = chat.encode(TEXT)
    rng = random.Random(7)
    for trial in range(5):
        order = tokens if trial == 0 else rng.sample(tokens, len(tokens))  # shuffled: unusual byte splits too
        watch = StopWatch(chat.decode, stops)
        expected = actual = None
        for n in range(1, len(order) + 1):
            expected = find_stop(chat.decode(order[:n]), stops)
            actual = watch.check([order[n - 1]])
            assert actual == expected, (trial, n)
            if expected is not None:
                break
        if trial == 0:
            assert (expected is None) == (stops == ("never there",))
