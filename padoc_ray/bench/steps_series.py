"""The step-time series beyond decode vs batch that ``padoc-ray bench steps`` measures for the engine model.

The engine model (:mod:`padoc_ray.bench.model`) needs what a step costs as a function of its whole
load, not only of its batch. Each series varies one thing on the real engine, everything else held:

* ``prefill``: one request whose prompt of P text tokens is not cached (a cache salt of its own),
  timed to its first token; that is one prefill step of P tokens.
* ``context``: ``context_batch`` sequences sharing a cached text prefix of L tokens decode
  ``tokens`` forced tokens at once; a step is the wall time over ``tokens`` (as in the decode series).
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

import time
import uuid
from collections.abc import Callable, Sequence

#: the series ``bench steps`` can add to decode vs batch (always measured)
EXTRA_SERIES = ("prefill", "context", "vision")


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
                          log: Callable[[str], None] = lambda m: None) -> list[dict]:
    """One row per cached prefix length L: the decode step of ``batch`` sequences over that prefix."""
    import asyncio

    from padoc_ray.engine.interface import GenRequest

    ids = _Ids()
    suffix = text(batch + 1)
    rows = []
    for ln in sizes:
        prefix = text(ln)
        salt = ids("context-salt")
        await first_token(engine, _one_token(ids, "context", [*prefix, suffix[-1]], suffix[0], cache_salt=salt))

        async def one(i: int, prefix: list[int] = prefix, salt: str = salt) -> tuple[int, int]:
            req = GenRequest(request_id=ids("context"), prompt_ids=[*prefix, suffix[i]], max_tokens=len(forced),
                             cache_salt=salt, stream=False, forced_tokens=forced)
            n, cached = 0, 0
            async for d in engine.generate(req):
                n += len(d.token_ids)
                cached = d.num_cached_tokens or cached
            if n != len(forced):
                raise RuntimeError(f"a context request decoded {n} tokens, not {len(forced)}")
            return n, cached

        walls, cached = [], []
        for _ in range(repeat):
            t = time.perf_counter()
            got = await asyncio.gather(*(one(i) for i in range(batch)))
            walls.append(time.perf_counter() - t)
            cached.append(min(c for _, c in got))
        wall = min(walls)
        row = {"context_tokens": ln + 1, "batch": batch, "tokens": len(forced),
               "step_ms": round(1000 * wall / len(forced), 3), "cached_tokens": min(cached),
               "runs_s": [round(w, 4) for w in walls]}
        log(f"context {ln:5d} tokens x {batch} seqs: step {row['step_ms']:8.2f} ms")
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
    from .model.fitted import line_fit

    fits = {}
    if "prefill" in series:
        fits["prefill"] = line_fit([(r["prompt_tokens"], r["ttft_ms"]) for r in series["prefill"]["rows"]],
                                   "ttft_ms", "per_prompt_token_ms")
    if "context" in series:
        fits["context"] = line_fit([(r["context_tokens"], r["step_ms"]) for r in series["context"]["rows"]],
                                   "step_ms_at_0", "per_context_token_ms")
    if "vision" in series:
        fits["vision"] = line_fit([(r["image_tokens"], r["encoder_ms"]) for r in series["vision"]["rows"]],
                                  "per_image_ms", "per_image_token_ms")
    return fits
