"""Lethe: stateful LLM agent serving with execution-state unlearning."""

__version__ = "0.1.0"
