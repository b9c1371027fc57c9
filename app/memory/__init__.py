"""Versioned memory records with durable tombstones: `service` holds the rules, `repository` the SQL."""

from app.memory.cascade import ForgetCascade, NoCascade
from app.memory.service import Forgotten, MemoryService

__all__ = ["ForgetCascade", "Forgotten", "MemoryService", "NoCascade"]
