"""Data subjects: the people data is about (issue 43; docs/subjects.md). Linked objects and the access request's
export are built; erasure, retention and legal holds are the next slices."""
