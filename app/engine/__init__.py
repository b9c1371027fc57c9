"""KV engines: token ids in, token ids out, with an explicit per-session cache that can be cropped."""
