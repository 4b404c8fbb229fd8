"""Stand-in for ``torchvision.transforms``: ``InterpolationMode``, the ``functional`` / ``v2`` modules,
and the classes vLLM's InternVL processor composes (``Compose``, ``Lambda``, ``Resize``, ``ToTensor``,
``Normalize``; :mod:`.transforms`)."""

from . import functional, transforms, v2
from .functional import InterpolationMode
from .transforms import Compose, Lambda, Normalize, Resize, ToTensor

__all__ = ["Compose", "InterpolationMode", "Lambda", "Normalize", "Resize", "ToTensor", "functional", "transforms",
           "v2"]


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    raise AttributeError(
        f"torchvision stand-in (padoc-ray CPU profile) does not implement torchvision.transforms.{name}; "
        f"it only provides {', '.join(__all__)} (what transformers' Qwen-VL processors and vLLM's InternVL "
        "processor use). Install a working torchvision to use it."
    )
