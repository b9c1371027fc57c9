"""Versioned memory records with durable tombstones: `service` holds the rules, `repository` the SQL."""

from app.memory.service import ForgetCascade, Forgotten, MemoryService, NoCascade

__all__ = ["ForgetCascade", "Forgotten", "MemoryService", "NoCascade"]
