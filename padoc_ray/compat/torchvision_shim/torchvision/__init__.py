"""padoc-ray's pure-torch stand-in for ``torchvision`` (CPU install profile only).

Why this exists: vLLM's Qwen2-VL / Qwen3-VL model files import
``transformers.models.qwen2_vl.image_processing_qwen2_vl``, which imports
``torchvision.transforms.v2`` at module level, and transformers builds the
Qwen-VL video processor (torchvision backend) even when videos are disabled.
On the CPU profile (``torch==*+cpu``) no matching torchvision wheel can be
installed (PyPI's wheels are CUDA builds that fail to import next to a CPU
torch), so the model could not even be loaded.

This package implements only what transformers' Qwen2-VL / Qwen3-VL image and
video processors and vLLM's InternVL processor touch: ``InterpolationMode``,
``transforms.functional`` / ``transforms.v2.functional`` (``resize``, ``pad``,
``crop``, ``center_crop``, ``normalize``, ``pil_to_tensor``, ``to_tensor``,
``to_pil_image``, ``grayscale_to_rgb``) with torchvision's semantics on
``(..., C, H, W)`` tensors, the transform classes ``Compose``, ``Lambda``,
``Resize``, ``ToTensor`` and ``Normalize`` (InternVL's per-tile pipeline), and
an ``io`` module whose functions raise ``NotImplementedError``.
``resize`` of CPU uint8 tensors with antialiased BILINEAR/BICUBIC (what the
Qwen-VL processors do) runs Pillow's resampler on each channel plane, so the
"fast" processors are bit-exact with transformers' PIL backend before
normalization (the real torchvision's native torch kernel is off by one level
on ~0.4% of pixels); other cases use ``torch.nn.functional.interpolate`` with
torchvision's settings.

It is only put on ``sys.path`` (by a ``.pth`` file written by
``python -m padoc_ray.compat.torchvision_fallback install``) when the real
torchvision cannot be imported. Install a working torchvision and re-run that
command to stop using it. Set ``PADOC_RAY_DISABLE_TORCHVISION_SHIM=1`` to skip
it for one process tree.
"""

# ``transformers`` reads this when no torchvision distribution metadata exists
# (``is_torchvision_greater_or_equal``). 0.26 means: the removed
# ``io.read_video`` API is reported unavailable (>= 0.26) and LANCZOS is not
# claimed on tensors (< 0.27), so transformers picks its documented fallbacks.
__version__ = "0.26.0+padoc.shim"

#: Marker that lets tools tell the stand-in from a real torchvision.
__padoc_shim__ = True

from . import io, transforms  # noqa: E402,F401  (real torchvision imports these eagerly too)

__all__ = ["io", "transforms", "__version__"]
