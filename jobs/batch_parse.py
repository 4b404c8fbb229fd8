"""Ray job entry point of the batch pipeline.

    ray job submit --address http://127.0.0.1:8265 --working-dir . -- \
        python jobs/batch_parse.py --input s3://bucket/pdfs --output s3://bucket/out --model s3://bucket/model

Same flags as ``padoc-ray parse`` (run ``python jobs/batch_parse.py --help``).
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the working dir's package

from padoc_ray.pipeline.cli_args import DESCRIPTION, add_batch_args, run_from_args  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="batch_parse.py", description=DESCRIPTION)
    add_batch_args(p)
    return run_from_args(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
