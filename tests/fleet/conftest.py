"""The fleet tests run vllm-router (the `fleet` extra) in front of two real `vllm serve` CPU workers with the tiny
SmolLM2, and real `lethe serve` processes on one PostgreSQL in front of the router. One fleet for the module
(bench/fleet.py starts it): a worker takes a minute or two to start here."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
