"""Tests for padoc-ray's torchvision stand-in (CPU profile) and the fallback that activates it.

The pixel comparisons run in one child interpreter that has the stand-in first on ``PYTHONPATH``,
so they test the stand-in whether or not a real torchvision is installed (and whether or not the
fallback ``.pth`` is installed): transformers binds ``torchvision`` at import time, so the stand-in
cannot be swapped in inside this process. The fast (torchvision-backend) processors must match the
PIL backend to within ``PIXEL_TOL`` (float32 rounding of transformers' fused rescale+normalize; the
resized uint8 pixels themselves are checked to be bit-identical to Pillow's). ``PIXEL_TOL`` is one
float32 unit in the last place at the normalized pixels' magnitude (|x| < 4: 2**-22 = 2.4e-7), the
README's figure, and what the comparison measures (2.38e-7 for the Qwen2-VL processor, 5.9e-8 for
the auto-loaded Qwen3-VL ones).
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import transformers  # noqa: E402,F401 - part of the CPU profile

from padoc_ray.compat import torchvision_fallback as tvf  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[1]
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


# --------------------------------------------------------------------------- fixtures


def _child_env(**extra: str) -> dict:
    env = dict(os.environ)
    env.pop(tvf.DISABLE_ENV, None)
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def shim_results(tmp_path_factory) -> dict:
    """Run ``_worker`` once in a child interpreter whose ``torchvision`` is the stand-in."""
    tmp_dir = tmp_path_factory.mktemp("tv_shim")
    pythonpath = os.pathsep.join(p for p in (tvf.shim_dir(), str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p)
    code = (
        "import json, sys; sys.path.insert(1, sys.argv[2]); import test_torchvision_fallback as t; "
        "print('@@RESULT@@' + json.dumps(t._worker(sys.argv[1])))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(tmp_dir), str(Path(__file__).parent)],
        env=_child_env(PYTHONPATH=pythonpath, TOKENIZERS_PARALLELISM="false"),
        capture_output=True,
        text=True,
        timeout=300,
        cwd=str(tmp_dir),
    )
    marker = [line for line in proc.stdout.splitlines() if line.startswith("@@RESULT@@")]
    assert proc.returncode == 0 and marker, f"worker failed (rc={proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return json.loads(marker[0][len("@@RESULT@@") :])


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


def test_probe_never_mistakes_the_stand_in_for_torchvision(monkeypatch):
    shim = tvf.shim_dir()
    outside = [p for p in sys.path if os.path.realpath(p or os.getcwd()) != shim]
    if importlib.machinery.PathFinder.find_spec("torchvision", outside) is not None:
        pytest.skip("a real torchvision is installed here; covered by the decision tests above")
    # Even with the stand-in importable through PYTHONPATH, there is no *real* torchvision.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [shim, os.environ.get("PYTHONPATH")])))
    assert tvf.real_torchvision_works() is False


def test_installed_fallback_reaches_child_processes(tmp_path):
    """Where the fallback is installed for this interpreter, plain and spawned children import the stand-in."""
    if not os.path.isfile(tvf.pth_path()):
        pytest.skip(f"fallback not installed for this interpreter ({tvf.pth_path()} missing)")
    script = tmp_path / "spawn_check.py"
    script.write_text(
        "import multiprocessing as mp\n"
        "import torchvision\n"
        "def child(q):\n"
        "    import torchvision\n"
        "    q.put(torchvision.__file__)\n"
        "if __name__ == '__main__':\n"
        "    ctx = mp.get_context('spawn')\n"
        "    q = ctx.Queue()\n"
        "    p = ctx.Process(target=child, args=(q,))\n"
        "    p.start()\n"
        "    print(torchvision.__file__)\n"
        "    print(q.get(timeout=60))\n"
        "    p.join()\n"
    )
    # No PYTHONPATH and a neutral cwd: only the site-packages .pth can provide the stand-in.
    env = _child_env()
    env.pop("PYTHONPATH", None)
    proc = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120, cwd=str(tmp_path)
    )
    assert proc.returncode == 0, proc.stderr
    parent_file, child_file = proc.stdout.split()
    assert parent_file.startswith(tvf.shim_dir()) and child_file.startswith(tvf.shim_dir())
