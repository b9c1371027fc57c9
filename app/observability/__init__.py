"""Metrics, structured logs and the request context they share."""
