"""The memory domain's SQL beside the records' heads (app/memory/repository.py): search and expiry."""
