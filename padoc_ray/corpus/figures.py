"""Figure pixels: matplotlib charts (Agg, no pyplot state) and photo-like images from smooth noise.

``render_figure(spec, width_px, height_px)`` returns an RGB PIL image of exactly that size, the
same bytes for the same spec on the same matplotlib/numpy build. A chart's own text (ticks, labels,
legend) is pixels inside the image, so it has no PDF text layer, matching the ``figure`` category,
which has no content. Nothing here knows where the figure goes on the page.
"""

from __future__ import annotations

import numpy as np
from PIL import Image

from .content import ChartSpec

_COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#17becf"]


def _photo(spec: ChartSpec, w: int, h: int) -> Image.Image:
    rng = np.random.default_rng(spec.seed)
    small = rng.random((max(2, h // 48), max(2, w // 48), 3))
    base = np.asarray(Image.fromarray((small * 255).astype(np.uint8)).resize((w, h), Image.BICUBIC), dtype=np.float32)
    yy, xx = np.mgrid[0:h, 0:w]
    tint = rng.random(3) * 80
    grad = (xx / max(1, w - 1))[..., None] * tint + (yy / max(1, h - 1))[..., None] * (80 - tint)
    img = 0.7 * base + 0.3 * grad + rng.normal(0, 6, (h, w, 3))
    # a few soft shapes so it is not pure texture
    for _ in range(int(rng.integers(2, 5))):
        cx, cy, r = rng.random() * w, rng.random() * h, (0.08 + rng.random() * 0.2) * min(w, h)
        mask = ((xx - cx) ** 2 + (yy - cy) ** 2) < r * r
        img[mask] = img[mask] * 0.4 + rng.random(3) * 255 * 0.6
    return Image.fromarray(np.clip(img, 0, 255).astype(np.uint8), "RGB")


def _chart(spec: ChartSpec, w: int, h: int) -> Image.Image:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    rng = np.random.default_rng(spec.seed)
    dpi = 100.0
    fig = Figure(figsize=(w / dpi, h / dpi), dpi=dpi)
    FigureCanvasAgg(fig)
    fs = max(5.0, min(9.0, h / 40))
    ax = fig.add_axes((0.14, 0.16, 0.82, 0.72 if spec.title else 0.78))
    if spec.kind == "line":
        x = np.arange(int(rng.integers(8, 30)))
        for k in range(spec.n_series):
            ax.plot(x, np.cumsum(rng.normal(0.3, 1.0, len(x))) + 10 * k, color=_COLORS[k], lw=1.2,
                    marker="o" if len(x) < 14 else None, ms=3, label=spec.labels[k])
        if spec.n_series > 1:
            ax.legend(fontsize=fs * 0.85, frameon=False)
    elif spec.kind == "bar":
        n = int(rng.integers(3, 9))
        x = np.arange(n)
        width = 0.8 / spec.n_series
        for k in range(spec.n_series):
            ax.bar(x + k * width, rng.random(n) * 100, width, color=_COLORS[k], label=spec.labels[k])
        ax.set_xticks(x + width * (spec.n_series - 1) / 2, [str(2015 + i) for i in range(n)])
        if spec.n_series > 1:
            ax.legend(fontsize=fs * 0.85, frameon=False)
    elif spec.kind == "scatter":
        for k in range(spec.n_series):
            n = int(rng.integers(20, 80))
            ax.scatter(rng.normal(k, 1, n), rng.normal(k, 1, n), s=6, color=_COLORS[k])
    elif spec.kind == "hist":
        ax.hist(rng.normal(0, 1, 400), bins=int(rng.integers(10, 30)), color=_COLORS[0], edgecolor="white", lw=0.5)
    else:  # pie
        ax.set_position((0.1, 0.05, 0.8, 0.85))
        n = int(rng.integers(3, 7))
        ax.pie(rng.random(n) + 0.2, labels=spec.labels[:n], colors=_COLORS[:n], textprops={"fontsize": fs})
    if spec.kind != "pie":
        ax.tick_params(labelsize=fs)
        ax.set_xlabel(spec.xlabel, fontsize=fs)
        ax.set_ylabel(spec.ylabel, fontsize=fs)
        ax.grid(alpha=0.3, lw=0.5)
    if spec.title:
        ax.set_title(spec.title, fontsize=fs * 1.1)
    fig.canvas.draw()
    rgba = np.asarray(fig.canvas.buffer_rgba())
    img = Image.fromarray(rgba[..., :3].copy(), "RGB")
    if img.size != (w, h):
        img = img.resize((w, h), Image.BILINEAR)
    return img


def render_figure(spec: ChartSpec, width_px: int, height_px: int) -> Image.Image:
    w, h = max(16, int(width_px)), max(16, int(height_px))
    return _photo(spec, w, h) if spec.kind == "photo" else _chart(spec, w, h)
