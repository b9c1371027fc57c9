"""Retention: per-tenant limits on how long idle sessions and memory values are kept, with per-subject and
per-namespace overrides, enforced by a sweep every process's forget worker runs under a lease (docs/subjects.md,
"Retention")."""
