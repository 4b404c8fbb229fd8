"""A step-time function fitted on this machine from ``padoc-ray bench steps --json``.

Every measured row of every series becomes one point: the :class:`StepLoad` that row ran and the
seconds it took. One linear model is fitted over all of them at once::

    seconds = fixed + per_seq * decode_seqs + per_prefill_token * prefill_tokens
              + per_attention_pair * attention_pairs + per_kv_token * kv_tokens
              + per_request * new_requests + per_image * images + per_image_token * image_tokens

Attention is two terms. ``attention_pairs`` is its arithmetic: each query token times the keys it
sees (a decoding sequence's context; n * lo + n * (n + 1) / 2 for a prefill chunk of n tokens after
lo cached ones, so a long uncached prompt costs quadratically, as measured: 4,096 tokens took 3.8x
the time of 2,048 on this CPU). ``kv_tokens`` is its memory traffic: the distinct KV tokens read, a
prefix that several sequences share counted once. On a CPU the second sequence over a shared prefix
finds it in cache, so 40 sequences decoding over 1,600 tokens each took 11 ms a step over one shared
prefix and 19 ms over 40 prefixes of their own (tiny model, 2026-12-03): a model that counts only
context tokens prices serving's unshared contexts (every sequential stream, the branches of different
pages) at the shared price, about 20% short of what serving steps measure.

``new_requests`` is what admitting a request costs the engine core beyond its prefill's arithmetic.
A fork admits one request per region, so it matters there: in a fork run at C=16 on this CPU a step
that admitted one branch took 4-6 ms more than one that admitted none, about 2-3 ms more than its
prefill chunk's pairs and tokens price (a trace of every step's period, 2026-12-03). The admit
series measures it: bursts of 1 to 16 branch-like requests arriving together.

A time to the first token is one such step plus ``first_token_overhead``: what a lone new request
costs between its arrival and its first step (admission, input processing, the output's way back),
which a decode step averaged over many steps does not carry. On this CPU it is several milliseconds,
more than a whole decode step, so fitting it into ``fixed`` would price every step like a request
arrival. It is fitted with the rest, reported, and left out of :meth:`FittedStepTime.seconds` (the
engine model counts steps; :meth:`FittedStepTime.first_token_seconds` adds it back).

The series are what make the terms separable: decode vs batch moves ``decode_seqs``, context vs
prefix length moves the attention pairs over one shared prefix (few KV tokens), distinct moves both
over prefixes of the sequences' own, prefill moves ``prefill_tokens`` and the pairs with no decode,
admit moves ``new_requests`` (and its bursts' first-token times, against the lone requests of the
prefill and vision rows, tell it from ``first_token_overhead``), and the vision rows differ from same-length text prompts only by their image. The fit minimizes
*relative* error (a decode step of 2 ms and a prefill of 200 ms count alike) and keeps every term
non-negative (a term that comes out negative is noise, dropped and refitted). Its ``residual`` is
the largest relative error over the points; :class:`FittedStepTime` reproduces every measured row
within it.

Pure: numpy only.
"""

from __future__ import annotations

import json
import os
import statistics
from collections.abc import Sequence

from .step import StepLoad, prefill_pairs

#: the step's terms, in the order of :func:`features`
TERMS = ("fixed", "per_seq", "per_prefill_token", "per_attention_pair", "per_kv_token", "per_request", "per_image",
         "per_image_token")
#: fitted beside them: the extra of a time to the first token over one step
REQUEST_TERM = "first_token_overhead"
#: the series a fitted step function needs (``bench steps`` always measures decode vs batch)
NEEDED_SERIES = ("prefill", "context", "distinct", "admit", "vision")


class StepsJsonError(ValueError):
    """A steps JSON the fitted step function cannot use (an old one, or one missing a series)."""


def features(load: StepLoad) -> list[float]:
    return [1.0, load.decode_seqs, load.prefill_tokens, load.pairs, load.distinct_kv_tokens, load.new_requests,
            load.images, load.image_tokens]


def decode_load(n: int, context: float, shared: int = 0, tokens: int | None = None) -> StepLoad:
    """The average step of ``n`` sequences decoding over ``context`` tokens each (on average), of which
    the first ``shared`` are one prefix they all read (0: each its own), over a run of ``tokens`` steps
    that admitted them all (None: admissions left out)."""
    ctx = round(n * context)
    return StepLoad(n, 0, ctx, kv_tokens=round(shared + n * (context - shared)),
                    new_requests=n / tokens if tokens else 0)


def prefill_load(new: int, cached: int = 0, *, images: int = 0, image_tokens: int = 0, requests: int = 1) -> StepLoad:
    """``requests`` requests admitted together, each prefilling ``new`` tokens after ``cached`` ones found
    in the prefix cache (one prefix they share)."""
    return StepLoad(0, requests * new, requests * (new + cached), images, image_tokens,
                    attention_pairs=requests * prefill_pairs(new, cached), kv_tokens=cached + requests * new,
                    new_requests=requests)


def line_fit(xy: Sequence[tuple[float, float]], intercept: str, slope: str) -> dict:
    """Least-squares ``y = a + b x`` (all of y as ``a`` with one point), named ``intercept``/``slope``."""
    xs, ys = [float(x) for x, _ in xy], [float(y) for _, y in xy]
    if len(set(xs)) < 2:
        return {intercept: round(statistics.fmean(ys), 4) if ys else 0.0, slope: 0.0}
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)
    return {intercept: round(my - b * mx, 4), slope: round(b, 6)}


def _missing(rep: dict) -> list[str]:
    have = rep.get("series") or {}
    return [s for s in NEEDED_SERIES if not (have.get(s) or {}).get("rows")]


Point = tuple[str, StepLoad, float, bool]  #: (series, load, measured seconds, is a time to the first token)


def points(rep: dict) -> list[Point]:
    """(series, load, measured seconds, first token?) of every measured row of a ``bench steps`` report.

    A decode, context or distinct step is the average over ``tokens`` steps, so its sequences attend over
    the prompt plus half the generated tokens on average; in the decode and context series they share
    their prompt but its last token (each request's own), in the distinct series nothing; the run admitted
    its ``batch`` requests, so each step carries batch / tokens of an admission. A first-token time is one
    prefill step of the prompt's uncached tokens after its cached ones; an admit row's is one step in which
    its ``requests`` requests are admitted and prefilled together."""
    missing = _missing(rep)
    if missing:
        raise StepsJsonError(
            f"the steps JSON has no {', '.join(missing)} series (written by an older bench steps, or one run with "
            f"--series leaving them out); rerun: padoc-ray bench steps --json FILE")
    if not rep.get("rows"):
        raise StepsJsonError("the steps JSON has no decode rows ('rows')")
    out: list[Point] = []
    half = rep["tokens"] / 2
    for r in rep["rows"]:
        if not r.get("prompt_tokens"):
            raise StepsJsonError("a decode row has no 'prompt_tokens' (the expanded prompt length)")
        out.append(("decode", decode_load(r["batch"], r["prompt_tokens"] + half, r["prompt_tokens"] - 1,
                                          rep["tokens"]), r["step_ms"] / 1000, False))
    s = rep["series"]
    for r in s["context"]["rows"]:
        out.append(("context", decode_load(r["batch"], r["context_tokens"] + r["tokens"] / 2, r["context_tokens"] - 1,
                                           r["tokens"]), r["step_ms"] / 1000, False))
    for r in s["distinct"]["rows"]:
        out.append(("distinct", decode_load(r["batch"], r["context_tokens"] + r["tokens"] / 2, tokens=r["tokens"]),
                    r["step_ms"] / 1000, False))
    for r in s["admit"]["rows"]:
        p, c = r["prompt_tokens"], r["cached_tokens"]
        out.append(("admit", prefill_load(p - c, c, requests=r["requests"]), r["wall_ms"] / 1000, True))
    for r in s["prefill"]["rows"]:
        p, c = r["prompt_tokens"], r["cached_tokens"]
        out.append(("prefill", prefill_load(p - c, c), r["ttft_ms"] / 1000, True))
    for r in s["vision"]["rows"]:
        e, t, c = r["prompt_tokens"], r["image_tokens"], r["cached_tokens"]
        out.append(("vision", prefill_load(e, images=1, image_tokens=t), r["new_image_ms"] / 1000, True))
        out.append(("vision", prefill_load(e - c, c), r["cached_image_ms"] / 1000, True))
        out.append(("vision", prefill_load(e), r["text_prompt_ms"] / 1000, True))
    return out


def fit_points(pts: Sequence[Point]) -> dict:
    """Non-negative least squares on relative error; terms in seconds, the residuals as fractions."""
    import numpy as np

    if any(y <= 0 for _, _, y, _ in pts):
        raise StepsJsonError("a measured time is not positive")
    names = (*TERMS, REQUEST_TERM)
    a = np.array([[*features(ld), float(first)] for _, ld, _, first in pts], dtype=float)
    y = np.array([y for _, _, y, _ in pts], dtype=float)
    w = 1.0 / y
    active = list(range(len(names)))
    coef = np.zeros(len(names))
    while active:
        sol, *_ = np.linalg.lstsq(a[:, active] * w[:, None], y * w, rcond=None)
        if (sol >= 0).all():
            coef[:] = 0.0
            coef[active] = sol
            break
        active.pop(int(np.argmin(sol)))  # the most negative term is dropped, the rest refitted
    rel = (a @ coef - y) / y
    return {"terms_s": {t: float(c) for t, c in zip(TERMS, coef[:len(TERMS)], strict=True)},
            "first_token_overhead_s": float(coef[-1]),
            "dropped": [t for i, t in enumerate(names) if i not in active],
            "residual": {"max_rel": float(np.abs(rel).max()), "rms_rel": float(np.sqrt((rel ** 2).mean()))},
            "points": len(pts)}


def fit_steps(rep: dict) -> dict:
    """The joint model of a ``bench steps`` report, as ``bench steps --json`` stores it (``step_model``)."""
    pts = points(rep)
    fit = fit_points(pts)
    extra = fit["first_token_overhead_s"]
    fit["per_point"] = [{"series": s, "load": _load_dict(ld), "first_token": first, "measured_ms": round(1000 * y, 4),
                         "fitted_ms": round(1000 * (_seconds(fit["terms_s"], ld) + (extra if first else 0.0)), 4)}
                        for s, ld, y, first in pts]
    return fit


def _load_dict(load: StepLoad) -> dict:
    return {**vars(load), "attention_pairs": load.pairs, "kv_tokens": load.distinct_kv_tokens}


def _seconds(terms: dict, load: StepLoad) -> float:
    return sum(terms[t] * f for t, f in zip(TERMS, features(load), strict=True))


class FittedStepTime:
    """:class:`~.step.StepTime` fitted on this machine; ``residual`` is the fit's largest relative error."""

    def __init__(self, terms_s: dict, residual: dict, source: str = "", dropped: Sequence[str] = (),
                 first_token_overhead_s: float = 0.0):
        unknown = set(terms_s) - set(TERMS)
        if unknown or any(v < 0 for v in terms_s.values()) or first_token_overhead_s < 0:
            raise ValueError(f"step terms must be non-negative and among {TERMS}: got {terms_s}")
        self.terms_s = {t: float(terms_s.get(t, 0.0)) for t in TERMS}
        self.first_token_overhead_s = float(first_token_overhead_s)
        self.residual = dict(residual)
        self.source = source
        self.dropped = tuple(dropped)

    @classmethod
    def from_steps_json(cls, path_or_dict: str | os.PathLike | dict) -> "FittedStepTime":
        """Fit the rows of a ``bench steps --json`` report (a path or the loaded dict). An old report,
        without the prefill, context, distinct, admit or vision series, is refused with :class:`StepsJsonError` naming
        what it lacks: decode steps alone cannot price a prefill, an image or an unshared context."""
        if isinstance(path_or_dict, dict):
            rep, source = path_or_dict, "dict"
        else:
            source = os.fspath(path_or_dict)
            try:
                with open(source, encoding="utf-8") as f:
                    rep = json.load(f)
            except (OSError, json.JSONDecodeError) as e:
                raise StepsJsonError(f"{source}: cannot read a steps JSON: {e}") from e
            if not isinstance(rep, dict):
                raise StepsJsonError(f"{source}: a steps JSON is an object, got {type(rep).__name__}")
        try:
            fit = fit_points(points(rep))
        except (KeyError, TypeError) as e:
            raise StepsJsonError(f"{source}: a steps JSON row lacks {e}") from e
        return cls(fit["terms_s"], fit["residual"], source=source, dropped=fit["dropped"],
                   first_token_overhead_s=fit["first_token_overhead_s"])

    def seconds(self, load: StepLoad) -> float:
        return _seconds(self.terms_s, load)

    def first_token_seconds(self, load: StepLoad) -> float:
        """A lone new request's time to its first token: its prefill step plus the request overhead."""
        return self.seconds(load) + self.first_token_overhead_s

    def describe(self) -> dict:
        return {"kind": "fitted", "source": self.source,
                "terms_ms": {t: round(1000 * v, 6) for t, v in self.terms_s.items()},
                "first_token_overhead_ms": round(1000 * self.first_token_overhead_s, 6),
                "dropped_terms": list(self.dropped),
                "residual_max_rel": round(self.residual.get("max_rel", 0.0), 4),
                "residual_rms_rel": round(self.residual.get("rms_rel", 0.0), 4)}
