"""Persistence: SQLAlchemy 2 async over asyncpg, PostgreSQL with pgvector, Alembic migrations."""

# The thread, OpenAI, subject, memory and hold tables join `Base` wherever the models are loaded.
from app.db import hold_models as hold_models
from app.db import memory_models as memory_models
from app.db import openai_models as openai_models
from app.db import subject_models as subject_models
from app.db import thread_models as thread_models
