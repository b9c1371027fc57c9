"""The evaluation harness of issue 8: the paper's experiments against Lethe over HTTP (see bench/eval/main.py)."""
