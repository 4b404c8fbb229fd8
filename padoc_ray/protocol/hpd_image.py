"""HPD-Parsing's page image rule, as pure code: its tile grid and what the page is sent as.

HPD-Parsing (an InternVL-format checkpoint) cuts a page into 448-pixel tiles plus a thumbnail. Its
released preprocessing (``MAX_PATCHES_WITH_RESIZE``) picks the grid differently from stock vLLM's
InternVL processor, which picks the grid nearest in aspect only. :func:`hpd_tile_grid` is HPD's rule;
:func:`hpd_image_request` is what makes stock vLLM cut exactly that grid: the page pre-resized to
``cols*448 x rows*448`` and ``max_dynamic_patch = cols*rows`` for that request (an image whose aspect
is exactly ``cols:rows`` and whose area fits ``cols*rows`` tiles leaves stock's rule one answer).

Imports nothing heavy (no torch, vllm, ray or PIL): a test imports it with those blocked.
"""

from __future__ import annotations

from functools import lru_cache

TILE = 448  #: pixels per tile side (InternViT's image_size)
MIN_TILES = 1  #: HPD's min_dynamic_patch
MAX_TILES = 24  #: HPD's max_dynamic_patch (a thumbnail comes on top when the grid has more than one tile)
TOKENS_PER_TILE = 256  #: (448 / 14)^2 patches, pixel-shuffled by 0.5 per side
#: HPD's rule keeps the grids within this distance of the page's aspect ratio (all of them if none is)
ASPECT_WINDOW = 0.2
#: ... and of those the this-many nearest in area, then the nearest in aspect
AREA_CANDIDATES = 3


@lru_cache(maxsize=64)
def tile_ratios(min_tiles: int, max_tiles: int) -> tuple[tuple[int, int], ...]:
    """Every (cols, rows) with ``min_tiles <= cols*rows <= max_tiles``, by tile count, then cols, then rows."""
    grids = {(c, r) for c in range(1, max_tiles + 1) for r in range(1, max_tiles + 1)
             if min_tiles <= c * r <= max_tiles}
    return tuple(sorted(grids, key=lambda g: (g[0] * g[1], g[0], g[1])))


def hpd_tile_grid(width: int, height: int, *, tile: int = TILE, min_tiles: int = MIN_TILES,
                  max_tiles: int = MAX_TILES, use_thumbnail: bool = True) -> tuple[int, int]:
    """HPD-Parsing's tile grid ``(cols, rows)`` for a ``width x height`` page.

    With a thumbnail the grid may use ``max_tiles + 1`` slots (as the released rule counts them).
    Candidates are the grids whose aspect ``cols/rows`` is within :data:`ASPECT_WINDOW` of the page's
    (all grids when none is); of those, the :data:`AREA_CANDIDATES` whose area ``cols*rows*tile^2`` is
    nearest the page's, and of these the one nearest in aspect. Ties keep the earlier grid in
    :func:`tile_ratios` order (both sorts are stable)."""
    if width <= 0 or height <= 0:
        raise ValueError(f"page size must be positive, got {width}x{height}")
    slots = max_tiles + 1 if use_thumbnail and max_tiles != 1 else max_tiles
    aspect, area = width / height, width * height
    scored = [(abs(area - tile * tile * c * r), abs(aspect - c / r), (c, r)) for c, r in tile_ratios(min_tiles, slots)]
    near = [s for s in scored if s[1] <= ASPECT_WINDOW] or scored
    near.sort(key=lambda s: s[0])  # stable: equal areas keep the ratio order
    best = near[0]
    for s in near[1:AREA_CANDIDATES]:
        if s[1] < best[1]:  # strictly nearer: the first of equals wins
            best = s
    return best[2]


def hpd_image_request(width: int, height: int, *, tile: int = TILE) -> tuple[tuple[int, int], dict[str, int]]:
    """What a ``width x height`` page is sent to stock vLLM as: the size to resize it to, and the
    request's ``mm_processor_kwargs`` that make vLLM's InternVL processor cut HPD's grid (its tiles,
    and a thumbnail when there is more than one)."""
    cols, rows = hpd_tile_grid(width, height, tile=tile)
    return (cols * tile, rows * tile), {"max_dynamic_patch": cols * rows}


def hpd_image_tokens(cols: int, rows: int) -> int:
    """Image tokens of a ``cols x rows`` grid in context: 256 per tile, plus the thumbnail's past one tile."""
    n = cols * rows
    return TOKENS_PER_TILE * (n + (1 if n > 1 else 0))
