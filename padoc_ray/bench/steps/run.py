"""How the engine's decode step time grows with the batch (`padoc-ray bench steps`).

Fork decoding wins by running a page's branches side by side: fewer steps per page, more sequences
per step. That pays in full while a step costs about the same whatever the batch (a GPU decoding a
real model is memory-bound) and less once a step's time grows with the batch (a compute-bound
CPU). This benchmark measures which regime the machine is in, on the real engine with the serving
settings: for each batch size n, n requests that share one page image and page prompt (one page's
branches, the prefix served from the cache) each decode exactly ``tokens`` teacher-forced tokens at
once; a step is the wall time over ``tokens``.

From the rows it fits ``step = fixed + per_seq * n`` and reports, for each n, the batching gain
left: the best token rate measured at any batch over the rate at n. Read n as the concurrency C of
one-stream-per-page (sequential) decoding: running more sequences per step (fork) can raise the
token rate by at most that factor on this machine; what fork gains beyond it comes from doing less
work per page (its branches attend over shorter contexts than one long sequential stream).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from padoc_ray.bench import DEFAULT_MODEL, EXAMPLES_DIR, UsageError, write_json
from padoc_ray.host import HostConfig
from padoc_ray.knobs import knob
from padoc_ray.perfmodel.fitted import NEEDED_SERIES, fit_steps

from .series import EXTRA_SERIES, series_fits

DEFAULT_BATCHES = (1, 4, 16, 64, 128, 256)
#: the speed probe's batch: sequences decoding at once in the probe :func:`speed_probe` runs (``bench steps``
#: at its start and end, ``bench serve --speed-probe`` around every cell), so that a measured run can be
#: compared with a step function fitted at another time on a machine whose speed drifts
PROBE_BATCH = 16
#: timed runs of the speed probe (their median is its figure): this machine's step time moves by 10% between
#: runs seconds apart, and three runs left single probes of one cell 10-40% apart (2026-12-03)
PROBE_REPEAT = 5

#: forced tokens come from this text (ordinary text tokens: no stop or control token among them)
_FORCED_TEXT = ("Decoding depth drops from the sum of all region lengths to the longest layout-content "
                "path, so a page finishes in fewer engine steps. ")


@dataclass(frozen=True)
class StepsConfig:
    #: batch sizes n to measure, each <= the engine's max_num_seqs
    batches: tuple[int, ...] = knob(DEFAULT_BATCHES, flags=("--batch",), parse="ints")
    tokens: int = 128  #: tokens every request decodes (teacher-forced, so exactly this many)
    repeat: int = 3  #: timed runs per batch size (the median is reported), after one untimed warm-up run
    #: series measured beside decode vs batch, for the engine model (prefill, context, distinct, admit, vision)
    series: tuple[str, ...] = EXTRA_SERIES
    prefill: tuple[int, ...] = (256, 1024, 2048, 4096)  #: prefill series: uncached prompt lengths P, in tokens
    context: tuple[int, ...] = (256, 2048, 8192)  #: context series: cached prefix lengths L per sequence, in tokens
    context_batch: int = 8  #: context series: sequences decoding over each prefix at once
    #: distinct series: prefix lengths L, each of the distinct_batch sequences over a prefix of its own, in tokens
    distinct: tuple[int, ...] = (256, 1024, 2048, 4096)
    distinct_batch: int = 16  #: distinct series: sequences decoding at once, each over its own prefix
    admit: tuple[int, ...] = (1, 4, 16)  #: admit series: requests that arrive together, one burst size each
    #: admit series: text tokens after the page prompt that every request of a burst finds cached (a layout prefix)
    admit_prefix: int = 1024
    #: vision series: the page image's longest side, in pixels (kept within the tiny model's pixel budget, so
    #: the processor does not resize: the encoder's cost, not a resize's, grows with the image)
    image_sides: tuple[int, ...] = (256, 384, 576)
    #: timed runs per size in the prefill, context, distinct, admit and vision series (the fastest is used)
    series_repeat: int = 5

    def __post_init__(self) -> None:
        if not self.batches or any(n < 1 for n in self.batches):
            raise ValueError("batch sizes must be positive integers")
        if len(set(self.batches)) != len(self.batches):
            raise ValueError("batch sizes must be distinct")
        if self.tokens < 2:
            raise ValueError("tokens must be >= 2 (one step is prefill)")
        if self.repeat < 1:
            raise ValueError("repeat must be >= 1")
        unknown = [x for x in self.series if x not in EXTRA_SERIES]
        if unknown:
            raise ValueError(f"unknown series {unknown}: choose among {', '.join(EXTRA_SERIES)}")
        for name, series in (("prefill", "prefill"), ("context", "context"), ("distinct", "distinct"),
                             ("admit", "admit"), ("image_sides", "vision")):
            sizes = getattr(self, name)
            if any(n < 1 for n in sizes) or len(set(sizes)) != len(sizes):
                raise ValueError(f"{name} sizes must be distinct positive integers")
            if series in self.series and not sizes:
                raise ValueError(f"the {series} series needs at least one {name} size")
        if self.series_repeat < 1:
            raise ValueError("series_repeat must be >= 1")
        if self.context_batch < 1 or self.distinct_batch < 1:
            raise ValueError("context_batch and distinct_batch must be >= 1")
        if self.admit_prefix < 0:
            raise ValueError("admit_prefix must be >= 0")


def fit_linear(rows: Sequence[dict]) -> dict:
    """Least-squares ``step_ms = fixed_ms + per_seq_ms * batch`` over the rows; with one row, all of
    its step is taken as fixed. ``saturation_tokens_per_s`` is where the token rate tends as the batch
    grows (1000 / per_seq_ms; None when a step does not grow with the batch)."""
    xs = [float(r["batch"]) for r in rows]
    ys = [float(r["step_ms"]) for r in rows]
    if len(rows) < 2:
        fixed, per_seq = (ys[0] if ys else 0.0), 0.0
    else:
        mx, my = statistics.fmean(xs), statistics.fmean(ys)
        sxx = sum((x - mx) ** 2 for x in xs)
        per_seq = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
        fixed = my - per_seq * mx
    return {
        "fixed_ms": round(fixed, 4),
        "per_seq_ms": round(per_seq, 5),
        "saturation_tokens_per_s": round(1000.0 / per_seq, 1) if per_seq > 0 else None,
    }


def batching_gain_left(rows: Sequence[dict]) -> list[dict]:
    """For each measured batch n: how much more token throughput a larger batch gets on this machine
    (best rate measured / rate at n; 1.0 where n is the best)."""
    best = max(r["tokens_per_s"] for r in rows)
    return [{"batch": r["batch"], "batching_gain_left": round(best / r["tokens_per_s"], 3)}
            for r in sorted(rows, key=lambda r: r["batch"])]


def forced_tokens(tokenizer, n: int) -> list[int]:
    ids = tokenizer.encode(_FORCED_TEXT)
    if not ids:
        raise ValueError("the tokenizer encoded the forced text to nothing")
    return [ids[i % len(ids)] for i in range(n)]


async def measure(engine, prompt_ids: Sequence[int], suffix_ids: Sequence[int], image, forced: Sequence[int],
                  cfg: StepsConfig, log: Callable[[str], None] = lambda m: None) -> list[dict]:
    """One row per batch size. Request i's prompt is ``prompt_ids`` + ``suffix_ids[i % len]`` (its own
    last token, so each request has blocks of its own after the shared prefix, like a branch)."""
    from padoc_ray.engine.interface import GenRequest

    seq = 0

    expanded: list[int] = []  # the engine's expanded prompt lengths (the image's tokens counted)

    async def one(i: int) -> int:
        nonlocal seq
        seq += 1
        req = GenRequest(request_id=f"steps-{seq}", prompt_ids=[*prompt_ids, suffix_ids[i % len(suffix_ids)]],
                         max_tokens=len(forced), image=image, image_uuid="bench-steps-page", stream=False,
                         forced_tokens=forced)
        n = 0
        async for d in engine.generate(req):
            n += len(d.token_ids)
            if d.num_prompt_tokens:
                expanded.append(d.num_prompt_tokens)
        return n

    async def batch(n: int) -> float:
        t = time.perf_counter()
        got = await asyncio.gather(*(one(i) for i in range(n)))
        dt = time.perf_counter() - t
        short = [g for g in got if g != len(forced)]
        if short:
            raise RuntimeError(f"{len(short)} of {n} requests decoded {short[0]} tokens, not {len(forced)}")
        return dt

    rows = []
    await batch(1)  # warm-up: the image is encoded and its prefix cached once
    for n in cfg.batches:
        await batch(n)  # untimed: first run at this size
        walls = [await batch(n) for _ in range(cfg.repeat)]
        wall = statistics.median(walls)
        row = {"batch": n, "wall_s": round(wall, 4), "step_ms": round(1000 * wall / cfg.tokens, 3),
               "tokens_per_s": round(n * cfg.tokens / wall, 1), "runs_s": [round(w, 4) for w in walls]}
        if expanded:
            row["prompt_tokens"] = max(expanded)
        log(f"batch {n:4d}: step {row['step_ms']:8.2f} ms  {row['tokens_per_s']:9.0f} tokens/s")
        rows.append(row)
    return rows


async def speed_probe(engine, model_protocol, image, *, tokens: int = 128, repeat: int = PROBE_REPEAT,
                      batch: int = PROBE_BATCH) -> float:
    """This machine's speed now: the median decode step (ms) of ``batch`` requests that share ``image``
    and the page prompt, each decoding ``tokens`` teacher-forced tokens (``bench steps``' decode row at
    that batch, run alone)."""
    tok = model_protocol.tokenizer
    cfg = StepsConfig(batches=(batch,), tokens=tokens, repeat=repeat, series=())
    rows = await measure(engine, model_protocol.prompt_ids("fork"), forced_tokens(tok, batch), image,
                         forced_tokens(tok, tokens), cfg)
    return rows[0]["step_ms"]


def page_image(path: str, longest_side: int | None = None):
    """A page image from an image file or a PDF's first page, rendered as the batch job renders it."""
    from padoc_ray.pdf import RenderConfig, open_document, render_page

    with open(path, "rb") as f:
        data = f.read()
    cfg = RenderConfig() if longest_side is None else RenderConfig(longest_side=longest_side)
    doc = open_document(data)
    try:
        return render_page(doc, 0, cfg).image
    finally:
        close = getattr(doc, "close", None)
        if close is not None:
            close()


def run(model: str, image_path: str, cfg: StepsConfig, *, engine_overrides: dict | None = None,
        log: Callable[[str], None] = lambda m: None) -> dict:
    """Start the engine with the host's settings for this machine, measure, and return the report."""
    from padoc_ray.tokenizer import ModelProtocol
    from padoc_ray.host import HostConfig

    ecfg = HostConfig(engine_overrides=engine_overrides or {}).engine_config(model)
    too_big = [n for n in cfg.batches if n > ecfg.max_num_seqs]
    if too_big:
        raise ValueError(f"batch sizes {too_big} exceed the engine's max_num_seqs {ecfg.max_num_seqs}")
    _check_envelope(cfg, ecfg)
    proto = ModelProtocol(model)
    image = page_image(image_path)
    forced = forced_tokens(proto.tokenizer, cfg.tokens)
    suffix = forced_tokens(proto.tokenizer, max(cfg.batches))  # any ordinary tokens; they only differ
    text = lambda n: forced_tokens(proto.tokenizer, n)  # noqa: E731 - a text prompt of n ordinary tokens
    images = [(side, page_image(image_path, side)) for side in cfg.image_sides] if "vision" in cfg.series else []
    page = (proto.prompt_ids("fork"), image)  # the context and distinct series' prefix starts with the page

    async def go() -> tuple[list[dict], dict]:
        from padoc_ray.engine.vllm_engine import VllmEngine

        from . import series as ss

        t = time.perf_counter()
        engine = VllmEngine(ecfg)
        log(f"engine up in {time.perf_counter() - t:.0f} s; decoding {cfg.tokens} tokens a request at batch sizes "
            f"{', '.join(map(str, cfg.batches))}, then the series {', '.join(cfg.series) or '(none)'}")
        try:
            probes = [await speed_probe(engine, proto, image, tokens=cfg.tokens)]
            rows = await measure(engine, proto.prompt_ids("fork"), suffix, image, forced, cfg, log)
            series: dict = {}
            if "prefill" in cfg.series:
                series["prefill"] = {"rows": await ss.measure_prefill(engine, text, cfg.prefill, cfg.series_repeat,
                                                                      log)}
            if "context" in cfg.series:
                series["context"] = {"rows": await ss.measure_context(engine, text, cfg.context, cfg.context_batch,
                                                                      forced, cfg.series_repeat, log, page=page)}
            if "distinct" in cfg.series:
                series["distinct"] = {"rows": await ss.measure_context(engine, text, cfg.distinct, cfg.distinct_batch,
                                                                       forced, cfg.series_repeat, log, shared=False,
                                                                       page=page)}
            if "admit" in cfg.series:
                series["admit"] = {"rows": await ss.measure_admit(engine, text, page, cfg.admit, cfg.admit_prefix,
                                                                  cfg.series_repeat, log)}
            if "vision" in cfg.series:
                series["vision"] = {"rows": await ss.measure_vision(engine, proto.prompt_ids("fork"), text, images,
                                                                    cfg.series_repeat, log)}
            probes.append(await speed_probe(engine, proto, image, tokens=cfg.tokens))
            return rows, series, probes
        finally:
            engine.shutdown()

    rows, series, probes = asyncio.run(go())
    for name, fit in series_fits(series).items():
        series[name]["fit"] = fit
    rep = {
        "model": model,
        "image": image_path,
        "image_size": list(image.size),
        "tokens": cfg.tokens,
        "repeat": cfg.repeat,
        "engine": {"max_num_seqs": ecfg.max_num_seqs, "max_num_batched_tokens": ecfg.max_num_batched_tokens,
                   "max_model_len": ecfg.max_model_len, "block_size": ecfg.block_size,
                   "executor": ecfg.executor, "cpu_threads": ecfg.cpu_threads, "dtype": ecfg.dtype},
        "rows": rows,
        "fit": fit_linear(rows),
        "batching_gain_left": batching_gain_left(rows),
        "series": series,
        # the machine's speed while it measured (start, end): bench model --compare scales by a measured run's own
        "speed_probe": {"batch": PROBE_BATCH, "tokens": cfg.tokens, "step_ms": round(statistics.fmean(probes), 3),
                        "runs_ms": probes},
    }
    if not [s for s in NEEDED_SERIES if s not in series]:
        rep["step_model"] = fit_steps(rep)
    return rep


def _check_envelope(cfg: StepsConfig, ecfg) -> None:
    """Each prefill must be one step and each context must fit the model: refuse sizes that do not."""
    if "prefill" in cfg.series and max(cfg.prefill) > ecfg.max_num_batched_tokens:
        raise ValueError(f"prefill sizes must be <= the engine's max_num_batched_tokens {ecfg.max_num_batched_tokens} "
                         f"(a longer prompt is prefilled in chunks, several steps)")
    for name in ("context", "distinct"):
        if name in cfg.series and max(getattr(cfg, name)) + 2 + cfg.tokens > ecfg.max_model_len:
            raise ValueError(f"{name} sizes + tokens must fit the engine's max_model_len {ecfg.max_model_len}")
    for series, what, n in (("context", "context_batch", cfg.context_batch),
                            ("distinct", "distinct_batch", cfg.distinct_batch), ("admit", "admit burst sizes", max(cfg.admit))):
        if series in cfg.series and n > ecfg.max_num_seqs:
            raise ValueError(f"{what} must be <= the engine's max_num_seqs {ecfg.max_num_seqs}")
    if "admit" in cfg.series and cfg.admit_prefix + 8 > ecfg.max_model_len:
        raise ValueError(f"admit_prefix must fit the engine's max_model_len {ecfg.max_model_len}")


def format_report(rep: dict) -> str:
    fit = rep["fit"]
    gain = {g["batch"]: g["batching_gain_left"] for g in rep["batching_gain_left"]}
    base = min(rep["rows"], key=lambda r: r["batch"])
    lines = [f"| batch | step ms | step / batch-{base['batch']} step | tokens/s | batching gain left (best tokens/s / this) |",
             "|---|---|---|---|---|"]
    for r in rep["rows"]:
        lines.append(f"| {r['batch']} | {r['step_ms']:.2f} | {r['step_ms'] / base['step_ms']:.2f}x | "
                     f"{r['tokens_per_s']:.0f} | {gain[r['batch']]:.2f}x |")
    sat = fit["saturation_tokens_per_s"]
    lines.append("")
    lines.append(f"step = {fit['fixed_ms']:.3f} ms + {fit['per_seq_ms']:.4f} ms x batch"
                 + (f" (token rate tends to {sat:.0f}/s)" if sat else " (a step does not grow with the batch)"))
    for name, ser in (rep.get("series") or {}).items():
        fit = ser.get("fit") or {}
        lines.append(f"{name}: " + ", ".join(f"{k} {v:g}" for k, v in fit.items()))
    model = rep.get("step_model")
    if model:
        terms = ", ".join(f"{k} {1000 * v:.4g} ms" for k, v in model["terms_s"].items())
        lines.append(f"step model: {terms}; a first token adds {1000 * model['first_token_overhead_s']:.4g} ms "
                     f"(largest error {100 * model['residual']['max_rel']:.1f}% over "
                     f"{model['points']} measured points)")
    return "\n".join(lines)


@dataclass(frozen=True, kw_only=True)
class StepsCommand:
    """On the real engine with the serving settings for this machine: for each batch size n, n requests sharing
    one page image and prompt (one page's branches) each decode --tokens teacher-forced tokens at once. Prints
    step time and tokens/s per n, the fit step = fixed + per_seq x n, and for each n (read as C pages decoded one
    stream each) the batching gain left: how much more token throughput a larger batch gets here. With --series
    it also measures what the engine model (bench model --steps) fits: prefill tokens, context length over one
    shared prefix and over prefixes of each sequence's own, bursts of requests admitted together, and the vision
    encoder per image."""

    model: str = knob(DEFAULT_MODEL, help="checkpoint directory")
    image: str = knob(os.path.join(EXAMPLES_DIR, "paper.pdf"), show=lambda v: "examples/paper.pdf",
                      help="page image, or a PDF whose first page is rendered as the batch job does")
    steps: StepsConfig = knob(factory=StepsConfig, nested=tuple(f.name for f in dataclasses.fields(StepsConfig)))
    #: the engine: --max-num-seqs (every batch size must fit)
    host: HostConfig = knob(factory=HostConfig, nested=("engine_overrides",))
    json: str | None = knob(None, metavar="OUT.json", help="also write the results here as JSON")


def main(cmd: StepsCommand) -> int:
    from padoc_ray.pdf import PdfError

    if not os.path.isdir(cmd.model):
        raise UsageError(f"--model: model directory not found: {cmd.model} (build one with: padoc-ray "
                         f"build-tiny-model {cmd.model})")
    if not os.path.exists(os.path.join(cmd.model, "padoc_protocol.json")):
        raise UsageError(f"--model: {cmd.model} is not a padoc-ray checkpoint bench steps can measure (no "
                         f"padoc_protocol.json: it fits the padoc family's step costs, which bench model then prices)")
    if not os.path.isfile(cmd.image):
        raise UsageError(f"--image: {cmd.image} is not a file")
    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    try:
        rep = run(os.path.abspath(cmd.model), cmd.image, cmd.steps, engine_overrides=dict(cmd.host.engine_overrides),
                  log=log)
    except PdfError as e:
        raise UsageError(f"--image: {cmd.image}: {e}") from None
    except ValueError as e:
        raise UsageError(f"bench steps: {e}") from None
    print(format_report(rep))
    write_json(cmd.json, rep)
    return 0
