"""Every live record of one namespace, with its value and version."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from lethe_client.errors import NotFound
from lethe_client.sync import LetheClient


def live_records(lethe: LetheClient, namespace: str) -> Iterator[tuple[str, Any, int]]:
    """(key, value, version) of each live key; a key forgotten between the listing and its read is left out."""
    cursor: str | None = None
    while True:
        page = lethe.list(namespace, limit=100, cursor=cursor)
        for key in page.keys:
            try:
                record = lethe.get(namespace, key)
            except NotFound:
                continue
            yield key, record.value, record.version
        if page.next_cursor is None:
            return
        cursor = page.next_cursor
