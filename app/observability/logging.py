"""Structured logs: one JSON object per line, carrying the request id of the request being served.

Log records never carry request bodies, memory values or secrets; `redact` is the last line of defence for
anything that looks like a credential in a message.
"""

from __future__ import annotations

import json
import logging
import re
import sys
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any

request_id_var: ContextVar[str | None] = ContextVar("request_id", default=None)

_SECRET_PATTERNS = [
    re.compile(r"(?i)(bearer\s+)[A-Za-z0-9._~+/=-]+"),
    re.compile(r"whsec_[A-Za-z0-9+/=]+"),
    re.compile(r"lethe_[A-Za-z0-9_-]{20,}"),
    re.compile(r"(?i)(postgres(?:ql)?(?:\+asyncpg)?://[^:/@\s]+:)[^@\s]+(@)"),
]
_STANDARD_ATTRS = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


def redact(text: str) -> str:
    for pattern in _SECRET_PATTERNS:
        if pattern.groups >= 2:
            text = pattern.sub(r"\1***\2", text)
        elif pattern.groups == 1:
            text = pattern.sub(r"\1***", text)
        else:
            text = pattern.sub("***", text)
    return text


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        payload: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": redact(record.getMessage()),
        }
        rid = request_id_var.get()
        if rid:
            payload["request_id"] = rid
        for key, value in vars(record).items():
            if key not in _STANDARD_ATTRS and not key.startswith("_"):
                payload[key] = value
        if record.exc_info:
            payload["exc"] = redact(self.formatException(record.exc_info))
        return json.dumps(payload, default=str)


class PlainFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        rid = request_id_var.get()
        prefix = f"[{rid}] " if rid else ""
        return redact(f"{record.levelname:<7} {record.name}: {prefix}{super().format(record)}")


class StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes each record to the `sys.stderr` of the moment it is emitted, not the one logging was configured with: a
    stream put in its place for a while (a CLI runner's, a test's capture) and closed afterwards must not take the
    log lines of the threads still running with it."""

    def emit(self, record: logging.LogRecord) -> None:
        self.stream = sys.stderr  # under the handler's lock (Handler.handle): one stream per record
        super().emit(record)


def configure_logging(level: str, *, json_lines: bool = True) -> None:
    handler = StderrHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if json_lines else PlainFormatter("%(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # uvicorn's access log repeats what our middleware logs, without the request id.
    logging.getLogger("uvicorn.access").handlers[:] = []
    logging.getLogger("uvicorn.access").propagate = False
    logging.getLogger("pgserver").setLevel(max(logging.WARNING, root.level))  # its INFO lines are per-pid chatter
    for name in ("uvicorn", "uvicorn.error"):
        logging.getLogger(name).handlers[:] = []
        logging.getLogger(name).propagate = True
