"""Formula heuristics of the OmniDocBench v1.6 Markdown extraction.

v1.6 lets a display formula be matched to a prediction that wrote it as plain text, as an image's
alt text or inside a table cell ("formula rescue" candidates); it splits a display formula that is
really several independent arithmetic statements joined by ``\\quad``; and it peels equation numbers
and trailing captions off display formulas. These heuristics only produce extra candidate items;
which ones are used is decided by the matcher. Pure string code, reproducing upstream.
"""

from __future__ import annotations

import re

from bs4 import BeautifulSoup

from padoc_ray.eval.e2e.normalize import latex_to_text

_FORMULA_TOKEN = re.compile(
    r"(\\frac|\\sqrt|\\sum|\\int|\\prod|\\times|\\div|\\square|\\cdots|\\left|\\right|"
    r"\\approx|\\xrightarrow|\\rightarrow|\\longrightarrow|"
    r"=|<|>|≤|≥|≈|÷|×|±|∑|∫|√|→|\^|_|□|△|…|%|/|\+|-)")
_CJK = re.compile(r"[\u4e00-\u9fff]")
_WORD4 = re.compile(r"[A-Za-z]{4,}")
_INLINE = re.compile(r"\$(.*?)\$|\\\((.*?)\\\)")
_DISPLAY = re.compile(r"\$\$(.*?)\$\$|\\\[(.*?)\\\]", re.DOTALL)


def unwrap_math_keep_content(text: str) -> str:
    """Every ``$$..$$``, ``\\[..\\]``, ``\\(..\\)``, ``$..$`` replaced by `` content ``."""
    if not isinstance(text, str):
        return ""
    for pattern in (r"\$\$(.*?)\$\$", r"\\\[(.*?)\\\]", r"\\\((.*?)\\\)", r"\$(.*?)\$"):
        text = re.sub(pattern, lambda m: f" {m.group(1)} ", text, flags=re.DOTALL)
    return text


def formula_like(text: str) -> bool:
    """Short text that is mostly arithmetic (operators, digits, a little math markup)."""
    text = " ".join(str(text or "").split())
    if not text or len(text) > 220:
        return False
    bare = unwrap_math_keep_content(text)
    compact = re.sub(r"\s+", "", bare)
    if not compact:
        return False
    operators = len(_FORMULA_TOKEN.findall(bare))
    digits = len(re.findall(r"\d", bare))
    math_spans = len(list(_INLINE.finditer(text))) + len(list(_DISPLAY.finditer(text)))
    cjk = len(_CJK.findall(bare))
    words = len(_WORD4.findall(bare))
    residual = re.sub(r"(\\[A-Za-z]+|[=<>≤≥÷×±∑∫√\^_□△…%/()+\-])", " ", bare)
    residual = re.sub(r"\s+", "", re.sub(r"\d", " ", residual))
    if math_spans > 0 and len(residual) <= 18 and operators >= 1:
        return True
    if ("□" in bare or "\\square" in bare) and operators >= 1 and words <= 1 and len(compact) <= 80:
        return True
    if ("\\xrightarrow" in bare or "\\longrightarrow" in bare or "→" in bare) and cjk <= 24 and len(compact) <= 120:
        return True
    if operators >= 2 and digits >= 1 and words <= 2 and cjk <= 12 and len(compact) <= 100:
        return True
    return operators >= 3 and words == 0 and cjk <= 18 and len(compact) <= 80


_SANITIZE = (("……", " \\cdots \\cdots "), ("…", " \\cdots "), ("×", " \\times "), ("÷", " \\div "), ("≤", " \\leq "),
             ("≥", " \\geq "), ("≠", " \\neq "), ("≈", " \\approx "), ("□", " \\square "), ("△", " \\triangle "),
             ("（", "("), ("）", ")"), ("［", "["), ("］", "]"), ("｛", "{"), ("｝", "}"))
_REDOX = "氧化还原反应"


def formula_candidate(text: str) -> str:
    """Turn formula-like plain text into a display formula ``\\[ .. \\]`` (Unicode operators to
    LaTeX, ``%``/``&`` escaped); ``""`` if nothing is left."""
    text = " ".join(str(text or "").replace("\u3000", " ").split())
    if not text:
        return ""
    text = unwrap_math_keep_content(text)
    for src, dst in _SANITIZE:
        text = text.replace(src, dst)
    arrow = re.search(r"(?P<lhs>.*?)\\xrightarrow\s*\{(?P<label>[^{}]+)\}(?P<rhs>.*)", text)
    if arrow:
        lhs, label, rhs = arrow.group("lhs").strip(), arrow.group("label").strip(), arrow.group("rhs").strip()
        if label and "\\" not in label:
            label = f"\\text{{{label}}}"
        if rhs.endswith(_REDOX):
            text = f"{lhs} \\underset{{{_REDOX}}}{{\\xrightarrow{{{label}}}}} {rhs[:-len(_REDOX)].strip()}".strip()
        else:
            text = f"{lhs} \\xrightarrow{{{label}}} {rhs}".strip()
    text = re.sub(r"(?<!\\)%", r"\\%", text)
    text = re.sub(r"(?<!\\)&", r"\\&", text)
    text = re.sub(r"\s+", " ", text).strip()
    if not text:
        return ""
    if text.startswith("\\begin{") or text.startswith("$$") or text.startswith("\\["):
        return text
    return "\\[ " + text + " \\]"


def _table_cell_formula(text: str) -> bool:
    compact = " ".join(str(text or "").split())
    if not compact or len(compact) > 120 or not formula_like(compact):
        return False
    digits = len(re.findall(r"\d", compact))
    fraction = "\\frac" in compact or bool(re.search(r"\d+\s*/\s*\d+", compact))
    operators = sum(t in compact for t in ("=", "+", "-", "×", "÷", "/", "≈", "\\times", "\\div", "\\approx"))
    if operators < 1:
        return False
    return digits >= 2 or fraction


def table_cell_formulas(table_html: str, position: list[int]) -> list[dict]:
    """Formula candidates for the formula-like cells of a predicted HTML table (pseudo positions
    counted from the table's start)."""
    try:
        soup = BeautifulSoup(str(table_html or ""), "html.parser")
    except Exception:  # bs4's html.parser raises on some broken markup; upstream skips the table then
        return []
    items, cursor = [], max(int(position[0]), 0)
    for cell in soup.find_all(["td", "th"]):
        text = " ".join(cell.get_text(separator=" ").split())
        if not _table_cell_formula(text):
            continue
        content = formula_candidate(text)
        if not content:
            continue
        end = cursor + max(len(text), 1)
        items.append({"category_type": "equation_isolated", "position": [cursor, end], "content": content,
                      "fine_category_type": "table_formula_rescue"})
        cursor = end + 1
    return items


def add_formula_rescue(items: list[dict], text: str, position: list[int], fine: str) -> None:
    """Append a rescue candidate for ``text`` if it looks like a formula (an arrow reaction counts as
    a real display formula, anything else as ``formula_rescue``)."""
    if not formula_like(text):
        return
    content = formula_candidate(text)
    if not content:
        return
    arrow = "\\xrightarrow" in content or "\\longrightarrow" in content
    category = "equation_isolated" if arrow else "formula_rescue"
    items.append({"category_type": category, "position": position, "content": content, "fine_category_type": fine})


# --------------------------------------------------------------------------------------------------
# display formulas: equation numbers / captions at the margins, compound arithmetic

_WRAPPERS = (("\\[", "\\]"), ("\\(", "\\)"), ("$$", "$$"), ("$", "$"))
_SPACING = r"(?:\\qquad|\\quad|\\enspace|\\,|\\;|\\:)"
_LEADING_NUMBER = re.compile(r"^\s*(?P<prefix>(?:\\left\(\s*[0-9IVXivx]+\s*\\right\)|\(\s*[0-9IVXivx]+\s*\)))\s*"
                             r"(?:" + _SPACING + r"\s*)*")
_TRAILING_CAPTIONS = (re.compile(r"(?P<sep>" + _SPACING + r"\s*)(?P<caption>\\text\s*\{[^{}]*\}\.?)\s*$"),
                      re.compile(r"(?P<sep>" + _SPACING + r"\s*)(?P<caption>\([^)]*[A-Za-z][^)]*\)\.?)\s*$"))


def _unwrap(text: str) -> tuple[str, str, str]:
    text = " ".join(str(text or "").split())
    for left, right in _WRAPPERS:
        if text.startswith(left) and text.endswith(right) and len(text) >= len(left) + len(right):
            return left, right, text[len(left):len(text) - len(right)].strip()
    return "", "", text


def _wrap(inner: str, left: str, right: str) -> str:
    inner = str(inner or "").strip()
    if not inner:
        return ""
    return f"{left} {inner} {right}" if left and right else inner


def latex_fragment_text(text: str) -> str:
    text = str(text or "").strip()
    if not text:
        return ""
    try:
        plain = latex_to_text(text, fallback=text, kind="formula")
    except Exception:
        plain = text
    return re.sub(r"\s+", " ", plain.replace("\xa0", " ")).strip()


def _looks_like_caption(text: str) -> bool:
    raw = str(text or "").strip()
    plain = latex_fragment_text(raw) if raw else ""
    if not plain:
        return False
    letters = len(re.findall(r"[A-Za-z]", plain))
    words = re.findall(r"[A-Za-z]{2,}", plain)
    math = len(re.findall(r"(\\[A-Za-z]+|[=<>≤≥÷×±∑∫√_^{}])", raw))
    digits = len(re.findall(r"\d", plain))
    core = plain[1:-1].strip() if plain.startswith("(") and plain.endswith(")") else plain
    if re.fullmatch(r"[0-9IVXivx]+", core.replace(" ", "")):
        return False
    return (letters >= 10 and len(words) >= 2 and math <= 6) or (letters >= 14 and digits == 0 and math <= 3)


def _margin_text_item(text: str, position: list[int]) -> dict | None:
    plain = latex_fragment_text(text)
    if not plain:
        return None
    return {"category_type": "text_all", "position": position, "content": plain,
            "fine_category_type": "equation_caption"}


def has_margin_text(formula: str) -> bool:
    """A leading ``(3)`` or a trailing ``\\quad \\text{...}`` caption inside a display formula."""
    compact = " ".join(str(formula or "").split())
    if not compact:
        return False
    inner = _unwrap(compact)[2]
    if not inner:
        return False
    if _LEADING_NUMBER.match(inner):
        return True
    for pattern in _TRAILING_CAPTIONS:
        m = pattern.search(inner)
        if m and _looks_like_caption(m.group("caption")):
            return True
    return False


def split_margin_text(formula: str, position: list[int]) -> tuple[str, list[dict]]:
    """Cut an equation number / trailing caption out of a display formula into text items."""
    compact = " ".join(str(formula or "").split())
    if not compact:
        return compact, []
    left, right, inner = _unwrap(compact)
    if not inner:
        return compact, []
    extra, work = [], inner
    lead = _LEADING_NUMBER.match(work)
    if lead:
        prefix = lead.group("prefix").strip()
        item = _margin_text_item(prefix, [position[0], min(position[1], position[0] + max(len(prefix), 1))])
        if item:
            extra.append(item)
        work = work[lead.end():].strip()
    while work:
        for pattern in _TRAILING_CAPTIONS:
            m = pattern.search(work)
            if not m or not _looks_like_caption(m.group("caption").strip()):
                continue
            caption = m.group("caption").strip()
            item = _margin_text_item(caption, [max(position[0], position[1] - max(len(caption), 1)), position[1]])
            if item:
                extra.append(item)
            work = work[:m.start("sep")].rstrip()
            break
        else:
            break
    work = re.sub(r"(?:" + _SPACING + r"\s*)+$", "", work).strip()
    if not work:
        return compact, []
    return _wrap(work, left, right), extra


def _compound_part(segment: str) -> bool:
    compact = " ".join(str(segment or "").split())
    if not compact or len(compact) > 160 or "\\begin{" in compact or "\\end{" in compact:
        return False
    if re.search(r"\\(mathbf|left|right|cdot|lambda|Gamma|varGamma|text|matrix|pmatrix|bmatrix)", compact):
        return False
    digits = len(re.findall(r"\d", compact))
    fraction = "\\frac" in compact or bool(re.search(r"\d+\s*/\s*\d+", compact))
    relations = sum(t in compact for t in ("=", "\\approx", "≈", "\\neq", "≠", "\\leq", "≤", "\\geq", "≥"))
    if relations < 1:
        return False
    return digits >= 2 or fraction


def split_compound_formula(formula: str, position: list[int]) -> list[dict]:
    """``\\[ 1+1=2 \\quad 2+2=4 \\]`` -> two display formulas (only when every part is an arithmetic
    statement); ``[]`` otherwise."""
    compact = " ".join(str(formula or "").split())
    if not compact:
        return []
    left, right, inner = _unwrap(compact)
    if not inner or ("\\quad" not in inner and "\\qquad" not in inner):
        return []
    parts = [p.strip() for p in re.split(r"\s*(?:\\qquad|\\quad)\s*", inner) if p.strip()]
    if len(parts) <= 1 or not all(_compound_part(p) for p in parts):
        return []
    span = max(position[1] - position[0], len(parts))
    step = max(span // len(parts), 1)
    out = []
    for i, part in enumerate(parts):
        start = position[0] + i * step
        end = position[1] if i == len(parts) - 1 else min(position[1], start + step)
        out.append({"category_type": "equation_isolated", "position": [start, end],
                    "content": _wrap(part, left, right)})
    return out


def add_display_formula(items: list[dict], formula: str, position: list[int], fine: str | None = None) -> None:
    """Append a display formula item (margin text split off, compound statements split apart)."""
    if has_margin_text(formula):
        formula, extra = split_margin_text(formula, position)
    else:
        extra = []
    parts = split_compound_formula(formula, position)
    if parts:
        for part in parts:
            if fine:
                part["fine_category_type"] = fine
        items.extend(parts)
    else:
        item = {"category_type": "equation_isolated", "position": position, "content": formula}
        if fine:
            item["fine_category_type"] = fine
        items.append(item)
    items.extend(extra)


def drop_short_inline_formula(item: dict) -> bool:
    """Inline ``$..$`` spans that are only a label (``$x_1$`` kept, ``$A$``/``$v2.0$`` dropped), or
    an arrow on its own."""
    if item.get("category_type") != "equation_isolated" or item.get("fine_category_type") != "equation_inline":
        return False
    raw = str(item.get("content", "") or "").strip()
    if not raw:
        return False
    core = unwrap_math_keep_content(raw)
    compact = re.sub(r"\s+", "", core)
    if compact.startswith("\\xrightarrow") or compact.startswith("\\longrightarrow"):
        return True
    if not compact or len(compact) > 24:
        return False
    strong = ("=", "<", ">", "≤", "≥", "≈", "≠", "^", "+", "-", "/", "\\cdot", "\\frac", "\\sqrt", "\\sum", "\\int",
              "\\times", "\\div", "\\approx", "\\neq", "\\leq", "\\geq", "\\xrightarrow", "\\longrightarrow")
    if any(t in core for t in strong):
        return False
    label = compact or re.sub(r"\s+", "", latex_fragment_text(raw))
    if not label:
        return False
    return bool(re.fullmatch(r"[A-Za-z0-9._,-]+", label) or re.fullmatch(r"[A-Za-z][A-Za-z0-9_.,-]*", label)
                or re.fullmatch(r"[A-Za-z0-9]+Oy", label) or re.fullmatch(r"[ΓγλμνxyzuvwMNOabcABC0-9._,-]+", label))
