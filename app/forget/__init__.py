"""Execution-state unlearning: forget jobs, Algorithm 1 (selective replay) and the baselines as strategies."""
