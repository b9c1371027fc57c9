"""SQL of sessions, their artifacts, provenance edges, leases and tool ledger."""
