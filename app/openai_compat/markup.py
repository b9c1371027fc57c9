"""A reply's visible text: the model's words without its tool-call markup (app/runtime/tool_catalog.py's call format).

The calls are items of their own (`function_call`, or a Chat Completions `tool_calls` entry), so the markup never
shows as text: not in a stored item, not in a streamed delta. A `<tool_call>` block that never closes (the reply was
cut by `max_output_tokens`) is no call and no text either. What remains is stripped of surrounding whitespace.

`VisibleStream` is the same function over a stream of text deltas: it emits exactly `visible_text(whole reply)`,
holding back only what it must (a possible start of `<tool_call>`, whitespace that may turn out to be trailing).
"""

from __future__ import annotations

import re
from typing import Final

OPEN: Final = "<tool_call>"
CLOSE: Final = "</tool_call>"
_MARKUP = re.compile(r"<tool_call>.*?(?:</tool_call>|\Z)", re.DOTALL)


def visible_text(reply: str) -> str:
    return _MARKUP.sub("", reply).strip()


class VisibleStream:
    """Feed it the reply's text deltas (`push`), then `finish`; the pieces it returns concatenate to
    `visible_text` of the whole reply."""

    def __init__(self) -> None:
        self._buffer = ""  # text not decided yet
        self._in_call = False
        self._started = False  # visible text emitted (leading whitespace is dropped before it)
        self._space = ""  # whitespace held back: emitted only once more visible text follows

    def push(self, delta: str) -> str:
        self._buffer += delta
        out = []
        while True:
            if self._in_call:
                end = self._buffer.find(CLOSE)
                if end < 0:
                    self._buffer = self._buffer[-(len(CLOSE) - 1):]  # the call's text goes; a split tag may not
                    break
                self._buffer, self._in_call = self._buffer[end + len(CLOSE):], False
                continue
            start = self._buffer.find(OPEN)
            if start >= 0:
                out.append(self._visible(self._buffer[:start]))
                self._buffer, self._in_call = self._buffer[start + len(OPEN):], True
                continue
            keep = _partial_open(self._buffer)
            out.append(self._visible(self._buffer[: len(self._buffer) - keep]))
            self._buffer = self._buffer[len(self._buffer) - keep:]
            break
        return "".join(out)

    def finish(self) -> str:
        """What is left once the reply ended (an unclosed call is dropped, and trailing whitespace)."""
        rest = "" if self._in_call else self._visible(self._buffer)
        self._buffer = ""
        return rest

    def _visible(self, text: str) -> str:
        text = self._space + text
        core = text.rstrip()
        self._space = text[len(core):]
        if not self._started:
            core = core.lstrip()
            self._started = bool(core)
        return core


def _partial_open(text: str) -> int:
    """How many characters at the end of `text` could begin `<tool_call>`."""
    for size in range(min(len(OPEN) - 1, len(text)), 0, -1):
        if OPEN.startswith(text[-size:]):
            return size
    return 0
