"""Which data subject (app/subjects/) an OpenAI-compatible request's new session is about: a conversation's
`metadata.lethe_subject_id`, or a Responses or Chat Completions request's own end-user fields (`safety_identifier`,
then `user`). Sessions a request continues keep the subject they have."""

from __future__ import annotations

import re

from app.ids import SUBJECT_ID_PATTERN
from app.openai_compat.errors import BadParameter

_SUBJECT = re.compile(SUBJECT_ID_PATTERN)


def subject_of(**given: str | None) -> str | None:
    """The first of `given` (param name → value) that is set, checked to be usable as a subject id: a value that
    is not answers 400 naming its parameter, never silently drops the link."""
    for param, value in given.items():
        if value is None:
            continue
        if not _SUBJECT.fullmatch(value):
            raise BadParameter(param, f"{param} names the data subject of the session and must match "
                                      f"{SUBJECT_ID_PATTERN} (letters, digits and ._:@+=-, at most 200)")
        return value
    return None
