"""Sessions: the service that creates sessions and commits their transitions R_t = F(R_{t-1}, o_t).

endpoints.py is the native front door and schemas.py its shapes; service.py is the facade the routers and the forget
service use; locking.py serializes the work on one session; commit.py runs a transition (or a compaction) under the
session's lease and commits it; views.py holds the values the facade takes and returns; repositories/ holds the SQL
of sessions, artifacts, provenance edges, leases and the tool ledger. The transition itself (the one function every
path calls, the context policies' transition halves, the engine calls, the records a transition writes) is
app/runtime; the policy objects are app/policies.py.
"""
