"""Lethe as an MCP server (`/mcp`, streamable HTTP): memory and forgetting as tools an agent can call, receipts as
resources. tools.py holds what the tools do (the memory and forget services, nothing else); mount.py puts the
official SDK's transport at `/mcp` behind the tenant's API key."""
