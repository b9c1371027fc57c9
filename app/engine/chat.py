"""Block-by-block rendering of ChatML (`<|im_start|>role\\ncontent<|im_end|>\\n`), the format of SmolLM2 and Qwen.

Every block is encoded on its own, so each artifact of a session owns an exact token span and the prompt is the
concatenation of block tokens. This equals what the tokenizer's own chat template produces for the same messages,
because ChatML's control tokens cut the text into pieces that BPE encodes independently: the text between two
control tokens is the same string either way. Two documented differences:

- content is encoded with `split_special_tokens=True`: a user who types `<|im_end|>` gets those characters as text,
  never a control token that would close their turn and open a forged one (the HF template would parse it);
- SmolLM2's template inserts a default system prompt when the first message is not a system message; blocks never
  add a message nobody wrote. Sessions open with their own system block, where both render the same tokens.
"""

from __future__ import annotations

from pathlib import Path

from app.engine.tokenizer import TextTokenizer, generation_eos_ids, load_tokenizer

ROLES = frozenset({"system", "user", "assistant", "tool"})
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
END_OF_TEXT = "<|endoftext|>"


class ChatMLTemplate:
    """A ChatTemplate (see protocol.py) over a tokenizer whose vocabulary has the ChatML tokens."""

    def __init__(self, tokenizer: TextTokenizer, *, extra_stop_ids: frozenset[int] = frozenset()) -> None:
        self._tokenizer = tokenizer
        self._im_start = self._special_id(IM_START)
        self._im_end = self._special_id(IM_END)
        self._newline = self.encode("\n")
        stops = {self._im_end, *extra_stop_ids}
        if tokenizer.eos_token_id is not None:
            stops.add(tokenizer.eos_token_id)
        end_of_text = tokenizer.token_id(END_OF_TEXT)
        if end_of_text is not None and end_of_text != tokenizer.unk_token_id:
            stops.add(end_of_text)
        self._stop_ids = frozenset(stops)
        self._assistant_header = self._header("assistant")
        self._end_of_turn = [self._im_end, *self._newline]

    def _special_id(self, token: str) -> int:
        token_id = self._tokenizer.token_id(token)
        if token_id is None or token_id == self._tokenizer.unk_token_id:
            raise RuntimeError(f"the tokenizer has no {token} token: the hf engine renders ChatML models only")
        return token_id

    def encode(self, text: str) -> list[int]:
        """Plain text to ids: no BOS or other tokens added, and control-token strings stay text."""
        return self._tokenizer.encode(text)

    def decode(self, token_ids: list[int]) -> str:
        # Control tokens stay visible and spaces untouched, so decode(encode(text)) gives back the text.
        return self._tokenizer.decode(token_ids)

    def _header(self, role: str) -> list[int]:
        return [self._im_start, *self.encode(f"{role}\n")]

    def render_block(self, role: str, content: str) -> list[int]:
        if role not in ROLES:
            raise ValueError(f"unknown chat role {role!r}; expected one of {sorted(ROLES)}")
        # Role, newline and content are one string between two control tokens, exactly as the HF template joins them:
        # encoding the header apart could split a merge (e.g. "\n" with leading spaces of the content) differently.
        return [self._im_start, *self.encode(f"{role}\n{content}"), *self._end_of_turn]

    def assistant_header(self) -> list[int]:
        return list(self._assistant_header)

    def end_of_turn(self) -> list[int]:
        return list(self._end_of_turn)

    @property
    def stop_token_ids(self) -> frozenset[int]:
        return self._stop_ids


def load_chat_template(model_dir: Path) -> tuple[ChatMLTemplate, int]:
    """The ChatML template over the tokenizer in `model_dir`, with the model's EOS ids as extra stops, and the
    tokenizer's size (added tokens included): the bound on valid token ids. Torch-free (tokenizer.py)."""
    tokenizer = load_tokenizer(model_dir)
    return ChatMLTemplate(tokenizer, extra_stop_ids=generation_eos_ids(model_dir)), len(tokenizer)
