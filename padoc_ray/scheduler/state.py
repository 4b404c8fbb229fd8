"""The layout-fork scheduler's decisions for one page, as pure code.

:class:`PageState` absorbs what the engine produced (token deltas, finishes) and decides what to do
next: which content branches to fork (with their exact prompts), which streams to stop, and what
the page's status is. It runs nothing itself and imports no engine, so the same decisions drive the
real vLLM engine and scripted fakes. The async plumbing lives in :mod:`padoc_ray.scheduler.runner`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import Sequence

from padoc_ray import status
from padoc_ray.protocol import Vocab
from padoc_ray.protocol.codec import RawRegion, StreamParser, child_prompt

DECODE_MODES = ("fork", "sequential")


class PageStatus(IntEnum):
    """Ordered by severity: when several apply, the highest wins."""

    OK = 0
    MALFORMED_LAYOUT = 1  # the stream parsed with errors (what was recoverable is kept)
    TOKEN_LIMIT = 2  # a stream hit max_tokens
    BRANCH_LIMIT = 3  # the layout closed more regions than max_branches
    RUNAWAY = 4  # repetition / no progress guard stopped a stream
    DEADLINE = 5  # the per-page deadline passed
    CANCELLED = 6  # the caller cancelled the page
    ENGINE_ERROR = 7  # the engine refused or failed a request
    INTERNAL_ERROR = 8  # an unexpected exception while the page ran (a bug; the message says which)

    @property
    def label(self) -> str:
        return self.name.lower()


@dataclass(frozen=True, kw_only=True)
class SchedulerConfig:
    """Per-page limits. Defaults follow the paper's serving setup (Appendix E.3)."""

    max_branches: int = 255  #: content branches per page; one more closed region -> branch_limit
    max_tokens: int = 8192  #: generated tokens per stream (layout, each branch, sequential)
    deadline_s: float | None = None  #: wall-clock budget per page; None = no deadline
    #: runaway guard: a stream whose last ``runaway_window`` tokens repeat with a period of at most
    #: ``runaway_max_period`` is stopped; None disables it
    runaway_window: int | None = 512
    runaway_max_period: int = 16  #: the runaway guard's longest repetition period, in tokens
    #: the layout stream must close a region at least every this many tokens
    layout_stall_tokens: int = 64
    #: skip forking branches for categories whose content format is "none" (figures)
    skip_contentless: bool = True
    #: run the layout stream at a higher priority than branches (needs scheduling_policy="priority")
    layout_priority: bool = False
    #: oldest page first: every request of a page runs ahead of the requests of pages admitted after it
    #: (needs scheduling_policy="priority", which the host then sets). With the engine's running batch
    #: capped (max_num_seqs), a burst of pages finishes one by one instead of all at its end.
    page_priority: bool = False
    #: stream branch tokens (True: the runaway guard can stop a branch early) or take each branch's
    #: output once at its end (False, the default: far less per-token work in the frontend; measured
    #: 1.33x -> 1.56x median paired speedup at 16 pages in flight on CPU). A runaway branch then runs
    #: to max_tokens and is flagged at the end.
    stream_branches: bool = False
    #: keep the layout stream (fork mode) inside the checkpoint's layout grammar: the engine masks every
    #: token the grammar does not allow next (category, coordinates in field order with x1 <= x2 and
    #: y1 <= y2, region close; end-of-stream only between regions; at most ``max_branches`` regions, all
    #: within ``max_tokens``), so the stream never parses with an error (no ``malformed_layout``).
    #: Teacher-forced tokens still win. Off by default: a trained model rarely needs it; it costs a
    #: logits mask per step for each layout stream. Branches and sequential streams are never constrained.
    constrain_layout: bool = False
    temperature: float = 0.0  #: sampling temperature of every stream (0: greedy)

    def __post_init__(self) -> None:
        if not 0 <= self.max_branches <= 100_000:
            raise ValueError("max_branches must be in [0, 100000]")
        if self.max_tokens < 1:
            raise ValueError("max_tokens must be >= 1")
        if self.deadline_s is not None and self.deadline_s <= 0:
            raise ValueError("deadline_s must be positive")
        if self.runaway_window is not None and self.runaway_window <= 2 * self.runaway_max_period:
            raise ValueError("runaway_window must exceed twice runaway_max_period")


def is_periodic(tail: Sequence[int], max_period: int) -> bool:
    """True if ``tail`` repeats with some period p <= max_period all the way through."""
    n = len(tail)
    for p in range(1, min(max_period, n // 2) + 1):
        if all(tail[i] == tail[i - p] for i in range(p, n)):
            return True
    return False


class RunawayGuard:
    """Watches one stream; checked every ``stride`` tokens to stay cheap."""

    def __init__(self, window: int | None, max_period: int, stride: int = 32):
        self.window, self.max_period, self.stride = window, max_period, stride
        self._next_check = window or 0

    def tripped(self, tokens: Sequence[int]) -> bool:
        if self.window is None or len(tokens) < self._next_check:
            return False
        self._next_check = len(tokens) + self.stride
        return is_periodic(tokens[-self.window:], self.max_period)


@dataclass(frozen=True)
class ForkAction:
    """Start branch ``index``: ``prompt_ids`` = page prompt + layout before its close + BRANCH_START."""

    index: int
    region: RawRegion
    prompt_ids: tuple[int, ...]


@dataclass
class StreamTrace:
    tokens: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    stopped: str | None = None  # why the scheduler stopped it, if it did


class PageState:
    """Decisions for one page in ``fork`` or ``sequential`` mode."""

    def __init__(self, vocab: Vocab, prompt_ids: Sequence[int], cfg: SchedulerConfig, mode: str = "fork"):
        if mode not in DECODE_MODES:
            raise ValueError(f"mode must be one of {DECODE_MODES}, got {mode!r}")
        self.vocab, self.cfg, self.mode = vocab, cfg, mode
        self.prompt_ids = tuple(prompt_ids)
        self.parser = StreamParser(vocab, sequential=(mode == "sequential"))
        self.main = StreamTrace()
        self.branches: dict[int, StreamTrace] = {}  # region index -> its branch
        self.skipped: set[int] = set()  # regions with no branch (contentless)
        self.status = PageStatus.OK
        self.messages: list[str] = []
        self._guard = RunawayGuard(cfg.runaway_window, cfg.runaway_max_period)
        self._branch_guards: dict[int, RunawayGuard] = {}
        self._last_close = 0

    # ---- status -------------------------------------------------------------------------------
    def flag(self, status: PageStatus, message: str = "") -> None:
        self.status = max(self.status, status)
        if message:
            self.messages.append(message)

    @property
    def stop_all(self) -> bool:
        """A status that ends the whole page (stop every stream now)."""
        return self.status >= PageStatus.BRANCH_LIMIT

    # ---- the main stream (layout stream, or the sequential stream) -------------------------------
    def on_main_tokens(self, ids: Sequence[int]) -> tuple[list[ForkAction], bool]:
        """Absorb new tokens of the main stream. Returns (forks to start, stop the main stream?)."""
        forks: list[ForkAction] = []
        for t in ids:
            self.main.tokens.append(t)
            region = self.parser.feed(t)
            if region is not None:
                self._last_close = len(self.main.tokens)
                if self.mode == "fork":
                    act = self._fork(region)
                    if act is not None:
                        forks.append(act)
                    if self.stop_all:
                        return forks, True
        if self.parser.ended:
            return forks, False
        if self.mode == "fork" and len(self.main.tokens) - self._last_close > self.cfg.layout_stall_tokens:
            self.flag(PageStatus.RUNAWAY, f"layout stream closed no region in {self.cfg.layout_stall_tokens} tokens")
            return forks, True
        if self._guard.tripped(self.main.tokens):
            self.flag(PageStatus.RUNAWAY, "main stream repeats itself")
            return forks, True
        return forks, False

    def _fork(self, region: RawRegion) -> ForkAction | None:
        if self.cfg.skip_contentless and self.vocab.spec.content_format(region.category) == "none":
            self.skipped.add(region.index)
            return None
        if len(self.branches) >= self.cfg.max_branches:
            self.flag(PageStatus.BRANCH_LIMIT, f"more than {self.cfg.max_branches} branches")
            return None
        self.branches[region.index] = StreamTrace()
        self._branch_guards[region.index] = RunawayGuard(self.cfg.runaway_window, self.cfg.runaway_max_period)
        prompt = child_prompt(self.prompt_ids, self.main.tokens, region.fork_point, self.vocab)
        return ForkAction(region.index, region, tuple(prompt))

    def on_main_finished(self, reason: str | None, prompt_tokens: int | None, cached: int | None) -> None:
        self.main.finish_reason, self.main.prompt_tokens, self.main.cached_tokens = reason, prompt_tokens, cached
        self._finished("the main stream", reason, len(self.main.tokens))

    def _finished(self, stream: str, reason: str | None, n_tokens: int) -> None:
        """What a stream's finish reason says about the page. vLLM 0.32's reasons
        (``vllm/v1/engine/__init__.py: FinishReason``) are stop, length, abort, error and repetition;
        "stopped" is the runner's own (it stopped the stream). Only stop and stopped say nothing."""
        if reason in ("stop", "stopped"):
            return
        if reason == "length":
            self.flag(PageStatus.TOKEN_LIMIT, f"{stream} hit max_tokens={self.cfg.max_tokens}")
        elif reason == "repetition":  # vLLM's own repetition detection (SamplingParams.repetition_detection)
            self.flag(PageStatus.RUNAWAY, f"the engine stopped {stream} as a repetition after {n_tokens} tokens")
        else:  # "error" (the engine failed the request itself), "abort" (not by us), or a reason we do not know
            self.flag(PageStatus.ENGINE_ERROR, f"the engine ended {stream} with finish reason "
                                               f"{reason or 'none'} after {n_tokens} tokens")

    # ---- branches ----------------------------------------------------------------------------------
    def on_branch_tokens(self, index: int, ids: Sequence[int]) -> bool:
        """Absorb branch tokens; True if the branch must be stopped."""
        tr = self.branches[index]
        tr.tokens.extend(ids)
        if self._branch_guards[index].tripped(tr.tokens):
            tr.stopped = status.RUNAWAY
            self.flag(PageStatus.RUNAWAY, f"branch {index} repeats itself")
            return True
        return False

    def on_branch_finished(self, index: int, reason: str | None, prompt_tokens: int | None, cached: int | None) -> None:
        tr = self.branches[index]
        tr.finish_reason, tr.prompt_tokens, tr.cached_tokens = reason, prompt_tokens, cached
        self._finished(f"branch {index}", reason, len(tr.tokens))

    # ---- end of page -------------------------------------------------------------------------------
    def finish(self) -> list[RawRegion]:
        regions = self.parser.finish()
        if self.parser.error_codes:
            self.flag(PageStatus.MALFORMED_LAYOUT, "stream errors: " + ",".join(self.parser.error_codes))
        return regions
