"""Benchmarks inject loops into teacher-forced branches (``--inject-loops FRACTION --seed N``): the
choice is the seed's, per page and branch, and a chosen branch's first attempt repeats a phrase while
its later attempts replay the truth."""

from __future__ import annotations

import pytest

from padoc_ray.host import HostConfig
from padoc_ray.scheduler import PageInput
from padoc_ray.scheduler.replay import LOOP_PHRASE, inject_loops, injected_branches


class _Tok:
    def encode(self, text):
        return [ord(c) for c in text]


class _Protocol:
    tokenizer = _Tok()


def _inp(n: int) -> PageInput:
    # branch 1 is contentless (its trace is its end token alone): never chosen
    traces = [[7, 8, 9, 0] if k != 1 else [0] for k in range(n)]
    return PageInput(page_id="p:0", image=None, width=10, height=10, forced_main=[1, 2], forced_branches=traces)


def test_the_same_seed_picks_the_same_branches_and_the_fraction_holds():
    a = injected_branches(10_000, 0.1, seed=3, key="doc.pdf:0")
    assert a == injected_branches(10_000, 0.1, seed=3, key="doc.pdf:0")
    assert a != injected_branches(10_000, 0.1, seed=4, key="doc.pdf:0")
    assert a != injected_branches(10_000, 0.1, seed=3, key="doc.pdf:1")
    assert 800 < len(a) < 1200  # ~10% of the branches
    assert injected_branches(50, 0.0, seed=3, key="k") == [] and len(injected_branches(50, 1.0, 3, "k")) == 50


def test_a_chosen_branch_first_repeats_the_phrase_then_replays_the_truth():
    inp = inject_loops(_Protocol(), _inp(6), fraction=1.0, seed=0, key="doc.pdf:0", max_tokens=100)
    assert sorted(inp.forced_first_attempt) == [0, 2, 3, 4, 5]  # every branch with content
    loop = inp.forced_first_attempt[0]
    assert len(loop) == 100 and "".join(map(chr, loop)).startswith(LOOP_PHRASE * 2)
    assert inp.forced_branches == _inp(6).forced_branches  # the truth, for every later attempt
    assert inject_loops(_Protocol(), _inp(6), fraction=0.0, seed=0, key="k", max_tokens=100).forced_first_attempt \
        is None


def test_the_host_config_takes_a_fraction():
    assert HostConfig(inject_loops=0.1).inject_loops == 0.1
    with pytest.raises(ValueError, match="fraction"):
        HostConfig(inject_loops=1.5)
