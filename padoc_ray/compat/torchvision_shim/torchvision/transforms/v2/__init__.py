"""Stand-in for ``torchvision.transforms.v2``: only the ``functional`` module (no transform classes)."""

from . import functional
from .functional import InterpolationMode

__all__ = ["InterpolationMode", "functional"]


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    raise AttributeError(
        f"torchvision stand-in (padoc-ray CPU profile) does not implement torchvision.transforms.v2.{name}; "
        "only the functional helpers used by transformers' Qwen-VL processors exist. "
        "Install a working torchvision to use it."
    )
