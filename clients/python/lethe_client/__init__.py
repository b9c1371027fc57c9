"""The Lethe Python client: `LetheClient` (blocking) and `AsyncLetheClient`, with one typed error mapping.

from lethe_client import LetheClient, PreconditionFailed
with LetheClient("http://127.0.0.1:8000", api_key) as lethe:
    rec = lethe.get("user-42", "diet")
    lethe.put("user-42", "diet", "vegan", if_match=rec.version)
"""

from lethe_client._calls import (
    BatchItem,
    ForgetResult,
    HistoryEntry,
    KeyPage,
    MemoryRecord,
    RecordPage,
    WriteResult,
)
from lethe_client.aio import AsyncLetheClient
from lethe_client.errors import (
    Conflict,
    ForgetNotDurable,
    Forgotten,
    LegalHold,
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
from lethe_client.sync import LetheClient

__all__ = [
    "AsyncLetheClient",
    "BatchItem",
    "Conflict",
    "ForgetNotDurable",
    "ForgetResult",
    "Forgotten",
    "HistoryEntry",
    "KeyPage",
    "LegalHold",
    "LetheAPIError",
    "LetheClient",
    "MemoryRecord",
    "NotFound",
    "PayloadTooLarge",
    "PreconditionFailed",
    "PreconditionRequired",
    "RateLimited",
    "RecordPage",
    "ServerError",
    "SessionBusy",
    "Unauthorized",
    "ValidationError",
    "WriteResult",
]
