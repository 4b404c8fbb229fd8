"""OmniDocBench v1.6 end-to-end metrics (``padoc-ray eval e2e``), a reimplementation of the upstream
evaluator (opendatalab/OmniDocBench, checked to agree with it page by page on its demo data).

Per-region API (reusable, e.g. in a re-annotation job):

- ``normalized_edit_distance(a, b, kind="text")`` -> float in [0, 1]: Levenshtein distance divided by
  the longer length after the protocol's normalization for ``kind``: ``"text"`` (inline LaTeX to
  Unicode, then only letters/digits/CJK kept), ``"formula"`` (delimiters, spacing, font commands,
  braces and whitespace removed, lower-cased), ``"table"`` (canonical HTML), ``"raw"`` (none).
  0 when both sides normalize to empty.
- ``teds(html_a, html_b, structure_only=False)`` -> float in [0, 1]: TEDS (TEDS-S with
  ``structure_only``) of two HTML tables after the table normalization; 0 if either is empty.
- ``normalize(s, kind)``, ``normalized_text``, ``normalized_formula``, ``normalized_html_table``:
  the normalizations themselves.
- ``extract_markdown(md)``: the text blocks, display/inline formulas and tables of one page of
  Markdown, as the protocol splits it.

Per-page / per-run API:

- ``load_ground_truth(path)`` -> ``(pages, problems)``; ``page_elements(page_dict)``: a page's
  elements with ignore flags applied and truncated blocks merged.
- ``match_page(elements, markdown, name)`` -> ``PageMatch`` (the matched text, formula, table pairs
  and the reading-order pair); ``evaluate(pages, {name: markdown}, E2EConfig())`` -> ``E2EReport``
  (per-page ``PageResult`` rows, the summary metrics, counts, problems).

Reported numbers are page averages, as OmniDocBench reports them: see :mod:`.evaluate`.
Edits are 0-1 (lower is better); TEDS, CDM and Overall 0-100. CDM itself is not computed (it needs
a TeX toolchain); a CDM computed elsewhere can be passed in (``E2EConfig(formula_cdm=...)``),
otherwise Overall uses (1 - Formula Edit) x 100 and is flagged as a proxy.

Pure Python (rapidfuzz, apted, lxml, BeautifulSoup, pylatexenc, scipy); no ray, vllm or torch.
"""

from padoc_ray.eval.e2e.evaluate import E2EConfig, E2EReport, PageResult, evaluate
from padoc_ray.eval.e2e.gt import E2EInputError, GtPage, Problem, load_ground_truth, page_elements
from padoc_ray.eval.e2e.markdown import extract_markdown
from padoc_ray.eval.e2e.metrics import normalize, normalized_edit_distance, teds
from padoc_ray.eval.e2e.normalize import normalized_formula, normalized_html_table, normalized_text
from padoc_ray.eval.e2e.page import PageMatch, match_page

__all__ = [
    "E2EConfig", "E2EInputError", "E2EReport", "GtPage", "PageMatch", "PageResult", "Problem", "evaluate",
    "extract_markdown", "load_ground_truth", "match_page", "normalize", "normalized_edit_distance",
    "normalized_formula", "normalized_html_table", "normalized_text", "page_elements", "teds",
]
