"""Stand-in for ``torchvision.transforms``: only ``InterpolationMode`` and the ``functional`` / ``v2`` modules."""

from . import functional, v2
from .functional import InterpolationMode

__all__ = ["InterpolationMode", "functional", "v2"]


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    raise AttributeError(
        f"torchvision stand-in (padoc-ray CPU profile) does not implement torchvision.transforms.{name}; "
        "only InterpolationMode and the functional helpers used by transformers' Qwen-VL processors exist. "
        "Install a working torchvision to use it."
    )
