"""Incremental detokenization: the text of a reply as its tokens are sampled, at a cost per token that does not grow
with the reply.

Decoding all tokens again for every new one is quadratic in the reply's length. Instead only a short window is
decoded, from `prefix_offset` (a few tokens already emitted, kept so the tokenizer sees the same context for the new
ones: a SentencePiece decoder drops a leading space at the start of what it decodes) to the end, and the text past the
window's emitted part is the delta. Text that ends in U+FFFD is held back: the last token ended inside a multi-byte
UTF-8 character, which the next token completes. This is the scheme of Hugging Face's TextStreamer and vLLM's
incremental detokenizer, without their lookback into the prompt (a reply's text is decoded from its own first token,
as the engine decodes the finished reply).
"""

from __future__ import annotations

from collections.abc import Callable

INCOMPLETE = "\ufffd"  # what a decoder answers for a UTF-8 sequence cut short


class IncrementalDetokenizer:
    """Feed it the sampled tokens with `push`; the deltas it answers, then `flush`, add up to `decode(all tokens)`."""

    def __init__(self, decode: Callable[[list[int]], str]) -> None:
        self._decode = decode
        self._tokens: list[int] = []
        self._prefix_offset = 0  # start of the decoded window: already emitted, kept as context
        self._read_offset = 0  # end of what has been emitted

    def push(self, tokens: list[int]) -> str:
        """The text that `tokens` add (possibly empty while a character is incomplete)."""
        self._tokens.extend(tokens)
        return self._advance(final=False)

    def peek(self) -> str:
        """The text held back so far (not yet emitted), at a cost that does not grow with the reply: the deltas
        emitted, then this, read as `decode(all tokens)` reads now."""
        emitted = self._decode(self._tokens[self._prefix_offset : self._read_offset])
        return self._decode(self._tokens[self._prefix_offset :])[len(emitted) :]

    def flush(self) -> str:
        """What is still held back once no token follows (a reply cut inside a character ends in U+FFFD)."""
        return self._advance(final=True)

    def _advance(self, *, final: bool) -> str:
        if self._read_offset == len(self._tokens):
            return ""
        emitted = self._decode(self._tokens[self._prefix_offset : self._read_offset])
        window = self._decode(self._tokens[self._prefix_offset :])
        if len(window) <= len(emitted) or (window.endswith(INCOMPLETE) and not final):
            return ""
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._tokens)
        return window[len(emitted) :]
