"""The engine wire's codec (wire.py): frozen dataclasses to JSON and back, the JSON checked against their field types.

`decode(kind, data)` reads JSON as a `kind` (a dataclass, a list or tuple of one, `X | None`, a Literal, an Enum, or
int/float/str/bool) and raises `ProtocolError` for anything that does not fit: a missing or unknown field, a value
of another type (a bool is not an int; an int is a float). Long lists of ints (token ids) are checked in one pass.
"""

from __future__ import annotations

import types
from dataclasses import MISSING, fields, is_dataclass
from enum import Enum
from typing import Any, Literal, TypeVar, Union, get_args, get_origin, get_type_hints

T = TypeVar("T")

_PLAIN = (int, float, str, bool, type(None))


class ProtocolError(Exception):
    """A message that does not follow the engine wire's format. `request_id` names the call it belongs to, when known
    (the peer answers that call with the error; a frame without an id ends the connection)."""

    def __init__(self, message: str, request_id: int | None = None) -> None:
        super().__init__(message)
        self.request_id = request_id


def to_json(value: object) -> Any:
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, _PLAIN):
        return value
    if isinstance(value, list | tuple):
        return [v if type(v) in _PLAIN else to_json(v) for v in value]
    if is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_json(getattr(value, f.name)) for f in fields(value)}
    raise TypeError(f"{type(value).__name__} does not go on the engine wire")


def decode(kind: type[T], data: object, *, request_id: int | None = None) -> T:
    """`data` (JSON) read as a `kind`; anything that does not fit raises ProtocolError."""
    try:
        value: T = _decode(kind, data, getattr(kind, "__name__", str(kind)))
    except _Misfit as misfit:
        raise ProtocolError(str(misfit), request_id) from None
    return value


class _Misfit(Exception):
    pass


def _decode(kind: Any, data: object, where: str) -> Any:
    origin = get_origin(kind)
    if origin is Literal:
        if isinstance(data, str) and data in get_args(kind):
            return data
        raise _Misfit(f"{where}: {data!r} is none of {get_args(kind)}")
    if origin is Union or origin is types.UnionType:
        options = get_args(kind)
        if data is None and type(None) in options:
            return None
        [option] = [o for o in options if o is not type(None)]  # only `X | None` goes on the wire
        return _decode(option, data, where)
    if origin is list or origin is tuple:
        return _decode_list(kind, data, where)
    if kind is float:
        if type(data) is float or type(data) is int:
            return float(data)
    elif kind in (int, str, bool):
        if type(data) is kind:
            return data
    elif isinstance(kind, type) and issubclass(kind, Enum):
        if not isinstance(data, bool):
            try:
                return kind(data)
            except ValueError:
                pass
    elif isinstance(kind, type) and is_dataclass(kind):
        return _decode_dataclass(kind, data, where)
    else:
        raise TypeError(f"{kind!r} does not go on the engine wire")
    raise _Misfit(f"{where}: expected {getattr(kind, '__name__', kind)}, got {type(data).__name__}")


def _decode_list(kind: Any, data: object, where: str) -> Any:
    """`list[X]` or `tuple[X, ...]` from a JSON list."""
    if not isinstance(data, list):
        raise _Misfit(f"{where}: expected a list, got {type(data).__name__}")
    item = get_args(kind)[0]
    if item is int and all(type(v) is int for v in data):  # token ids: the long lists, checked in one pass
        items: list[Any] = data
    elif item is float and all(type(v) is float or type(v) is int for v in data):
        items = [float(v) for v in data]
    else:
        items = [_decode(item, v, f"{where}[{i}]") for i, v in enumerate(data)]
    return tuple(items) if get_origin(kind) is tuple else list(items)


def _decode_dataclass(kind: type[Any], data: object, where: str) -> Any:
    if not isinstance(data, dict):
        raise _Misfit(f"{where}: expected an object, got {type(data).__name__}")
    hints = _hints(kind)
    unknown = data.keys() - hints.keys()
    if unknown:
        raise _Misfit(f"{where}: unknown fields {sorted(map(str, unknown))}")
    values = {}
    for f in fields(kind):
        if f.name in data:
            values[f.name] = _decode(hints[f.name], data[f.name], f"{where}.{f.name}")
        elif f.default is MISSING and f.default_factory is MISSING:
            raise _Misfit(f"{where}: missing field {f.name!r}")
    return kind(**values)


_HINTS: dict[type[Any], dict[str, Any]] = {}


def _hints(kind: type[Any]) -> dict[str, Any]:
    """The field types of a dataclass (its annotations resolved in its own module), read once."""
    hints = _HINTS.get(kind)
    if hints is None:
        resolved = get_type_hints(kind)
        hints = _HINTS[kind] = {f.name: resolved[f.name] for f in fields(kind)}
    return hints
