"""Constants and helpers shared by tests (import from here, not from conftest)."""

from __future__ import annotations

import socket
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODEL_CACHE = ROOT / ".lethe" / "models"
BOOTSTRAP_KEY = "test-bootstrap-key-" + "0" * 24
WEBHOOK_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
