"""Repositories own SQL: one module per aggregate, each function takes an AsyncSession."""
