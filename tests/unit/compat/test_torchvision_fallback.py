"""Tests for padoc-ray's torchvision stand-in (CPU profile) and the fallback that activates it.

The pixel comparisons run in one child interpreter that has the stand-in first on ``PYTHONPATH``,
so they test the stand-in whether or not a real torchvision is installed (and whether or not the
fallback ``.pth`` is installed): transformers binds ``torchvision`` at import time, so the stand-in
cannot be swapped in inside this process. The fast (torchvision-backend) processors must match the
PIL backend to within ``PIXEL_TOL`` (float32 rounding of transformers' fused rescale+normalize; the
resized uint8 pixels themselves are checked to be bit-identical to Pillow's). ``PIXEL_TOL`` is one
float32 unit in the last place at the normalized pixels' magnitude (|x| < 4: 2**-22 = 2.4e-7), the
docs/gpu.md's figure, and what the comparison measures (2.38e-7 for the Qwen2-VL processor, 5.9e-8 for
the auto-loaded Qwen3-VL ones).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import transformers  # noqa: E402,F401 - part of the CPU profile

from padoc_ray.compat import torchvision_fallback as tvf  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[3]
PIXEL_TOL = 2.0**-22  # one float32 ulp in [2, 4): the README's "max difference 2.4e-7"


# --------------------------------------------------------------------------- child-process worker


def _images():
    """Deterministic synthetic PIL images of odd sizes: noise (worst case for bicubic) plus a gradient."""
    import numpy as np
    from PIL import Image

    rng = np.random.RandomState(1234)

    def make(width, height, mode):
        yy, xx = np.mgrid[0:height, 0:width]
        grad = (xx * 255 // max(width - 1, 1) + yy * 255 // max(height - 1, 1)) // 2
        noise = rng.randint(0, 256, (height, width, 3))
        rgb = np.where(noise[..., :1] > 128, noise, grad[..., None]).astype(np.uint8)
        image = Image.fromarray(rgb)
        return image.convert("L") if mode == "L" else image

    return {
        "rgb_200x317": make(200, 317, "RGB"),
        "gray_123x77": make(123, 77, "L"),
        "strip_1000x64": make(1000, 64, "RGB"),
        "tiny_30x41_upscaled": make(30, 41, "RGB"),
    }


def _compare(fast, slow, images) -> dict:
    out = {}
    cases = {name: [im] for name, im in images.items()}
    cases["batch_of_all"] = list(images.values())
    for name, ims in cases.items():
        a = fast(ims, return_tensors="pt")
        b = slow(ims, return_tensors="pt")
        same_shape = tuple(a["pixel_values"].shape) == tuple(b["pixel_values"].shape)
        out[name] = {
            "grid_fast": a["image_grid_thw"].tolist(),
            "grid_slow": b["image_grid_thw"].tolist(),
            "same_shape": same_shape,
            "max_abs_diff": (a["pixel_values"] - b["pixel_values"]).abs().max().item() if same_shape else None,
            "exact": same_shape and bool((a["pixel_values"] == b["pixel_values"]).all()),
        }
    return out


def _worker(tmp_dir: str) -> dict:
    import numpy as np
    import torch
    import torchvision
    from PIL import Image
    from torchvision.transforms.v2 import functional as tvF
    from transformers import AutoImageProcessor
    from transformers.models.qwen2_vl import Qwen2VLImageProcessor, Qwen2VLImageProcessorPil
    from transformers.models.qwen3_vl import Qwen3VLVideoProcessor

    res: dict = {
        "torchvision_file": torchvision.__file__,
        "is_shim": bool(getattr(torchvision, "__padoc_shim__", False)),
    }
    images = _images()

    # (1) Qwen2-VL defaults (patch 14, CLIP mean/std) with a small pixel budget.
    budget = {"min_pixels": 56 * 56, "max_pixels": 128 * 128}
    res["qwen2vl"] = _compare(Qwen2VLImageProcessor(**budget), Qwen2VLImageProcessorPil(**budget), images)

    # (2) What AutoImageProcessor picks for a Qwen3-VL checkpoint, per backend.
    auto = {}
    for type_name in ("Qwen2VLImageProcessor", "Qwen2VLImageProcessorFast"):
        folder = os.path.join(tmp_dir, type_name)
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, "preprocessor_config.json"), "w") as f:
            json.dump(
                {
                    "image_processor_type": type_name,
                    "processor_class": "Qwen3VLProcessor",
                    "size": {"shortest_edge": 64 * 64, "longest_edge": 160 * 160},
                    "patch_size": 16,
                    "temporal_patch_size": 2,
                    "merge_size": 2,
                    "image_mean": [0.5, 0.5, 0.5],
                    "image_std": [0.5, 0.5, 0.5],
                },
                f,
            )
        fast = AutoImageProcessor.from_pretrained(folder, backend="torchvision")
        slow = AutoImageProcessor.from_pretrained(folder, backend="pil")
        auto[type_name] = {
            "fast_class": type(fast).__name__,
            "fast_backend": fast.backend,
            "slow_class": type(slow).__name__,
            "slow_backend": slow.backend,
            "cases": _compare(fast, slow, images),
        }
    res["auto_qwen3vl"] = auto

    # (3) The resize kernel alone on a video-shaped (B, T, C, H, W) uint8 tensor vs Pillow, per frame.
    frames = [images["rgb_200x317"], images["rgb_200x317"].transpose(Image.Transpose.FLIP_LEFT_RIGHT)]
    video = torch.stack([tvF.pil_to_tensor(im) for im in frames])[None]  # (1, 2, 3, 317, 200)
    resized = tvF.resize(video, [97, 61], interpolation=tvF.InterpolationMode.BICUBIC, antialias=True)
    expected = torch.stack([torch.from_numpy(np.array(im.resize((61, 97), Image.BICUBIC))) for im in frames])
    res["resize_video_exact"] = bool(torch.equal(resized[0].permute(0, 2, 3, 1), expected))
    res["resize_video_shape"] = list(resized.shape)

    # (4) The Qwen3-VL video processor builds and runs (grayscale_to_rgb, resize, normalize paths).
    video_np = np.stack([np.asarray(im) for im in frames] * 2)  # (4, 317, 200, 3) uint8
    vp = Qwen3VLVideoProcessor(size={"shortest_edge": 32 * 32 * 4, "longest_edge": 64 * 64 * 8})
    vout = vp(videos=[video_np], do_sample_frames=False, return_tensors="pt")
    res["video"] = {
        "pixel_values_videos": list(vout["pixel_values_videos"].shape),
        "video_grid_thw": vout["video_grid_thw"].tolist(),
    }
    gray = torch.zeros(2, 1, 5, 7, dtype=torch.uint8)
    res["grayscale_to_rgb_shape"] = list(tvF.grayscale_to_rgb(gray).shape)

    # (5) torchvision.io is importable but unusable.
    from torchvision.io import ImageReadMode, decode_image, read_video

    errors = {}
    for name, call in {
        "decode_image": lambda: decode_image(torch.zeros(8, dtype=torch.uint8), mode=ImageReadMode.RGB),
        "read_video": lambda: read_video("clip.mp4"),
    }.items():
        try:
            call()
            errors[name] = None
        except Exception as exc:  # noqa: BLE001 - reported back to the parent
            errors[name] = [type(exc).__name__, str(exc)]
    res["io_errors"] = errors
    return res


def _internvl_reference(image, grid: tuple[int, int] | None):
    """InternVL's tiles of ``image`` from Pillow and numpy alone: a bicubic resize to the grid's
    ``cols*448 x rows*448``, row-major 448 tiles and a 448 thumbnail of the page (or one 448 resize),
    each made RGB, scaled to [0, 1] and normalized with ImageNet's mean/std in float32."""
    import numpy as np
    from PIL import Image

    if grid is None:
        tiles = [image.resize((448, 448), Image.BICUBIC)]
    else:
        cols, rows = grid
        big = image.resize((cols * 448, rows * 448), Image.BICUBIC)
        tiles = [big.crop((c * 448, r * 448, (c + 1) * 448, (r + 1) * 448)) for r in range(rows) for c in range(cols)]
        tiles.append(image.resize((448, 448), Image.BICUBIC))
    mean = np.asarray((0.485, 0.456, 0.406), np.float32)
    std = np.asarray((0.229, 0.224, 0.225), np.float32)
    out = [(np.asarray(t.convert("RGB"), np.float32) / np.float32(255) - mean) / std for t in tiles]
    return np.stack(out).transpose(0, 3, 1, 2)


def _internvl_worker(tmp_dir: str) -> dict:
    """vLLM's own InternVL image preprocessing (``build_transform``: Compose, Lambda, Resize, ToTensor,
    Normalize) running on the stand-in, against :func:`_internvl_reference`."""
    import numpy as np
    import torchvision
    from vllm.transformers_utils.processors.internvl import image_to_pixel_values_internvl

    images = _images()
    cases = {  # name: (image, max_num, the grid InternVL's rule picks (None: a single tile, no thumbnail))
        "page_896x1344": (images["rgb_200x317"].resize((896, 1344)), 6, (2, 3)),
        "page_700x1000": (images["rgb_200x317"].resize((700, 1000)), 6, (2, 3)),
        "gray_123x77": (images["gray_123x77"], 6, (3, 2)),  # aspect 1.6: 3x2 is nearest
        "strip_1000x64_single": (images["strip_1000x64"], 1, None),
    }
    res = {"torchvision_file": torchvision.__file__, "cases": {}}
    for name, (image, max_num, grid) in cases.items():
        got = image_to_pixel_values_internvl(image, input_size=448, min_num=1, max_num=max_num,
                                             use_thumbnail=True).numpy()
        ref = _internvl_reference(image, grid)
        same = got.shape == ref.shape
        res["cases"][name] = {"shape": list(got.shape), "ref_shape": list(ref.shape), "dtype": str(got.dtype),
                              "exact": same and bool(np.array_equal(got, ref)),
                              "max_abs_diff": float(np.abs(got - ref).max()) if same else None}
    return res


# --------------------------------------------------------------------------- fixtures


def _child_env(**extra: str) -> dict:
    env = dict(os.environ)
    env.pop(tvf.DISABLE_ENV, None)
    env.update(extra)
    return env


def _run_in_stand_in_child(fn: str, tmp_dir: Path, timeout: int = 300) -> dict:
    """Run ``fn(tmp_dir)`` of this module in a child interpreter whose ``torchvision`` is the stand-in."""
    pythonpath = os.pathsep.join(p for p in (tvf.shim_dir(), str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p)
    code = (
        "import json, sys; sys.path.insert(1, sys.argv[2]); import test_torchvision_fallback as t; "
        f"print('@@RESULT@@' + json.dumps(t.{fn}(sys.argv[1])))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(tmp_dir), str(Path(__file__).parent)],
        env=_child_env(PYTHONPATH=pythonpath, TOKENIZERS_PARALLELISM="false"),
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=str(tmp_dir),
    )
    marker = [line for line in proc.stdout.splitlines() if line.startswith("@@RESULT@@")]
    assert proc.returncode == 0 and marker, f"{fn} failed (rc={proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return json.loads(marker[0][len("@@RESULT@@") :])


@pytest.fixture(scope="module")
def shim_results(tmp_path_factory) -> dict:
    """Run ``_worker`` once in a child interpreter whose ``torchvision`` is the stand-in."""
    return _run_in_stand_in_child("_worker", tmp_path_factory.mktemp("tv_shim"))


@pytest.fixture(scope="module")
def internvl_results(tmp_path_factory) -> dict:
    """Run ``_internvl_worker`` once in a child interpreter whose ``torchvision`` is the stand-in."""
    return _run_in_stand_in_child("_internvl_worker", tmp_path_factory.mktemp("tv_internvl"))


def _assert_cases_match(cases: dict) -> None:
    for name, case in cases.items():
        assert case["same_shape"], f"{name}: pixel_values shapes differ"
        assert case["grid_fast"] == case["grid_slow"], f"{name}: image_grid_thw differs"
        assert case["max_abs_diff"] <= PIXEL_TOL, f"{name}: max |fast - pil| = {case['max_abs_diff']}"


# --------------------------------------------------------------------------- (a) pixels


def test_worker_uses_the_stand_in(shim_results):
    assert shim_results["is_shim"], shim_results["torchvision_file"]
    assert shim_results["torchvision_file"].startswith(tvf.shim_dir())


def test_qwen2vl_fast_matches_pil_backend(shim_results):
    cases = shim_results["qwen2vl"]
    _assert_cases_match(cases)
    assert cases["batch_of_all"]["grid_fast"] == [
        g for name in _image_names() for g in cases[name]["grid_fast"]
    ], "batched call must give the per-image grids in order"


def _image_names():
    return ["rgb_200x317", "gray_123x77", "strip_1000x64", "tiny_30x41_upscaled"]


@pytest.mark.parametrize("type_name", ["Qwen2VLImageProcessor", "Qwen2VLImageProcessorFast"])
def test_auto_image_processor_for_qwen3vl_matches_pil_backend(shim_results, type_name):
    auto = shim_results["auto_qwen3vl"][type_name]
    assert auto["fast_backend"] == "torchvision" and auto["fast_class"] == "Qwen2VLImageProcessor"
    assert auto["slow_backend"] == "pil" and auto["slow_class"] == "Qwen2VLImageProcessorPil"
    _assert_cases_match(auto["cases"])


def test_resize_is_pillow_exact_on_video_shaped_tensors(shim_results):
    assert shim_results["resize_video_shape"] == [1, 2, 3, 97, 61]
    assert shim_results["resize_video_exact"]


def test_qwen3vl_video_processor_runs(shim_results):
    video = shim_results["video"]
    (t, h, w), = video["video_grid_thw"]
    assert t == 2 and h > 0 and w > 0
    assert video["pixel_values_videos"] == [t * h * w, 3 * 2 * 16 * 16]
    assert shim_results["grayscale_to_rgb_shape"] == [2, 3, 5, 7]


def _shim_functional():
    """The stand-in's kernels, loaded under a private name (works next to a real torchvision too)."""
    path = Path(tvf.shim_dir()) / "torchvision" / "transforms" / "functional.py"
    spec = importlib.util.spec_from_file_location("_padoc_tv_functional_under_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_pad_crop_normalize_kernels_follow_torchvision_semantics():
    import numpy as np
    import torch
    fn = _shim_functional()
    x = torch.arange(2 * 3 * 4 * 5, dtype=torch.uint8).reshape(2, 3, 4, 5)
    ref = x.numpy()
    for tv_mode, np_mode in (("edge", "edge"), ("reflect", "reflect"), ("symmetric", "symmetric")):
        out = fn.pad(x, [1, 2, 3, 1], padding_mode=tv_mode)  # left, top, right, bottom
        assert out.dtype == torch.uint8
        np.testing.assert_array_equal(out.numpy(), np.pad(ref, [(0, 0), (0, 0), (2, 1), (1, 3)], mode=np_mode))
    out = fn.pad(x, [1, 2], fill=[7, 8, 9])  # left/right 1, top/bottom 2, per-channel fill
    assert tuple(out.shape) == (2, 3, 8, 7)
    assert out[:, :, 0, 0].tolist() == [[7, 8, 9], [7, 8, 9]] and torch.equal(out[:, :, 2:6, 1:6], x)
    crop = fn.crop(x, -1, 3, 3, 4)  # partly outside: zero-filled like torchvision
    assert tuple(crop.shape) == (2, 3, 3, 4)
    assert torch.equal(crop[..., 1:, :2], x[..., :2, 3:]) and crop[..., 0, :].eq(0).all() and crop[..., 2:].eq(0).all()
    assert torch.equal(fn.center_crop(x, [2, 3]), x[..., 1:3, 1:4])
    big = fn.center_crop(x, [6, 8])
    assert tuple(big.shape) == (2, 3, 6, 8) and torch.equal(big[..., 1:5, 1:6], x)
    f = x.float()
    mean, std = [1.0, 2.0, 3.0], [2.0, 4.0, 8.0]
    expected = (f - torch.tensor(mean).view(-1, 1, 1)) / torch.tensor(std).view(-1, 1, 1)
    assert torch.equal(fn.normalize(f, mean, std), expected) and torch.equal(f, x.float())
    with pytest.raises(TypeError):
        fn.normalize(x, mean, std)  # like torchvision: uint8 must be converted first
    assert fn.resize(f, [4, 5]) is f  # same size: returned unchanged
    assert tuple(fn.resize(f, 2).shape) == (2, 3, 2, 2)  # int: shorter edge (4 -> 2, 5 -> int(2.5))
    assert tuple(fn.resize(x, [9, 11], interpolation=fn.InterpolationMode.NEAREST).shape) == (2, 3, 9, 11)
    img = fn.to_pil_image(x[0])
    assert img.mode == "RGB" and torch.equal(fn.pil_to_tensor(img), x[0])
    assert torch.allclose(fn.to_tensor(img), x[0].float() / 255)
    with pytest.raises(AttributeError, match="does not implement"):
        fn.rotate  # noqa: B018 - anything unimplemented fails with a clear message


def _shim_package():
    """The whole stand-in package, loaded under a private name (works next to a real torchvision too)."""
    name = "_padoc_tv_package_under_test"
    if name not in sys.modules:
        init = Path(tvf.shim_dir()) / "torchvision" / "__init__.py"
        spec = importlib.util.spec_from_file_location(name, init, submodule_search_locations=[str(init.parent)])
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # before exec: its relative imports resolve under this name
        spec.loader.exec_module(module)
    return sys.modules[name]


def _internvl_pipeline(T):
    """vLLM's InternVL ``build_transform(448)``, with a plain RGB conversion as its Lambda."""
    return T.Compose([
        T.Lambda(lambda img: img.convert("RGB")),
        T.Resize((448, 448), interpolation=T.InterpolationMode.BICUBIC),
        T.ToTensor(),
        T.Normalize(mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225)),
    ])


def test_internvl_tile_pipeline_is_pil_and_numpy_exact():
    """Compose(Lambda, Resize BICUBIC, ToTensor, Normalize) of PIL images: bit-identical to Pillow's
    bicubic resize (what the real torchvision calls for PIL inputs) and float32 numpy arithmetic."""
    import numpy as np
    from PIL import Image

    pipeline = _internvl_pipeline(_shim_package().transforms)
    images = {**_images(), "rgb_448_same_size": _images()["rgb_200x317"].resize((448, 448))}
    for name, image in images.items():
        out = pipeline(image)
        assert out.dtype.is_floating_point and tuple(out.shape) == (3, 448, 448), name
        np.testing.assert_array_equal(out.numpy(), _internvl_reference(image, None)[0], err_msg=name)
        if image.size == (448, 448):  # a tile already 448: Resize leaves its pixels as they are
            ref = np.asarray(image, np.float32) / np.float32(255)
            assert np.array_equal(out.numpy(), ((ref - np.float32([0.485, 0.456, 0.406]))
                                                / np.float32([0.229, 0.224, 0.225])).transpose(2, 0, 1))
    tensor = _shim_package().transforms.functional.pil_to_tensor(images["rgb_200x317"])
    resized = _shim_package().transforms.Resize((97, 61), interpolation=Image.BICUBIC)(tensor)  # int code 3
    expected = np.asarray(images["rgb_200x317"].resize((61, 97), Image.BICUBIC)).transpose(2, 0, 1)
    assert np.array_equal(resized.numpy(), expected)  # uint8 tensors: Pillow's filter per plane


def test_transform_classes_follow_torchvision_semantics():
    import numpy as np
    import torch
    from PIL import Image

    T = _shim_package().transforms
    image = _images()["rgb_200x317"]  # 200 wide, 317 high
    assert T.Resize(100)(image).size == (100, int(100 * 317 / 200))  # int: the shorter edge, aspect kept
    assert T.Resize([100])(image).size == (100, 158)
    assert T.Resize(100, max_size=120)(image).size == (int(120 * 100 / 158), 120)  # longer edge capped
    assert np.array_equal(np.asarray(T.Resize((50, 40))(image)), np.asarray(image.resize((40, 50), Image.BILINEAR)))
    assert T.Resize((8, 8), interpolation=3).interpolation is T.InterpolationMode.BICUBIC
    with pytest.raises(ValueError, match="1 or 2 values"):
        T.Resize((1, 2, 3))
    with pytest.raises(TypeError):
        T.Resize("448")
    with pytest.raises(TypeError, match="callable"):
        T.Lambda(3)
    assert T.Compose([T.Lambda(lambda x: x + 1), T.Lambda(lambda x: x * 10)])(1) == 20  # in order
    arr = np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3)  # HWC ndarray
    t = T.ToTensor()(arr)
    assert tuple(t.shape) == (3, 2, 3) and t.dtype == torch.float32
    assert torch.equal(t, torch.from_numpy(arr.transpose(2, 0, 1).astype(np.float32)) / 255)
    x = torch.ones(3, 2, 2)
    assert torch.equal(T.Normalize([1.0, 0.0, 0.5], [1.0, 2.0, 0.5])(x)[:, 0, 0], torch.tensor([0.0, 0.5, 1.0]))
    assert torch.equal(x, torch.ones(3, 2, 2))  # not in place by default ...
    T.Normalize([1.0, 1.0, 1.0], [1.0, 1.0, 1.0], inplace=True)(x)
    assert x.eq(0).all()  # ... in place on request
    assert isinstance(T.Resize(4), torch.nn.Module) and isinstance(T.Normalize([0], [1]), torch.nn.Module)
    assert "Resize(size=(448, 448), interpolation=bicubic" in repr(_internvl_pipeline(T))
    with pytest.raises(AttributeError, match="does not implement torchvision.transforms.RandomCrop"):
        T.RandomCrop  # noqa: B018 - anything unimplemented fails with a clear message


def test_vllm_internvl_preprocessing_runs_on_the_stand_in(internvl_results):
    """vLLM's InternVL processor code, unchanged, on the stand-in: its tiles and thumbnail are exactly
    Pillow's bicubic resizes normalized in float32."""
    assert internvl_results["torchvision_file"].startswith(tvf.shim_dir())
    for name, case in internvl_results["cases"].items():
        assert case["shape"] == case["ref_shape"], name
        assert case["dtype"] == "float32" and case["exact"], f"{name}: max |diff| = {case['max_abs_diff']}"
    assert internvl_results["cases"]["page_896x1344"]["shape"] == [7, 3, 448, 448]  # 2x3 tiles + thumbnail
    assert internvl_results["cases"]["strip_1000x64_single"]["shape"] == [1, 3, 448, 448]


# --------------------------------------------------------------------------- (c) io


def test_torchvision_io_raises_clear_error(shim_results):
    for name, err in shim_results["io_errors"].items():
        assert err is not None, f"torchvision.io.{name} should raise"
        kind, message = err
        assert kind == "NotImplementedError"
        assert f"torchvision.io.{name}" in message and "stand-in" in message


# --------------------------------------------------------------------------- (b) fallback decision


def test_install_is_a_no_op_when_real_torchvision_works(monkeypatch, tmp_path):
    stale = tmp_path / tvf.PTH_NAME
    stale.write_text(tvf.pth_line())
    monkeypatch.setattr(tvf, "real_torchvision_works", lambda *a, **k: True)
    assert tvf.install(site_dir=tmp_path) is None
    assert not stale.exists(), "a previous fallback must be removed once torchvision works"


def test_install_writes_pth_when_real_torchvision_is_broken(monkeypatch, tmp_path):
    monkeypatch.setattr(tvf, "real_torchvision_works", lambda *a, **k: False)
    path = tvf.install(site_dir=tmp_path)
    assert path == str(tmp_path / tvf.PTH_NAME)
    text = Path(path).read_text()
    assert text == tvf.pth_line() and text.startswith("import ") and text.count("\n") == 1
    assert repr(tvf.shim_dir()) in text
    assert tvf.uninstall(site_dir=tmp_path) == path
    assert tvf.uninstall(site_dir=tmp_path) is None


def _fresh_torchvision_file(site_dir: Path, **env: str) -> str:
    """``torchvision.__file__`` in a fresh interpreter that processes ``site_dir``'s .pth files."""
    code = (
        "import site, sys; site.addsitedir(sys.argv[1]); "
        "import torchvision; print(torchvision.__file__)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(site_dir)],
        env=_child_env(**env),
        capture_output=True,
        text=True,
        timeout=120,
    )
    return proc.stdout.strip() if proc.returncode == 0 else f"<ImportError rc={proc.returncode}>"


def test_pth_line_puts_stand_in_first_and_honours_opt_out(monkeypatch, tmp_path):
    monkeypatch.setattr(tvf, "real_torchvision_works", lambda *a, **k: False)
    tvf.install(site_dir=tmp_path)
    assert _fresh_torchvision_file(tmp_path).startswith(tvf.shim_dir())
    opted_out = _fresh_torchvision_file(tmp_path, **{tvf.DISABLE_ENV: "1"})
    assert not opted_out.startswith(tvf.shim_dir())


_HIDER = """# test-only: `torchvision` imports from padoc-ray's stand-in folder alone; a real one is hidden
import importlib.machinery, os, sys

SHIM = {shim!r}


class HideRealTorchvision:
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name != "torchvision":
            return None
        shim = [p for p in sys.path if os.path.realpath(p or os.getcwd()) == SHIM]
        spec = importlib.machinery.PathFinder.find_spec(name, shim) if shim else None
        if spec is None:
            raise ModuleNotFoundError("No module named 'torchvision' (a real one is hidden by the test)", name=name)
        return spec


sys.meta_path.insert(0, HideRealTorchvision)
"""


@pytest.fixture(scope="module")
def bare_site(tmp_path_factory) -> dict:
    """A fresh virtual environment with no real torchvision, whichever wheels this one got: its
    site-packages sees this environment's packages (a plain path line, so none of their .pth files
    runs: not an installed fallback either) and hides any ``torchvision`` outside the stand-in's folder
    (a ``sys.meta_path`` finder that its ``.pth`` installs in every interpreter it starts, children
    too). {"python": its interpreter, "site": its site-packages}."""
    import sysconfig

    root = tmp_path_factory.mktemp("bare-site") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True, timeout=120)
    python = str(root / "bin" / "python")
    site = Path(subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True, timeout=60).stdout.strip())
    (site / "padoc_test_hide_torchvision.py").write_text(_HIDER.format(shim=tvf.shim_dir()))
    (site / "padoc_test_hide_torchvision.pth").write_text("import padoc_test_hide_torchvision\n")
    (site / "padoc_test_this_env.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return {"python": python, "site": str(site)}


def _fake_torchvision(tmp_path: Path) -> Path:
    """A folder holding a package that looks like a real torchvision to the probe (``transforms.v2``
    and its ``functional``, no stand-in marker)."""
    pkg = tmp_path / "fake" / "torchvision"
    (pkg / "transforms" / "v2").mkdir(parents=True)
    for init in ("__init__.py", "transforms/__init__.py", "transforms/v2/__init__.py", "transforms/v2/functional.py"):
        (pkg / init).write_text("")
    return pkg.parent


def test_probe_never_mistakes_the_stand_in_for_torchvision(monkeypatch, bare_site, tmp_path):
    """In an environment without a real torchvision (``bare_site``) the probe finds none, though the
    stand-in is importable; it is not blind: a torchvision that is not the stand-in counts (and
    ``bare_site`` hides that one too)."""
    shim = tvf.shim_dir()
    # Even with the stand-in importable through PYTHONPATH, there is no *real* torchvision.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [shim, os.environ.get("PYTHONPATH")])))
    assert tvf.real_torchvision_works(bare_site["python"]) is False
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([shim, str(_fake_torchvision(tmp_path))]))
    assert tvf.real_torchvision_works() is True
    assert tvf.real_torchvision_works(bare_site["python"]) is False  # where any real one is hidden


_SPAWN_CHECK = """import multiprocessing as mp
import torchvision
def child(q):
    import torchvision
    q.put(torchvision.__file__)
if __name__ == '__main__':
    ctx = mp.get_context('spawn')
    q = ctx.Queue()
    p = ctx.Process(target=child, args=(q,))
    p.start()
    print(torchvision.__file__)
    print(q.get(timeout=60))
    p.join()
"""


def test_installed_fallback_reaches_child_processes(monkeypatch, bare_site, tmp_path):
    """Where the fallback is installed for an interpreter (``bare_site``'s: the same outcome whichever
    torchvision this environment has), plain and spawned children import the stand-in; before, they
    import no torchvision at all."""
    script = tmp_path / "spawn_check.py"
    script.write_text(_SPAWN_CHECK)
    # No PYTHONPATH and a neutral cwd: only the site-packages .pth can provide the stand-in.
    env = _child_env()
    env.pop("PYTHONPATH", None)

    def run():
        return subprocess.run([bare_site["python"], str(script)], env=env, capture_output=True, text=True,
                              timeout=120, cwd=str(tmp_path))

    before = run()
    assert before.returncode != 0 and "No module named 'torchvision' (a real one is hidden" in before.stderr, \
        before.stderr[-2000:]
    monkeypatch.setattr(tvf, "real_torchvision_works", lambda *a, **k: False)
    assert tvf.install(site_dir=bare_site["site"]) == tvf.pth_path(bare_site["site"])
    try:
        proc = run()
    finally:
        tvf.uninstall(site_dir=bare_site["site"])
    assert proc.returncode == 0, proc.stderr
    parent_file, child_file = proc.stdout.split()
    assert parent_file.startswith(tvf.shim_dir()) and child_file.startswith(tvf.shim_dir())
