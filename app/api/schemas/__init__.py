"""Request and response bodies of the HTTP API (../shared/API.md). Requests forbid unknown fields."""
