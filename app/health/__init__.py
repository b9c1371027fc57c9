"""Liveness, readiness and metrics."""
