"""HTTP layer: thin routers over services. No SQL and no engine calls here."""
