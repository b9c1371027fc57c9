"""SQL for LangGraph threads (every module here). Every statement is scoped to one tenant.

The ordered barrier (langgraph#7206): every write of a thread first locks the thread's row (`_LOCK`, an upsert, or
`_LOCK_EXISTING`), and only then, in a *later* statement of the same transaction, checks the deleted ids and stores.
A later statement takes a fresh snapshot at READ COMMITTED, so it sees a delete that committed while it waited for the
lock; a delete that comes second sees the write. Either way a write never lands on top of a deleted checkpoint.

The HTTP routes run these on the plain asyncpg pool (app/db/statements.py), as the memory API does.
"""

