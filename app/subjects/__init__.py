"""Data subjects: the people data is about (issue 43; docs/subjects.md): what is linked to a person, the access
request's export and the erasure request. Legal holds live in app/holds/, retention in app/retention/."""
