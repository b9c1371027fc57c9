"""The memory domain's SQL: records.py the heads, their versions and tombstones; search.py search and expiry."""
