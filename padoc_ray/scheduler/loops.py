"""Repetition-loop detectors for one stream, as pure code (issue 31, part 1).

:class:`LoopDetector` watches a token stream (a content branch, the layout stream or a sequential
stream) and says when it has started to loop: the recent tokens all repeat earlier text (their
n-grams were seen within ``max_period`` tokens), and the n-gram at hand has been seen ``count``
times. It is incremental and amortized O(1) per token (a rolling hash of the last ``n`` tokens and
a dict from hash to its last position and occurrence count, pruned as positions leave the period
horizon), so it can sit in a vLLM logits processor (one token per step per request) or in the
scheduler (token deltas). Its decision depends only on the token sequence, never on how it was
chunked.

What it catches, with the defaults of :class:`LoopConfig` (:meth:`LoopConfig.latency` gives the
tokens of loop before the hit, counted from the first copy of the repeated unit):

- exact short periods (``abcabc...``, what ``state.is_periodic`` catches after 512 tokens) after
  256 tokens (``min_span``);
- long periods up to ``max_period`` (a sentence or a table row repeated) when the third copy has
  begun: period 200 after 412 tokens, 400 after 812;
- near-repetitions (a repeated row whose number field increments): the ``n`` positions whose
  n-grams hold the changed token are a break of ``n`` (``n + 1`` when the number grows a digit),
  bridged up to ``max_break`` (a break of ``n + 2``, 99 -> 100, restarts the stretch once). A row
  of at most ``n`` tokens with a changed token has no recurring n-gram: a smaller ``n`` catches
  those, at the price of more recurrences in real text.

What trips it although it is real content: a long exact or near repetition that is really on the
page, e.g. a 12 x 12 zero or identity matrix written out, or a blank form whose rows differ only by
their number. No detector of repetition can tell those from a loop; the ground-truth pages hold
none (``padoc-ray bench loops``).

What it leaves alone: n-grams that recur sparsely or in short runs (table markup, a blank
worksheet row, shared phrasing, dot leaders), because the stream must repeat without a break
longer than ``max_break`` for ``window`` tokens, over ``min_span`` tokens.

:class:`LayoutLoopDetector` watches a layout stream (or a sequential stream) at the level of its
regions: the same box and category again and again, or boxes that keep landing on ground already
covered (a region loop that jitters the coordinates defeats exact token matching).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

from padoc_ray.protocol import RawRegion, Vocab

#: reasons a detector gives for a hit (stable strings: they become stop reasons and row fields)
TOKEN_LOOP = "token_loop"  # the token stream repeats itself (n-gram recurrence)
REPEATED_REGION = "repeated_region"  # the layout stream emits the same region again and again
STALLED_LAYOUT = "stalled_layout"  # the layout stream's boxes keep covering ground already covered

_MOD = (1 << 61) - 1  # a Mersenne prime: the rolling hash's modulus
_BASE = 1_000_003  # the rolling hash's base (any value coprime to _MOD; token ids are far below it)


def _check_ranges(cfg, **bounds: tuple[int, int]) -> None:
    """``name=(lo, hi)``: each of ``cfg``'s fields must lie in [lo, hi] (a ValueError naming both)."""
    for name, (lo, hi) in bounds.items():
        if not lo <= getattr(cfg, name) <= hi:
            raise ValueError(f"{name} must be in [{lo}, {hi}]")


@dataclass(frozen=True, kw_only=True)
class LoopConfig:
    """When a token stream counts as looping. The defaults never trip on the project's ground-truth
    pages (``padoc-ray bench loops`` measures it); see :meth:`latency` for how soon a loop
    is caught."""

    #: n-gram size: positions are compared by the hash of the n tokens ending there. Smaller catches
    #: near-repetitions of shorter rows (no n-gram of a row of <= n tokens with a changed token
    #: recurs); larger ignores more shared phrasing in real text
    n: int = 12
    #: the n-gram ending at the tripping token must be at least its count-th occurrence, each within
    #: ``max_period`` tokens of the previous one: a long unit must be seen this many times
    count: int = 3
    #: the longest period caught (a table row); also the horizon of the position dict
    max_period: int = 512
    #: the last ``window`` tokens must all repeat earlier text (n-grams seen within ``max_period``),
    #: allowing breaks of at most ``max_break`` positions: this is what tells a loop from the
    #: sparse recurrences of real text (table markup, shared phrasing)
    window: int = 160
    #: a break of at most this many non-recurring positions inside a repetition is bridged: one
    #: changed token costs ``n`` positions (a row number that increments), a number that grows a
    #: digit or two changed tokens side by side ``n + 1``; a row label of three new tokens costs
    #: ``n + 2`` and is not bridged (a blank worksheet whose rows differ by their labels is no loop)
    max_break: int = 13
    #: a repetition must also span this many tokens (its repeating stretch plus one period), so a
    #: short exact run in real content (dot leaders, a blank table row, a row of zeros) is no loop;
    #: ``state.is_periodic`` asks for 512
    min_span: int = 256

    def __post_init__(self) -> None:
        _check_ranges(self, n=(2, 64), count=(2, 1000), window=(1, 100_000), min_span=(0, 100_000))
        if not self.n <= self.max_period <= 100_000:
            raise ValueError("max_period must be in [n, 100000]")
        if not 0 <= self.max_break < self.window:
            raise ValueError("max_break must be in [0, window)")

    def latency(self, period: int) -> int:
        """How many tokens of an exact loop of ``period`` (counted from the first token of its first
        copy) pass before it is caught."""
        third = (self.count - 1) * period + self.n  # the count-th copy of the first n-gram ends here
        stretch = max(self.window, self.min_span - period - self.n + 1)  # repeating positions needed
        return max(third, period + self.n - 1 + stretch)


@dataclass(frozen=True)
class LoopHit:
    """Why and where a detector tripped."""

    reason: str  #: TOKEN_LOOP, REPEATED_REGION or STALLED_LAYOUT
    position: int  #: tokens fed when it tripped (the tripping token included)
    period: int  #: tokens between two copies (token loops) or regions between two copies (layout)
    detail: str = ""


class LoopDetector:
    """One token stream's loop detector. ``feed(ids)`` returns True once the stream loops (and keeps
    returning True); ``hit`` (``reason``, ``period``) says why. Feeding the same tokens in any
    chunking gives the same decision at the same position.

    Per token: the rolling hash of the n-gram ending there; if that n-gram was seen within
    ``max_period`` tokens, the position repeats, with period = the distance and chain = its
    occurrences so far. Repeating positions form a stretch (breaks of at most ``max_break`` bridged);
    the stream loops at a repeating position whose chain reaches ``count`` once its stretch is at
    least ``window`` long and spans ``min_span`` with one period."""

    __slots__ = ("cfg", "fed", "hit", "peak", "_const", "_hash", "_start", "_last_rep")

    def __init__(self, cfg: LoopConfig | None = None):
        self.cfg = cfg = cfg or LoopConfig()
        self.fed = 0  #: tokens examined so far (up to the tripping token)
        self.hit: LoopHit | None = None
        #: the longest repeating stretch seen at an n-gram's count-th occurrence or later (tokens): how
        #: close the stream came (it trips at ``window``, or more for short periods)
        self.peak = 0
        recent = [0] * cfg.n  # the last n tokens (+1), as a ring
        last: dict[int, tuple[int, int]] = {}  # n-gram hash -> (last position, chain length)
        hashes = [-1] * (cfg.max_period + 1)  # hash at each position within the horizon, as a ring
        weight = pow(_BASE, cfg.n, _MOD)  # the weight of the token leaving the n-gram
        # what feed() needs, in one tuple (one attribute load per call: a logits processor calls it per token)
        self._const = (cfg.n, recent, last, hashes, weight, cfg.max_period + 1, cfg.count, cfg.window,
                       cfg.max_break, cfg.min_span - cfg.n + 1)
        self._hash = 0
        self._start = -1  # first position of the current repeating stretch
        self._last_rep = -(1 << 40)  # the last repeating position

    @property
    def looping(self) -> bool:
        return self.hit is not None

    @property
    def reason(self) -> str | None:
        return None if self.hit is None else self.hit.reason

    @property
    def period(self) -> int | None:
        return None if self.hit is None else self.hit.period

    def feed(self, token_ids: Iterable[int]) -> bool:
        """Absorb tokens; True once the stream loops. Tokens after the hit are ignored (``fed`` stops
        at the tripping token)."""
        if self.hit is not None:
            return True
        n, recent, last, hashes, weight, horizon, count, window, max_break, span = self._const
        h, pos, start, last_rep = self._hash, self.fed, self._start, self._last_rep
        for tok in token_ids:
            slot = pos % n
            v = tok + 1  # so that token 0 weighs something; 0 = no token yet
            h = (h * _BASE - recent[slot] * weight + v) % _MOD
            recent[slot] = v
            hslot = pos % horizon
            if pos < n - 1:  # no full n-gram yet
                hashes[hslot] = -1
                pos += 1
                continue
            old = hashes[hslot]  # the hash at pos - horizon: it can no longer chain, forget it
            if old >= 0:
                ent = last.get(old)
                if ent is not None and ent[0] == pos - horizon:
                    del last[old]
            hashes[hslot] = h
            prev = last.get(h)
            if prev is None:
                last[h] = (pos, 1)
                pos += 1
                continue
            period, chain = pos - prev[0], prev[1] + 1  # period <= max_period: older entries were pruned
            last[h] = (pos, chain)
            if pos - last_rep - 1 > max_break:
                start = pos
            last_rep = pos
            stretch = pos - start + 1
            pos += 1
            if chain < count:
                continue
            if stretch > self.peak:
                self.peak = stretch
            if stretch >= window and stretch + period >= span:
                self._hash, self.fed, self._start, self._last_rep = h, pos, start, last_rep
                self.hit = LoopHit(TOKEN_LOOP, pos, period,
                                   f"the last {stretch} tokens repeat (n-gram seen {chain} times)")
                return True
        self._hash, self.fed, self._start, self._last_rep = h, pos, start, last_rep
        return False


# ---- the layout stream --------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class LayoutLoopConfig:
    """When a layout stream loops at the level of its regions. Real pages hold many similar small
    boxes (list items, table-like lines of equal height), but never the same ground twice."""

    #: the same category and box (every coordinate within ``box_tolerance`` bins) this many times
    #: among the last ``history`` regions is a loop
    repeats: int = 3
    #: coordinates of two boxes within this many bins count as the same box
    box_tolerance: int = 0
    #: this many regions in a row, each overlapping an earlier region of the last ``history`` by at
    #: least ``overlap`` IoU, is a stalled layout (boxes no longer advance)
    stalled: int = 3
    #: the IoU (boxes as inclusive bins) at which a region counts as lying on an earlier one's ground
    overlap: float = 0.5
    #: how many past regions a new region is compared against
    history: int = 32

    def __post_init__(self) -> None:
        _check_ranges(self, repeats=(2, 1000), box_tolerance=(0, 100), stalled=(1, 1000), history=(1, 10_000))
        if not 0.0 < self.overlap <= 1.0:
            raise ValueError("overlap must be in (0, 1]")
        if self.repeats - 1 > self.history:
            raise ValueError("history must hold repeats - 1 earlier regions")


def box_iou(a: Sequence[int], b: Sequence[int]) -> float:
    """IoU of two boxes given as inclusive bins (x1, y1, x2, y2): a one-bin box has area 1."""
    ax1, ay1, ax2, ay2 = min(a[0], a[2]), min(a[1], a[3]), max(a[0], a[2]), max(a[1], a[3])
    bx1, by1, bx2, by2 = min(b[0], b[2]), min(b[1], b[3]), max(b[0], b[2]), max(b[1], b[3])
    iw = min(ax2, bx2) - max(ax1, bx1) + 1
    ih = min(ay2, by2) - max(ay1, by1) + 1
    if iw <= 0 or ih <= 0:
        return 0.0
    inter = iw * ih
    union = (ax2 - ax1 + 1) * (ay2 - ay1 + 1) + (bx2 - bx1 + 1) * (by2 - by1 + 1) - inter
    return inter / union


class RegionLoopDetector:
    """The region-level check alone, over regions in stream order (``feed_region``); True once the
    regions loop. :class:`LayoutLoopDetector` drives it from tokens."""

    def __init__(self, cfg: LayoutLoopConfig | None = None):
        self.cfg = cfg or LayoutLoopConfig()
        self.regions = 0  #: regions fed so far
        self.hit: LoopHit | None = None
        self._past: list[tuple[str, tuple[int, int, int, int]]] = []  # the last `history` regions
        self._stale = 0  # regions in a row overlapping earlier ground
        self.peak_repeats = 1  #: the most copies of one region seen among the last ``history`` (trips at repeats)
        self.peak_stalled = 0  #: the longest run of regions on covered ground (trips at stalled)

    def feed_region(self, category: str, bins: Sequence[int], position: int = 0) -> bool:
        if self.hit is not None:
            return True
        cfg, past = self.cfg, self._past
        box = (bins[0], bins[1], bins[2], bins[3])
        tol = cfg.box_tolerance
        same, nearest, stale_with = 0, 0, None
        for k in range(len(past) - 1, -1, -1):
            cat, b = past[k]
            if cat == category and all(abs(b[i] - box[i]) <= tol for i in range(4)):
                same += 1
                nearest = nearest or len(past) - k
                if same + 1 >= cfg.repeats:
                    self.hit = LoopHit(REPEATED_REGION, position, nearest,
                                       f"{category} {box} {same + 1} times in the last {len(past) + 1} regions")
                    break
            if stale_with is None and box_iou(b, box) >= cfg.overlap:
                stale_with = len(past) - k
        self._stale = self._stale + 1 if stale_with is not None else 0
        self.peak_repeats = max(self.peak_repeats, same + 1)
        self.peak_stalled = max(self.peak_stalled, self._stale)
        if self.hit is None and self._stale >= cfg.stalled:
            self.hit = LoopHit(STALLED_LAYOUT, position, stale_with or 0,
                               f"{self._stale} regions in a row overlap earlier ones (IoU >= {cfg.overlap})")
        past.append((category, box))
        if len(past) > cfg.history:
            del past[0]
        self.regions += 1
        return self.hit is not None


class LayoutLoopDetector:
    """A layout stream's (or a sequential stream's) region-level loop detector, fed tokens:
    ``feed(ids)`` parses them with :class:`~padoc_ray.protocol.codec.StreamParser` and checks every
    closed region. Chunking-independent like :class:`LoopDetector`."""

    def __init__(self, vocab: Vocab, cfg: LayoutLoopConfig | None = None, *, sequential: bool = False):
        self.parser = vocab.parser(sequential=sequential)
        self.regions = RegionLoopDetector(cfg)

    @property
    def cfg(self) -> LayoutLoopConfig:
        return self.regions.cfg

    @property
    def hit(self) -> LoopHit | None:
        return self.regions.hit

    @property
    def looping(self) -> bool:
        return self.regions.hit is not None

    @property
    def reason(self) -> str | None:
        return None if self.hit is None else self.hit.reason

    @property
    def period(self) -> int | None:
        return None if self.hit is None else self.hit.period

    def feed(self, token_ids: Iterable[int]) -> bool:
        if self.regions.hit is not None:
            return True
        parser = self.parser
        for tok in token_ids:
            region: RawRegion | None = parser.feed(tok)
            if region is not None and self.regions.feed_region(region.category, region.bins, parser.n_fed):
                return True
        return False


class StreamLoopGuard:
    """Both checks a stream gets: the token detector and, for the layout or sequential stream, the
    region detector. ``feed(ids)`` is True once either trips; ``hit`` is the first hit."""

    def __init__(self, cfg: LoopConfig | None = None, *, vocab: Vocab | None = None,
                 layout_cfg: LayoutLoopConfig | None = None, sequential: bool = False):
        self.tokens = LoopDetector(cfg)
        self.layout = None if vocab is None else LayoutLoopDetector(vocab, layout_cfg, sequential=sequential)

    @property
    def hit(self) -> LoopHit | None:
        a = self.tokens.hit
        b = None if self.layout is None else self.layout.hit
        if a is None or b is None:
            return a or b
        return a if a.position <= b.position else b

    def feed(self, token_ids: Sequence[int]) -> bool:
        if self.hit is not None:
            return True
        if self.layout is None:
            return self.tokens.feed(token_ids)
        for tok in token_ids:  # token by token, so the first hit wins whichever detector it is
            a = self.tokens.feed((tok,))
            b = self.layout.feed((tok,))
            if a or b:
                return True
        return False
