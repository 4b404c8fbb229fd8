"""The subset of ``torchvision.transforms(.v2).functional`` that transformers' Qwen-VL processors use.

Tensors are ``(..., C, H, W)`` like in torchvision. Semantics follow torchvision's v2 kernels on CPU,
except that antialiased BILINEAR/BICUBIC resizes of CPU uint8 tensors (and BOX/HAMMING/LANCZOS) use
Pillow's resampler per channel plane: bit-exact with transformers' PIL backend.
"""

from __future__ import annotations

import enum
import numbers
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

try:  # Pillow is a transformers "vision" requirement; keep the tensor paths usable without it.
    import PIL.Image as _PILImage
except ImportError:  # pragma: no cover
    _PILImage = None

__all__ = [
    "InterpolationMode",
    "center_crop",
    "crop",
    "grayscale_to_rgb",
    "normalize",
    "pad",
    "pil_to_tensor",
    "resize",
    "to_pil_image",
    "to_tensor",
]


class InterpolationMode(enum.Enum):
    """Interpolation modes, with torchvision's values."""

    NEAREST = "nearest"
    NEAREST_EXACT = "nearest-exact"
    BILINEAR = "bilinear"
    BICUBIC = "bicubic"
    BOX = "box"
    HAMMING = "hamming"
    LANCZOS = "lanczos"


# PIL resampling codes (what ``int`` interpolation arguments mean in torchvision).
_INT_TO_MODE = {
    0: InterpolationMode.NEAREST,
    1: InterpolationMode.LANCZOS,
    2: InterpolationMode.BILINEAR,
    3: InterpolationMode.BICUBIC,
    4: InterpolationMode.BOX,
    5: InterpolationMode.HAMMING,
}
_MODE_TO_PIL = {mode: code for code, mode in _INT_TO_MODE.items()}
_MODE_TO_PIL[InterpolationMode.NEAREST_EXACT] = 0


def _is_pil(obj: Any) -> bool:
    return _PILImage is not None and isinstance(obj, _PILImage.Image)


def _check_tensor(obj: Any, fn: str) -> None:
    if not isinstance(obj, torch.Tensor):
        raise TypeError(f"torchvision stand-in: {fn}() supports torch.Tensor (and PIL images) only, got {type(obj)}")


def _as_mode(interpolation: InterpolationMode | int) -> InterpolationMode:
    if isinstance(interpolation, InterpolationMode):
        return interpolation
    if isinstance(interpolation, int) and int(interpolation) in _INT_TO_MODE:
        return _INT_TO_MODE[int(interpolation)]
    raise TypeError(f"interpolation should be an InterpolationMode or a PIL resampling int, got {interpolation!r}")


def _pil_roundtrip(fn, img, *args, **kwargs):
    """Apply a tensor kernel to a PIL image (8-bit modes), returning a PIL image."""
    out = fn(pil_to_tensor(img), *args, **kwargs)
    return to_pil_image(out, mode=img.mode)


# --------------------------------------------------------------------------- conversions


def pil_to_tensor(pic: Any) -> torch.Tensor:
    """PIL image -> ``(C, H, W)`` tensor of the image's own dtype (a permuted view, as in torchvision)."""
    if not _is_pil(pic):
        raise TypeError(f"pic should be PIL Image. Got {type(pic)}")
    img = torch.as_tensor(np.array(pic, copy=True))
    img = img.view(pic.size[1], pic.size[0], len(pic.getbands()))
    return img.permute((2, 0, 1))


def to_tensor(pic: Any) -> torch.Tensor:
    """PIL image or ``HWC`` ndarray -> contiguous ``(C, H, W)`` tensor; uint8 input becomes float in [0, 1]."""
    if isinstance(pic, np.ndarray):
        if pic.ndim == 2:
            pic = pic[:, :, None]
        img = torch.from_numpy(pic.transpose((2, 0, 1))).contiguous()
    elif _is_pil(pic):
        nptype = {"I": np.int32, "I;16": np.int16, "F": np.float32}.get(pic.mode, np.uint8)
        img = torch.from_numpy(np.array(pic, nptype, copy=True))
        if pic.mode == "1":
            img = 255 * img
        img = img.view(pic.size[1], pic.size[0], len(pic.getbands())).permute((2, 0, 1)).contiguous()
    else:
        raise TypeError(f"pic should be PIL Image or ndarray. Got {type(pic)}")
    if img.dtype == torch.uint8:
        return img.to(dtype=torch.get_default_dtype()).div(255)
    return img


def to_pil_image(pic: Any, mode: str | None = None):
    """``(C, H, W)`` tensor or ``(H, W, C)`` ndarray -> PIL image (float data is scaled by 255)."""
    if _PILImage is None:  # pragma: no cover
        raise ImportError("to_pil_image needs Pillow")
    if isinstance(pic, torch.Tensor):
        if pic.ndim == 2:
            pic = pic.unsqueeze(0)
        if pic.ndim != 3:
            raise ValueError(f"pic should be 2/3 dimensional. Got {pic.ndim} dimensions.")
        if pic.is_floating_point() and mode != "F":
            pic = pic.mul(255).byte()
        npimg = pic.detach().cpu().permute(1, 2, 0).numpy()
    elif isinstance(pic, np.ndarray):
        npimg = pic[:, :, None] if pic.ndim == 2 else pic
        if np.issubdtype(npimg.dtype, np.floating) and mode != "F":
            npimg = (npimg * 255).astype(np.uint8)
    else:
        raise TypeError(f"pic should be Tensor or ndarray. Got {type(pic)}.")
    if npimg.shape[2] == 1:
        npimg = npimg[:, :, 0]
    elif npimg.shape[2] not in (2, 3, 4):
        raise ValueError(f"pic should have 1 to 4 channels, got {npimg.shape[2]}")
    if mode == "F" or npimg.dtype == np.float64:
        npimg = npimg.astype(np.float32)
    if npimg.ndim == 3 and npimg.shape[2] == 2:  # Pillow cannot infer "LA" from an array
        img = _PILImage.merge("LA", [_PILImage.fromarray(np.ascontiguousarray(npimg[:, :, c])) for c in range(2)])
    else:
        img = _PILImage.fromarray(np.ascontiguousarray(npimg))
    return img if mode is None or img.mode == mode else img.convert(mode)


def grayscale_to_rgb(inpt: Any) -> Any:
    """Repeat a single channel three times; images with >= 3 channels are returned unchanged."""
    if _is_pil(inpt):
        return inpt.convert("RGB")
    _check_tensor(inpt, "grayscale_to_rgb")
    if inpt.shape[-3] >= 3:
        return inpt
    repeats = [1] * inpt.ndim
    repeats[-3] = 3
    return inpt.repeat(repeats)


# --------------------------------------------------------------------------- resize


def _output_size(h: int, w: int, size: int | Sequence[int] | None, max_size: int | None) -> tuple[int, int]:
    if isinstance(size, numbers.Integral):
        size = [int(size)]
    if size is not None and len(size) == 2:
        if max_size is not None:
            raise ValueError("max_size should only be passed if size specifies the length of the smaller edge")
        return int(size[0]), int(size[1])
    if size is None:
        if max_size is None:
            raise ValueError("one of size or max_size must be given")
        scale = max_size / max(h, w)
        return (max_size, int(w * scale)) if h >= w else (int(h * scale), max_size)
    if len(size) != 1:
        raise ValueError(f"size must be an int or a sequence of one or two ints, got {size}")
    short, long = (w, h) if w <= h else (h, w)
    new_short, new_long = int(size[0]), int(size[0] * long / short)
    if max_size is not None:
        if max_size <= size[0]:
            raise ValueError(f"max_size = {max_size} must be strictly greater than the requested size {size[0]}")
        if new_long > max_size:
            new_short, new_long = int(max_size * new_short / new_long), max_size
    return (new_long, new_short) if w <= h else (new_short, new_long)


def _resize_with_pil(image: torch.Tensor, size: tuple[int, int], mode: InterpolationMode) -> torch.Tensor:
    """Resize each channel plane of a CPU uint8 / float32 tensor with Pillow (PIL's resampling filters)."""
    if _PILImage is None or image.device.type != "cpu" or image.dtype not in (torch.uint8, torch.float32):
        raise NotImplementedError(
            f"torchvision stand-in: {mode.name} resize is only supported for CPU uint8/float32 tensors"
        )
    h, w = size
    planes = image.reshape(-1, *image.shape[-2:])
    out = [
        np.asarray(_PILImage.fromarray(np.ascontiguousarray(p.numpy())).resize((w, h), resample=_MODE_TO_PIL[mode]))
        for p in planes
    ]
    return torch.from_numpy(np.stack(out)).reshape(*image.shape[:-2], h, w)


def resize(
    inpt: Any,
    size: int | Sequence[int] | None,
    interpolation: InterpolationMode | int = InterpolationMode.BILINEAR,
    max_size: int | None = None,
    antialias: bool | None = True,
) -> Any:
    """Resize to ``size`` ((h, w), or the shorter edge when a single int), like torchvision's v2 ``resize``."""
    mode = _as_mode(interpolation)
    if _is_pil(inpt):
        h, w = _output_size(inpt.size[1], inpt.size[0], size, max_size)
        return inpt.resize((w, h), resample=_MODE_TO_PIL[mode])
    _check_tensor(inpt, "resize")
    shape = inpt.shape
    num_channels, old_h, old_w = shape[-3:]
    new_h, new_w = _output_size(old_h, old_w, size, max_size)
    if (new_h, new_w) == (old_h, old_w) or inpt.numel() == 0:
        return inpt if (new_h, new_w) == (old_h, old_w) else inpt.new_empty((*shape[:-2], new_h, new_w))
    if mode in (InterpolationMode.BOX, InterpolationMode.HAMMING, InterpolationMode.LANCZOS):
        return _resize_with_pil(inpt, (new_h, new_w), mode)
    if (
        mode in (InterpolationMode.BILINEAR, InterpolationMode.BICUBIC)
        and antialias
        and inpt.dtype == torch.uint8
        and inpt.device.type == "cpu"
        and _PILImage is not None
    ):
        # Pillow's own resampler, one channel plane at a time: bit-exact with transformers' PIL backend.
        # (torch's native uint8 antialias kernel, which the real torchvision calls here, is off by one
        # level from Pillow on ~0.4% of pixels.)
        return _resize_with_pil(inpt, (new_h, new_w), mode)

    image = inpt.reshape(-1, num_channels, old_h, old_w).contiguous()
    nearest = mode in (InterpolationMode.NEAREST, InterpolationMode.NEAREST_EXACT)
    acceptable = [torch.float32, torch.float64]
    if nearest or image.device.type == "cpu":
        acceptable.append(torch.uint8)  # torch has native uint8 kernels for these
    dtype = image.dtype
    need_cast = dtype not in acceptable
    if need_cast:
        image = image.to(torch.float32)
    image = F.interpolate(
        image,
        size=[new_h, new_w],
        mode=mode.value,
        align_corners=None if nearest else False,
        antialias=bool(antialias) and not nearest,
    )
    if need_cast:
        if mode == InterpolationMode.BICUBIC and dtype == torch.uint8:
            image = image.clamp_(min=0, max=255)
        if not dtype.is_floating_point and dtype != torch.bool:
            image = image.round_()
        image = image.to(dtype)
    return image.reshape(*shape[:-2], new_h, new_w)


# --------------------------------------------------------------------------- pad / crop


def _parse_padding(padding: int | Sequence[int]) -> tuple[int, int, int, int]:
    """torchvision padding -> (left, top, right, bottom)."""
    if isinstance(padding, numbers.Integral):
        padding = [int(padding)]
    padding = [int(p) for p in padding]
    if len(padding) == 1:
        return padding[0], padding[0], padding[0], padding[0]
    if len(padding) == 2:
        return padding[0], padding[1], padding[0], padding[1]
    if len(padding) == 4:
        return padding[0], padding[1], padding[2], padding[3]
    raise ValueError(f"Padding must be an int or a 1, 2, or 4 element sequence, got {padding}")


def _pad_indices(n: int, before: int, after: int, mode: str, device) -> torch.Tensor:
    i = torch.arange(-before, n + after, device=device)
    if mode == "edge":
        return i.clamp(0, n - 1)
    if mode == "reflect":  # mirror without repeating the edge
        if n == 1:
            return torch.zeros_like(i)
        period = 2 * (n - 1)
        i = i.remainder(period)
        return torch.where(i >= n, period - i, i)
    period = 2 * n  # symmetric: mirror repeating the edge
    i = i.remainder(period)
    return torch.where(i >= n, period - 1 - i, i)


def pad(
    inpt: Any,
    padding: int | Sequence[int],
    fill: float | Sequence[float] | None = None,
    padding_mode: str = "constant",
) -> Any:
    """Pad the last two dims: ``padding`` is int, [lr, tb] or [left, top, right, bottom]; negative crops."""
    if _is_pil(inpt):
        return _pil_roundtrip(pad, inpt, padding, fill=fill, padding_mode=padding_mode)
    _check_tensor(inpt, "pad")
    if padding_mode not in ("constant", "edge", "reflect", "symmetric"):
        raise ValueError(f"padding_mode should be constant, edge, reflect or symmetric, got {padding_mode}")
    left, top, right, bottom = _parse_padding(padding)
    if padding_mode == "constant":
        fill = 0 if fill is None else fill
        if isinstance(fill, (list, tuple)) and len(fill) == 1:
            fill = fill[0]
        if not isinstance(fill, (list, tuple)):
            return F.pad(inpt, [left, right, top, bottom], mode="constant", value=float(fill))
        out = F.pad(inpt, [left, right, top, bottom], mode="constant", value=0.0)
        fill_t = torch.as_tensor(fill, dtype=out.dtype, device=out.device).view(-1, 1, 1)
        mask = torch.ones(inpt.shape[-2:], dtype=torch.bool, device=inpt.device)
        mask = F.pad(mask, [left, right, top, bottom], mode="constant", value=False)
        return torch.where(mask, out, fill_t)
    # edge / reflect / symmetric via index maps (works for every dtype and any number of leading dims)
    if min(left, top, right, bottom) < 0:
        raise ValueError(f"negative padding is only supported with padding_mode='constant', got {padding}")
    h, w = inpt.shape[-2:]
    if padding_mode == "reflect" and (max(top, bottom) >= h or max(left, right) >= w):
        raise ValueError("reflect padding must be smaller than the corresponding image dimension")
    rows = _pad_indices(h, top, bottom, padding_mode, inpt.device)
    cols = _pad_indices(w, left, right, padding_mode, inpt.device)
    return inpt.index_select(-2, rows).index_select(-1, cols)


def crop(inpt: Any, top: int, left: int, height: int, width: int) -> Any:
    """Crop ``[top:top+height, left:left+width]``; regions outside the image are zero-filled."""
    if _is_pil(inpt):
        return inpt.crop((left, top, left + width, top + height))
    _check_tensor(inpt, "crop")
    h, w = inpt.shape[-2:]
    right, bottom = left + width, top + height
    if left < 0 or top < 0 or right > w or bottom > h:
        inpt = inpt[..., max(top, 0) : min(bottom, h), max(left, 0) : min(right, w)]
        pads = [max(-left, 0), max(right - w, 0), max(-top, 0), max(bottom - h, 0)]
        return F.pad(inpt, pads, mode="constant", value=0.0)
    return inpt[..., top:bottom, left:right]


def center_crop(inpt: Any, output_size: int | Sequence[int]) -> Any:
    """Crop the center ``output_size`` ((h, w) or a square side); zero-pads first when the image is smaller."""
    if isinstance(output_size, numbers.Integral):
        crop_h = crop_w = int(output_size)
    elif isinstance(output_size, (tuple, list)) and len(output_size) == 1:
        crop_h = crop_w = int(output_size[0])
    else:
        crop_h, crop_w = (int(s) for s in output_size)
    if _is_pil(inpt):
        return _pil_roundtrip(center_crop, inpt, [crop_h, crop_w])
    _check_tensor(inpt, "center_crop")
    image_h, image_w = inpt.shape[-2:]
    if crop_h > image_h or crop_w > image_w:
        padding_ltrb = [
            (crop_w - image_w) // 2 if crop_w > image_w else 0,
            (crop_h - image_h) // 2 if crop_h > image_h else 0,
            (crop_w - image_w + 1) // 2 if crop_w > image_w else 0,
            (crop_h - image_h + 1) // 2 if crop_h > image_h else 0,
        ]
        inpt = pad(inpt, padding_ltrb, fill=0)
        image_h, image_w = inpt.shape[-2:]
        if (crop_h, crop_w) == (image_h, image_w):
            return inpt
    crop_top = int(round((image_h - crop_h) / 2.0))
    crop_left = int(round((image_w - crop_w) / 2.0))
    return inpt[..., crop_top : crop_top + crop_h, crop_left : crop_left + crop_w]


# --------------------------------------------------------------------------- normalize


def normalize(
    inpt: torch.Tensor,
    mean: Sequence[float] | torch.Tensor,
    std: Sequence[float] | torch.Tensor,
    inplace: bool = False,
) -> torch.Tensor:
    """``(x - mean) / std`` per channel on a float tensor (``inplace`` reuses ``x``'s storage)."""
    _check_tensor(inpt, "normalize")
    if not inpt.is_floating_point():
        raise TypeError(f"Input tensor should be a float tensor. Got {inpt.dtype}.")
    if inpt.ndim < 3:
        raise ValueError(f"Expected tensor to be a tensor image of size (..., C, H, W). Got {tuple(inpt.shape)}.")
    mean_t = torch.as_tensor(mean, dtype=inpt.dtype, device=inpt.device)
    std_t = torch.as_tensor(std, dtype=inpt.dtype, device=inpt.device)
    if (std_t == 0).any():
        raise ValueError(f"std evaluated to zero after conversion to {inpt.dtype}, leading to division by zero.")
    if mean_t.ndim == 1:
        mean_t = mean_t.view(-1, 1, 1)
    if std_t.ndim == 1:
        std_t = std_t.view(-1, 1, 1)
    out = inpt.sub_(mean_t) if inplace else inpt.sub(mean_t)
    return out.div_(std_t)


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    raise AttributeError(
        f"torchvision stand-in (padoc-ray CPU profile) does not implement transforms.functional.{name}; "
        f"it only provides {', '.join(__all__)}. Install a working torchvision to use it."
    )

