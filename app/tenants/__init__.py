"""Tenants, API keys and webhook secrets."""
