"""Sessions: the service that creates sessions and commits their transitions R_t = F(R_{t-1}, o_t).

service.py is the facade the routers and the forget service use; locking.py serializes the work on one session;
turns.py orchestrates a transition (and a compaction); policies/ holds how a turn runs and how it compacts under each
context policy (`full`, `retrieval`); views.py the values the facade returns. The transition machinery itself
(rendering, the engine calls, the records a transition writes) is app/runtime.
"""
