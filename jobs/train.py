"""Ray job entry point of training.

    ray job submit --address http://127.0.0.1:8265 --working-dir . -- \
        python jobs/train.py --model models/tiny --gt corpus/gt.json --images corpus/images \
            --steps 300 --workers 2 --out out/train

Same flags as ``padoc-ray train`` (run ``python jobs/train.py --help``).
"""

import argparse
import logging
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the working dir's package

from padoc_ray.trainer.cli import DESCRIPTION, add_train_args, run_from_args  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="train.py", description=DESCRIPTION)
    add_train_args(p)
    p.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return run_from_args(args)


if __name__ == "__main__":
    sys.exit(main())
