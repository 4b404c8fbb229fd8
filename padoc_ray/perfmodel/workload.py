"""The paper's 384-page serving workload, synthesized: pages whose decode statistics match Table 11(a).

The paper's pages are not here, only their statistics. :func:`paper384` makes 384 protocol pages
whose per-page ``F_seq`` and ``F_PaDoc`` (the project's own definition,
:func:`padoc_ray.protocol.decode_depth`, as host records and ``corpus profile`` compute them) have
the median, quartiles and mean of Table 11(a), and so its 58.4% median step reduction.

How: ``F_seq`` and ``F_PaDoc`` are each drawn at evenly spaced quantiles of a two-piece log-normal
through the table's quartiles (its top capped where the mean comes out at the table's). Long pages
have more regions and so fork more: the two are coupled by a Gaussian copula whose correlation is
the one (on a 0.05 grid) that best gives the step reduction's quartiles. Each page is then built to its two targets: one
region sits on the critical path (its layout prefix plus its content is ``F_PaDoc``), the rest of
``F_seq`` is spread over the other regions (random shares, none above the critical path); a region
that gets no content is a figure.

Content of a wanted token length: English prose (``corpus.content``) encoded by the model
protocol's tokenizer, cut at that many tokens, decoded, and trimmed or padded one character or
word at a time until it encodes to exactly that many tokens again. Lengths are counted in the
tokenizer that runs (here the tiny checkpoint's, about 3 tokens an English word where Qwen's takes
1.3): the *token* statistics match the paper's, not the words.

Output lengths (Tables 12-13): mean output tokens/s over valid pages/s is what a page generates. For
PaDoc (every page valid) that is about 892 tokens (860-901 across C), close to the mean ``F_seq``
plus a branch's end-of-stream per region, which is what a fork page here generates. Sequential's
1,124-1,390 per valid page includes its 20-25 pages that ran to the 8,192-token generation limit
(Appendix E.3, "Validity"); the other 359-364 were valid. :func:`paper384_traces` makes
:data:`SEQUENTIAL_RUNAWAY_PAGES` of the pages, chosen at random with the workload's seed, run away the
same way in sequential mode only: their sequential stream goes on past the limit with new prose in
the last region (no repetition, so no loop detector stops it early; the paper's ran into the limit),
while their fork traces stay the page's own (every PaDoc page was valid).

Image tokens: the paper serves OmniDocBench's page images, which are images at their source
resolution, not PDFs rendered by this project (the batch job's 1,600 px longest side does not apply);
Qwen3-VL's processor keeps anything under 16.7 MP as it is. Its pages are mostly A4 and Letter at
200 dpi (the demo's page_info: 1654 x 2339, 1655 x 2340, 2339 x 1654, ...), so by default the pages
here are :data:`PAGE_SIZES` (A4 portrait and landscape, Letter at 200 dpi), counted as Qwen3-VL's
processor counts them (:func:`image_tokens`): 3,657-3,796 tokens a page. ``page_sizes`` (``bench
model --page-sizes GT.json``) draws the sizes from a ground truth's page_info instead, e.g.
OmniDocBench's own. ``proc`` counts them with another model's image processor instead (``bench model
--gpu G --model-config hpd-1b``: HPD-Parsing's 448-px tiles, 6,400 tokens for an A4 page at 200 dpi;
``dots-ocr``: dots.ocr's smart_resize with 28-px squares, 4,956 for it).

Pure: imports no ray, vllm or torch.
"""

from __future__ import annotations

import math
import random
import statistics
from dataclasses import replace
from statistics import NormalDist

from padoc_ray.corpus.content import paragraph
from padoc_ray.protocol import Box, Page, Region, decode_depth, serialize_sequential
from padoc_ray.protocol.codec import content_tokens, region_layout_tokens
from padoc_ray.protocol.family import PREFIX_FORK

from .trace import AnyImageProcessor, PageTrace, trace_from_page
from .trace import image_tokens as processor_image_tokens

#: Table 11(a) (376 valid C64 pages of the 384) and the output tokens per page implied by Tables 12-13
PAPER_384 = {
    "pages": 384,
    "f_seq": {"p25": 376.5, "median": 725.0, "p75": 1270.5, "mean": 923.2},
    "f_padoc": {"p25": 182.5, "median": 297.5, "p75": 441.0, "mean": 325.3},
    "step_reduction_pct": {"p25": 47.7, "median": 58.4, "p75": 68.2, "mean": 56.3},
    # Table 13 mean TPS / Table 3 valid pages/s, PaDoc, C=16..256: 859.8, 899.6, 900.8, 901.4, 899.8
    "padoc_output_tokens_per_page": 892.3,
}
#: Sequential SFT pages that ran to the 8,192-token generation limit, per setting: "20-25" of 384 (Appendix
#: E.3); the midpoint. PaDoc had none
SEQUENTIAL_RUNAWAY_PAGES = 22
#: what a paper384 run assumes beyond the engine model's own (report.json's ``assumptions``)
ASSUMPTIONS = (
    f"paper384: {SEQUENTIAL_RUNAWAY_PAGES} of the 384 pages (the paper's 20-25) run to the 8,192-token generation "
    "limit in sequential mode and are invalid, as the paper's Sequential SFT pages did; which ones is chosen at "
    "random (the paper does not say); their fork traces are the page's own (every PaDoc page was valid)",
    "paper384: Sequential runs in vLLM's standard envelope (256 sequences, 32,768 batched tokens), PaDoc in the "
    "paper's (384, 24,576), as Appendix E.3 states",
)
#: (name, width px, height px, share of pages): portrait A4 and US Letter, some landscape A4, at 200 dpi
PAGE_SIZES = (("a4", 1654, 2339, 0.7), ("letter", 1700, 2200, 0.2), ("a4-landscape", 2339, 1654, 0.1))
#: Qwen3-VL's image processor: 16-px patches merged 2x2, and its pixel budget (preprocessor_config.json
#: "size": shortest_edge / longest_edge, counted in pixels)
PATCH, MERGE, MIN_PIXELS, MAX_PIXELS = 16, 2, 65536, 16777216
_Z = NormalDist()
_QUARTILE_Z = _Z.inv_cdf(0.75)


def image_tokens(width: int, height: int, patch: int = PATCH, merge: int = MERGE,
                 min_pixels: int = MIN_PIXELS, max_pixels: int = MAX_PIXELS) -> int:
    """Tokens a ``width`` x ``height`` image becomes: each side rounded to a multiple of patch x merge,
    scaled into the pixel budget (Qwen-VL's ``smart_resize``), one token per merged patch group."""
    f = patch * merge
    h, w = max(f, round(height / f) * f), max(f, round(width / f) * f)
    if h * w > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h, w = max(f, math.floor(height / beta / f) * f), max(f, math.floor(width / beta / f) * f)
    elif h * w < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h, w = math.ceil(height * beta / f) * f, math.ceil(width * beta / f) * f
    return (h // f) * (w // f)


def _two_piece(q: float, lo: float, mid: float, hi: float) -> float:
    """The q-quantile of a two-piece normal through the quartiles ``lo`` < ``mid`` < ``hi``."""
    z = _Z.inv_cdf(q)
    return mid + z * ((mid - lo) if z < 0 else (hi - mid)) / _QUARTILE_Z


def _stratified(qs: list[float], table: dict) -> list[float]:
    """Values at quantiles ``qs`` of a two-piece log-normal through the table's quartiles, the top
    capped where their mean is the table's."""
    logs = [math.exp(_two_piece(q, math.log(table["p25"]), math.log(table["median"]), math.log(table["p75"])))
            for q in qs]
    lo, hi = table["p75"], max(logs)
    for _ in range(60):  # bisect the cap
        cap = (lo + hi) / 2
        lo, hi = (cap, hi) if statistics.fmean(min(v, cap) for v in logs) < table["mean"] else (lo, cap)
    return [min(v, cap) for v in logs]


def _targets(n: int, rng: random.Random) -> list[tuple[int, int]]:
    """(F_seq, F_PaDoc) targets of n pages: both marginals at evenly spaced quantiles, coupled by the
    copula correlation that best gives the step reduction's quartiles."""
    red = PAPER_384["step_reduction_pct"]
    qs = [(i + 0.5) / n for i in range(n)]
    f_seq = _stratified(qs, PAPER_384["f_seq"])
    noise = [_Z.inv_cdf(q) for q in qs]
    rng.shuffle(noise)
    best = None
    for rho in [i / 20 for i in range(20)]:
        z = [rho * _Z.inv_cdf(q) + math.sqrt(1 - rho * rho) * e for q, e in zip(qs, noise, strict=True)]
        order = sorted(range(n), key=lambda i: z[i])  # page i gets F_PaDoc at z's rank
        fp_sorted = _stratified(qs, PAPER_384["f_padoc"])
        f_padoc = [0.0] * n
        for rank, i in enumerate(order):
            f_padoc[i] = fp_sorted[rank]
        pairs = [(round(s), max(2, min(round(p), round(0.99 * s)))) for s, p in zip(f_seq, f_padoc, strict=True)]
        got = _quartiles([100 * (1 - p / s) for s, p in pairs])
        err = sum(abs(got[k] - red[k]) for k in ("p25", "median", "p75"))
        if best is None or err < best[0]:
            best = (err, pairs)
    pairs = best[1]
    rng.shuffle(pairs)
    return pairs


def _quartiles(values: list[float]) -> dict:
    q = statistics.quantiles(values, n=4, method="inclusive")
    return {"p25": q[0], "median": q[1], "p75": q[2], "mean": statistics.fmean(values)}


def _content_lengths(f_seq: int, f_padoc: int, r: int, rng: random.Random) -> list[int]:
    """Per-region content tokens (in reading order) whose decode depth is (f_seq, f_padoc) where that
    is reachable with ``r`` layout tokens a region; the closest reachable otherwise."""
    n_max = max(1, (f_padoc - 2) // r)  # the layout stream must end within the critical path
    n = max(1, min(n_max, round(f_seq / rng.uniform(35, 80))))
    for _ in range(2 * n_max):
        j = rng.randint(1, n)  # the region on the critical path
        lens = [0] * n
        lens[j - 1] = max(0, f_padoc - 1 - j * r)
        rest = f_seq - (n * r + 1) - lens[j - 1]
        caps = [0 if k == j else max(0, f_padoc - 1 - k * r) for k in range(1, n + 1)]
        if rest < 0 and n > 1:
            n -= 1
            continue
        if rest > sum(caps) and n < n_max:
            n += 1
            continue
        _spread(lens, caps, max(0, min(rest, sum(caps))), rng)
        return lens
    return lens


def _spread(lens: list[int], caps: list[int], total: int, rng: random.Random) -> None:
    """Add ``total`` tokens to ``lens`` in random shares, no region above its cap (water-filling)."""
    room = [i for i, c in enumerate(caps) if c > 0]
    weights = {i: rng.expovariate(1.0) for i in room}
    while total > 0 and room:
        wsum = sum(weights[i] for i in room)
        given = 0
        for i in room:
            add = min(caps[i] - lens[i], int(total * weights[i] / wsum))
            lens[i] += add
            given += add
        if given == 0:  # the remainder is smaller than one share: hand it out a token at a time
            for i in room[:total]:
                lens[i] += 1
                given += 1
        total -= given
        room = [i for i in room if lens[i] < caps[i]]


def text_of_tokens(tokenizer, n: int, rng: random.Random) -> str:
    """English prose that ``tokenizer`` encodes to exactly ``n`` tokens."""
    text = paragraph(rng, "en", 4)
    ids = tokenizer.encode(text)
    while len(ids) < n:
        text += " " + paragraph(rng, "en", 4)
        ids = tokenizer.encode(text)
    text = tokenizer.decode(ids[:n]).strip()
    for _ in range(4 * n + 8):
        got = len(tokenizer.encode(text))
        if got == n:
            return text
        text = text[:-1] if got > n else text + " a"
    raise ValueError(f"could not make text of exactly {n} tokens with this tokenizer")


def _page(i: int, lens: list[int], proto, rng: random.Random, size: tuple[int, int],
          proc: AnyImageProcessor | None = None) -> tuple[str, Page, int]:
    w, h = size
    y, weight = 0.05, sum(max(c, 20) for c in lens)
    regions = []
    for k, c in enumerate(lens):
        y2 = y + 0.9 * max(c, 20) / weight
        box = Box(0.08, y, 0.92, y2)
        if c == 0:
            regions.append(Region("figure", box, None, "none"))
        else:
            cat = "title" if k == 0 and len(lens) > 2 and c < 40 else "text_block"
            regions.append(Region(cat, box, text_of_tokens(proto.tokenizer, c, rng), "text"))
        y = y2
    tokens = image_tokens(w, h) if proc is None else processor_image_tokens(w, h, proc)
    return f"paper384-{i:03d}", Page(width=w, height=h, regions=tuple(regions), page_no=i), tokens


def paper384(model_protocol, seed: int = 0, pages: int = PAPER_384["pages"],
             page_sizes: list[tuple[int, int]] | None = None,
             proc: AnyImageProcessor | None = None) -> list[tuple[str, Page, int]]:
    """``pages`` synthetic pages (name, protocol ``Page``, image tokens) matching the paper's workload,
    their token lengths in ``model_protocol``'s tokenizer and layout protocol; the same seed gives the
    same pages. Image sizes: :data:`PAGE_SIZES`, or each drawn from ``page_sizes`` ((width, height));
    image tokens: Qwen3-VL's processor's (:func:`image_tokens`), or ``proc``'s."""
    if pages < 4:
        raise ValueError("paper384 needs at least 4 pages (its statistics are quartiles)")
    rng = random.Random(seed)
    r = len(region_layout_tokens(model_protocol.vocab, Region("text_block", Box(0.1, 0.1, 0.9, 0.2), "x")))
    targets = _targets(pages, rng)
    size_rng = random.Random(f"sizes-{seed}")  # its own stream: the pages' content does not depend on their sizes
    if page_sizes:
        sizes = [size_rng.choice(list(page_sizes)) for _ in targets]
    else:
        sizes = [(w, h) for _, w, h, _ in size_rng.choices(PAGE_SIZES, weights=[s[3] for s in PAGE_SIZES],
                                                            k=len(targets))]
    return [_page(i, _content_lengths(fs, fp, r, rng), model_protocol, rng, size, proc)
            for i, ((fs, fp), size) in enumerate(zip(targets, sizes, strict=True))]


def runaway_page(page: Page, tokens: int, model_protocol, rng: random.Random) -> Page:
    """``page`` whose sequential stream is longer than ``tokens``: its last text region's content goes on
    with new prose (a page that runs away without repeating itself)."""
    vocab, tok = model_protocol.vocab, model_protocol.tokenizer
    last = max((i for i, r in enumerate(page.regions) if r.content_format == "text"), default=None)
    if last is None:
        raise ValueError("a page with no text region cannot run away in its content")
    have = len(serialize_sequential(vocab, tok, page))
    more = text_of_tokens(tok, max(64, tokens - have + 64), rng)
    regions = list(page.regions)
    regions[last] = replace(regions[last], content=f"{regions[last].content} {more}")
    out = replace(page, regions=tuple(regions))
    if len(serialize_sequential(vocab, tok, out)) <= tokens:
        raise ValueError(f"could not make a sequential stream of more than {tokens} tokens")
    return out


def paper384_traces(model_protocol, seed: int = 0, pages: int | None = None, *,
                    runaway: int = SEQUENTIAL_RUNAWAY_PAGES, max_tokens: int = 8192,
                    page_sizes: list[tuple[int, int]] | None = None, proc: AnyImageProcessor | None = None,
                    branch_shape: str = PREFIX_FORK) -> tuple[list[PageTrace], list[str]]:
    """The workload as engine-model traces (:func:`~.trace.trace_from_page`, fork branches prompted in
    ``branch_shape``) and the names of the pages whose sequential stream runs past ``max_tokens``
    (``runaway`` of the 384, scaled to ``pages`` when fewer are taken, chosen with ``seed``). Their fork
    traces are the page's own. ``proc``: as :func:`paper384`'s."""
    items = paper384(model_protocol, seed=seed, page_sizes=page_sizes, proc=proc)
    n = len(items) if pages is None else min(pages, len(items))
    rng = random.Random(f"runaway-{seed}")
    k = round(runaway * n / len(items))
    chosen = set(rng.sample(range(n), k))
    traces, names = [], []
    for i, (name, page, it) in enumerate(items[:n]):
        t = trace_from_page(model_protocol, name, page, it, branch_shape)
        if i in chosen:
            long = trace_from_page(model_protocol, name, runaway_page(page, max_tokens, model_protocol, rng), it)
            t = replace(t, sequential=long.sequential)
            names.append(name)
        traces.append(t)
    return traces, names


def workload_stats(pages: list[tuple[str, Page, int]], model_protocol) -> dict:
    """What the workload matches, computed from the pages as the project computes it: quartiles and
    mean of ``F_seq``, ``F_PaDoc`` and the step reduction (%), and the tokens a fork page generates
    (its layout stream plus every content branch with its end-of-stream)."""
    f_seq, f_padoc, red, out, img = [], [], [], [], []
    for _, page, tokens in pages:
        ll = [len(region_layout_tokens(model_protocol.vocab, r)) for r in page.regions]
        cl = [len(content_tokens(model_protocol.tokenizer, r)) for r in page.regions]
        d = decode_depth(ll, cl)
        f_seq.append(d.f_seq)
        f_padoc.append(d.f_padoc)
        red.append(100 * d.step_reduction)
        out.append(d.f_seq + sum(1 for r in page.regions if r.content_format != "none"))
        img.append(tokens)
    return {"pages": len(pages), "f_seq": _quartiles(f_seq), "f_padoc": _quartiles(f_padoc),
            "step_reduction_pct": _quartiles(red), "padoc_output_tokens_per_page": statistics.fmean(out),
            "image_tokens": _quartiles(img)}
