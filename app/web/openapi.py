"""What FastAPI's generated spec says that the service does not do, corrected once where the spec is built."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import FastAPI


def _without_null(schema: dict[str, Any]) -> None:
    """An optional parameter is absent or a value, never JSON null: `?status=null` is the string "null"."""
    options = schema.get("anyOf")
    if not isinstance(options, list) or {"type": "null"} not in options:
        return
    rest = [o for o in options if o != {"type": "null"}]
    del schema["anyOf"]
    if len(rest) == 1:
        schema.update(rest[0])
    else:
        schema["anyOf"] = rest


def install_exact_parameters(app: FastAPI) -> None:
    """Query, header and path parameters are declared without FastAPI's `null` alternative for `X | None`."""
    generate: Callable[[], dict[str, Any]] = app.openapi

    def openapi() -> dict[str, Any]:
        spec = generate()
        for operations in spec.get("paths", {}).values():
            for operation in operations.values():
                for parameter in operation.get("parameters", []):
                    _without_null(parameter.get("schema", {}))
        return spec

    app.openapi = openapi  # type: ignore[method-assign]


def link(operation_id: str, description: str, **parameters: str) -> dict[str, Any]:
    """An OpenAPI link: how an answer's ids fill another operation's parameters (clients and stateful tests)."""
    return {"operationId": operation_id, "description": description, "parameters": parameters}
