"""Synthetic documents whose true layout and content are known, for tests, replay benchmarks, the
evaluator and the trainer.

``padoc-ray corpus generate`` draws PDFs with reportlab (paragraphs, headings, lists, real tables
with merged cells, mathtext formulas, matplotlib charts, headers, footers, page numbers, page
footnotes; some pages scanned, some rotated, some in Chinese, Greek or Russian) and writes their
ground truth in OmniDocBench's format through the protocol's ``Page``/``page_to_omnidocbench``;
``verify`` checks that ground truth against the PDFs' own text layer; ``profile`` compares token
lengths under a checkpoint's protocol with real pages.

Modules: ``content`` (what is said), ``blocks`` (measured blocks), ``layout`` (pages, reading
order), ``draw`` (reportlab drawing, exact boxes), ``figures`` (chart pixels), ``profiles`` (named
mixes), ``generate`` (documents in parallel, outputs), ``verify``, ``profile``, ``cli``.
Importing this package loads nothing heavy; reportlab, matplotlib and pypdfium2 load on use.
"""
