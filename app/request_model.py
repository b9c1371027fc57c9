"""The base of every request body: unknown fields rejected, strict JSON types, and no text PostgreSQL cannot store.

It sits below every layer that validates input (the API's schemas, the webhook service), so each can use it."""

from __future__ import annotations

import types
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from app.text import REASON, unstorable_path

# A name a client gives a thing (a tool, a model): short, and safe to echo in an error.
Name = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z_][A-Za-z0-9_.-]*$")]


def unstorable_error(path: str) -> PydanticCustomError:
    where = f" (at {path.lstrip('.')})" if path else ""
    return PydanticCustomError("unstorable_text", "text {reason}{where}", {"reason": REASON, "where": where})


def _takes_int(annotation: Any) -> bool:
    if annotation is int:
        return True
    if get_origin(annotation) in (Union, types.UnionType):
        return int in get_args(annotation) and float not in get_args(annotation)
    return False


class RequestModel(BaseModel):
    """Unknown fields are rejected (422): a misspelt option must not be silently ignored.

    Types are strict, as the JSON Schema says: `0` is not a boolean, `false` and `"5"` are not integers (pydantic's
    lax mode would take them). An integral number (`5.0`) is an integer in JSON Schema, so it is one here too.

    Every field of every request body, nested lists and objects included, is checked for text PostgreSQL cannot
    store (app/text.py): a NUL or an unpaired surrogate answers 422 with the field's `loc`, never a 500 from the
    database. One validator here instead of one per field, so a field added later is covered too."""

    model_config = ConfigDict(extra="forbid", strict=True)

    @model_validator(mode="before")
    @classmethod
    def _integral(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        fields = cls.model_fields

        def integral(name: str, value: Any) -> bool:
            return isinstance(value, float) and value.is_integer() and name in fields and _takes_int(
                fields[name].annotation
            )

        return {name: int(value) if integral(name, value) else value for name, value in data.items()}

    @field_validator("*", mode="after")
    @classmethod
    def _storable(cls, value: Any) -> Any:
        path = unstorable_path(value)
        if path is not None:
            raise unstorable_error(path)
        return value
