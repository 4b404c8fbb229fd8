"""Ray job entry point of training.

    ray job submit --address http://127.0.0.1:8265 --working-dir . -- \
        python jobs/train.py --model models/tiny --gt corpus/gt.json --images corpus/images \
            --steps 300 --workers 2 --out out/train

Same flags as ``padoc-ray train`` (run ``python jobs/train.py --help``).
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the working dir's package

from padoc_ray.cli.train import DESCRIPTION, add_train_args, run_from_args  # noqa: E402
from padoc_ray.cli.common import job_main  # noqa: E402


def main(argv=None) -> int:
    return job_main("train.py", DESCRIPTION, add_train_args, run_from_args, argv)


if __name__ == "__main__":
    sys.exit(main())
