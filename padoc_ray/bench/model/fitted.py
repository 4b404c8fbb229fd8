"""A step-time function fitted on this machine from ``padoc-ray bench steps --json``.

Every measured row of every series becomes one point: the :class:`StepLoad` that row ran and the
seconds it took. One linear model is fitted over all of them at once::

    seconds = fixed + per_seq * decode_seqs + per_prefill_token * prefill_tokens
              + per_context_token * context_tokens + per_image * images + per_image_token * image_tokens

A time to the first token is one such step plus ``first_token_overhead``: what a lone new request
costs between its arrival and its first step (admission, input processing, the output's way back),
which a decode step averaged over many steps does not carry. On this CPU it is several milliseconds,
more than a whole decode step, so fitting it into ``fixed`` would price every step like a request
arrival. It is fitted with the rest, reported, and left out of :meth:`FittedStepTime.seconds` (the
engine model counts steps; :meth:`FittedStepTime.first_token_seconds` adds it back).

The series are what make the six terms separable: decode vs batch moves ``decode_seqs``, context vs
prefix length moves ``context_tokens`` at a fixed batch, prefill moves ``prefill_tokens`` with no
decode, and the vision rows differ from same-length text prompts only by their image. The fit
minimizes *relative* error (a decode step of 2 ms and a prefill of 200 ms count alike) and keeps
every term non-negative (a term that comes out negative is noise, dropped and refitted). Its
``residual`` is the largest relative error over the points; :class:`FittedStepTime` reproduces every
measured row within it.

Pure: numpy only.
"""

from __future__ import annotations

import json
import os
import statistics
from collections.abc import Sequence

from .step import StepLoad

#: the step's terms, in the order of :func:`features`
TERMS = ("fixed", "per_seq", "per_prefill_token", "per_context_token", "per_image", "per_image_token")
#: fitted beside them: the extra of a time to the first token over one step
REQUEST_TERM = "first_token_overhead"
#: the series a fitted step function needs (``bench steps`` always measures decode vs batch)
NEEDED_SERIES = ("prefill", "context", "vision")


class StepsJsonError(ValueError):
    """A steps JSON the fitted step function cannot use (an old one, or one missing a series)."""


def features(load: StepLoad) -> list[float]:
    return [1.0, load.decode_seqs, load.prefill_tokens, load.context_tokens, load.images, load.image_tokens]


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

    A decode or context step is the average over ``tokens`` steps, so its sequences attend over the
    prompt plus half the generated tokens on average; a first-token time is one prefill step of the
    prompt's uncached tokens (attending over the whole prompt)."""
    missing = _missing(rep)
    if missing:
        raise StepsJsonError(
            f"the steps JSON has no {', '.join(missing)} series (written by a bench steps that measured decode vs "
            f"batch only, or run with --series leaving them out); rerun: padoc-ray bench steps --json FILE")
    if not rep.get("rows"):
        raise StepsJsonError("the steps JSON has no decode rows ('rows')")
    out: list[Point] = []
    half = rep["tokens"] / 2
    for r in rep["rows"]:
        if not r.get("prompt_tokens"):
            raise StepsJsonError("a decode row has no 'prompt_tokens' (the expanded prompt length)")
        n = r["batch"]
        out.append(("decode", StepLoad(n, 0, round(n * (r["prompt_tokens"] + half))), r["step_ms"] / 1000, False))
    s = rep["series"]
    for r in s["context"]["rows"]:
        n = r["batch"]
        out.append(("context", StepLoad(n, 0, round(n * (r["context_tokens"] + r["tokens"] / 2))), r["step_ms"] / 1000,
                    False))
    for r in s["prefill"]["rows"]:
        p = r["prompt_tokens"]
        out.append(("prefill", StepLoad(0, p - r["cached_tokens"], p), r["ttft_ms"] / 1000, True))
    for r in s["vision"]["rows"]:
        e, t = r["prompt_tokens"], r["image_tokens"]
        out.append(("vision", StepLoad(0, e, e, images=1, image_tokens=t), r["new_image_ms"] / 1000, True))
        out.append(("vision", StepLoad(0, e - r["cached_tokens"], e), r["cached_image_ms"] / 1000, True))
        out.append(("vision", StepLoad(0, e, e), r["text_prompt_ms"] / 1000, True))
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
    fit["per_point"] = [{"series": s, "load": vars(ld), "first_token": first, "measured_ms": round(1000 * y, 4),
                         "fitted_ms": round(1000 * (_seconds(fit["terms_s"], ld) + (extra if first else 0.0)), 4)}
                        for s, ld, y, first in pts]
    return fit


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
        without the prefill/context/vision series, is refused with :class:`StepsJsonError` naming
        what it lacks: decode steps alone cannot price a prefill or an image."""
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
