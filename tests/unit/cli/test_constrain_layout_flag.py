"""--constrain-layout reaches the scheduler config of every surface that takes it (argparse only, no engine)."""

from __future__ import annotations

import pytest

from padoc_ray.cli import build_parser
from padoc_ray.cli.parse import _scheduler_cfg

PARSE = ["parse", "--input", "in", "--output", "out", "--model", "m"]
SERVE = ["serve", "--model", "m"]
PAGE = ["parse-page", "x.pdf", "--model", "m"]
REPLAY = ["bench", "replay", "--gt", "g.json", "--images", "i", "--model", "m", "--out", "o"]
HTTP = ["bench", "http"]


@pytest.mark.parametrize("argv", [PARSE, SERVE, PAGE, REPLAY, HTTP, ["demo"]], ids=lambda a: " ".join(a[:2]))
def test_the_flag_is_accepted_and_off_by_default(argv):
    p = build_parser()
    assert p.parse_args(argv).constrain_layout is False
    assert p.parse_args([*argv, "--constrain-layout"]).constrain_layout is True


@pytest.mark.parametrize("on", [False, True])
def test_the_flag_reaches_the_scheduler_config(on):
    from padoc_ray.cli.batch import config_from_args as batch_config
    from padoc_ray.cli.serve import config_from_args as serve_config

    p = build_parser()
    flag = ["--constrain-layout"] if on else []
    assert batch_config(p.parse_args([*PARSE, *flag])).engines.host.scheduler.constrain_layout is on
    assert serve_config(p.parse_args([*SERVE, *flag])).host.scheduler.constrain_layout is on
    assert _scheduler_cfg(p.parse_args([*PAGE, "--max-branches", "7", *flag])).constrain_layout is on


def test_a_serve_config_file_can_turn_it_on():
    from padoc_ray.serve.config import ServeConfig

    cfg = ServeConfig.from_args({"model": "m", "host": {"scheduler": {"constrain_layout": True, "max_branches": 9}}})
    assert cfg.host.scheduler.constrain_layout and cfg.host.scheduler.max_branches == 9
