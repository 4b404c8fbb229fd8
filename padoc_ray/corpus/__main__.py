"""``python -m padoc_ray.corpus ...``: the corpus commands without the main ``padoc-ray`` CLI."""

import argparse
import sys

from .cli import register


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="padoc-ray")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    register(sub)
    args = parser.parse_args(["corpus", *(sys.argv[1:] if argv is None else argv)])
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
