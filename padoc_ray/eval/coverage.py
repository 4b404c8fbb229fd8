"""PageIoU's coverage backends (:mod:`padoc_ray.eval.pageiou`): the page area carrying each count triple.

Both backends produce the same thing: for each supported class, the page area carrying each
distinct count triple (a, b, c). Every area sum of the protocol is a weighted sum of a pointwise
function of (a, b, c), so the equations are then evaluated once per distinct triple instead of once
per cell (a page has thousands of cells but a few dozen triples).

``exact`` (:func:`coverage_exact`) compresses the coordinates of all box edges plus 0 and 1 into a grid
of cells on which every count is constant and weights each cell by its exact area; ``raster``
(:func:`coverage_raster`) rounds box edges onto a G x G grid, every pixel weighing 1 / G^2. Both fill
the counts with a 2-D difference array and prefix sums; :func:`triple_areas` then sums the area of
each distinct triple, and :func:`area_sums` evaluates the protocol's equations on them. Pure: numpy only.
"""

from __future__ import annotations

import numpy as np


def _fill(n_layers: int, layer: np.ndarray, i1, j1, i2, j2, nx: int, ny: int) -> np.ndarray:
    """Counts per layer on an (nx - 1, ny - 1) cell grid: a 2-D difference array over the (nx, ny)
    cell corners, then prefix sums along both axes."""
    size = nx * ny
    base = layer * size
    diff = np.zeros(n_layers * size, dtype=np.int16 if len(layer) < 1 << 15 else np.int32)  # counts <= boxes
    np.add.at(diff, np.concatenate([base + i1 * ny + j1, base + i2 * ny + j2]), 1)
    np.add.at(diff, np.concatenate([base + i2 * ny + j1, base + i1 * ny + j2]), -1)
    diff = diff.reshape(n_layers, nx, ny)
    np.cumsum(diff, axis=1, out=diff)
    np.cumsum(diff, axis=2, out=diff)
    return diff[:, :-1, :-1]


def coverage_exact(r: np.ndarray, layer: np.ndarray, n_layers: int) -> tuple[np.ndarray, np.ndarray]:
    """Coordinate compression: cells between consecutive distinct edges (and 0, 1), exact areas."""
    xs = np.unique(np.concatenate([[0.0, 1.0], r[:, 0], r[:, 2]]))
    ys = np.unique(np.concatenate([[0.0, 1.0], r[:, 1], r[:, 3]]))
    ix = np.searchsorted(xs, r[:, [0, 2]])
    iy = np.searchsorted(ys, r[:, [1, 3]])
    counts = _fill(n_layers, layer, ix[:, 0], iy[:, 0], ix[:, 1], iy[:, 1], len(xs), len(ys))
    return counts, np.outer(np.diff(xs), np.diff(ys))


def coverage_raster(r: np.ndarray, layer: np.ndarray, n_layers: int, grid: int) -> tuple[np.ndarray, float]:
    """Edges rounded to the nearest of grid + 1 lines per axis; every pixel weighs 1 / grid^2."""
    g = np.clip(np.floor(r * grid + 0.5), 0, grid).astype(np.int64)
    counts = _fill(n_layers, layer, g[:, 0], g[:, 1], g[:, 2], g[:, 3], grid + 1, grid + 1)
    return counts, 1.0 / (grid * grid)


def triple_areas(counts: np.ndarray, w: np.ndarray | float) -> tuple[np.ndarray, ...]:
    """(class slot, a, b, c, area) over the distinct count triples of each class; counts are (3Q, X, Y)."""
    q = counts.shape[0] // 3
    k = int(counts.max()) + 1
    flat = counts.reshape(q, 3, -1).astype(np.int32 if q * k ** 3 < 1 << 31 else np.int64)
    key = ((np.arange(q)[:, None] * k + flat[:, 0]) * k + flat[:, 1]) * k + flat[:, 2]
    weights = None if np.ndim(w) == 0 else np.broadcast_to(w.ravel(), key.shape).ravel()
    if q * k ** 3 <= 1 << 22:  # small key space: a direct histogram
        hist = np.bincount(key.ravel(), weights=weights, minlength=q * k ** 3)
        uniq = np.flatnonzero(hist)
        area = hist[uniq]
    else:
        uniq, inv = np.unique(key, return_inverse=True)
        area = np.bincount(inv.ravel(), weights=weights, minlength=len(uniq))
    if weights is None:
        area = area * float(w)
    c = uniq % k
    b = uniq // k % k
    a = uniq // (k * k) % k
    return uniq // (k * k * k), a, b, c, area


def area_sums(slot: np.ndarray, a: np.ndarray, b: np.ndarray, c: np.ndarray, area: np.ndarray,
               n_slots: int) -> dict[str, np.ndarray]:
    """Per category mode, an array (4, Q) of I, U, D_gt, D_pr (the paper's eqs. 26 and 28)."""
    def s(f):
        return np.bincount(slot, weights=f * area, minlength=n_slots)

    i_acc = np.minimum(a + b, c)
    acc = np.stack([s(i_acc), s(np.maximum(a, c)), s(np.maximum(a, i_acc)), s(c)])
    u_ign = np.where((a == 0) & (b > 0), 0, np.maximum(a, c))
    d_pr_ign = c - np.minimum(np.maximum(c - a, 0), b)
    ign = np.stack([s(np.minimum(a, c)), s(u_ign), s(a), s(d_pr_ign)])
    return {"acceptable": acc, "ignore_acceptable": ign}
