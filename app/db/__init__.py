"""Persistence: SQLAlchemy 2 async over asyncpg, PostgreSQL with pgvector, Alembic migrations."""

from app.db import thread_models as thread_models  # the thread tables join `Base` wherever the models are loaded
