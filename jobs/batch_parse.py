"""Ray job entry point of the batch pipeline.

    ray job submit --address http://127.0.0.1:8265 --working-dir . -- \
        python jobs/batch_parse.py --input s3://bucket/pdfs --output s3://bucket/out --model s3://bucket/model

Same flags as ``padoc-ray parse`` (run ``python jobs/batch_parse.py --help``).
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the working dir's package

from padoc_ray.cli.batch import DESCRIPTION, add_batch_args, run_from_args  # noqa: E402
from padoc_ray.cli.common import job_main  # noqa: E402


def main(argv=None) -> int:
    return job_main("batch_parse.py", DESCRIPTION, add_batch_args, run_from_args, argv)


if __name__ == "__main__":
    sys.exit(main())
