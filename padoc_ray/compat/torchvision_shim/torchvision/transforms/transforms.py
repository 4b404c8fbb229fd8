"""The ``torchvision.transforms`` classes that vLLM's InternVL processor builds its pipeline from.

vLLM's ``transformers_utils/processors/internvl.py`` (``build_transform``) composes, per 448-pixel tile::

    Compose([Lambda(to RGB), Resize((448, 448), interpolation=BICUBIC), ToTensor(), Normalize(mean, std)])

These classes follow torchvision's (v1) ones: each is a thin wrapper over the stand-in's
:mod:`.functional` kernels, which give PIL inputs to Pillow itself (``Resize`` of a PIL image is
``PIL.Image.resize`` with the mode's filter, as in the real torchvision), and tensors to torch.
``Resize`` and ``Normalize`` are ``torch.nn.Module``s, as there.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Sequence
from typing import Any

import torch

from . import functional as F
from .functional import InterpolationMode

__all__ = ["Compose", "Lambda", "Normalize", "Resize", "ToTensor"]


class Compose:
    """Apply ``transforms`` in order."""

    def __init__(self, transforms: Sequence[Callable[[Any], Any]]) -> None:
        self.transforms = transforms

    def __call__(self, img: Any) -> Any:
        for t in self.transforms:
            img = t(img)
        return img

    def __repr__(self) -> str:
        body = "".join(f"\n    {t}" for t in self.transforms)
        return f"{self.__class__.__name__}({body}\n)"


class Lambda:
    """Apply a user function (``lambd``) as a transform."""

    def __init__(self, lambd: Callable[[Any], Any]) -> None:
        if not callable(lambd):
            raise TypeError(f"Argument lambd should be callable, got {type(lambd).__name__!r}")
        self.lambd = lambd

    def __call__(self, img: Any) -> Any:
        return self.lambd(img)

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}()"


class Resize(torch.nn.Module):
    """Resize to ``size``: ``(h, w)``, or an int / 1-sequence for the shorter edge (aspect kept,
    the longer edge capped at ``max_size``). An int ``interpolation`` is a PIL filter code."""

    def __init__(self, size: int | Sequence[int], interpolation: InterpolationMode | int = InterpolationMode.BILINEAR,
                 max_size: int | None = None, antialias: bool | None = True) -> None:
        super().__init__()
        if not isinstance(size, (numbers.Integral, Sequence)) or isinstance(size, str):
            raise TypeError(f"Size should be int or sequence. Got {type(size)}")
        if isinstance(size, Sequence) and len(size) not in (1, 2):
            raise ValueError("If size is a sequence, it should have 1 or 2 values")
        self.size = size
        self.max_size = max_size
        self.interpolation = F._as_mode(interpolation)
        self.antialias = antialias

    def forward(self, img: Any) -> Any:
        return F.resize(img, self.size, self.interpolation, self.max_size, self.antialias)

    def __repr__(self) -> str:
        return (f"{self.__class__.__name__}(size={self.size}, interpolation={self.interpolation.value}, "
                f"max_size={self.max_size}, antialias={self.antialias})")


class ToTensor:
    """PIL image or ``HWC`` ndarray -> ``(C, H, W)`` tensor; 8-bit data is scaled to float [0, 1]."""

    def __call__(self, pic: Any) -> torch.Tensor:
        return F.to_tensor(pic)

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}()"


class Normalize(torch.nn.Module):
    """``(x - mean) / std`` per channel of a float ``(..., C, H, W)`` tensor."""

    def __init__(self, mean: Sequence[float], std: Sequence[float], inplace: bool = False) -> None:
        super().__init__()
        self.mean = mean
        self.std = std
        self.inplace = inplace

    def forward(self, tensor: torch.Tensor) -> torch.Tensor:
        return F.normalize(tensor, self.mean, self.std, self.inplace)

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}(mean={self.mean}, std={self.std})"
