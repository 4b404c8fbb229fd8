"""Stand-in for ``torchvision.transforms.v2.functional`` (same kernels as ``transforms.functional`` here)."""

from ..functional import (  # noqa: F401
    InterpolationMode,
    __all__,
    __getattr__,
    center_crop,
    crop,
    grayscale_to_rgb,
    normalize,
    pad,
    pil_to_tensor,
    resize,
    to_pil_image,
    to_tensor,
)
