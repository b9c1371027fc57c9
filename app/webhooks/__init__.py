"""Signed webhooks from injection detectors."""
