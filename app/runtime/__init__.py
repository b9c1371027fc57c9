"""The stateful agent runtime: one session is a deterministic transition system R_t = F(R_{t-1}, o_t).

blocks.py renders observations to exact token spans, transition.py is F on the engine, context.py decides what a
model call depends on, checkpoints.py what a boundary records, records.py what a transition writes. The service
that commits transitions is app/sessions.
"""
