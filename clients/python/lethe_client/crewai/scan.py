"""Every live record of one namespace, with its value and version."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from lethe_client.sync import LetheClient

PAGE = 100  # the most records a page with values (`GET /v1/memory/{namespace}?values=true`)


def live_records(lethe: LetheClient, namespace: str) -> Iterator[tuple[str, Any, int]]:
    """(key, value, version) of each live key, one request a page of records (their values come with them)."""
    cursor: str | None = None
    while True:
        page = lethe.list_records(namespace, limit=PAGE, cursor=cursor)
        for record in page.records:
            yield record.key, record.value, record.version
        if page.next_cursor is None:
            return
        cursor = page.next_cursor
