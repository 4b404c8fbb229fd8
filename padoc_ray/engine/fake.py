"""A scripted engine for fast unit tests and no-op pipeline benchmarks (never instead of the real one).

It implements :class:`~padoc_ray.engine.interface.Engine`: each request emits its forced tokens
(or what ``script(request)`` returns) in deltas of ``chunk`` tokens (at least ``stream_interval``
where the request sets one; one delta for a request with ``stream=False``), taking ``token_delay_s``
per token, honouring ``max_tokens`` (without a script,
:attr:`~padoc_ray.engine.interface.GenRequest.generation_limit`) and ``stop_token_ids`` like vLLM.
It records every request it saw and which ones are live, and can be told to fail. Pure: no vllm,
no torch.
"""

from __future__ import annotations

import asyncio
from typing import AsyncIterator, Callable, Sequence

from .interface import EngineDeadError, EngineError, GenDelta, GenRequest


class ScriptedEngine:
    def __init__(
        self,
        script: Callable[[GenRequest], Sequence[int]] | None = None,
        *,
        chunk: int = 1,
        token_delay_s: float = 0.0,
        fail: Callable[[GenRequest], Exception | None] | None = None,
        block_size: int = 32,
        record: bool = True,
    ):
        #: no script: every request emits its forced tokens and ends with them, as under vLLM; a script
        #: stands for what a model writes (it may ignore forcing), bounded by max_tokens alone
        self._replays = script is None
        self.script = script or (lambda req: list(req.forced_tokens or ()))
        self.chunk, self.token_delay_s, self.fail, self.block_size = chunk, token_delay_s, fail, block_size
        #: keep every request, abort and prompt prefix (what tests inspect); off for a long-running no-op
        #: engine (``padoc-ray serve --engine noop``), whose memory must not grow with the requests it served
        self.record = record
        self.requests: list[GenRequest] = []
        self.live: set[str] = set()
        self.aborted: list[str] = []
        self.max_live = 0
        self.dead = False
        self._seen_prefixes: set[tuple[int, ...]] = set()

    def _cached(self, prompt: Sequence[int]) -> int:
        """Block-aligned longest prefix seen before (a crude model of vLLM's prefix cache)."""
        if not self.record:
            return 0
        best = 0
        for n in range(self.block_size, len(prompt), self.block_size):
            if tuple(prompt[:n]) in self._seen_prefixes:
                best = n
        for n in range(self.block_size, len(prompt) + 1, self.block_size):
            self._seen_prefixes.add(tuple(prompt[:n]))
        return best

    async def generate(self, req: GenRequest) -> AsyncIterator[GenDelta]:
        if self.dead:
            raise EngineDeadError("scripted engine is dead")
        if req.request_id in self.live:
            raise EngineError(f"duplicate request id {req.request_id}")
        if self.record:
            self.requests.append(req)
        err = self.fail(req) if self.fail else None
        if err is not None:
            if isinstance(err, EngineDeadError):
                self.dead = True
            raise err
        self.live.add(req.request_id)
        self.max_live = max(self.max_live, len(self.live))
        done = False
        try:
            toks = list(self.script(req))
            out: list[int] = []
            limit = req.generation_limit if self._replays else req.max_tokens
            reason = "length"
            for t in toks:
                if len(out) >= limit:
                    break
                out.append(t)
                if t in req.stop_token_ids:
                    reason = "stop"
                    break
            else:
                reason = "stop" if len(out) < limit else "length"
            cached = self._cached(req.prompt_ids)
            chunk = self.chunk if req.stream else max(len(out), 1)
            if req.stream and req.stream_interval:  # vLLM's per-request stream_interval: chunks of at least it
                chunk = max(chunk, req.stream_interval)
            for i in range(0, max(len(out), 1), chunk):
                part = out[i:i + chunk]
                await asyncio.sleep(self.token_delay_s * max(1, len(part)))  # time grows with tokens
                if req.request_id not in self.live:
                    return
                last = i + chunk >= len(out)
                done = last
                yield GenDelta(req.request_id, part, finished=last, finish_reason=reason if last else None,
                               num_prompt_tokens=len(req.prompt_ids), num_cached_tokens=cached)
        finally:
            if req.request_id in self.live and not done:  # closed early: vLLM aborts such a request too
                if self.record:
                    self.aborted.append(req.request_id)
            self.live.discard(req.request_id)

    async def abort(self, request_ids: Sequence[str]) -> None:
        for r in request_ids:
            if r in self.live:
                if self.record:
                    self.aborted.append(r)
            self.live.discard(r)

    def num_unfinished_requests(self) -> int:
        return len(self.live)

    def shutdown(self) -> None:
        self.live.clear()
