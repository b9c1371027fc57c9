"""Legal holds: what must not be erased while a hold stands (docs/subjects.md, "Legal holds")."""
