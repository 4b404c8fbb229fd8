"""The step-time series beyond decode vs batch that ``padoc-ray bench steps`` measures for the engine model.

The engine model (:mod:`padoc_ray.perfmodel`) needs what a step costs as a function of its whole
load, not only of its batch. Each series varies one thing on the real engine, everything else held:

* ``prefill``: one request whose prompt of P text tokens is not cached (a cache salt of its own),
  timed to its first token; that is one prefill step of P tokens.
* ``context``: ``context_batch`` sequences sharing a cached prefix (the page prompt with its image,
  then L text tokens, as a branch's prompt is the page and its layout) decode ``tokens`` forced
  tokens at once; a step is the wall time over ``tokens`` (as in the decode series).
* ``distinct``: the same with ``distinct_batch`` sequences each over a cached prefix of its own (its
  own image uuid and cache salt), as a sequential stream or another page's branch decodes in
  serving. Context vs distinct tells the attention's arithmetic (the same in both) from its memory
  traffic (one prefix read for all, or one each): on a CPU a shared prefix is read from cache after
  the first sequence. Every request of both carries the image, as every serving request does: a
  request with an image costs the engine more per step than a text one (the tiny model, batch 16:
  9.0 ms over a shared 341-token page prompt, 7.3 ms over 16 unshared 257-token text prompts).
* ``admit``: bursts of n branch-like requests (the page prompt and a text prefix, both served from the
  prefix cache, then a few tokens of their own) arriving together, each for its first token: the time
  until the last has it. A fork admits a request per region, and admitting one costs the engine core
  more than its prefill chunk's arithmetic; the burst's growth with n is that cost.
* ``vision``: a page image at several sizes, each as a new image (its own uuid and salt), the same
  request again with the image and prefix cached, and a text-only prompt of the same expanded length
  with a salt of its own. New image minus text prompt is the vision encoder (and its preprocessing):
  the cached request skips the prefill too, so it would mix the prefill's cost into the encoder's.

Each size is timed ``repeat`` times and the fastest run is kept: on a shared machine other load only
ever adds time, so the fastest run is the closest to the engine's own cost (all runs stay in the
rows). Times to the first token are vLLM's own (arrival to first token) where the engine reports them, else
the wall time to the first output. Every request of a timed run is new to the cache where it should be
and cached where it should be; the rows keep ``cached_tokens`` so a reader can check.
"""

from __future__ import annotations

import itertools
import time
import uuid
from collections.abc import Callable, Sequence

#: the series ``bench steps`` can add to decode vs batch (always measured)
EXTRA_SERIES = ("prefill", "context", "distinct", "admit", "vision")


async def first_token(engine, req) -> tuple[float, object]:
    """(seconds to the request's first token, its final delta)."""
    t = time.perf_counter()
    wall = None
    last = None
    async for d in engine.generate(req):
        if wall is None and d.token_ids:
            wall = time.perf_counter() - t
        last = d
    if last is None or wall is None:
        raise RuntimeError(f"request {req.request_id} produced no token")
    return (last.first_token_s or wall), last


class _Ids:
    """Request ids and cache salts unique to this run (a second run on one engine shares nothing)."""

    def __init__(self) -> None:
        self.run = uuid.uuid4().hex[:8]
        self.n = 0

    def __call__(self, what: str) -> str:
        self.n += 1
        return f"steps-{what}-{self.run}-{self.n}"


def _ms(s: float) -> float:
    return round(1000.0 * s, 3)


def _one_token(ids: _Ids, what: str, prompt: Sequence[int], first: int, **kw):
    from padoc_ray.engine.interface import GenRequest

    rid = ids(what)
    return GenRequest(request_id=rid, prompt_ids=list(prompt), max_tokens=1, forced_tokens=[first],
                      cache_salt=kw.pop("cache_salt", rid), stream=True, **kw)


async def measure_prefill(engine, text: Callable[[int], list[int]], sizes: Sequence[int], repeat: int,
                          log: Callable[[str], None] = lambda m: None) -> list[dict]:
    """One row per prompt length P: the fastest time to the first token of a lone uncached request."""
    ids = _Ids()
    rows = []
    await first_token(engine, _one_token(ids, "prefill", text(min(sizes)), text(1)[0]))  # warm-up
    for p in sizes:
        prompt = text(p)
        runs, cached = [], []
        for _ in range(repeat):
            s, last = await first_token(engine, _one_token(ids, "prefill", prompt, prompt[0]))
            runs.append(s)
            cached.append(last.num_cached_tokens or 0)
        row = {"prompt_tokens": p, "ttft_ms": _ms(min(runs)), "cached_tokens": max(cached),
               "runs_ms": [_ms(r) for r in runs]}
        log(f"prefill {p:5d} tokens: first token {row['ttft_ms']:8.2f} ms")
        rows.append(row)
    return rows


async def measure_context(engine, text: Callable[[int], list[int]], sizes: Sequence[int], batch: int,
                          forced: Sequence[int], repeat: int,
                          log: Callable[[str], None] = lambda m: None, *, shared: bool = True,
                          page: tuple[Sequence[int], object] | None = None) -> list[dict]:
    """One row per cached prefix length L: the decode step of ``batch`` sequences over that prefix, one
    prefix they all share (``shared``, the context series) or one each (the distinct series). With
    ``page`` (the page prompt's ids and its image) the prefix is the page prompt and L text tokens, as a
    branch's prompt is the page and its layout: every request then carries the image, as every serving
    request does (its own, under its own uuid, when not shared); ``context_tokens`` is the prompt's
    length as the engine counts it (the image's tokens expanded)."""
    import asyncio

    from padoc_ray.engine.interface import GenRequest

    ids = _Ids()
    what = "context" if shared else "distinct"
    suffix = text(batch + 1)
    head, image = page if page is not None else ((), None)
    rows = []
    for ln in sizes:
        prefix = [*head, *text(ln)]
        salts = [ids(f"{what}-salt")] * batch if shared else [ids(f"{what}-salt") for _ in range(batch)]
        mm = [{"image": image, "image_uuid": salt} if image is not None else {} for salt in salts]
        expanded = len(prefix) + 1
        for i in range(1 if shared else batch):  # the prefix (each one's, when not shared) into the cache
            _, last = await first_token(engine, _one_token(ids, what, [*prefix, suffix[i]], suffix[0],
                                                           cache_salt=salts[i], **mm[i]))
            expanded = last.num_prompt_tokens or expanded

        async def one(i: int, prefix: list[int] = prefix, salts: list[str] = salts, mm: list = mm) -> tuple[int, int]:
            req = GenRequest(request_id=ids(what), prompt_ids=[*prefix, suffix[i]], max_tokens=len(forced),
                             cache_salt=salts[i], stream=False, forced_tokens=forced, **mm[i])
            n, cached = 0, 0
            async for d in engine.generate(req):
                n += len(d.token_ids)
                cached = d.num_cached_tokens or cached
            if n != len(forced):
                raise RuntimeError(f"a {what} request decoded {n} tokens, not {len(forced)}")
            return n, cached

        walls, cached = [], []
        for _ in range(repeat):
            t = time.perf_counter()
            got = await asyncio.gather(*(one(i) for i in range(batch)))
            walls.append(time.perf_counter() - t)
            cached.append(min(c for _, c in got))
        wall = min(walls)
        row = {"context_tokens": expanded, "text_tokens": ln, "image": image is not None, "batch": batch,
               "tokens": len(forced), "step_ms": round(1000 * wall / len(forced), 3), "cached_tokens": min(cached),
               "runs_s": [round(w, 4) for w in walls]}
        log(f"{what:8s} {expanded:5d} tokens x {batch} seqs: step {row['step_ms']:8.2f} ms")
        rows.append(row)
    return rows


async def measure_admit(engine, text: Callable[[int], list[int]], page: tuple[Sequence[int], object],
                        counts: Sequence[int], prefix_tokens: int, repeat: int,
                        log: Callable[[str], None] = lambda m: None) -> list[dict]:
    """One row per burst size n: n requests whose prompts are the page (``page``: its prompt ids and image)
    and ``prefix_tokens`` text tokens (cached once before, like a branch's page and layout prefix), then 4
    tokens of their own, sent together for one token each; ``wall_ms`` is the fastest burst's time until
    the last first token, ``cached_tokens`` the fewest prompt tokens one of its requests found cached."""
    import asyncio

    ids = _Ids()
    head, image = page
    base = [*head, *text(prefix_tokens)]
    salt = ids("admit-salt")
    first = text(1)[0]
    mm = {"image": image, "image_uuid": salt, "cache_salt": salt}
    _, last = await first_token(engine, _one_token(ids, "admit", [*base, first], first, **mm))
    expanded = (last.num_prompt_tokens or len(base) + 1) + 3  # the 4 own tokens instead of the one
    tails = itertools.count(1)  # each request's own tokens differ from every other's of the series
    rows = []
    for n in counts:
        walls, cached = [], []
        for _ in range(repeat):
            reqs = [_one_token(ids, "admit", [*base, *text(4 + next(tails))[-4:]], first, **mm) for _ in range(n)]
            t = time.perf_counter()
            got = await asyncio.gather(*(first_token(engine, r) for r in reqs))
            walls.append(time.perf_counter() - t)
            cached.append(min(d.num_cached_tokens or 0 for _, d in got))
        row = {"requests": n, "prompt_tokens": expanded, "prefix_tokens": prefix_tokens,
               "wall_ms": _ms(min(walls)), "cached_tokens": min(cached), "runs_ms": [_ms(w) for w in walls]}
        log(f"admit    {n:3d} requests at once ({expanded} tokens, {row['cached_tokens']} cached): "
            f"{row['wall_ms']:8.2f} ms")
        rows.append(row)
    return rows


async def measure_vision(engine, prompt: Sequence[int], text: Callable[[int], list[int]],
                         images: Sequence[tuple[int, object]], repeat: int,
                         log: Callable[[str], None] = lambda m: None) -> list[dict]:
    """One row per image size: first-token times of a new image, the same image cached, and a text
    prompt of the same expanded length; ``encoder_ms`` = new image - text prompt."""
    ids = _Ids()
    first = text(1)[0]
    rows = []
    warm = images[0][1]
    uid = ids("vision-warm")
    await first_token(engine, _one_token(ids, "vision", prompt, first, image=warm, image_uuid=uid, cache_salt=uid))
    for side, image in images:
        new, cached, plain, cached_tokens, expanded = [], [], [], [], None
        for _ in range(repeat):
            uid = ids("vision-image")
            s, last = await first_token(engine, _one_token(ids, "vision", prompt, first, image=image, image_uuid=uid,
                                                           cache_salt=uid))
            expanded = last.num_prompt_tokens
            if not expanded:
                raise RuntimeError("the engine did not report the expanded prompt length of an image request")
            new.append(s)
            s, last = await first_token(engine, _one_token(ids, "vision", prompt, first, image=image, image_uuid=uid,
                                                           cache_salt=uid))
            cached.append(s)
            cached_tokens.append(last.num_cached_tokens or 0)
            s, _ = await first_token(engine, _one_token(ids, "vision", text(expanded), first))
            plain.append(s)
        best = {k: min(v) for k, v in (("new", new), ("cached", cached), ("text", plain))}
        row = {"longest_side": side, "image_size": list(image.size), "prompt_tokens": expanded,
               "image_tokens": expanded - len(prompt) + 1,  # the one placeholder became the image's tokens
               "new_image_ms": _ms(best["new"]), "cached_image_ms": _ms(best["cached"]),
               "cached_tokens": min(cached_tokens), "text_prompt_ms": _ms(best["text"]),
               "encoder_ms": _ms(best["new"] - best["text"])}
        log(f"vision {row['image_size']} ({row['image_tokens']} image tokens): new {row['new_image_ms']:.1f} ms, "
            f"cached {row['cached_image_ms']:.1f} ms, text {row['text_prompt_ms']:.1f} ms")
        rows.append(row)
    return rows


def series_fits(series: dict) -> dict:
    """Each series' own straight-line fit (in milliseconds), beside the joint model of :mod:`.model.fitted`."""
    from padoc_ray.perfmodel.fitted import line_fit

    fits = {}
    if "prefill" in series:
        fits["prefill"] = line_fit([(r["prompt_tokens"], r["ttft_ms"]) for r in series["prefill"]["rows"]],
                                   "ttft_ms", "per_prompt_token_ms")
    for name in ("context", "distinct"):
        if name in series:
            fits[name] = line_fit([(r["context_tokens"], r["step_ms"]) for r in series[name]["rows"]],
                                  "step_ms_at_0", "per_context_token_ms")
    if "admit" in series:
        fits["admit"] = line_fit([(r["requests"], r["wall_ms"]) for r in series["admit"]["rows"]],
                                 "wall_ms_at_0", "per_request_ms")
    if "vision" in series:
        fits["vision"] = line_fit([(r["image_tokens"], r["encoder_ms"]) for r in series["vision"]["rows"]],
                                  "per_image_ms", "per_image_token_ms")
    return fits
