"""Ray job entry point of offline corpus re-annotation.

    ray job submit --address http://127.0.0.1:8265 --working-dir . -- \
        python jobs/reannotate.py --gt s3://b/corpus/gt.json --source s3://b/corpus/pdfs \
            --output s3://b/reannotation --model s3://b/model --modes fork,sequential

Same flags as ``padoc-ray reannotate`` (run ``python jobs/reannotate.py --help``).
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the working dir's package

from padoc_ray.cli.batch import REANNOTATE_DESCRIPTION, add_reannotate_args, reannotate_from_args  # noqa: E402
from padoc_ray.cli.common import job_main  # noqa: E402


def main(argv=None) -> int:
    return job_main("reannotate.py", REANNOTATE_DESCRIPTION, add_reannotate_args, reannotate_from_args, argv)


if __name__ == "__main__":
    sys.exit(main())
