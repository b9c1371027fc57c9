"""The engine wire's messages (wire.py): one frozen dataclass per operation, named by an `Op`, and one per answer.

`Request[R]` says what answers an operation: `Prefill` is answered by a `Prefilled`. Operations on a handle carry
`At`: the handle, the length of the log the client's copy holds, and its salt; their answers carry the handle's
`HandleState`, so the client's copy and the engine process's handle move together (client.py, server.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any, ClassVar, Final, Generic, TypeVar, get_args, get_origin

from app.engine.protocol import Exactness, Generation, Sampling, TokenUsage

R = TypeVar("R")


class Op(StrEnum):
    HELLO = "hello"
    ATTACH = "attach"
    OPEN = "open"
    PREFILL = "prefill"
    GENERATE = "generate"
    CROP = "crop"
    FORK = "fork"
    RELEASE = "release"
    DROP = "drop"
    EMBED = "embed"
    STATS = "stats"
    CANCEL = "cancel"  # not a request: the frame that cancels one (wire.Cancel)


# -- answers --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Empty:
    pass


@dataclass(frozen=True)
class Greeting:
    """What the engine process serves; `ready` once its whole load is done (the engine *and* the model directory)."""

    name: str
    model_id: str
    ready: bool
    error: str | None  # why the engine failed to start
    exactness: Exactness | None  # None until ready
    records_chunks: bool
    rereads_replies: bool
    max_context_tokens: int | None
    model_dir: str | None  # where the workers load the tokenizer from; None until ready


@dataclass(frozen=True)
class HandleState:
    """A handle after an operation: the worker's copy checks its length and takes its version and recipe."""

    version: int  # bumped by every change of the log or the salt: a copy at another version is stale
    length: int
    chunks: tuple[int, ...] = ()


@dataclass(frozen=True)
class HandleRef:
    id: int
    version: int


@dataclass(frozen=True)
class HandleCopy:
    tokens: tuple[int, ...]
    salt: str | None
    state: HandleState


@dataclass(frozen=True)
class Attached:
    """The session's handle: none (`handle` None), the client's copy is current (`copy` None), or its whole state."""

    handle: int | None = None
    copy: HandleCopy | None = None


@dataclass(frozen=True)
class Opened:
    handle: int
    state: HandleState


@dataclass(frozen=True)
class Changed:
    state: HandleState


@dataclass(frozen=True)
class Prefilled:
    usage: TokenUsage
    state: HandleState


@dataclass(frozen=True)
class Generated:
    generation: Generation
    state: HandleState


@dataclass(frozen=True)
class Forked:
    handle: int  # the twin's
    twin: HandleState
    state: HandleState  # the forked handle's


@dataclass(frozen=True)
class Embedded:
    vectors: list[list[float]]


@dataclass(frozen=True)
class EngineStats:
    handles: int
    sessions: int


# -- requests -------------------------------------------------------------------------------------------------------


class Request(Generic[R]):
    """An operation's arguments, answered by an `R`."""

    op: ClassVar[Op]


@dataclass(frozen=True)
class At:
    """The handle an operation works on, as the client's copy knows it: the server first cuts its log back to
    `expect` tokens (a tail an abandoned operation left) and moves it to `salt`."""

    handle: int
    expect: int
    salt: str | None


@dataclass(frozen=True)
class Hello(Request[Greeting]):
    op = Op.HELLO


@dataclass(frozen=True)
class Attach(Request[Attached]):
    op = Op.ATTACH
    key: str
    known: HandleRef | None = None  # the client's copy, when it has one from this engine process


@dataclass(frozen=True)
class Open(Request[Opened]):
    op = Op.OPEN
    key: str
    salt: str | None = None
    tokens: tuple[int, ...] = ()
    chunks: tuple[int, ...] | None = None


@dataclass(frozen=True)
class Prefill(Request[Prefilled]):
    op = Op.PREFILL
    at: At
    tokens: tuple[int, ...]


@dataclass(frozen=True)
class Generate(Request[Generated]):
    op = Op.GENERATE
    at: At
    sampling: Sampling
    stream: bool = False  # send the tokens as they are sampled
    draft: tuple[int, ...] | None = None  # a replay's recorded reply, to verify (KVEngine.generate)


@dataclass(frozen=True)
class Crop(Request[Changed]):
    op = Op.CROP
    at: At
    n: int


@dataclass(frozen=True)
class Fork(Request[Forked]):
    op = Op.FORK
    at: At
    key: str


@dataclass(frozen=True)
class Release(Request[Empty]):
    op = Op.RELEASE
    handles: tuple[int, ...]


@dataclass(frozen=True)
class Drop(Request[Empty]):
    """Forget the session's cache (its log is in doubt, or the session is gone)."""

    op = Op.DROP
    key: str


@dataclass(frozen=True)
class Embed(Request[Embedded]):
    op = Op.EMBED
    texts: tuple[str, ...]


@dataclass(frozen=True)
class Stats(Request[EngineStats]):
    op = Op.STATS


AnyRequest = Hello | Attach | Open | Prefill | Generate | Crop | Fork | Release | Drop | Embed | Stats
REQUESTS: Final[dict[Op, type[AnyRequest]]] = {
    cls.op: cls for cls in (Hello, Attach, Open, Prefill, Generate, Crop, Fork, Release, Drop, Embed, Stats)
}


def _reply_of(cls: type[Request[Any]]) -> type[Any]:
    for base in getattr(cls, "__orig_bases__", ()):
        if get_origin(base) is Request:
            answer: type[Any] = get_args(base)[0]
            return answer
    raise TypeError(f"{cls.__name__} names no reply type")


REPLIES: Final[dict[Op, type[Any]]] = {op: _reply_of(cls) for op, cls in REQUESTS.items()}


def reply_type(request: Request[Any]) -> type[Any]:
    """The dataclass that answers `request`: the `R` of its class's `Request[R]` base."""
    return REPLIES[request.op]


def exactness_of(value: str) -> Exactness:
    """An engine's `exactness` as the wire's closed set of values."""
    for known in get_args(Exactness):
        if value == known:
            exact: Exactness = known
            return exact
    raise ValueError(f"unknown exactness {value!r}")
