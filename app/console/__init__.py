"""The operator console: static assets served by `lethe serve` at /console, talking only to the public /v1 API."""
