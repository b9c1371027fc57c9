"""The Lethe Python client: `LetheClient` (blocking) and `AsyncLetheClient`, with one typed error mapping.

from app.client import LetheClient, PreconditionFailed
with LetheClient("http://127.0.0.1:8000", api_key) as lethe:
    rec = lethe.get("user-42", "diet")
    lethe.put("user-42", "diet", "vegan", if_match=rec.version)
"""

from app.client._calls import BatchItem, ForgetResult, HistoryEntry, KeyPage, MemoryRecord, WriteResult
from app.client.aio import AsyncLetheClient
from app.client.errors import (
    Conflict,
    ForgetNotDurable,
    Forgotten,
    LetheAPIError,
    NotFound,
    PayloadTooLarge,
    PreconditionFailed,
    PreconditionRequired,
    RateLimited,
    ServerError,
    SessionBusy,
    Unauthorized,
    ValidationError,
)
from app.client.sync import LetheClient

__all__ = [
    "AsyncLetheClient",
    "BatchItem",
    "Conflict",
    "ForgetNotDurable",
    "ForgetResult",
    "Forgotten",
    "HistoryEntry",
    "KeyPage",
    "LetheAPIError",
    "LetheClient",
    "MemoryRecord",
    "NotFound",
    "PayloadTooLarge",
    "PreconditionFailed",
    "PreconditionRequired",
    "RateLimited",
    "ServerError",
    "SessionBusy",
    "Unauthorized",
    "ValidationError",
    "WriteResult",
]
