"""Persistence: SQLAlchemy 2 async over asyncpg, PostgreSQL with pgvector, Alembic migrations."""
