"""The OpenAI-compatible front door: Conversations, Responses, Chat Completions and Models over Lethe's sessions.

Beside the native API, on the same tenants and keys. Nothing here is named `openai`: that would shadow the SDK."""
