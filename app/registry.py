"""The one shape of a registry: things of one kind, each known by its name, looked up by it.

Forget strategies, context policies, built-in tools and engines are each a `Registry`. An unknown name is the
caller's mistake, so `named` raises `InvalidRequest` naming the kind and the names there are; code that looks a name
up after validation (a stored job's strategy) gets the same answer.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Final, Generic, Protocol, TypeVar

from app.errors import InvalidRequest


class Named(Protocol):
    @property
    def name(self) -> str: ...


N = TypeVar("N", bound=Named)


class Registry(Generic[N]):
    def __init__(self, kind: str, *items: N) -> None:
        self.kind = kind
        self._by_name: Final[Mapping[str, N]] = {item.name: item for item in items}
        if len(self._by_name) != len(items):
            raise ValueError(f"two {kind}s share a name")

    def named(self, name: str) -> N:
        try:
            return self._by_name[name]
        except KeyError:
            raise InvalidRequest(f"no {self.kind} {name!r}; one of {', '.join(self._by_name)}") from None

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def __iter__(self) -> Iterator[N]:
        return iter(self._by_name.values())

    @property
    def names(self) -> list[str]:
        return list(self._by_name)
