"""How many draws pdfium will make for a PDF page, counted before it renders (:class:`DrawCounter`).

A page of a few KB can make pdfium draw millions of objects (forms nesting forms, annotation
appearances, tiling patterns, Type 3 glyphs) and take minutes; :func:`padoc_ray.pdf.render_page`
refuses a page whose count passes ``RenderConfig.max_page_draws`` (``page_too_complex``). This
package reads the page with pikepdf (qpdf) and counts; it renders nothing and knows nothing of rows.
What it reads of each content stream (the resources named, glyphs shown, objects painted) is
:mod:`padoc_ray.pdf_draws.content`'s.
"""

from __future__ import annotations

from padoc_ray.pdf_draws.content import Content, content_bytes


class DrawCounter:
    """Counts the draws pdfium would make to render a PDF page, before it renders it: a few KB of
    forms nested a few levels deep, each drawing the next ten times, cost pdfium minutes (or abort it).

    What is counted is what pdfium draws when :func:`render_page` renders a page. That includes
    annotations: pypdfium2's ``draw_annots`` is on by default, so pdfium gets ``FPDF_ANNOT``.

    * **The page's content.** Each ``Do`` counts 1. A form XObject's ``Do`` also counts the draws
      of the form's own content, so nesting multiplies (the product of the ``Do`` counts down the
      chain).
    * **Annotation appearances.** Each annotation in ``/Annots`` counts 1, plus the draws of its
      normal appearance stream (``/AP /N``). When ``/N`` is a dictionary of appearance states, the
      state ``/AS`` names is counted: it is the one pdfium draws (cpdf_annot.cpp
      GetAnnotAPInternal). Without ``/AS``, pdfium picks by the field's ``/V`` or ``Off``; the
      counter does not reproduce that choice and counts the costliest state instead.
    * **Which annotations.** Hidden and NoView annotations are skipped, as pdfium skips them.
      Widgets are counted, though pdfium draws them only with a form environment, which the
      renderer does not start (an upper bound).
    * **Tiling patterns.** These are ``/Pattern`` resources of PatternType 1 that a content
      selects (``/P scn``, ``/P SCN``). pdfium renders the pattern cell anew for every object
      painted with it, and once per tile when the cell is larger than the painted area. One use
      costs ``1 + the cell's draws``, times a tile factor of ``ceil(BBox width / XStep) *
      ceil(BBox height / YStep)``: 1 for an ordinary pattern, large for a cell with tiny steps.
    * **Soft masks.** An ``/ExtGState`` selected with ``gs`` whose ``/SMask`` has a ``/G`` group
      form is rendered for every object painted under it, so one use costs ``1 + the group's
      draws``.
    * **Type 3 fonts.** These are ``/Font`` resources of Subtype Type3 that a content selects with
      ``Tf``. Every glyph shown costs 1 plus the draws of the costliest of the font's
      ``/CharProcs``. The procedures use the font's ``/Resources``, or else the resources the font
      was found in. The glyphs counted are the bytes inside the content's string operands (a
      simple font shows one glyph per byte).

    **Resources and what forms inherit.** Each content is walked with its own resources. As in
    pdfium, a content that lacks a kind of resource (no ``/XObject`` dictionary, say) finds it in
    the page's. A font, pattern or soft mask in force is in force in the forms drawn after it,
    since a form may paint and show text without selecting its own. So from the first selection in
    a content on, the content's paints and glyphs, and the forms it draws, cost the costliest one
    selected. The ``q``/``Q`` nesting and later resets are not followed, which makes the count an
    upper bound.

    **Cycles** are priced by what pdfium does with them, not refused outright. A form that draws
    itself, directly or through others, is nested again and again until pdfium's depth limits
    stop it:

    * pdfium parses forms at most ``kMaxFormLevel = 40`` levels below the content that starts the
      chain (core/fpdfapi/page/cpdf_streamcontentparser.cpp). Measured with pypdfium2 5.15.2
      (pdfium 8149): a form that draws itself once, shifted 2 pt, paints 40 bars.
    * pdfium renders objects at most ``kRenderMaxRecursionDepth = 64`` levels deep
      (core/fpdfapi/render/cpdf_renderstatus.cpp). This bounds patterns and Type 3 glyphs nested in
      each other, whose forms pdfium parses afresh.

    Each walk therefore carries both remaining depths, and a cycle costs what it costs unrolled
    down to them. Two forms that draw each other once cost 41 draws, and the page renders. A form
    that draws itself twice costs 1 + 2 + ... + 2^40 draws and is refused. :meth:`cyclic` says
    whether a page's walk met a cycle, and :meth:`describe` says why a page is over the limit.

    **Cost of counting.** Every content is read once, with a regular expression rather than a
    parse. Walks are memoized by object, resources and walk state, so a form shared by many pages
    or drawn many times costs one walk. The walk stops as soon as the count passes the limit. A
    page whose walk would visit more than 200,000 distinct states counts as over the limit (no
    legitimate page comes near).

    **Scope.** Uses pikepdf (qpdf), opened lazily on the bytes pdfium opened. A page pikepdf
    cannot read counts 0: pdfium's own parsing decides. Pixel work is not counted: ten thousand
    full-page fills, or a cell painted once per tile over a large area, cost time without many
    draws. The renderer's deadlines bound those."""

    def __init__(self, data: bytes):
        self._data = data
        self._pdf = None  # pikepdf.Pdf, or False when pikepdf cannot open the file
        self._memo: dict[tuple, tuple[int, bool]] = {}  # walk state -> (exact draws, met a cycle)
        self._contents: dict[tuple[int, int], Content | None] = {}  # stream or page objgen -> its operators
        self._unit: dict[tuple, int] = {}  # (kind, resource context, name, depth, limit) -> cost of one use
        self._pages: dict[int, tuple[int, int, bool, bool]] = {}  # index -> (content, annotations, cyclic, uncountable)

    def cyclic(self, index: int) -> bool:
        """Whether the walk of page ``index`` met a form (or pattern, or glyph) that draws itself
        (after :meth:`page_draws` counted it)."""
        return index in self._pages and self._pages[index][2]

    def describe(self, index: int, limit: int) -> str:
        """Why page ``index`` is over ``limit`` (after :meth:`page_draws` counted it), for its row."""
        content, annots, cyclic, uncountable = self._pages.get(index, (limit + 1, 0, False, False))
        tail = "over the limit RenderConfig.max_page_draws (--page-draw-limit)"
        if uncountable:
            return (f"its forms, patterns and glyphs are too many to count (more than {_MAX_WALKS:,} distinct "
                    f"nestings); taken as more than {limit:,} draws, {tail}")
        where = ([f"{content:,} in its content"] if content else []) + (
            [f"{annots:,} in its annotations' appearance streams"] if annots else [])
        counted = f"counted {content + annots:,} before stopping: {', '.join(where)}"
        why = "nested forms, annotation appearances, patterns, glyphs"
        if cyclic:
            why = (f"a form XObject on it draws itself, which pdfium nests down to its depth limit of {_FORM_LEVELS} "
                   f"form levels")
        return (f"it would draw more than {limit:,} XObjects, pattern cells and Type 3 glyphs ({why}; {counted}), "
                f"{tail}")

    def page_draws(self, index: int, limit: int) -> int:
        """Draws page ``index`` makes, or a number above ``limit`` (the walk stops there)."""
        try:
            import pikepdf
        except ImportError:
            return 0
        if self._pdf is None:
            import io

            try:
                self._pdf = pikepdf.open(io.BytesIO(self._data))
            except Exception:  # noqa: BLE001 - pdfium opened it; qpdf's view is only a guard
                self._pdf = False
        if not self._pdf or not 0 <= index < len(self._pdf.pages):
            return 0
        walk = _Walk(self, limit)
        content = annots = 0
        try:
            page = self._pdf.pages[index].obj
            res = _page_resources(page)
            content = walk.content(page, res, res, _FORM_LEVELS, _RENDER_DEPTH, 0, 0, limit)
            if content <= limit:
                annots = walk.annotations(page, res, limit - content)
        except (_TooComplex, RecursionError):
            self._pages[index] = (content, annots, walk.cycles > 0, True)
            return limit + 1
        except Exception:  # noqa: BLE001 - a damaged object: pdfium's parsing decides
            return 0
        self._pages[index] = (content, annots, walk.cycles > 0, False)
        return content + annots

    def _content(self, node):
        """The operators of a content stream (or of a page's /Contents), read once; None when unreadable."""
        key = node.objgen
        if key in self._contents:
            return self._contents[key]
        data = content_bytes(node)
        info = None if data is None else Content(data, node)
        if key != (0, 0):
            self._contents[key] = info
        return info


#: pdfium parses form XObjects at most this many levels below the content that starts the chain (a
#: page's, an annotation appearance's, a pattern cell's, a Type 3 glyph's): kMaxFormLevel in
#: core/fpdfapi/page/cpdf_streamcontentparser.cpp (measured: a form drawing itself paints 40 times)
_FORM_LEVELS = 40
#: and renders objects at most this many levels deep, patterns and Type 3 glyphs included:
#: kRenderMaxRecursionDepth in core/fpdfapi/render/cpdf_renderstatus.cpp
_RENDER_DEPTH = 64
#: a page whose walk would visit more distinct (content, resources, depth) states than this is
#: taken as over the limit: the work of counting stays bounded whatever the file
_MAX_WALKS = 200_000


class _TooComplex(Exception):
    """The walk of a page visited more than _MAX_WALKS states."""


class _Res:
    """A resource dictionary with a stable key (its object number, or its holder's when direct)."""

    __slots__ = ("d", "key")

    def __init__(self, d, holder_key):
        import pikepdf

        self.d = d if isinstance(d, pikepdf.Dictionary) else None
        self.key = None if self.d is None else (d.objgen if d.objgen != (0, 0) else ("in", holder_key))

    def category(self, name: str):
        import pikepdf

        c = self.d.get(name) if self.d is not None else None
        return c if isinstance(c, pikepdf.Dictionary) else None


_NO_RES = _Res(None, None)


def _own_resources(stream, fallback: _Res) -> _Res:
    """A form's (pattern's, glyph's) /Resources, or ``fallback`` when it has none."""
    own = _Res(stream.get("/Resources"), stream.objgen)
    return own if own.d is not None else fallback


def _page_resources(page) -> _Res:
    """A page's /Resources, inherited from the page tree when the page has none."""
    node, hops = page, 0
    while node is not None and hops < 64:
        res = node.get("/Resources")
        if res is not None:
            return _Res(res, node.objgen)
        node, hops = node.get("/Parent"), hops + 1
    return _NO_RES


def _lookup(res: _Res, page_res: _Res, category: str, name: str):
    """A named resource as pdfium finds it: in the content's own resources, or, when those have no
    dictionary of that category at all, in the page's (CPDF_StreamContentParser::FindResourceHolder)."""
    holder = res.category(category)
    if holder is None and page_res.key != res.key:
        holder = page_res.category(category)
    return holder.get(name) if holder is not None else None


def _selected(first: dict[str, int], unit) -> tuple[int | None, int]:
    """(offset of the first selection among ``first`` (name -> offset) whose ``unit`` cost is not
    0, the costliest such cost): (None, 0) when none costs anything."""
    at, worst = None, 0
    for name, offset in first.items():
        cost = unit(name)
        if cost:
            at, worst = offset if at is None else min(at, offset), max(worst, cost)
    return at, worst


class _Walk:
    """One page's count: the walk's limit, the forms on the current path, the cycles met, the work done."""

    def __init__(self, counter: DrawCounter, limit: int):
        self.c, self.limit = counter, limit
        self.path: dict[tuple[int, int], int] = {}
        self.cycles = 0
        self.work = 0

    def content(self, node, res: _Res, page_res: _Res, forms: int, depth: int, glyph: int, paint: int,
                budget: int) -> int:
        """Draws of one content (a page's, a form's, a cell's, a glyph's), or a number above ``budget``.
        ``forms``/``depth``: form levels and render levels pdfium still goes down; ``glyph``/``paint``:
        the cost of one glyph shown and of one object painted in the font, pattern and soft mask
        inherited from the content that draws this one (0: none costs more than plain drawing)."""
        key = (node.objgen, res.key, page_res.key, forms, depth, glyph, paint)
        hit = self.c._memo.get(key)
        if hit is not None:
            self.cycles += hit[1]
            return hit[0]
        info = self.c._content(node)
        if info is None:
            return 0
        self.work += 1
        if self.work > _MAX_WALKS:
            raise _TooComplex()
        og = node.objgen
        if self.path.get(og):
            self.cycles += 1  # drawn again below itself: pdfium nests it down to its limits
        self.path[og] = self.path.get(og, 0) + 1
        before = self.cycles
        try:
            total = self._body(info, res, page_res, forms, depth, glyph, paint, budget)
        finally:
            self.path[og] -= 1
        if total <= budget and og != (0, 0):  # a stopped walk is not the content's count
            self.c._memo[key] = (total, self.cycles > before)
        return total

    def _body(self, info: Content, res: _Res, page_res: _Res, forms: int, depth: int, glyph: int,
              paint: int, budget: int) -> int:
        import pikepdf
        from bisect import bisect_right

        # from the first selection of a Type 3 font (of a tiling pattern or soft mask) on, a glyph shown
        # (an object painted) costs the costliest selected; before it, what this content inherited
        g_at, g_sel = _selected(info.fonts, lambda n: self._unit("font", res, page_res, n, depth))
        p_at, p_pat = _selected(info.patterns, lambda n: self._unit("pattern", res, page_res, n, depth))
        p_at2, p_gs = _selected(info.states, lambda n: self._unit("smask", res, page_res, n, depth))
        p_at, p_sel = min((a for a in (p_at, p_at2) if a is not None), default=None), max(p_pat, p_gs)
        g_after, p_after = max(glyph, g_sel), max(paint, p_sel)
        cuts = sorted({c for c in (g_at, p_at) if c is not None})
        total = 0
        for name, offsets in info.draws.items():
            x = None
            if forms > 0 and depth > 0:  # else pdfium does not parse (or render) forms this deep: the Do alone
                x = _lookup(res, page_res, "/XObject", name)
                if not isinstance(x, pikepdf.Stream) or x.get("/Subtype") != "/Form":
                    x = None
            if x is None:
                total += len(offsets)
                if total > budget:
                    return total
                continue
            lo = 0
            for cut in cuts + [None]:  # the draws between two selections share what they inherit
                hi = len(offsets) if cut is None else bisect_right(offsets, cut)
                k, lo, at = hi - lo, hi, offsets[lo] if hi > lo else None
                if not k:
                    continue
                g = g_after if g_at is not None and at > g_at else glyph
                p = p_after if p_at is not None and at > p_at else paint
                total += k
                if total > budget:
                    return total
                n = self.content(x, _own_resources(x, res), page_res, forms - 1, depth - 1, g, p,
                                 (budget - total) // k)
                total += k * n
                if total > budget:
                    return total
        for start, inherited, after, cost in ((g_at, glyph, g_after, info.glyphs), (p_at, paint, p_after, info.paints)):
            if after:
                later = cost(start) if start is not None else 0
                total += (cost(0) - later) * inherited + later * after
        return total

    def _unit(self, kind: str, res: _Res, page_res: _Res, name: str, depth: int) -> int:
        """The cost of one glyph of a Type 3 font, of one object painted with a tiling pattern or
        under a soft mask, found under ``name``; 0 when the name is none of those. Computed against
        the page's limit (so the same everywhere it is used) and kept."""
        key = (kind, res.key, page_res.key, name, depth, self.limit)
        cost = self.c._unit.get(key)
        if cost is None:
            try:
                cost = self._unit_cost(kind, res, page_res, name, depth)
            except (_TooComplex, RecursionError):
                raise
            except Exception:  # noqa: BLE001 - a damaged font or pattern: pdfium draws nothing of it
                cost = 0
            self.c._unit[key] = cost
        return cost

    def _unit_cost(self, kind: str, res: _Res, page_res: _Res, name: str, depth: int) -> int:
        import pikepdf

        cat = {"font": "/Font", "pattern": "/Pattern", "smask": "/ExtGState"}[kind]
        obj = _lookup(res, page_res, cat, name)
        if kind == "font":
            procs = obj.get("/CharProcs") if isinstance(obj, pikepdf.Dictionary) else None
            if obj is None or obj.get("/Subtype") != "/Type3" or not isinstance(procs, pikepdf.Dictionary):
                return 0
            # pdfium: a glyph's form gets the font's /Resources, else those the font was found in
            font_res = _own_resources(obj, res)
            worst = 0
            if depth > 0:
                for proc in procs.values():
                    if isinstance(proc, pikepdf.Stream):
                        worst = max(worst, self.content(proc, _own_resources(proc, font_res), font_res,
                                                        _FORM_LEVELS, depth - 1, 0, 0, self.limit))
                        if worst > self.limit:
                            break
            return 1 + worst
        if kind == "pattern":
            if not isinstance(obj, pikepdf.Stream) or obj.get("/PatternType") != 1:
                return 0  # a shading pattern (2) has no content
            cell = self.content(obj, _own_resources(obj, res), page_res, _FORM_LEVELS, depth - 1, 0, 0,
                                self.limit) if depth > 0 else 0
            return _tiles(obj) * (1 + cell)
        smask = obj.get("/SMask") if isinstance(obj, pikepdf.Dictionary) else None
        group = smask.get("/G") if isinstance(smask, pikepdf.Dictionary) else None
        if not isinstance(group, pikepdf.Stream):
            return 0
        return 1 + (self.content(group, _own_resources(group, res), page_res, _FORM_LEVELS, depth - 1, 0, 0,
                                 self.limit) if depth > 0 else 0)

    def annotations(self, page, res: _Res, budget: int) -> int:
        """Draws of the page's annotations: 1 each, plus their normal appearance's content."""
        import pikepdf

        annots = page.get("/Annots")
        if not isinstance(annots, pikepdf.Array):
            return 0
        total = 0
        for a in annots:
            if not isinstance(a, pikepdf.Dictionary):
                continue
            flags = a.get("/F")
            if isinstance(flags, int) and flags & (2 | 32):  # Hidden, NoView: pdfium skips them
                continue
            total += 1
            worst = 0
            for ap in _appearances(a):
                # pdfium: the appearance form gets its own /Resources, else the page's
                n = self.content(ap, _own_resources(ap, res), res, _FORM_LEVELS, _RENDER_DEPTH, 0, 0,
                                 budget - total)
                worst = max(worst, n)
                if worst > budget - total:
                    break
            total += worst
            if total > budget:
                return total
        return total


def _appearances(annot) -> list:
    """The normal appearance stream(s) pdfium may draw for an annotation: /AP /N itself, or, when
    it is a dictionary of states, the state /AS names (what pdfium draws: cpdf_annot.cpp
    GetAnnotAPInternal), or every state when there is no /AS (pdfium then picks by /V or Off)."""
    import pikepdf

    ap = annot.get("/AP")
    n = ap.get("/N") if isinstance(ap, pikepdf.Dictionary) else None
    if isinstance(n, pikepdf.Stream):
        return [n]
    if not isinstance(n, pikepdf.Dictionary):
        return []
    state = annot.get("/AS")
    if isinstance(state, pikepdf.Name):
        s = n.get(str(state))
        return [s] if isinstance(s, pikepdf.Stream) else []
    return [s for s in n.values() if isinstance(s, pikepdf.Stream)]


def _tiles(pattern) -> int:
    """How many times pdfium may render a tiling pattern's cell for one painted object: once, into
    a bitmap it then tiles, when the cell fits the painted area; else once per tile over the area
    (CPDF_RenderTiling::Draw), which a cell much larger than its step makes huge. Estimated as
    ``ceil(BBox width / XStep) * ceil(BBox height / YStep)``, at least 1 a side (1 for an ordinary
    pattern, whose step is its cell)."""
    import math

    try:
        box = [float(v) for v in pattern.get("/BBox")]
        w, h = abs(box[2] - box[0]), abs(box[3] - box[1])
    except Exception:  # noqa: BLE001 - no usable BBox: pdfium draws an empty cell
        return 1

    def axis(size: float, step) -> int:
        try:
            step = abs(float(step))
        except Exception:  # noqa: BLE001
            return 1
        if not step or not math.isfinite(step) or not math.isfinite(size):
            return 1  # pdfium's tile range then degenerates to one column (or row)
        return max(1, min(math.ceil(size / step), 10**9))

    return axis(w, pattern.get("/XStep")) * axis(h, pattern.get("/YStep"))
