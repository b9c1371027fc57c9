"""Artifact-level provenance: who was in the context of which model call, and what a source reached."""
