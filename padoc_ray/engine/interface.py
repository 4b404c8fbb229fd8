"""The narrow engine interface the scheduler talks to; a vLLM adapter and scripted fakes implement it.

Pure: imports no vllm or torch. A request carries already-tokenized, *unexpanded* prompt ids (one
image placeholder), the page image, and the ids that make prefix caching work across a page's
requests (multimodal uuid, cache salt). Deltas carry only new token ids; the engine does no
detokenization and knows nothing of the PaDoc protocol.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, AsyncIterator, Mapping, Protocol, Sequence


class EngineError(RuntimeError):
    """A request the engine refused or failed; other requests are unaffected (page-level error)."""


class EngineDeadError(RuntimeError):
    """The engine is gone; every in-flight request is lost (actor-level error: restart it)."""


@dataclass(frozen=True, kw_only=True)
class GenRequest:
    request_id: str
    prompt_ids: Sequence[int]
    max_tokens: int
    image: Any = None  # a PIL image, or None for text-only prompts
    image_uuid: str | None = None  # same for every request of a page: the image is encoded once
    cache_salt: str | None = None  # same for every request of a document: namespaces its cache
    #: per-request arguments of the checkpoint's image processor (hpd: ``max_dynamic_patch``, so vLLM's
    #: InternVL processor cuts the tile grid the checkpoint was trained on); None: the processor's defaults
    mm_processor_kwargs: Mapping[str, Any] | None = None
    stop_token_ids: Sequence[int] = ()
    #: teacher-forced replay: the request's outputs are exactly these ids (see :func:`forced_token`) and it
    #: ends with them (:attr:`generation_limit`); the engine forces them the way its model runner can
    #: (vLLM V1: engine.forcing; Model Runner V2: vLLM's own trace replay)
    forced_tokens: Sequence[int] | None = None
    #: keep this layout stream in the checkpoint's layout grammar with at most this many regions
    #: (see engine.layout_constraint; forced tokens still win); None: unconstrained
    constrain_layout_regions: int | None = None
    temperature: float = 0.0
    repetition_penalty: float = 1.0  #: vLLM's (1.0: none)
    seed: int | None = None
    priority: int = 0  # lower runs first, under the priority scheduling policy
    stream: bool = True  # False: one delta at the end (far less per-token work in the frontend)
    #: with ``stream``: deliver new tokens in chunks of at least this many (vLLM's per-request
    #: ``stream_interval``; the first and the final output come at once); None: every step
    stream_interval: int | None = None

    @property
    def generation_limit(self) -> int:
        """Tokens this request may generate: ``max_tokens``, and for a forced request no more than its
        trace (vLLM's trace replay ends a request there; the V1 forcing processor is held to the same)."""
        return min(self.max_tokens, len(self.forced_tokens)) if self.forced_tokens else self.max_tokens


def forced_token(trace: Sequence[int], step: int) -> int | None:
    """The token a teacher-forced request emits as its ``step``-th output (0-based), or None once its
    trace is used up. The one rule of teacher forcing, whichever model runner applies it."""
    return trace[step] if 0 <= step < len(trace) else None


@dataclass
class GenDelta:
    request_id: str
    token_ids: list[int]  # tokens generated since the previous delta (may be several)
    finished: bool = False
    finish_reason: str | None = None  # "stop" | "length" | "abort" | engine-specific
    num_prompt_tokens: int | None = None  # expanded prompt length, as the engine counts it
    num_cached_tokens: int | None = None  # prompt tokens served from the prefix cache
    #: seconds from the engine receiving the request to its first token, as the engine measured it
    #: (None: not measured); lets a caller that takes only the final output (stream=False) time it
    first_token_s: float | None = None


@dataclass(frozen=True)
class DraftCheck:
    """What the model says of a draft appended to a request's prompt, read from one prefill (a draft is
    text the request is expected to generate, e.g. a region's text from the PDF's text layer)."""

    #: per draft position, the model's greedy token there (given the prompt and the draft before it);
    #: None where the engine cannot tell: the position before it came from the prefix cache, so no
    #: logits were computed for it. Never read None as agreement.
    greedy: tuple[int | None, ...]
    next_token: int | None  #: the model's greedy token after the whole draft (None: not known)
    num_prompt_tokens: int | None = None  #: the expanded prompt + draft, as the engine counts it
    num_cached_tokens: int | None = None  #: of those, served from the prefix cache


class Engine(Protocol):
    def generate(self, req: GenRequest) -> AsyncIterator[GenDelta]:
        """Stream deltas of one request; raises EngineError / EngineDeadError."""
        ...

    # An engine that can check drafts also has
    #   async def verify(self, req: GenRequest, draft: Sequence[int]) -> DraftCheck
    # (one prefill of req's prompt + draft, no decoding); engines without it get no drafts.

    async def abort(self, request_ids: Sequence[str]) -> None: ...

    def num_unfinished_requests(self) -> int: ...

    def shutdown(self) -> None: ...
