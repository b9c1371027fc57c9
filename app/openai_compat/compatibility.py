"""The compatibility policy for parameter *values* no schema type can state (README, "Compatibility policy").

Every parameter of the compatible routes is one of three things: honoured; accepted because the value asks for
nothing Lethe would do differently; or refused with a 400 naming it, because Lethe cannot honour it. The types in
schemas.py settle most of it (e.g. `store` takes only `true`); what needs a reason per value lives here, so the README
table and the code say the same thing.

`include` asks OpenAI to add data to output items of a kind. A kind Lethe never produces (no built-in search, code or
computer tools, no reasoning items, no image inputs: those are refused) makes the request vacuous: the answer is the
one it would be without it. Logprobs are a kind Lethe produces (messages) without the data asked for: 400.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from app.openai_compat.errors import BadParameter

# include value → why asking for it changes nothing here.
VACUOUS_INCLUDES: Final[dict[str, str]] = {
    "file_search_call.results": "no file_search tool runs here",
    "web_search_call.results": "no web_search tool runs here",
    "web_search_call.action.sources": "no web_search tool runs here",
    "computer_call_output.output.image_url": "no computer tool runs here",
    "code_interpreter_call.outputs": "no code_interpreter tool runs here",
    "reasoning.encrypted_content": "the model emits no reasoning items",
    "message.input_image.image_url": "image inputs are refused, so no message holds one",
}
REFUSED_INCLUDES: Final[dict[str, str]] = {
    "message.output_text.logprobs": "logprobs are not returned by this server",
}


def check_include(values: Sequence[str] | None, param: str = "include") -> None:
    """400 for an `include` value Lethe cannot honour; the vacuous ones (and `[]`) pass."""
    for value in values or ():
        if value not in VACUOUS_INCLUDES:
            reason = REFUSED_INCLUDES.get(value, "not a value this server knows")
            raise BadParameter(param, f"include {value!r} is not supported: {reason}")
