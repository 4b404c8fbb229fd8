"""Stand-in for ``torchvision.io``: importable (transformers imports names from it), but nothing works.

Image and video decoding need torchvision's compiled extensions. Pass already-decoded images
(PIL images, numpy arrays or tensors) to the processors instead of paths, URLs or bytes.
"""

from __future__ import annotations

import enum

_MESSAGE = (
    "torchvision.io.{name} is not available: this is padoc-ray's pure-torch torchvision stand-in "
    "(CPU profile), which has no image/video codecs. Pass decoded images (PIL.Image, numpy arrays or "
    "tensors) instead of file paths, URLs or bytes, or install a working torchvision."
)


class ImageReadMode(enum.Enum):
    """Same members as torchvision's enum (only used as a value here)."""

    UNCHANGED = 0
    GRAY = 1
    GRAY_ALPHA = 2
    RGB = 3
    RGB_ALPHA = 4
    RGBA = 4


def _unavailable(name: str):
    def fn(*args, **kwargs):
        raise NotImplementedError(_MESSAGE.format(name=name))

    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = "Not available in the torchvision stand-in; always raises NotImplementedError."
    return fn


_FUNCTIONS = (
    "decode_image",
    "decode_jpeg",
    "decode_png",
    "decode_webp",
    "decode_gif",
    "decode_avif",
    "decode_heic",
    "encode_jpeg",
    "encode_png",
    "read_file",
    "read_image",
    "read_video",
    "read_video_timestamps",
    "write_file",
    "write_jpeg",
    "write_png",
    "write_video",
)
for _name in _FUNCTIONS:
    globals()[_name] = _unavailable(_name)
del _name


class VideoReader:
    """Not available in the torchvision stand-in; instantiating it raises NotImplementedError."""

    def __init__(self, *args, **kwargs):
        raise NotImplementedError(_MESSAGE.format(name="VideoReader"))


__all__ = ["ImageReadMode", "VideoReader", *_FUNCTIONS]
