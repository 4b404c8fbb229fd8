"""The pure loop detectors (scheduler/loops.py) and their false-positive measurement (bench/loops.py)."""

import os
import random

import pytest

from padoc_ray.bench import loops as bench_loops
from padoc_ray.bench.loops import DEMO_GT, SHARED_GT, corpus_pages, measure, omnidocbench_pages, step_cost
from padoc_ray.protocol import serialize_padoc, serialize_sequential
from padoc_ray.scheduler.loops import (
    REPEATED_REGION,
    STALLED_LAYOUT,
    TOKEN_LOOP,
    LayoutLoopConfig,
    LayoutLoopDetector,
    LoopConfig,
    LoopDetector,
    RegionLoopDetector,
    StreamLoopGuard,
    box_iou,
)
from padoc_ray.scheduler.state import is_periodic

from tests.helpers import components

CFG = LoopConfig()


def normal(k: int, seed: int = 0) -> list[int]:
    """Tokens that never repeat themselves (drawn from a large vocabulary)."""
    rng = random.Random(seed)
    return [rng.randrange(1000, 60_000) for _ in range(k)]


def digits(v: int) -> list[int]:
    return [10 + int(c) for c in str(v)]  # one token per digit, as Qwen's tokenizer splits numbers


def fed_until_hit(ids, cfg=CFG) -> LoopDetector:
    d = LoopDetector(cfg)
    d.feed(ids)
    return d


# ---- token loops ---------------------------------------------------------------------------------
@pytest.mark.parametrize("period", [1, 2, 4, 7, 16])
def test_exact_short_period_is_caught_within_the_window(period):
    unit = normal(period, seed=period)
    d = fed_until_hit(unit * (2000 // period))
    assert d.reason == TOKEN_LOOP and d.period == period
    assert d.fed == CFG.latency(period) <= 512  # no later than is_periodic could (512 tokens of loop)


def test_everything_is_periodic_catches_is_caught_no_later():
    for period in range(1, 17):
        ids = normal(period, seed=100 + period) * (600 // period + 1)
        assert is_periodic(ids[:512], 16)
        d = fed_until_hit(ids[:512])
        assert d.looping, period


def test_long_period_table_row_is_caught_on_its_third_copy():
    row = normal(200, seed=1)
    d = fed_until_hit(row * 10)
    assert d.reason == TOKEN_LOOP and d.period == 200
    assert d.fed == CFG.latency(200) == 2 * 200 + CFG.n  # just into the third copy


def test_up_to_max_period():
    row = normal(CFG.max_period, seed=2)
    assert fed_until_hit(row * 4).period == CFG.max_period
    assert not fed_until_hit(normal(CFG.max_period + 1, seed=3) * 4).looping  # longer: not a loop to it


def test_near_repetition_with_an_incrementing_number_is_caught():
    a, b = normal(20, seed=4), normal(25, seed=5)
    ids = [t for i in range(1, 200) for t in (a + digits(i) + b)]  # "<tr><td>i</td>...": number increments
    d = fed_until_hit(ids)
    assert d.reason == TOKEN_LOOP and 40 <= d.period <= 50
    assert d.fed <= 512


def test_a_loop_after_1000_normal_tokens_is_caught_within_one_window_of_starting():
    for period in (3, 12, 60, 200):
        prefix = normal(1000, seed=6)
        d = fed_until_hit(prefix + normal(period, seed=7 + period) * (2000 // period))
        assert d.looping and d.period == period
        assert d.fed - 1000 == CFG.latency(period)
        assert d.fed - 1000 <= max(512, 2 * period + CFG.n)


def test_normal_tokens_never_trip():
    d = fed_until_hit(normal(20_000, seed=8))
    assert not d.looping and d.fed == 20_000 and d.peak < CFG.window


def test_a_short_exact_run_in_real_content_is_no_loop():
    """Dot leaders, a blank table row, a zero matrix: exact, but shorter than min_span."""
    text = normal(300, seed=9) + [5] * 100 + normal(300, seed=10) + [1, 2, 3] * 60 + normal(300, seed=11)
    assert not fed_until_hit(text).looping


def test_a_twice_repeated_paragraph_is_no_loop():
    para = normal(300, seed=12)
    assert not fed_until_hit(normal(100, seed=13) + para + para + normal(300, seed=14)).looping


def test_sparse_recurrences_are_no_loop():
    """Table markup recurs on every row, but the cells between differ: breaks longer than max_break."""
    markup = normal(12, seed=15)
    ids = [t for i in range(300) for t in (markup + normal(CFG.max_break, seed=1000 + i))]
    assert not fed_until_hit(ids).looping


def test_decisions_do_not_depend_on_chunking():
    rng = random.Random(16)
    streams = [
        normal(700, seed=17) + normal(9, seed=18) * 80,
        normal(300, seed=19) + [t for i in range(100) for t in normal(30, seed=20) + digits(i)],
        normal(3000, seed=21),
        normal(50, seed=22) + normal(250, seed=23) * 5,
    ]
    for ids in streams:
        one = LoopDetector()
        for t in ids:
            one.feed([t])
        whole = fed_until_hit(ids)
        for _ in range(5):
            d, i = LoopDetector(), 0
            while i < len(ids):
                k = rng.choice([1, 2, 3, 7, 16, 64, 500])
                d.feed(ids[i:i + k])
                i += k
            assert (d.hit, d.fed, d.peak) == (whole.hit, whole.fed, whole.peak) == (one.hit, one.fed, one.peak)
        d = LoopDetector()
        d.feed(iter(ids))  # any iterable
        assert d.hit == whole.hit


def test_the_hit_sticks():
    d = LoopDetector()
    assert d.feed([7] * 1000)
    at = d.fed
    assert d.feed(normal(100)) and d.fed == at


def test_memory_stays_bounded():
    d = fed_until_hit(normal(50_000, seed=24))
    assert len(d._const[2]) <= CFG.max_period + 1  # the n-gram dict


@pytest.mark.parametrize("kw", [dict(n=1), dict(n=65), dict(count=1), dict(max_period=5), dict(window=0),
                                dict(max_break=-1), dict(max_break=160), dict(min_span=-1)])
def test_loop_config_rejects_nonsense(kw):
    with pytest.raises(ValueError):
        LoopConfig(**kw)


@pytest.mark.parametrize("kw", [dict(repeats=1), dict(box_tolerance=-1), dict(stalled=0), dict(overlap=0.0),
                                dict(overlap=1.5), dict(history=0), dict(repeats=10, history=5)])
def test_layout_config_rejects_nonsense(kw):
    with pytest.raises(ValueError):
        LayoutLoopConfig(**kw)


# ---- the layout stream ---------------------------------------------------------------------------
def test_box_iou():
    assert box_iou((0, 0, 9, 9), (0, 0, 9, 9)) == 1.0
    assert box_iou((0, 0, 9, 9), (10, 0, 19, 9)) == 0.0
    assert box_iou((0, 0, 9, 9), (5, 0, 14, 9)) == pytest.approx(50 / 150)


def test_repeated_identical_regions_are_caught():
    d = RegionLoopDetector()
    assert not d.feed_region("title", (10, 10, 500, 40))
    assert not d.feed_region("text_block", (10, 50, 500, 300))
    assert not d.feed_region("text_block", (10, 50, 500, 300))
    assert d.feed_region("text_block", (10, 50, 500, 300))
    assert d.hit.reason == REPEATED_REGION and d.hit.period == 1


def test_a_cycle_of_regions_is_caught():
    d = RegionLoopDetector()
    cycle = [("text_block", (10, 50 + 40 * k, 500, 80 + 40 * k)) for k in range(3)]
    hits = [d.feed_region(c, b) for _ in range(3) for c, b in cycle]
    assert hits.index(True) < 9 and d.hit.reason in (REPEATED_REGION, STALLED_LAYOUT)


def test_jittered_boxes_that_stay_put_are_caught():
    d = RegionLoopDetector()
    rng = random.Random(25)
    assert not d.feed_region("title", (10, 10, 500, 40))
    for _ in range(10):
        if d.feed_region("text_block", (100 + rng.randint(-3, 3), 200 + rng.randint(-3, 3), 600, 400)):
            break
    assert d.hit is not None and d.regions <= 2 + LayoutLoopConfig().stalled


def test_equal_height_lines_in_reading_order_are_no_loop():
    d = RegionLoopDetector()
    for col in (0, 500):  # two columns of list items, then a return to the top
        for k in range(40):
            assert not d.feed_region("text_block", (col + 20, 20 + 24 * k, col + 480, 40 + 24 * k))


def test_layout_detector_reads_tokens(model_protocol):
    from padoc_ray.protocol import Box, Page, Region

    v = model_protocol.vocab
    r = Region(category="text_block", box=Box(0.1, 0.1, 0.9, 0.2), content="x", content_format="text")
    layout = serialize_padoc(v, model_protocol.tokenizer, Page(width=100, height=100, regions=(r,) * 5)).layout
    d = LayoutLoopDetector(v)
    assert d.feed(layout) and d.reason == REPEATED_REGION and d.hit.position == 3 * 7
    g = StreamLoopGuard(vocab=v)
    assert g.feed(layout) and g.hit.reason == REPEATED_REGION


# ---- real pages ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def real_pages(model_protocol):
    pages = omnidocbench_pages(DEMO_GT, model_protocol.spec, "demo")
    if os.path.exists(SHARED_GT):
        pages += omnidocbench_pages(SHARED_GT, model_protocol.spec, "omnidocbench_demo")
    return pages + corpus_pages(model_protocol.spec, seeds=[0], pages_per_run=2, profiles=("mixed", "report"))


def test_the_real_pages_include_the_shared_omnidocbench_demo(model_protocol, real_pages):
    """The real-page checks run on the shared OmniDocBench demo pages too where ../shared is there; where
    it is not, they check less, and this test says so (a skip; a failure on CI)."""
    components.shared_file(SHARED_GT, "the shared OmniDocBench demo ground truth (pages for the loop checks)")
    want = [name for name, _ in omnidocbench_pages(SHARED_GT, model_protocol.spec, "omnidocbench_demo")]
    assert want and [name for name, _ in real_pages if name.startswith("omnidocbench_demo:")] == want


def test_real_pages_never_trip(model_protocol, real_pages):
    """Every stream of every page, as replay forces it, through fresh detectors: 0 stops."""
    rep = measure(real_pages, model_protocol.vocab, model_protocol.tokenizer)
    assert rep.pages == len(real_pages) >= 9
    assert rep.kinds["branch"].streams > 5 * rep.pages and rep.tokens > 10_000
    assert rep.stops == 0, rep.hits
    assert max(k.peak for k in rep.kinds.values()) < CFG.window


def test_real_pages_never_trip_in_the_other_families_streams(real_pages, tiny_hpd_dir, tiny_dots_dir):
    """The same pages as HPD-Parsing's text blocks and as dots.ocr's JSON layout, grounding answers and single
    request (each family's own serializers and BPE tokenizer, as `bench loops --model` runs them; hpd has no
    sequential stream): 0 stops. JSON's repeated cell shape (``{"bbox": [...], "category": ...}``) is no loop."""
    from padoc_ray.tokenizer import ModelProtocol

    for proto in (ModelProtocol(tiny_hpd_dir), ModelProtocol(tiny_dots_dir)):
        has_seq = "sequential" in proto.modes
        rep = measure(real_pages, proto.vocab, proto.tokenizer, sequential=has_seq)
        assert rep.pages == len(real_pages) and rep.kinds["layout"].streams == rep.pages
        assert rep.kinds["branch"].streams > 5 * rep.pages
        assert rep.kinds["sequential"].streams == (rep.pages if has_seq else 0)
        assert rep.stops == 0, (proto.family, rep.hits)


def test_real_layouts_never_trip_and_a_looping_one_does(model_protocol, real_pages):
    v, tok = model_protocol.vocab, model_protocol.tokenizer
    for _, page in real_pages:
        layout = serialize_padoc(v, tok, page).layout
        assert not LayoutLoopDetector(v).feed(layout)
        assert not LayoutLoopDetector(v, sequential=True).feed(serialize_sequential(v, tok, page))
    # a layout that, after its real regions, emits its last region again and again
    layout = list(serialize_padoc(v, tok, real_pages[0][1]).layout[:-1])
    last = layout[-7:]
    d = LayoutLoopDetector(v)
    assert d.feed(layout + last * 3) and d.reason == REPEATED_REGION


def test_a_real_branch_that_starts_looping_is_caught(model_protocol, real_pages):
    tok = model_protocol.tokenizer
    text = tok.encode(" ".join(r.content or "" for _, p in real_pages[:3] for r in p.regions))[:1500]
    phrase = tok.encode(" and the results are shown in the table below")
    d = fed_until_hit(text + phrase * 100)
    assert d.looping and d.period == len(phrase) and d.fed - len(text) <= 512


class _Work:
    """A clock that reads the work done, not the time: every token fed to a loop detector is 1 us."""

    def __init__(self, monkeypatch):
        self.tokens = 0
        work = self

        class Counting(LoopDetector):
            def feed(self, token_ids):
                token_ids = list(token_ids)
                work.tokens += len(token_ids)
                return super().feed(token_ids)

        monkeypatch.setattr(bench_loops, "LoopDetector", Counting)

    def __call__(self) -> float:
        return self.tokens * 1e-6


def test_step_cost_is_per_step_and_per_token_and_counts_the_detectors_that_trip(model_protocol, real_pages,
                                                                                  monkeypatch):
    """bench loops --cost: on a clock that reads 1 us per token fed, a step of 32 live streams costs 32 us
    however many steps are timed (a figure per step, not per run), 1 us per token whether the tokens come
    one a step or in 16-token deltas, and a share of the 20 ms CPU step; real text trips no detector while
    timed, a looping text trips all of them. On the real clock the figure is positive."""
    streams = [b[1:] for _, p in real_pages for b in serialize_padoc(model_protocol.vocab, model_protocol.tokenizer,
                                                                     p).branches]
    c = step_cost(streams, n_streams=32, steps=200)
    assert c["streams"] == 32 and c["us_per_step"] > 0 and c["tripped_while_timing"] == 0
    work = _Work(monkeypatch)
    for steps in (200, 400):
        c = step_cost(streams, n_streams=32, steps=steps, clock=work)
        assert (c["streams"], c["steps"], c["repeat"]) == (32, steps, 3)
        assert c["us_per_step"] == c["median_us_per_step"] == 32.0
        assert c["us_per_token"] == c["us_per_token_in_16_token_deltas"] == 1.0
        assert c["share_of_cpu_step"] == 0.0016 and c["tripped_while_timing"] == 0
    assert work.tokens == 3 * 2 * 32 * (200 + 400)  # best of 3 runs, one token a step and in deltas
    c = step_cost([[1000, 1001, 1002, 1003] * 400], n_streams=8, steps=400, clock=work)  # past min_span 256
    assert c["tripped_while_timing"] == 8 and c["us_per_step"] == 8.0


def test_layout_decisions_do_not_depend_on_chunking(model_protocol, real_pages):
    v = model_protocol.vocab
    layout = list(serialize_padoc(v, model_protocol.tokenizer, real_pages[1][1]).layout[:-1])
    layout += layout[-14:] * 3
    whole = LayoutLoopDetector(v)
    assert whole.feed(layout)
    for k in (1, 3, 7, 50):
        d = LayoutLoopDetector(v)
        for i in range(0, len(layout), k):
            d.feed(layout[i:i + k])
        assert d.hit == whole.hit


def test_real_layouts_keep_a_margin(model_protocol, real_pages):
    rep = measure(real_pages, model_protocol.vocab, model_protocol.tokenizer)
    lay = rep.kinds["layout"]
    assert lay.peak_repeats < LayoutLoopConfig().repeats and lay.peak_stalled < LayoutLoopConfig().stalled


def test_real_looking_tables_through_the_tokenizer(model_protocol):
    tok = model_protocol.tokenizer
    rng = random.Random(26)
    words = ("apple bridge candle desert engine forest garden harbor island jacket kettle ladder meadow needle "
             "orange pencil quarry rabbit saddle tunnel umbrella valley wagon yellow zebra anchor basket castle "
             "dragon eagle falcon glacier hammer igloo jungle kitten lemon mirror number ocean parrot quiet "
             "river silver tiger uniform violet window yogurt zipper almond bottle carpet dolphin elbow fabric "
             "goblet helmet insect jigsaw koala lantern magnet nectar oyster pepper quill rocket sandal tomato "
             "unicorn velvet walnut yarrow blossom cactus dinner ember feather ginger hollow ivory jasmine "
             "kernel lizard marble nutmeg oxygen prairie quartz").split()
    assert len(set(words)) >= 90
    rng.shuffle(words)  # every row label: three words no other label has
    numeric = "<table>" + "".join("<tr>" + "".join(f"<td>{rng.uniform(0, 100):.2f}</td>" for _ in range(5))
                                  + "</tr>\n" for _ in range(60)) + "</table>"
    worksheet = "<table>" + "".join(f"<tr><td>{' '.join(words[3 * r:3 * r + 3])}</td>"
                                    + "<td></td>" * 8 + "</tr>\n" for r in range(30)) + "</table>"
    toc = "".join(f"Chapter {i} Results " + "." * rng.randint(20, 60) + f" {i * 7}\n" for i in range(1, 40))
    for text in (numeric, worksheet, toc):
        assert not fed_until_hit(tok.encode(text)).looping
    looping = "<table>" + "".join(f"<tr><td>{i}</td><td>Total revenue</td><td>0.00</td><td>0.00</td></tr>\n"
                                  for i in range(95, 200)) + "</table>"  # 99 -> 100 on the way
    d = fed_until_hit(tok.encode(looping))
    assert d.looping and d.fed <= 512


def test_a_sequential_stream_whose_content_loops_is_caught(model_protocol, real_pages):
    v, tok = model_protocol.vocab, model_protocol.tokenizer
    seq = list(serialize_sequential(v, tok, real_pages[0][1])[:-1])
    g = StreamLoopGuard(vocab=v, sequential=True)
    assert not g.feed(seq)
    assert g.feed(tok.encode(" the same words again") * 60) and g.hit.reason == TOKEN_LOOP


def test_the_script_reports_its_figures(tiny_model_dir, tmp_path, capsys):
    import json

    from padoc_ray.cli import main

    out = tmp_path / "loops.json"
    assert main(["bench", "loops", "--model", tiny_model_dir, "--seeds", "0", "--cost", "--streams", "8", "--steps",
                 "100", "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    fp = res["false_positives"]
    assert fp["stops"] == 0 and fp["pages"] >= 5 and fp["streams"] > fp["pages"] and fp["false_positive_rate"] == 0
    assert res["cost"]["streams"] == 8 and res["cost"]["us_per_step"] > 0
    assert "false-positive rate" in capsys.readouterr().out
