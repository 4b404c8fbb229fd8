"""The soak benchmark's pure parts: how a response is classified, RSS slopes, job accounting and
the report (`padoc-ray bench soak`; the traffic and the processes are in :mod:`padoc_ray.bench.soak.run`).

Imports no ray, requests or psutil: everything here works on plain records and is unit-tested on
synthetic ones.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from padoc_ray import status
from padoc_ray.perfmodel.table3 import quantile

#: the classes a response falls in (:func:`classify`)
OK, CLIENT_ERROR, SERVER_ERROR, BACKPRESSURE, NO_RESPONSE = "2xx", "4xx", "5xx", "503_retry_after", "no_response"

MB = 1 << 20


def classify(code: int | None, retry_after: str | None = None) -> str:
    """A response's class: 2xx (and 3xx), 4xx, 503 with Retry-After (backpressure: the service said
    when to come back), every other 5xx, or no response at all (a client disconnect or a
    client-side error, ``code`` None)."""
    if code is None:
        return NO_RESPONSE
    if code == 503 and retry_after:
        return BACKPRESSURE
    if code >= 500:
        return SERVER_ERROR
    if code >= 400:
        return CLIENT_ERROR
    return OK


@dataclass
class Response:
    """One HTTP request the soak sent: its kind (``parse``, ``job_poll``, ...), status code (None:
    none came back), Retry-After header and client-side latency."""

    kind: str
    code: int | None
    latency_s: float
    retry_after: str | None = None
    error: str | None = None  #: the client-side exception's name when no response came back


def warmup_seconds(duration_s: float, fraction: float = 0.2, min_s: float = 60.0) -> float:
    """The part of a run left out of the RSS slopes: ``fraction`` of it, at least ``min_s``, but
    never more than half of it (a run under ``2 * min_s`` keeps its second half)."""
    if not 0 <= fraction < 1:
        raise ValueError(f"warm-up fraction must be in [0, 1), got {fraction}")
    return max(fraction * duration_s, min(min_s, duration_s / 2))


def rss_slope_mb_per_h(samples: Sequence[tuple[float, float]], after_s: float = 0.0) -> float | None:
    """Least-squares slope of RSS over time, in MB per hour, of the samples (seconds, bytes) taken
    at or after ``after_s``; None when fewer than two such samples (or all at one instant)."""
    pts = [(t, rss) for t, rss in samples if t >= after_s]
    if len(pts) < 2 or len({t for t, _ in pts}) < 2:
        return None
    slope, _ = statistics.linear_regression([t for t, _ in pts], [rss for _, rss in pts])
    return slope * 3600 / MB


@dataclass
class JobTrace:
    """One job the soak created (it answered 202), as the client saw it to the end."""

    id: str
    expected_pages: tuple[int, ...]  #: the page indexes the job should parse (0-based)
    final_status: str | None = None  #: its last status seen (None: never read back)
    result_pages: list[int] | None = None  #: page_index of every entry of its result (done jobs)
    cancel_sent: bool = False
    result_code: int | None = None  #: status code of GET .../result (done jobs)


def job_accounting(jobs: Iterable[JobTrace]) -> dict:
    """``jobs_lost``: jobs that never reached a final state, or done jobs whose result lacks one of
    their pages (or could not be fetched); ``job_pages_duplicated``: page entries beyond the first
    of each page_index in the results. Also the jobs by final status and how many were cancelled."""
    lost: list[str] = []
    dup = 0
    final: Counter = Counter()
    cancel_sent = 0
    n = 0
    for j in jobs:
        n += 1
        cancel_sent += j.cancel_sent
        final[j.final_status or "never_final"] += 1
        if j.final_status not in status.JOB_FINAL:
            lost.append(j.id)
            continue
        if j.final_status != status.JOB_DONE:
            continue
        got = j.result_pages
        if got is None or not set(j.expected_pages) <= set(got):
            lost.append(j.id)
        if got is not None:
            dup += len(got) - len(set(got))
    return {"jobs_created": n, "jobs_lost": len(lost), "job_pages_duplicated": dup, "jobs_cancel_sent": cancel_sent,
            "jobs_by_final_status": dict(sorted(final.items())), "lost_job_ids": lost[:20]}


def request_summary(responses: Sequence[Response]) -> dict:
    """Counts per kind, the status-code histogram (overall and per kind), the 5xx split, and
    latency P50/P95 per kind (of requests that got a response)."""
    by_kind: dict[str, list[Response]] = {}
    for r in responses:
        by_kind.setdefault(r.kind, []).append(r)
    classes = Counter(classify(r.code, r.retry_after) for r in responses)
    kinds = {}
    for kind, rs in sorted(by_kind.items()):
        lat = [r.latency_s for r in rs if r.code is not None]
        kinds[kind] = {"requests": len(rs), "codes": _histogram(rs),
                       "p50_s": round(quantile(lat, 0.5), 4) if lat else None,
                       "p95_s": round(quantile(lat, 0.95), 4) if lat else None}
    errors = Counter(r.error for r in responses if r.code is None and r.error)
    return {"requests": len(responses), "http_5xx": classes[SERVER_ERROR],
            "http_503_retry_after": classes[BACKPRESSURE], "http_4xx": classes[CLIENT_ERROR],
            "no_response": classes[NO_RESPONSE], "status_codes": _histogram(responses),
            "client_errors": dict(sorted(errors.items())), "kinds": kinds}


def _histogram(rs: Iterable[Response]) -> dict[str, int]:
    c = Counter("none" if r.code is None else str(r.code) for r in rs)
    return dict(sorted(c.items()))


@dataclass
class RssSeries:
    """One process's RSS samples (or a group's: the sum of its live processes' RSS): (seconds since
    the traffic started, bytes)."""

    name: str  #: ``"<label> <pid>"``
    samples: list[tuple[float, float]] = field(default_factory=list)
    max_processes: int = 1  #: a group's most processes at one sample


def rss_floor_slope_mb_per_h(samples: Sequence[tuple[float, float]], after_s: float = 0.0,
                             window_s: float = 300.0) -> float | None:
    """Least-squares slope, in MB per hour, of the RSS floor: each ``window_s`` window's lowest sample
    (after ``after_s``). The work in flight raises a process's RSS only for a while, and so the
    all-samples slope of a process whose RSS swings with it depends on where the swings fall; a leak
    raises the floor. Whole windows only, from the first sample on; None: fewer than three."""
    pts = [(t, rss) for t, rss in samples if t >= after_s]
    if not pts:
        return None
    t0, lows = pts[0][0], {}
    whole = int((pts[-1][0] - t0) // window_s)  # a last, shorter window's lowest sample is no floor
    for t, rss in pts:
        k = int((t - t0) // window_s)
        if k < whole and (k not in lows or rss < lows[k][1]):
            lows[k] = (t, rss)
    return rss_slope_mb_per_h(list(lows.values())) if len(lows) >= 3 else None


def rss_summary(series: Iterable[RssSeries], warmup_s: float) -> dict:
    """``rss_slope_mb_per_h``: per process (None: too few samples after the warm-up) and the worst
    (largest) slope; ``rss_floor_slope_mb_per_h``: the same for the floor
    (:func:`rss_floor_slope_mb_per_h`); ``rss_mb``: each process's first and last sample, and its
    whole curve (``curve``: [minutes since the traffic started, MB] per sample), to tell a cache that fills and
    levels off from a leak that keeps going."""
    slopes, floors, mb = {}, {}, {}
    for s in series:
        slopes[s.name] = _round(rss_slope_mb_per_h(s.samples, warmup_s))
        floors[s.name] = _round(rss_floor_slope_mb_per_h(s.samples, warmup_s))
        if s.samples:
            mb[s.name] = {"start": round(s.samples[0][1] / MB, 1), "end": round(s.samples[-1][1] / MB, 1),
                          "samples": len(s.samples), "max_processes": s.max_processes,
                          "curve": [[round(t / 60, 2), round(b / MB, 1)] for t, b in s.samples]}
    return {"rss_slope_mb_per_h": _with_worst(slopes), "rss_floor_slope_mb_per_h": _with_worst(floors), "rss_mb": mb}


def _with_worst(per_process: dict) -> dict:
    known = [v for v in per_process.values() if v is not None]
    return {"worst": max(known) if known else None, "processes": per_process}


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 2)


def build_report(responses: Sequence[Response], jobs: Iterable[JobTrace], series: Iterable[RssSeries], *,
                 duration_s: float, warmup_s: float, server: Mapping, config: Mapping,
                 anomalies: Mapping[str, int] | None = None) -> dict:
    """The soak's JSON report: the contract keys (``rss_slope_mb_per_h``, ``requests``, ``http_5xx``,
    ``jobs_lost``, ``job_pages_duplicated``) first, then what explains them. ``anomalies``: answers
    that were not what their request should get (a bad input not refused with 4xx, a stream without
    its result line, ...), by what happened."""
    req = request_summary(responses)
    acc = job_accounting(jobs)
    rss = rss_summary(series, warmup_s)
    return {"rss_slope_mb_per_h": rss["rss_slope_mb_per_h"], "requests": req["requests"], "http_5xx": req["http_5xx"],
            "jobs_lost": acc["jobs_lost"], "job_pages_duplicated": acc["job_pages_duplicated"],
            "rss_floor_slope_mb_per_h": rss["rss_floor_slope_mb_per_h"],
            "http_503_retry_after": req["http_503_retry_after"], "http_4xx": req["http_4xx"],
            "no_response": req["no_response"], "duration_min": round(duration_s / 60, 3),
            "warmup_min": round(warmup_s / 60, 3), "status_codes": req["status_codes"],
            "client_errors": req["client_errors"], "kinds": req["kinds"],
            "jobs": {k: v for k, v in acc.items() if k not in ("jobs_lost", "job_pages_duplicated")},
            "anomalies": dict(sorted((anomalies or {}).items())), "rss_mb": rss["rss_mb"], "server": dict(server),
            "config": dict(config)}
