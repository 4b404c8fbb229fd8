"""The loop detectors (:mod:`padoc_ray.scheduler.loops`) on every ground-truth page: false positives
and cost.

``padoc-ray bench loops --model DIR`` teacher-forces every ground-truth page the project
has through fresh detectors, stream by stream, serialized exactly as replay forces them
(:func:`padoc_ray.scheduler.replay.replay_input`): the layout stream (token and region detectors),
each content branch without its BRANCH_START (token detector) and the sequential stream (both).
The pages are the demo pages (``examples/ground_truth.json``), the shared OmniDocBench demo pages
when present, and synthetic pages of the corpus generator over several seeds and every profile. A
real page must never trip a detector: the report counts ``stops`` (0 is the target) and the
closest call (``peak``: the most recurring positions any window reached, against what trips).

``--cost`` times the detector at ``--streams`` live streams (default 256): one engine step feeds
one token to each stream's detector; the figure is microseconds per step and its share of a 20 ms
CPU engine step.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

from padoc_ray.protocol import Page, PageFormatError, page_from_omnidocbench
from padoc_ray.scheduler.loops import LayoutLoopConfig, LoopConfig, LoopDetector, LoopHit, StreamLoopGuard
from padoc_ray.knobs import knob

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEMO_GT = os.path.join(ROOT, "examples", "ground_truth.json")
SHARED_GT = os.path.normpath(os.path.join(ROOT, "..", "shared", "data", "omnidocbench_demo", "OmniDocBench_demo.json"))
PROFILES = ("mixed", "academic", "report", "cjk")
CPU_STEP_MS = 20.0  #: a tiny-model CPU engine step is tens of ms (notes); the cost is reported against this
KINDS = ("layout", "branch", "sequential")


@dataclass
class KindStats:
    streams: int = 0
    tokens: int = 0
    stops: int = 0
    peak: int = 0  #: the longest repeating stretch (tokens) of any stream
    peak_repeats: int = 0  #: layout/sequential: the most copies of one region in any stream's history
    peak_stalled: int = 0  #: layout/sequential: the longest run of regions on covered ground


@dataclass
class FPReport:
    pages: int = 0
    sources: dict[str, int] = field(default_factory=dict)  #: pages per source
    kinds: dict[str, KindStats] = field(default_factory=lambda: {k: KindStats() for k in KINDS})
    hits: list[dict] = field(default_factory=list)  #: every stop: page, stream, reason, position, period
    trips_at: int = 0  #: the repeating stretch (tokens) that trips the token detector at long periods
    layout_trips_at: tuple[int, int] = (0, 0)  #: (repeats, stalled) that trip the region detector

    @property
    def streams(self) -> int:
        return sum(k.streams for k in self.kinds.values())

    @property
    def tokens(self) -> int:
        return sum(k.tokens for k in self.kinds.values())

    @property
    def stops(self) -> int:
        return sum(k.stops for k in self.kinds.values())

    def as_dict(self) -> dict:
        return {
            "pages": self.pages, "sources": self.sources, "streams": self.streams, "tokens": self.tokens,
            "stops": self.stops, "false_positive_rate": self.stops / self.streams if self.streams else 0.0,
            "trips_at": self.trips_at, "layout_trips_at": list(self.layout_trips_at),
            "kinds": {k: vars(v) for k, v in self.kinds.items()}, "hits": self.hits,
        }


def _hit_row(page: str, stream: str, hit: LoopHit) -> dict:
    return {"page": page, "stream": stream, "reason": hit.reason, "position": hit.position, "period": hit.period,
            "detail": hit.detail}


def measure(pages: Iterable[tuple[str, Page]], vocab, tokenizer, cfg: LoopConfig | None = None,
            layout_cfg: LayoutLoopConfig | None = None, report: FPReport | None = None,
            sequential: bool = True) -> FPReport:
    """Feed every stream of every ``(name, page)`` to fresh detectors; count streams, tokens, stops. The
    streams are the checkpoint family's own (its ``serialize_fork``; ``sequential``: also its sequential
    stream, for a family that has one)."""
    cfg = cfg or LoopConfig()
    rep = report or FPReport()
    rep.trips_at = cfg.window
    lcfg = layout_cfg or LayoutLoopConfig()
    rep.layout_trips_at = (lcfg.repeats, lcfg.stalled)

    def run(kind: str, name: str, stream: str, ids: Sequence[int], guard) -> None:
        st = rep.kinds[kind]
        st.streams += 1
        st.tokens += len(ids)
        if guard.feed(ids):
            st.stops += 1
            rep.hits.append(_hit_row(name, stream, guard.hit))
        det = guard if isinstance(guard, LoopDetector) else guard.tokens
        st.peak = max(st.peak, det.peak)
        if isinstance(guard, StreamLoopGuard) and guard.layout is not None:
            st.peak_repeats = max(st.peak_repeats, guard.layout.regions.peak_repeats)
            st.peak_stalled = max(st.peak_stalled, guard.layout.regions.peak_stalled)

    for name, page in pages:
        rep.pages += 1
        s = vocab.serialize_fork(tokenizer, page)
        run("layout", name, "layout", s.layout, StreamLoopGuard(cfg, vocab=vocab, layout_cfg=layout_cfg))
        for k, b in enumerate(s.branches):
            run("branch", name, f"branch {k}", b[1:], LoopDetector(cfg))  # as replay forces them
        if sequential:
            seq = vocab.serialize_sequential(tokenizer, page)
            run("sequential", name, "sequential", seq,
                StreamLoopGuard(cfg, vocab=vocab, layout_cfg=layout_cfg, sequential=True))
    return rep


# ---- the pages ----------------------------------------------------------------------------------
def omnidocbench_pages(path: str, spec, source: str) -> list[tuple[str, Page]]:
    with open(path, encoding="utf-8") as f:
        objs = json.load(f)
    out = []
    for i, obj in enumerate(objs):
        try:
            page = page_from_omnidocbench(obj, spec)
        except PageFormatError:
            continue
        name = (obj.get("page_info") or {}).get("image_path") or str(i)
        out.append((f"{source}:{name}", page))
    return out


def corpus_pages(spec, seeds: Sequence[int], pages_per_run: int, profiles: Sequence[str] = PROFILES,
                 workers: int = 1) -> list[tuple[str, Page]]:
    """Pages of the corpus generator, ``pages_per_run`` for every seed and profile (no images)."""
    from padoc_ray.corpus.generate import GenerateConfig, generate_corpus

    out = []
    with tempfile.TemporaryDirectory(prefix="padoc-loops-") as tmp:
        for seed in seeds:
            for prof in profiles:
                d = os.path.join(tmp, f"{prof}-{seed}")
                res = generate_corpus(GenerateConfig(out=d, pages=pages_per_run, seed=seed, profile=prof,
                                                     workers=workers))
                out += omnidocbench_pages(res.gt_path, spec, f"corpus/{prof}/seed{seed}")
    return out


def all_pages(spec, *, seeds: Sequence[int], pages_per_run: int, profiles: Sequence[str] = PROFILES,
              extra: Sequence[str] = (), workers: int = 1) -> list[tuple[str, Page]]:
    pages = []
    for path, source in [(DEMO_GT, "demo"), (SHARED_GT, "omnidocbench_demo"), *[(p, p) for p in extra]]:
        if os.path.exists(path):
            pages += omnidocbench_pages(path, spec, source)
    if seeds and pages_per_run > 0:
        pages += corpus_pages(spec, seeds, pages_per_run, profiles, workers)
    return pages


# ---- cost ---------------------------------------------------------------------------------------
def step_cost(streams: Sequence[Sequence[int]], n_streams: int = 256, steps: int = 2000,
              cfg: LoopConfig | None = None, repeat: int = 3, clock: Callable[[], float] = time.perf_counter) -> dict:
    """Microseconds per engine step with ``n_streams`` live detectors, one token each per step.
    The streams are joined into one text and detector i replays it from its own offset, so the
    dicts fill as on real text. ``clock`` reads seconds (tests give one that counts the work)."""
    cfg = cfg or LoopConfig()
    pool = [t for s in streams for t in s]  # one long real text: no detector sees a loop while timed
    if len(pool) < 2 * steps:
        raise ValueError(f"need at least {2 * steps} tokens of streams to replay, got {len(pool)}")
    stride = max(1, (len(pool) - steps) // n_streams)
    offsets = [(i * stride) % (len(pool) - steps) for i in range(n_streams)]
    toks = [pool[o:o + steps] for o in offsets]

    def fresh():
        return [LoopDetector(cfg) for _ in range(n_streams)]

    def one_token_steps() -> tuple[float, int]:  # the logits processor's way: one token per stream per step
        dets = fresh()
        t0 = clock()
        for j in range(steps):
            for d, t in zip(dets, toks, strict=True):
                d.feed((t[j],))
        return (clock() - t0) / steps, sum(d.looping for d in dets)

    def delta_steps(chunk: int = 16) -> float:  # the scheduler's way: deltas of 16 tokens per stream
        dets = fresh()
        t0 = clock()
        for j in range(0, steps, chunk):
            for d, t in zip(dets, toks, strict=True):
                d.feed(t[j:j + chunk])
        return (clock() - t0) / (steps * n_streams)

    # best of `repeat` runs: the machine's cores are shared, and the best run is the detector's own cost
    runs = [one_token_steps() for _ in range(repeat)]
    per_step, tripped = min(r[0] for r in runs), max(r[1] for r in runs)
    per_tok_delta = min(delta_steps() for _ in range(repeat))
    us = per_step * 1e6
    return {
        "streams": n_streams, "steps": steps, "us_per_step": round(us, 1),
        "us_per_token": round(us / n_streams, 3), "us_per_token_in_16_token_deltas": round(per_tok_delta * 1e6, 3),
        "cpu_step_ms": CPU_STEP_MS, "share_of_cpu_step": round(us / (CPU_STEP_MS * 1000), 4),
        "median_us_per_step": round(sorted(r[0] for r in runs)[len(runs) // 2] * 1e6, 1), "repeat": repeat,
        "tripped_while_timing": tripped,
    }


# ---- the command ----------------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class LoopsConfig:
    """Teacher-force every ground-truth page the project has (the demo pages and the corpus generator over
    --seeds) through the scheduler's loop detectors, stream by stream, as replay serializes them; print the stops
    (0 on real pages) and the closest any real stream came to one. --cost also times the detector per engine
    step at --streams live streams."""

    model: str  #: a checkpoint directory of any family (its tokenizer and protocol: padoc, hpd or dots)
    seeds: int = 4  #: corpus seeds 0..N-1
    pages_per_run: int = 15  #: corpus pages per seed and profile (4 seeds x 4 profiles x 15 = 240 pages)
    profiles: tuple[str, ...] = knob(PROFILES, metavar="NAME,NAME,...")  #: the corpus generator's profiles
    #: another OmniDocBench JSON file of pages to check
    gt: tuple[str, ...] = knob((), action="append", metavar="GT.json", to_field=tuple, from_field=list,
                               note="repeatable")
    workers: int = 1  #: corpus generator processes
    cost: bool = False  #: also time the detector per engine step
    streams: int = 256  #: live streams while timing the detector (with cost)
    steps: int = 2000  #: engine steps timed (with cost)
    json: str | None = None  #: write the figures here as JSON


def run(args: LoopsConfig) -> int:
    """The false-positive measurement (and with ``cost`` the cost per step); prints it, 0."""
    from padoc_ray.tokenizer import ModelProtocol

    mp = ModelProtocol(args.model)
    t0 = time.perf_counter()
    # the pages' categories: a padoc spec's own; another family's pages keep OmniDocBench's (its vocab maps them)
    spec = mp.spec if mp.family == "padoc" else None
    pages = all_pages(spec, seeds=range(args.seeds), pages_per_run=args.pages_per_run,
                      profiles=list(args.profiles), extra=list(args.gt), workers=args.workers)
    rep = FPReport()
    for name, _ in pages:
        src = name.split(":", 1)[0].split("/seed")[0]
        rep.sources[src] = rep.sources.get(src, 0) + 1
    measure(pages, mp.vocab, mp.tokenizer, report=rep, sequential="sequential" in mp.modes)
    out = {"false_positives": rep.as_dict(), "seconds": round(time.perf_counter() - t0, 1)}
    fp = out["false_positives"]
    print(f"pages {fp['pages']} {fp['sources']}")
    for k, v in fp["kinds"].items():
        regions = (f"  region copies {v['peak_repeats']}/{fp['layout_trips_at'][0]}  "
                   f"stalled run {v['peak_stalled']}/{fp['layout_trips_at'][1]}") if k != "branch" else ""
        print(f"  {k:<10} streams {v['streams']:>6}  tokens {v['tokens']:>8}  stops {v['stops']}  "
              f"repeating stretch {v['peak']}/{fp['trips_at']}{regions}")
    print(f"streams {fp['streams']}  tokens {fp['tokens']}  stops {fp['stops']}  "
          f"false-positive rate {fp['false_positive_rate']:.4%}")
    for h in fp["hits"]:
        print(f"  STOP {h['page']} {h['stream']}: {h['reason']} at {h['position']} (period {h['period']}) "
              f"{h['detail']}")
    if args.cost:
        streams = []
        for _, page in pages:
            s = mp.vocab.serialize_fork(mp.tokenizer, page)
            streams += [b[1:] for b in s.branches]
        c = step_cost(streams, args.streams, args.steps)
        out["cost"] = c
        print(f"cost: {c['us_per_step']} us per step at {c['streams']} streams ({c['us_per_token']} us per token; "
              f"{c['us_per_token_in_16_token_deltas']} us per token in 16-token deltas) = "
              f"{c['share_of_cpu_step']:.2%} of a {CPU_STEP_MS:g} ms CPU step")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 1 if fp["stops"] else 0
