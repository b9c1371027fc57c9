"""Keyset pagination for listings ordered newest first.

A cursor is the (created_at, id) of the last row of a page, opaque to clients (base64url JSON). The next page is every
row strictly older in that order, so rows inserted meanwhile never shift a page and a page never repeats a row."""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from datetime import datetime

from app.errors import InvalidRequest
from app.text import storable


@dataclass(frozen=True)
class Position:
    created_at: datetime
    id: str


def encode(position: Position) -> str:
    raw = json.dumps([position.created_at.isoformat(), position.id], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode(cursor: str) -> Position:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        created_at, row_id = json.loads(raw)
        position = Position(datetime.fromisoformat(created_at), row_id)
    except (binascii.Error, ValueError, TypeError, UnicodeDecodeError):
        raise InvalidRequest("cursor is not one this API handed out") from None
    if not isinstance(row_id, str) or not storable(row_id) or position.created_at.tzinfo is None:
        raise InvalidRequest("cursor is not one this API handed out")
    return position


def next_cursor(positions: list[Position], limit: int) -> str | None:
    """The cursor after a page fetched with `limit + 1` rows: None when it was the last page."""
    return encode(positions[limit - 1]) if len(positions) > limit else None
