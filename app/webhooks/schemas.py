"""What a detector webhook delivers: the flag that starts a forget (validated after the signature is verified)."""

from __future__ import annotations

from typing import Any

from pydantic import ConfigDict, Field

from app.request_model import RequestModel


def _flag_schema(schema: dict[str, Any]) -> None:
    """A flag names the artifact, a text span, or both (422 otherwise)."""
    schema["anyOf"] = [
        {"type": "object", "required": [name], "properties": {name: {"type": "string"}}}
        for name in ("artifact_id", "text")
    ]


class DetectorWebhook(RequestModel):
    model_config = ConfigDict(json_schema_extra=_flag_schema)

    session_id: str = Field(min_length=1, max_length=64)
    artifact_id: str | None = Field(default=None, min_length=1, max_length=64)
    text: str | None = Field(default=None, min_length=1, max_length=100_000)
    detector: str = Field(default="unknown", max_length=200)
    score: float | None = Field(default=None, ge=0.0, le=1.0)
