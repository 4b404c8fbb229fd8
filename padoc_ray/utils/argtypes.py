"""argparse value types shared by the commands (pure)."""

from __future__ import annotations

import argparse


def positive(kind):
    """``type=positive(int)`` / ``positive(float)``: a number > 0, or a usage error that says so."""

    def parse(text: str):
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a positive {kind.__name__}, got {text!r}") from None
        if not v > 0:
            raise argparse.ArgumentTypeError(f"expected a positive {kind.__name__}, got {text!r}")
        return v

    return parse
