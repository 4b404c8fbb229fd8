"""``show``: draw one parsed page of an output (:mod:`padoc_ray.output.show`)."""

from __future__ import annotations

import os

from padoc_ray.cli.common import add_command, die


def cmd_show(args) -> int:
    from padoc_ray.output.show import ShowError, show_page
    from padoc_ray.cli.flags import from_args
    from padoc_ray.storage import StorageConfig

    if args.gt and not os.path.exists(args.gt):
        die(f"ground truth {args.gt} not found")
    try:
        info = show_page(args.output, args.doc, args.page, args.out, gt=args.gt,
                         storage=from_args(StorageConfig, args))
    except ShowError as e:
        die(str(e))
    extra = f", ground truth {info['truth']} regions" if info["truth"] is not None else ""
    print(f"{info['out']}: doc {info['doc_id'][:12]} page {info['page_index']} ({info['status']}), "
          f"{info['predicted']} predicted regions{extra}")
    return 0



def register(sub) -> None:
    from padoc_ray.cli.flags import add_fields
    from padoc_ray.storage import StorageConfig

    sh = add_command(sub, "show", help="draw a parsed page with its predicted boxes (and the ground truth)",
                        description="Re-render one page of a batch output and draw its predicted regions, coloured by "
                                    "category and numbered in reading order; with --gt, the ground truth beside it.")
    sh.add_argument("output", help="the batch job's --output (local folder or s3://)")
    sh.add_argument("--doc", required=True, help="doc_id, a unique prefix of one, or the source file name")
    sh.add_argument("--page", type=int, required=True, help="0-based page index")
    sh.add_argument("--out", required=True, help="PNG to write")
    sh.add_argument("--gt", default=None, help="OmniDocBench-format ground truth to draw beside the prediction")
    add_fields(sh, StorageConfig, ("endpoint",))
    sh.set_defaults(func=cmd_show)
