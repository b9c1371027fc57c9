"""The retrieval context policy (DeLLM): a reply sees only the messages most relevant to its question.

A retrieval session keeps every message in the store (the session's artifacts, with all-MiniLM-L6-v2 embeddings in
pgvector). A reply's prompt is built afresh for each turn:

    preamble (system prompt, instructions: transition 0's system-role blocks other than memory)
    + one system-role block listing the retrieved messages in log order (absent when nothing was retrieved)
    + the turn's own observations, as their blocks
    + the assistant header

where the retrieved messages are the `top_k` live messages of earlier transitions with cosine similarity at least
`min_similarity` to the turn's observations (paper defaults 5 and 0.25). The reply's provenance parents are exactly
the preamble, the retrieved messages and the turn's observations (context.RetrievedContext), so deleting a message
reaches only the replies that saw it: DeLLM's Dep(m).

The artifacts still tile a log from token 0 (each message rendered as its block, as in a full session), so the API's
token spans and the rewrite machinery work unchanged; but that log is a store, not a prompt. The engine's cache for
the session holds only the preamble between turns: each reply prefills its context and observations after it in one
call, samples, and is cropped back. The same calls run when a forget regenerates a reply, so a regenerated reply whose
context did not change is the same reply.

Memory records injected at transition 0 are messages like any other (retrievable, not preamble): a reply depends on
a record only if it retrieved it. A summary (`summarize`) is a derived message whose parents are its sources.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

from sqlalchemy.ext.asyncio import AsyncSession

from app.db.database import Database
from app.db.models import Artifact
from app.embeddings import Embedder
from app.engine.protocol import CacheHandle, KVEngine, Sampling, TokenSink
from app.engine.session_caches import SessionCaches
from app.keys.content import Sealer
from app.runtime.blocks import Block, Observation, assistant_block, render
from app.runtime.compaction import SUMMARY_HEADER
from app.runtime.engine_calls import Usage, check_room, use_salt
from app.sessions.repositories import artifact_search as search_repo
from app.sessions.repositories.artifact_search import Neighbor
from app.sessions.repositories.artifacts import LogEntry

# Kinds a reply can retrieve (and that therefore carry an embedding). Tool calls are not messages; the system prompt
# and instructions are in every prompt anyway.
CONTEXT_KINDS: Final[tuple[str, ...]] = ("user", "document", "tool_result", "memory", "assistant", "summary")
PREAMBLE_KINDS: Final[frozenset[str]] = frozenset({"system", "instruction"})
CONTEXT_HEADER: Final = "Here are past conversations between you and the user:"
CONTEXT_FOOTER: Final = "Reply to the user's query based on past conversation."
SUMMARIZE: Final = "Summarize the conversation above in a few sentences. Keep every fact I told you; add nothing else."
SPEAKER: Final[Mapping[str, str]] = {
    "user": "User", "document": "Document", "tool_result": "Tool", "memory": "Memory", "assistant": "Assistant",
    "summary": "Summary",
}


SamplingOf = Callable[[int | None], Sampling]  # the transition's sampling, given the most tokens it may sample


@dataclass(frozen=True)
class Params:
    top_k: int = 5
    min_similarity: float = 0.25

    @classmethod
    def of(cls, config: Mapping[str, Any] | None) -> Params:
        config = config or {}
        return cls(int(config.get("top_k", cls.top_k)), float(config.get("min_similarity", cls.min_similarity)))


@dataclass(frozen=True)
class Answer:
    reply: Block  # the reply as the store holds it (assistant block), its meta naming the retrieved context
    usage: Usage
    finish_reason: Literal["stop", "length"] | None


def preamble(log: Sequence[LogEntry]) -> tuple[list[str], list[int]]:
    """(ids, tokens) of the preamble: transition 0's system prompt and instructions, in log order."""
    entries = [e for e in log if e.turn == 0 and e.kind in PREAMBLE_KINDS]
    return [e.id for e in entries], [t for e in entries for t in e.token_ids]


def context_tokens(engine: KVEngine, messages: Sequence[Neighbor]) -> list[int]:
    """The retrieved messages as one system-role block, in log order (the paper's "past conversations")."""
    if not messages:
        return []
    lines = [f"{SPEAKER.get(m.kind, m.kind)}: {m.content}" for m in sorted(messages, key=lambda m: m.position)]
    return engine.chat.render_block("system", "\n".join([CONTEXT_HEADER, *lines, CONTEXT_FOOTER]))


def query_text(observations: Sequence[Block]) -> str:
    """Several observations' text, as one query."""
    return "\n".join(b.content for b in observations if b.kind in CONTEXT_KINDS)


async def query_vector(
    embedder: Embedder, observations: Sequence[Block], known: Sequence[list[float] | None] = ()
) -> list[float]:
    """What a turn's retrieval searches with, the one rule for a live turn and for a forget's regeneration of it (so
    a regenerated reply whose store did not change retrieves what the original did): a lone observation's own
    vector (`known[0]`, the one stored with it, when the caller has it), else the observations' text embedded."""
    if len(observations) == 1:
        if known and known[0] is not None:
            return known[0]
        return (await embedder.embed([observations[0].content]))[0]
    return (await embedder.embed([query_text(observations)]))[0]


async def embed_rows(
    db: Database, sealer: Sealer, embedder: Embedder,
    unembedded: Callable[[AsyncSession], Awaitable[Sequence[Artifact]]], *texts: str,
) -> list[list[float]]:
    """Embed the artifacts `unembedded` reads (rows without a vector), and `texts` in the same call, whose vectors
    it returns. The model runs between two short transactions, never inside one."""
    async with db.transaction() as tx:
        missing = [(a.id, a.content) for a in await unembedded(tx)]
    if not missing and not texts:
        return []
    vectors = await embedder.embed([content for _, content in missing] + list(texts))
    if missing:
        async with db.transaction() as tx:
            await search_repo.set_embeddings(tx, sealer, {i: v for (i, _), v in zip(missing, vectors, strict=False)})
    return vectors[len(missing):]


async def embed_missing(db: Database, sealer: Sealer, embedder: Embedder, session_id: str) -> None:
    """Embed the session's live messages that have no vector yet (memory injected at creation, messages a forget
    rewrote), so retrieval sees every message. The caller holds the session's lease, so nothing else writes these
    rows meanwhile."""
    await embed_rows(db, sealer, embedder, lambda tx: search_repo.unembedded(tx, sealer, session_id, CONTEXT_KINDS))


@dataclass(frozen=True)
class Fresh:
    """A message not (yet) stored as it will be: a forget's regenerated reply or sanitized observation."""

    message: Neighbor  # similarity unset (0)
    vector: list[float]


async def retrieve(
    tx: AsyncSession,
    sealer: Sealer,
    session_id: str,
    vector: list[float],
    params: Params,
    before_turn: int,
    *,
    exclude: Sequence[str] = (),
    fresh: Sequence[Fresh] = (),
) -> list[Neighbor]:
    """The context of a reply at transition `before_turn`: the stored messages (minus `exclude`) and `fresh` ones,
    the `top_k` nearest at least `min_similarity` away, nearest first (ties: log order)."""
    stored = await search_repo.nearest_messages(
        tx, sealer, session_id, vector, kinds=CONTEXT_KINDS, before_turn=before_turn, top_k=params.top_k,
        min_similarity=params.min_similarity, exclude=exclude,
    )
    scored = [
        Neighbor(f.message.id, f.message.kind, f.message.turn, f.message.position, f.message.content,
                 f.message.source_ids, sum(a * b for a, b in zip(vector, f.vector, strict=True)))
        for f in fresh
        if f.message.turn < before_turn
    ]
    candidates = [*stored, *(n for n in scored if n.similarity >= params.min_similarity)]
    return sorted(candidates, key=lambda n: (-n.similarity, n.position))[: params.top_k]


async def respond(
    engine: KVEngine,
    handles: SessionCaches,
    key: str,
    salt: str,
    preamble_tokens: list[int],
    context: Sequence[Neighbor],
    observations: Sequence[Block],
    sampling_of: SamplingOf,
    on_tokens: TokenSink | None = None,
    draft: list[int] | None = None,
) -> Answer:
    """Sample one reply from preamble + context + observations. `sampling_of(room)` gives the transition's sampling
    once the prompt's size is known (transition.sampling_for)."""
    chat = engine.chat
    rest = [*context_tokens(engine, context), *(t for b in observations for t in b.token_ids)]
    room = check_room(engine, len(preamble_tokens), len(rest), True)
    sampling = sampling_of(room)
    handle, preamble_prefilled = await _at_preamble(engine, handles, key, salt, preamble_tokens)
    try:
        first = await engine.prefill(handle, [*rest, *chat.assistant_header()])
        prompt_tokens = len(handle.tokens)
        generation = await engine.generate(handle, sampling, on_tokens, draft=draft)
    finally:
        try:
            await engine.crop(handle, len(preamble_tokens))  # between replies the cache holds the preamble only
        except Exception:
            await handles.drop(key)
    generated = generation.token_ids
    if generation.text != chat.decode(generated):  # a stop string cut the text: the store holds what it says
        generated = chat.encode(generation.text)
    prefill = preamble_prefilled + first.prefilled + generation.usage.prefilled
    usage = Usage(
        prompt_tokens, max(0, prompt_tokens - prefill), prefill, generation.usage.decoded, 0, generation.usage.verified
    )
    meta = {"retrieved": [{"id": m.id, "similarity": round(m.similarity, 4)} for m in context]}
    reply = assistant_block(chat, generation.text, generated)
    return Answer(Block(reply.kind, reply.content, reply.token_ids, meta), usage, generation.finish_reason)


async def summarize(
    engine: KVEngine,
    handles: SessionCaches,
    key: str,
    salt: str,
    preamble_tokens: list[int],
    sources: Sequence[Neighbor],
    sampling_of: SamplingOf,
    draft: list[int] | None = None,
) -> Answer:
    """A summary of `sources`: the same call as a reply, with the sources as its context and a request to
    summarize as its only observation (the request is not stored)."""
    request = render(engine.chat, Observation("user", SUMMARIZE))
    answer = await respond(engine, handles, key, salt, preamble_tokens, sources, [request], sampling_of, None, draft)
    text = answer.reply.content.strip()
    meta = {"summarized": [m.id for m in sources]}
    block = Block("summary", text, engine.chat.render_block("system", SUMMARY_HEADER + text), meta)
    return Answer(block, answer.usage, answer.finish_reason)


async def _at_preamble(
    engine: KVEngine, handles: SessionCaches, key: str, salt: str, preamble_tokens: list[int]
) -> tuple[CacheHandle, int]:
    """This process's handle for the session holding exactly the preamble; the tokens prefilled to get there."""
    handle = await handles.checkout(key)
    if handle is None:
        handle = await engine.open(key, salt=salt)
    else:
        use_salt(engine, handle, salt)
    common = 0
    for ours, wanted in zip(handle.tokens, preamble_tokens, strict=False):
        if ours != wanted:
            break
        common += 1
    if common < len(handle.tokens):
        await engine.crop(handle, common)
    prefilled = 0
    if common < len(preamble_tokens):
        prefilled = (await engine.prefill(handle, preamble_tokens[common:])).prefilled
    handles.keep(key, handle)
    return handle, prefilled
