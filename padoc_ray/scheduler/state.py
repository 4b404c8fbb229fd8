"""The layout-fork scheduler's decisions for one page, as pure code.

:class:`PageState` absorbs what the engine produced (token deltas, finishes) and decides what to do
next: which content branches to fork (with their exact prompts), which streams to stop, and what
the page's status is. It runs nothing itself and imports no engine, so the same decisions drive the
real vLLM engine and scripted fakes. The async plumbing lives in :mod:`padoc_ray.scheduler.runner`.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Sequence

from padoc_ray import status
from padoc_ray.protocol import Vocab
from padoc_ray.protocol.codec import RawRegion

from .config import DECODE_MODES, SchedulerConfig
from .loops import LoopDetector, StreamLoopGuard


class PageStatus(IntEnum):
    """Ordered by severity: when several apply, the highest wins."""

    OK = 0
    MALFORMED_LAYOUT = 1  # the stream parsed with errors (what was recoverable is kept)
    TOKEN_LIMIT = 2  # a stream hit max_tokens
    #: a content branch looped or hit max_tokens on every attempt (or the retry budget was spent): that
    #: region's content is lost, the others are kept (the page goes on)
    BRANCH_UNRECOVERED = 3
    #: the layout stream looped again after its retry: the page ends with the regions it has (branches
    #: already forked finish)
    LAYOUT_UNRECOVERED = 4
    # from here on a status ends the whole page (PageState.stop_all)
    BRANCH_LIMIT = 5  # the layout closed more regions than max_branches
    RUNAWAY = 6  # repetition / no progress guard stopped a stream (with retries off)
    DEADLINE = 7  # the per-page deadline passed
    CANCELLED = 8  # the caller cancelled the page
    ENGINE_ERROR = 9  # the engine refused or failed a request
    INTERNAL_ERROR = 10  # an unexpected exception while the page ran (a bug; the message says which)

    @property
    def label(self) -> str:
        return self.name.lower()


def retry_seed(page_id: str, stream: int, attempt: int, seed: int) -> int:
    """The sampling seed of a retry: stable across processes and runs (not Python's salted hash).
    ``stream``: the region index of a branch, -1 for the layout stream."""
    h = hashlib.sha256(f"{page_id}\x00{stream}\x00{attempt}\x00{seed}".encode()).digest()
    return int.from_bytes(h[:8], "big") & 0x7FFF_FFFF_FFFF_FFFF


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
    """Start branch ``index`` with ``prompt_ids``, as the family's branch shape makes them: page prompt +
    layout before its close + BRANCH_START (``prefix-fork``), or the page's grounding prompt for its box.
    ``attempt`` > 0: a re-fork of the branch (the same prompt, the next temperature of the ladder)."""

    index: int
    region: RawRegion
    prompt_ids: tuple[int, ...]
    attempt: int = 0


@dataclass(frozen=True)
class MainRetry:
    """Start the main stream again: ``prompt_ids`` = page prompt + its tokens up to and including its
    last closed region (``boundary`` of them); attempt > 0."""

    prompt_ids: tuple[int, ...]
    boundary: int
    attempt: int


@dataclass
class StreamTrace:
    tokens: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    stopped: str | None = None  # why the scheduler stopped it, if it did


#: how an attempt of a stream ended (a region's ``finish``): normally, or why it is retried
FINISH_STOP, FINISH_LOOP, FINISH_LENGTH = status.REGION_STOP, status.REGION_LOOP, status.REGION_LENGTH
#: branch retry outcomes (PageRecord.retry_outcomes; the padoc_branch_retries metric's ``outcome`` tag)
RECOVERED, EXHAUSTED, BUDGET = "recovered", "exhausted", "budget"


class PageState:
    """Decisions for one page in ``fork`` or ``sequential`` mode.

    Loops (issue 31). Every stream has the runaway guard (``runaway_window``) and, with
    ``loop_detection``, the detectors of :mod:`.loops` (the main stream's also check its regions).

    - A branch stopped as a loop (or ended by vLLM's repetition check) or ended at max_tokens is
      forked again (:meth:`on_branch_finished` returns the :class:`ForkAction`, ``attempt`` > 0) with
      its first prompt, up to ``branch_retries`` times while ``retry_token_budget`` lasts; the region
      keeps its last attempt (the first that ends with ``stop``). One that never does flags
      BRANCH_UNRECOVERED (the page goes on); with ``branch_retries=0`` it flags RUNAWAY / TOKEN_LIMIT.
    - A main stream that loops or stalls in fork mode is stopped and (:meth:`on_main_finished` returns
      a :class:`MainRetry`) started again from its last closed region, up to ``layout_retries`` times:
      its tokens after that boundary are dropped and the parser re-reads what is kept, so regions
      already forked stay and new ones continue the numbering. A region whose close trips the detector
      is not forked. After the retries the page ends with its closed regions (LAYOUT_UNRECOVERED). A
      sequential stream that loops is RUNAWAY, as before.
    - Every token of every attempt counts (``discarded_tokens``); the runner picks each attempt's
      temperature (:meth:`SchedulerConfig.attempt_temperature`) and seed (:func:`retry_seed`)."""

    def __init__(self, vocab: Vocab, prompt_ids: Sequence[int], cfg: SchedulerConfig, mode: str = "fork"):
        if mode not in DECODE_MODES:
            raise ValueError(f"mode must be one of {DECODE_MODES}, got {mode!r}")
        self.vocab, self.cfg, self.mode = vocab, cfg, mode
        self.prompt_ids = tuple(prompt_ids)
        self.parser = vocab.parser(sequential=(mode == "sequential"))
        self.main = StreamTrace()
        self.branches: dict[int, StreamTrace] = {}  # region index -> its branch (its current / kept attempt)
        self.forks: dict[int, ForkAction] = {}  # region index -> its first fork (a re-fork repeats its prompt)
        self.attempts: dict[int, int] = {}  # region index -> attempts started
        self.spent: dict[int, int] = {}  # region index -> tokens of its discarded attempts
        self.finish_of: dict[int, str] = {}  # region index -> how its last attempt ended
        self.outcomes: dict[int, str] = {}  # region index -> its retry outcome (branches that needed one)
        self.skipped: set[int] = set()  # regions with no branch (contentless)
        #: every region the main stream closed, in closing order (a layout retry keeps them: it restarts after
        #: the last one); the runner announces each once (region events)
        self.closed: list[RawRegion] = []
        self.status = PageStatus.OK
        self.messages: list[str] = []
        self.main_attempt = 0
        #: every token generated by attempts that were discarded (retried), prompt / cached tokens of their
        #: requests: they count in the page's totals
        self.discarded_tokens = 0
        self.discarded_prompt_tokens = 0
        self.discarded_cached_tokens = 0
        self.retry_tokens = 0  # tokens generated by retry attempts (attempt > 0), against retry_token_budget
        self.retries = 0  # retry attempts started (branches and layout)
        self._new_main_guards()
        self._branch_guards: dict[int, tuple[RunawayGuard, LoopDetector | None]] = {}
        self._last_close = 0
        self._main_retry: MainRetry | None = None

    def _new_main_guards(self) -> None:
        self._guard = RunawayGuard(self.cfg.runaway_window, self.cfg.runaway_max_period)
        self._loops = (StreamLoopGuard(self.cfg.loop_config, vocab=self.vocab,
                                       sequential=(self.mode == "sequential"))
                       if self.cfg.loop_detection else None)

    # ---- status -------------------------------------------------------------------------------
    def flag(self, status: PageStatus, message: str = "") -> None:
        self.status = max(self.status, status)
        if message:
            self.messages.append(message)

    @property
    def stop_all(self) -> bool:
        """A status that ends the whole page (stop every stream now)."""
        return self.status >= PageStatus.BRANCH_LIMIT

    def _budget_left(self) -> bool:
        b = self.cfg.retry_token_budget
        return b is None or self.retry_tokens < b

    # ---- the main stream (layout stream, or the sequential stream) -------------------------------
    def on_main_tokens(self, ids: Sequence[int]) -> tuple[list[ForkAction], bool]:
        """Absorb new tokens of the main stream. Returns (forks to start, stop the main stream?)."""
        forks: list[ForkAction] = []
        if self.main_attempt > 0:
            self.retry_tokens += len(ids)
        loops = self._loops
        for k, t in enumerate(ids):
            self.main.tokens.append(t)
            if loops is not None and loops.feed((t,)):  # before the parser: a region that trips it is not forked
                hit = loops.hit
                self.discarded_tokens += len(ids) - k - 1  # generated, never read
                return forks, self._main_loops(f"main stream loops ({hit.reason}, period {hit.period}: {hit.detail})")
            region = self.parser.feed(t)
            if region is not None:
                self._last_close = len(self.main.tokens)
                self.closed.append(region)
                if self.mode == "fork":
                    act = self._fork(region)
                    if act is not None:
                        forks.append(act)
                    if self.stop_all:
                        return forks, True
        if self.parser.ended:
            return forks, False
        if self.mode == "fork" and len(self.main.tokens) - self._last_close > self.cfg.layout_stall_tokens:
            return forks, self._main_loops(f"layout stream closed no region in {self.cfg.layout_stall_tokens} tokens")
        if self._guard.tripped(self.main.tokens):
            return forks, self._main_loops("main stream repeats itself")
        return forks, False

    def _main_loops(self, message: str) -> bool:
        """The main stream loops: retry it from its last closed region (fork mode, while retries and
        budget are left), else end it. Returns True (stop the stream)."""
        self.main.stopped = FINISH_LOOP
        if self.mode != "fork" or self.cfg.layout_retries == 0:
            self.flag(PageStatus.RUNAWAY, message)
            return True
        boundary = self._last_close
        if self.main_attempt < self.cfg.layout_retries and self._budget_left():
            self.messages.append(f"{message}: retried from its region boundary at token {boundary}")
            self._main_retry = MainRetry((*self.prompt_ids, *self.main.tokens[:boundary]), boundary,
                                         self.main_attempt + 1)
        else:
            why = "the retry budget is spent" if self.main_attempt < self.cfg.layout_retries else \
                f"after {self.main_attempt} retr{'y' if self.main_attempt == 1 else 'ies'}"
            self.flag(PageStatus.LAYOUT_UNRECOVERED, f"{message} ({why}): the page ends with the regions it has")
            self._rollback(boundary)
        return True

    def _rollback(self, boundary: int) -> None:
        """Forget the main stream's tokens after ``boundary`` (they count as discarded): a fresh parser and
        fresh guards re-read what is kept (no region is forked again)."""
        self.discarded_tokens += len(self.main.tokens) - boundary
        del self.main.tokens[boundary:]
        self.parser = self.vocab.parser(sequential=(self.mode == "sequential"))
        self._new_main_guards()
        for t in self.main.tokens:
            self.parser.feed(t)
            if self._loops is not None:
                self._loops.feed((t,))
        self._last_close = boundary

    def _fork(self, region: RawRegion) -> ForkAction | None:
        v = self.vocab  # a region without content (hpd: a block the model closed without <FORK>) may get none
        if not v.has_branch(region) and (self.cfg.skip_contentless or not v.forkable(region)):
            self.skipped.add(region.index)
            return None
        if len(self.branches) >= self.cfg.max_branches:
            self.flag(PageStatus.BRANCH_LIMIT, f"more than {self.cfg.max_branches} branches")
            return None
        prompt = self.vocab.branch_prompt(self.prompt_ids, self.main.tokens, region)  # the family's branch shape
        act = ForkAction(region.index, region, tuple(prompt))
        self.forks[region.index] = act
        self._start_attempt(region.index, 0)
        return act

    def _start_attempt(self, index: int, attempt: int) -> None:
        self.branches[index] = StreamTrace()
        self.attempts[index] = attempt + 1
        det = LoopDetector(self.cfg.loop_config) if self.cfg.loop_detection else None
        self._branch_guards[index] = (RunawayGuard(self.cfg.runaway_window, self.cfg.runaway_max_period), det)

    def on_main_finished(self, reason: str | None, prompt_tokens: int | None,
                         cached: int | None) -> MainRetry | None:
        """The main stream ended (``reason`` "stopped": the runner stopped it). Returns the retry to start,
        if the stream was stopped as a loop and may be retried."""
        retry, self._main_retry = self._main_retry, None
        if retry is not None and not self.stop_all:
            self.discarded_prompt_tokens += prompt_tokens or 0
            self.discarded_cached_tokens += cached or 0
            self._rollback(retry.boundary)
            self.main = StreamTrace(tokens=self.main.tokens)
            self.main_attempt = retry.attempt
            self.retries += 1
            return retry
        self.main.finish_reason, self.main.prompt_tokens, self.main.cached_tokens = reason, prompt_tokens, cached
        self._finished("the main stream", reason, len(self.main.tokens))
        return None

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
        if self.attempts[index] > 1:
            self.retry_tokens += len(ids)
        if tr.stopped is not None:
            return True
        guard, det = self._branch_guards[index]
        if det is not None and det.feed(ids):
            tr.stopped = FINISH_LOOP
            self.messages.append(f"branch {index} loops ({det.hit.reason}, period {det.hit.period}) "
                                 f"after {det.hit.position} tokens")
            return True
        if guard.tripped(tr.tokens):
            tr.stopped = FINISH_LOOP
            self.messages.append(f"branch {index} repeats itself")
            return True
        return False

    def on_branch_finished(self, index: int, reason: str | None, prompt_tokens: int | None,
                           cached: int | None) -> ForkAction | None:
        """A branch attempt ended (``reason`` "stopped": the runner stopped it). Returns the re-fork to
        start, if it looped or hit max_tokens and may be retried."""
        tr = self.branches[index]
        tr.finish_reason, tr.prompt_tokens, tr.cached_tokens = reason, prompt_tokens, cached
        attempt = self.attempts[index] - 1
        if self.cfg.branch_retries == 0 and tr.stopped == FINISH_LOOP:  # today's: a loop is a runaway page
            self.finish_of[index] = FINISH_LOOP
            self.flag(PageStatus.RUNAWAY)
            self._finished(f"branch {index}", reason, len(tr.tokens))
            return None
        if reason == "stop":
            self.finish_of[index] = FINISH_STOP
            if attempt > 0:
                self.outcomes[index] = RECOVERED
            return None
        if tr.stopped == FINISH_LOOP or reason == "repetition":
            kind = FINISH_LOOP
        elif reason == "length":
            kind = FINISH_LENGTH
        else:  # stopped with the page, or an engine error: no retry
            self.finish_of[index] = reason or "none"
            self._finished(f"branch {index}", reason, len(tr.tokens))
            return None
        self.finish_of[index] = kind
        if self.cfg.branch_retries == 0:  # today's statuses (runaway / token_limit)
            self._finished(f"branch {index}", reason, len(tr.tokens))
            return None
        if self.stop_all:
            return None
        if attempt < self.cfg.branch_retries and self._budget_left():
            self.discarded_tokens += len(tr.tokens)
            self.spent[index] = self.spent.get(index, 0) + len(tr.tokens)
            self.discarded_prompt_tokens += prompt_tokens or 0
            self.discarded_cached_tokens += cached or 0
            self._start_attempt(index, attempt + 1)
            self.retries += 1
            f = self.forks[index]
            return ForkAction(index, f.region, f.prompt_ids, attempt + 1)
        outcome = EXHAUSTED if attempt >= self.cfg.branch_retries else BUDGET
        self.outcomes[index] = outcome
        why = (f"after {attempt + 1} attempts" if outcome == EXHAUSTED else
               f"the retry budget of {self.cfg.retry_token_budget} tokens is spent")
        self.flag(PageStatus.BRANCH_UNRECOVERED, f"branch {index} did not recover ({kind}; {why})")
        return None

    def region_tokens(self, index: int) -> int:
        """Tokens generated for region ``index``'s content, every attempt of its branch."""
        tr = self.branches.get(index)
        return self.spent.get(index, 0) + (len(tr.tokens) if tr is not None else 0)

    # ---- end of page -------------------------------------------------------------------------------
    def finish(self) -> list[RawRegion]:
        regions = self.parser.finish()
        if self.parser.error_codes:
            self.flag(PageStatus.MALFORMED_LAYOUT, "stream errors: " + ",".join(self.parser.error_codes))
        return regions
