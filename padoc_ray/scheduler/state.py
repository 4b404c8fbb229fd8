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
from padoc_ray.protocol.codec import RawRegion, child_prompt

from .loops import LoopConfig, LoopDetector, StreamLoopGuard

DECODE_MODES = ("fork", "sequential")


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
    #: stream every branch token (True: the guards can stop a branch at any token) or not (False, the
    #: default: far less per-token work in the frontend; measured 1.33x -> 1.56x median paired speedup at
    #: 16 pages in flight on CPU): branches then come in chunks of branch_stream_interval tokens, or, with
    #: that 0, once at their end (a looping branch then runs to max_tokens and is judged at its end)
    stream_branches: bool = False
    #: keep the layout stream (fork mode) inside the checkpoint's layout grammar: the engine masks every
    #: token the grammar does not allow next (category, coordinates in field order with x1 <= x2 and
    #: y1 <= y2, region close; end-of-stream only between regions; at most ``max_branches`` regions, all
    #: within ``max_tokens``), so the stream never parses with an error (no ``malformed_layout``).
    #: Teacher-forced tokens still win. Off by default: a trained model rarely needs it; it costs a
    #: logits mask per step for each layout stream. Branches and sequential streams are never constrained.
    constrain_layout: bool = False
    temperature: float = 0.0  #: sampling temperature of every stream (0: greedy)
    #: vLLM's repetition penalty on every stream (1.0: none). HPD-Parsing's authors suggest 1.05 for complex
    #: layouts; teacher-forced tokens are not affected
    repetition_penalty: float = 1.0
    #: the loop detector (scheduler.loops: repeated n-grams of any period up to a table row, and for the
    #: layout stream repeated or stalled regions) on every stream, next to the runaway guard; off: the
    #: runaway guard and the layout stall check alone
    loop_detection: bool = True
    #: the loop detector's n-gram size (scheduler.loops.LoopConfig.n): smaller catches near-repetitions
    #: of shorter rows, larger ignores more shared phrasing; a changed token inside a repetition is bridged
    loop_ngram: int = LoopConfig.n
    #: how many times that n-gram must recur, each within loop_max_period tokens of the previous one
    loop_count: int = LoopConfig.count
    #: the stretch of recent tokens that must all repeat earlier text before a stream counts as looping
    loop_window: int = LoopConfig.window
    #: the longest period a loop may have (a repeated table row) for the detector to catch it
    loop_max_period: int = LoopConfig.max_period
    #: re-forks of a content branch stopped as a loop or ended at max_tokens: the same prompt (still in the
    #: prefix cache) again, at the next temperature of retry_temperatures; the region keeps the first attempt
    #: that ends normally, the layout stream and the other branches are untouched. 0: no re-fork (such a
    #: branch makes the page runaway / token_limit)
    branch_retries: int = 2
    #: the seeded temperature ladder: attempt i (0 = the first) samples at max(temperature, ladder[i]),
    #: the last entry for later attempts
    retry_temperatures: tuple[float, ...] = (0.0, 0.3, 0.6)
    #: every retry request samples with a seed derived from (page id, stream, attempt, retry_seed): the same
    #: seed gives the same result
    retry_seed: int = 0
    #: retries of a looping layout stream (fork mode), each from its last closed region (the prefix is
    #: cached; forks already started stay); after them the page ends with the regions it has
    #: (layout_unrecovered). 0: a looping layout stream ends the page as runaway
    layout_retries: int = 1
    #: tokens a page may spend on retries (branches and layout) before no more retries start; None: no cap
    retry_token_budget: int | None = 16384
    #: branch requests stream their tokens in chunks of this many (so a looping branch is seen and stopped
    #: within about the detector's window plus this, at a small frontend cost); 0: final-only branches
    #: (the detector then judges a branch when it ends), unless stream_branches
    branch_stream_interval: int = 64

    def __post_init__(self) -> None:
        if not 0 <= self.max_branches <= 100_000:
            raise ValueError("max_branches must be in [0, 100000]")
        if self.max_tokens < 1:
            raise ValueError("max_tokens must be >= 1")
        if not 0.0 < self.repetition_penalty <= 2.0:
            raise ValueError("repetition_penalty must be in (0, 2] (1.0: none)")
        if self.deadline_s is not None and self.deadline_s <= 0:
            raise ValueError("deadline_s must be positive")
        if self.runaway_window is not None and self.runaway_window <= 2 * self.runaway_max_period:
            raise ValueError("runaway_window must exceed twice runaway_max_period")
        # a config file gives a list: keep the field a tuple of floats (hashable, equal to the flag's)
        object.__setattr__(self, "retry_temperatures", tuple(float(t) for t in self.retry_temperatures))
        if not 0 <= self.branch_retries <= 100:
            raise ValueError("branch_retries must be in [0, 100]")
        if not 0 <= self.layout_retries <= 100:
            raise ValueError("layout_retries must be in [0, 100]")
        if not self.retry_temperatures or any(not 0.0 <= t <= 10.0 for t in self.retry_temperatures):
            raise ValueError("retry_temperatures must be one or more temperatures in [0, 10]")
        if self.retry_token_budget is not None and self.retry_token_budget < 0:
            raise ValueError("retry_token_budget must be >= 0 (or None: no cap)")
        if self.branch_stream_interval < 0:
            raise ValueError("branch_stream_interval must be >= 0")
        self.loop_config  # the detector's own checks of its settings

    @property
    def loop_config(self) -> LoopConfig:
        """The token loop detector's settings (a changed token inside a repetition, n or n + 1
        positions, is bridged whatever n is)."""
        try:
            return LoopConfig(n=self.loop_ngram, count=self.loop_count, window=self.loop_window,
                              max_period=self.loop_max_period, max_break=self.loop_ngram + 1)
        except ValueError as e:
            raise ValueError(f"loop detector: {e}") from None

    def attempt_temperature(self, attempt: int) -> float:
        """The sampling temperature of attempt ``attempt`` (0 = the first) of a stream. A negative
        ``temperature`` is passed on as it is (the engine refuses it: engine_error, never hidden)."""
        if self.temperature < 0:
            return self.temperature
        ladder = self.retry_temperatures
        return max(self.temperature, ladder[min(attempt, len(ladder) - 1)])


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
    """Start branch ``index``: ``prompt_ids`` = page prompt + layout before its close + BRANCH_START.
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
        prompt = child_prompt(self.prompt_ids, self.main.tokens, region.fork_point, self.vocab)
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
