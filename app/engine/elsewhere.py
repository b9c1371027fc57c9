"""The engine as an HTTP worker sees it: in the engine process, never here.

An HTTP worker (app/serving.py) forwards every request that can reach the model to the one engine process
(app/api/forwarding.py), so its services are built around this stand-in: it loads nothing (no torch import, no
weights, no cache) and any call into it is a wiring bug, reported as such rather than answered wrongly.
"""

from __future__ import annotations

from app.engine.protocol import CacheHandle, ChatTemplate, Generation, Sampling, TokenSink, TokenUsage


class EngineInAnotherProcess:
    def __init__(self, name: str, model_id: str) -> None:
        self.name = name
        self.model_id = model_id

    def _elsewhere(self) -> RuntimeError:
        return RuntimeError("the engine runs in the engine process; this HTTP worker must forward the request")

    @property
    def chat(self) -> ChatTemplate:
        raise self._elsewhere()

    @property
    def exactness(self) -> str:
        raise self._elsewhere()

    async def start(self) -> None:
        return None

    @property
    def ready(self) -> bool:
        return False

    @property
    def max_context_tokens(self) -> int | None:
        return None

    async def close(self) -> None:
        return None

    async def open(self, session_key: str, *, salt: str | None = None, tokens: list[int] | None = None) -> CacheHandle:
        raise self._elsewhere()

    async def prefill(self, handle: CacheHandle, token_ids: list[int]) -> TokenUsage:
        raise self._elsewhere()

    async def generate(
        self, handle: CacheHandle, sampling: Sampling, on_tokens: TokenSink | None = None
    ) -> Generation:
        raise self._elsewhere()

    async def crop(self, handle: CacheHandle, n_tokens: int) -> None:
        raise self._elsewhere()

    async def fork(self, handle: CacheHandle, session_key: str) -> CacheHandle:
        raise self._elsewhere()

    async def release(self, handle: CacheHandle) -> None:
        raise self._elsewhere()
