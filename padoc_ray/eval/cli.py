"""`padoc-ray eval ...`: the evaluation command group (layout, e2e)."""

from __future__ import annotations


def add_parser(sub) -> None:
    from padoc_ray.eval import e2e_cli, layout_cli

    ev = sub.add_parser("eval", help="evaluate predictions against OmniDocBench-format ground truth",
                        description="Evaluate parser output. `layout`: PageIoU (paper App. B). "
                                    "`e2e`: OmniDocBench v1.6 end-to-end metrics.")
    esub = ev.add_subparsers(dest="eval_command", metavar="EVAL")
    layout_cli.add_parser(esub)
    e2e_cli.add_parser(esub)
