"""Named corpus profiles: the mix of languages, columns, page sizes, block kinds and page
treatments (scanned, rotated) a generated corpus draws from.

A profile is data only; ``layout`` and ``generate`` read it. ``promises`` lists the categories a
profile guarantees to produce in any corpus of a few dozen pages (the tests hold each profile to
it). The weights of ``mixed`` were tuned with ``padoc-ray corpus profile`` toward the token-length
figures of the 18 OmniDocBench demo pages under the same tokenizer (content tokens per region and
sequential decode steps per page match at the median; single- and double-column pages have as
many regions as the demo's pages of those layouts).
"""

from __future__ import annotations

from dataclasses import dataclass, field

#: display sizes in points (width, height); all whole points so that pixel sizes at 144 dpi are exact
PAGE_SIZES = {
    "letter": (612, 792),
    "a4": (595, 842),
    "b5": (499, 709),
    "slide": (720, 405),
}

BODY_FURNITURE = ("header", "footer", "page_number", "page_footnote")


@dataclass(frozen=True)
class Profile:
    name: str
    description: str
    languages: dict[str, float]  # document language -> weight
    columns: dict[int, float]  # body columns -> weight (per document)
    page_sizes: dict[str, float]
    doc_pages: tuple[int, int]  # pages per document, inclusive
    blocks: dict[str, float]  # paragraph, heading, list, table, formula, figure -> weight
    serif: float = 0.6  # share of documents with a serif body font
    body_size: tuple[float, float] = (9.5, 11.0)
    p_header: float = 0.7  # documents with a running header
    p_footer: float = 0.35  # documents with a footer line
    p_page_number: float = 0.85  # documents with page numbers
    p_footnote: float = 0.15  # pages with a page footnote
    p_title: float = 0.8  # documents whose first page opens with a title block
    p_abstract: float = 0.3  # ...followed by authors and an abstract
    p_scanned_doc: float = 0.0  # documents whose pages are all rasterized ("scanned")
    p_rotated_page: float = 0.0  # landscape pages stored with /Rotate 90
    p_slides_doc: float = 0.0  # 16:9 slide decks (large fonts, bullets, charts)
    p_wide_float: float = 0.2  # multi-column pages opening with a full-width figure or table
    p_references: float = 0.0  # documents whose last page ends with a reference list
    p_equation_number: float = 0.5
    p_table_note: float = 0.25
    p_merged_cells: float = 0.5
    photo_share: float = 0.25  # figures that are photos rather than charts
    long_paragraphs: float = 0.12  # share of long (8-14 sentence) paragraphs
    table_rows: tuple[int, int] = (3, 16)  # body rows, inclusive
    promises: tuple[str, ...] = field(default=())


_CORE = ("title", "text_block", "header", "page_number")

PROFILES: dict[str, Profile] = {
    "mixed": Profile(
        name="mixed",
        description="a blend of papers, reports, books and slides in English, Chinese, Greek and Russian; "
                    "one to three columns; some scanned and some rotated pages (the default)",
        languages={"en": 0.64, "zh": 0.30, "el": 0.03, "ru": 0.03},
        columns={1: 0.5, 2: 0.4, 3: 0.1},
        page_sizes={"letter": 0.45, "a4": 0.45, "b5": 0.10},
        doc_pages=(1, 6),
        blocks={"paragraph": 0.42, "heading": 0.18, "list": 0.08, "table": 0.09, "formula": 0.09, "figure": 0.14},
        body_size=(10.0, 12.0),
        long_paragraphs=0.25,
        p_footnote=0.12,
        p_scanned_doc=0.08,
        p_rotated_page=0.05,
        p_slides_doc=0.06,
        p_references=0.3,
        promises=_CORE + ("figure", "figure_caption", "table", "table_caption", "equation_isolated",
                          "equation_caption", "footer", "page_footnote"),
    ),
    "academic": Profile(
        name="academic",
        description="two-column papers: title, authors, abstract, numbered sections, display formulas with "
                    "numbers, tables with captions and notes, charts, footnotes and references",
        languages={"en": 1.0},
        columns={2: 1.0},
        page_sizes={"letter": 0.5, "a4": 0.5},
        doc_pages=(2, 8),
        blocks={"paragraph": 0.46, "heading": 0.12, "list": 0.03, "table": 0.11, "formula": 0.17, "figure": 0.11},
        serif=0.9,
        body_size=(9.0, 10.0),
        p_header=0.8,
        p_footer=0.1,
        p_page_number=0.95,
        p_footnote=0.25,
        p_title=1.0,
        p_abstract=0.9,
        p_wide_float=0.25,
        p_references=0.8,
        p_equation_number=0.9,
        p_table_note=0.35,
        photo_share=0.1,
        promises=_CORE + ("figure", "figure_caption", "table", "table_caption", "table_footnote",
                          "equation_isolated", "equation_caption", "page_footnote", "reference"),
    ),
    "report": Profile(
        name="report",
        description="one-column business and technical reports: headings, paragraphs, bullet lists, tables "
                    "(merged header cells) and charts, running headers and footers",
        languages={"en": 1.0},
        columns={1: 1.0},
        page_sizes={"letter": 0.5, "a4": 0.5},
        doc_pages=(2, 10),
        blocks={"paragraph": 0.42, "heading": 0.15, "list": 0.12, "table": 0.15, "formula": 0.01, "figure": 0.15},
        serif=0.3,
        body_size=(10.0, 11.5),
        p_header=0.9,
        p_footer=0.7,
        p_page_number=0.95,
        p_footnote=0.1,
        p_title=0.9,
        p_abstract=0.0,
        p_table_note=0.4,
        p_merged_cells=0.6,
        photo_share=0.1,
        promises=_CORE + ("figure", "figure_caption", "table", "table_caption", "footer"),
    ),
    "cjk": Profile(
        name="cjk",
        description="Chinese documents (STSong-Light): books, reports and papers in one or two columns with "
                    "tables, charts and formulas",
        languages={"zh": 1.0},
        columns={1: 0.65, 2: 0.35},
        page_sizes={"a4": 0.6, "b5": 0.4},
        doc_pages=(1, 6),
        blocks={"paragraph": 0.52, "heading": 0.13, "list": 0.06, "table": 0.11, "formula": 0.06, "figure": 0.12},
        serif=1.0,
        body_size=(9.5, 11.0),
        p_footer=0.4,
        p_footnote=0.15,
        photo_share=0.2,
        promises=_CORE + ("figure", "figure_caption", "table", "table_caption", "equation_isolated", "footer"),
    ),
}


def get_profile(name: str) -> Profile:
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown profile {name!r}; valid profiles: {', '.join(sorted(PROFILES))}") from None


def weighted(rng, weights: dict):
    """Pick a key of ``weights`` (dict order is the draw order, so results are deterministic)."""
    total = sum(weights.values())
    r = rng.random() * total
    acc = 0.0
    last = None
    for k, w in weights.items():
        acc += w
        last = k
        if r < acc:
            return k
    return last
