"""HTTP plumbing both front doors share (native and OpenAI-compatible): SSE, consistency, deps, problems."""
