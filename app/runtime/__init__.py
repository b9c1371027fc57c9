"""The stateful agent runtime: one session is a deterministic transition system R_t = F(R_{t-1}, o_t).

transition.py is F: the one function every path that advances a session calls (a turn, a compaction, a forget's
replay or regeneration). It runs the session's policy transition half (policies/full.py, policies/retrieval.py) over the
engine calls of engine_calls.py and the tool loop of tool_loop.py, and computes what the transition writes:
records.py (artifacts tiling the log, provenance edges decided by provenance.py) and checkpoints.py; writes.py is the
one writer of what it computed. blocks.py renders observations to exact token spans; routing.py is a session's
routing key, salts.py its cache salts. The service that commits transitions is app/sessions.
"""
