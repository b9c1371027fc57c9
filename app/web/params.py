"""Path parameters that name stored objects.

An id that cannot exist (app/ids.py `plausible`: a NUL, a surrogate, a slash-free path segment longer than any id)
fails validation with the error type `unknown_id`, which the problem handler (app/web/problems.py) answers as 404,
after authentication, like any other unknown id: the database is never asked about it.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Query
from pydantic import AfterValidator
from pydantic_core import PydanticCustomError

from app.ids import plausible

UNKNOWN_ID = "unknown_id"
ID_PATTERN = r"^[A-Za-z0-9_-]+$"  # for an id in a query, where a malformed one is a 422 (app/ids.py `plausible`)
# A listing's cursor is base64url without padding (app/pagination.py, app/memory/validation.py). One the API did not
# hand out answers 422 too, which no schema can tell from a real one.
CURSOR_PATTERN = r"^[A-Za-z0-9_-]+$"
Cursor = Annotated[
    str | None,
    Query(min_length=1, max_length=400, pattern=CURSOR_PATTERN, description="next_cursor of the previous page"),
]


def _plausible(value: str) -> str:
    if not plausible(value):
        raise PydanticCustomError(UNKNOWN_ID, "no object has this id")
    return value


ObjectId = Annotated[str, AfterValidator(_plausible)]
