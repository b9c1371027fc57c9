"""The session's cache salt after a forget (app/runtime/salts.py), through the API on the default (hf) engine: a
forget that replayed a suffix keeps the salt; one that leaves the log a prefix of the old one (the last transition
forgotten) bumps the session's cache generation. On hf, which shares no cache between handles, the bump costs
nothing: the next turn still reuses the whole log. (What the salts do on vLLM, measured with vLLM's cached-token
counts: tests/engine_vllm/test_vllm_forget_salt.py.)"""

from __future__ import annotations

import httpx

from app.runtime.salts import rotates, session_salt
from tests.forget.forget_helpers import forget, run_script, user
from tests.support import sql

GREEDY = {"temperature": 0, "max_tokens": 12, "seed": 7}
SECRET = "A private note for you: my locker code is 4471-ZQ."


def generation(database_url: str, session_id: str) -> int:
    return int(sql(database_url, "SELECT cache_generation FROM sessions WHERE id = $1", session_id)[0][0])


def test_salts_are_per_session_and_generation() -> None:
    salts = {session_salt("t1", "s1"), session_salt("t1", "s2"), session_salt("t2", "s1"), session_salt("t1", "s1", 1)}
    assert len(salts) == 4


def test_only_a_log_left_as_a_prefix_of_the_old_one_rotates() -> None:
    old = [1, 2, 3, 4, 5]
    assert rotates(old, [1, 2, 3])  # the forgotten transitions were the last: a turn could send them again
    assert not rotates(old, [1, 2, 9, 9, 9, 9])  # replayed: differs from the old log inside itself
    assert not rotates(old, [1, 2, 9])
    assert not rotates(old, old)  # nothing left the log
    assert rotates(old, [1, 2, 9], retrieval=True)  # a retrieval prompt is not one growing log


def test_a_forget_bumps_the_cache_generation_only_when_a_turn_could_reach_the_forgotten_blocks(
    client: httpx.Client, database_url: str
) -> None:
    replayed, ids = run_script(client, [[user("Hi! Please help me plan my week.")], [user(SECRET)],
                                        [user("Suggest a time for my runs.")]], GREEDY)
    assert forget(client, {"artifact_id": ids[1][0]}, wait=True)["status"] == "succeeded"
    assert generation(database_url, replayed) == 0

    last, ids = run_script(client, [[user("Hi! Please help me plan my week.")], [user(SECRET)]], GREEDY)
    assert forget(client, {"artifact_id": ids[1][0]}, wait=True)["status"] == "succeeded"
    assert generation(database_url, last) == 1
    logged = client.get(f"/v1/sessions/{last}").json()["token_count"]
    r = client.post(f"/v1/sessions/{last}/turns", json={"inputs": [user("Thanks!")]})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["reused_tokens"] == logged  # hf keeps its cache under the new salt: nothing rebuilt
