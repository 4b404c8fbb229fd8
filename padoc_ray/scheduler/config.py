"""What the scheduler is told: :class:`SchedulerConfig` (every per-page limit, guard and retry knob; each
field is a flag of every parsing surface, in the order :data:`SCHEDULER_FLAGS` gives) and the decode modes."""

from __future__ import annotations

from dataclasses import dataclass

from padoc_ray.knobs import knob, negative_is_none, none_is_negative, none_is_zero, zero_is_none

from .loops import LoopConfig

DECODE_MODES = ("fork", "sequential")


TEXT_LAYER_MODES = ("off", "speculate")  #: SchedulerConfig.text_layer


@dataclass(frozen=True, kw_only=True)
class SchedulerConfig:
    """Per-page limits. Defaults follow the paper's serving setup (Appendix E.3)."""

    max_branches: int = 255  #: content branches per page; one more closed region -> branch_limit
    max_tokens: int = 8192  #: generated tokens per stream (layout, each branch, sequential)
    #: wall-clock budget per page; None = no deadline
    deadline_s: float | None = knob(None, flags=("--page-deadline", "--deadline"), metavar="SECONDS",
                                    default_text="none")
    #: runaway guard: a stream whose last ``runaway_window`` tokens repeat with a period of at most
    #: ``runaway_max_period`` is stopped; None disables it
    runaway_window: int | None = knob(512, metavar="N", to_field=zero_is_none, from_field=none_is_zero, note="0: off")
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
    branch_retries: int = knob(2, metavar="K")
    #: the seeded temperature ladder: attempt i (0 = the first) samples at max(temperature, ladder[i]),
    #: the last entry for later attempts
    retry_temperatures: tuple[float, ...] = knob((0.0, 0.3, 0.6), metavar="T,T,...", note="comma list")
    #: every retry request samples with a seed derived from (page id, stream, attempt, retry_seed): the same
    #: seed gives the same result
    retry_seed: int = 0
    #: retries of a looping layout stream (fork mode), each from its last closed region (the prefix is
    #: cached; forks already started stay); after them the page ends with the regions it has
    #: (layout_unrecovered). 0: a looping layout stream ends the page as runaway
    layout_retries: int = 1
    #: tokens a page may spend on retries (branches and layout) before no more retries start; None: no cap
    retry_token_budget: int | None = knob(16384, metavar="TOKENS", to_field=negative_is_none,
                                          from_field=none_is_negative, note="-1: no cap",
                                          show=lambda v: "no cap" if v < 0 else str(v))
    #: branch requests stream their tokens in chunks of this many (so a looping branch is seen and stopped
    #: within about the detector's window plus this, at a small frontend cost); 0: final-only branches
    #: (the detector then judges a branch when it ends), unless stream_branches
    branch_stream_interval: int = 64
    #: speculate: a text region's branch gets the page's text layer in its box as a draft (fork mode,
    #: greedy first attempts), which the model checks in one prefill; it keeps the longest prefix it agrees
    #: with and decodes on from there. Lossless: the content is the model's own, token for token; a page
    #: without a trusted text layer (a scan, a broken encoding) sends no draft. off: no drafts
    text_layer: str = knob("speculate", choices=TEXT_LAYER_MODES)

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
        if self.text_layer not in TEXT_LAYER_MODES:
            raise ValueError(f"text_layer must be one of {', '.join(TEXT_LAYER_MODES)}")
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


#: the order SchedulerConfig's fields show as flags on every parsing surface (all of them, the most used first)
SCHEDULER_FLAGS = ("max_tokens", "max_branches", "deadline_s", "constrain_layout", "runaway_window",
                   "runaway_max_period", "layout_stall_tokens", "skip_contentless", "layout_priority",
                   "page_priority", "stream_branches", "temperature", "repetition_penalty", "loop_detection",
                   "loop_ngram", "loop_count", "loop_window", "loop_max_period", "branch_retries",
                   "retry_temperatures", "retry_seed", "layout_retries", "retry_token_budget",
                   "branch_stream_interval", "text_layer")
