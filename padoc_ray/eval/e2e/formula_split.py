"""Multi-line display formulas, as the OmniDocBench v1.6 matcher treats them.

A ground-truth or predicted formula whose whole body is one multi-line environment (``array`` with
an ``l``/``c``/``r`` column spec, ``aligned``, ``align``, ``split``, ``gather``, ``cases`` with
logic markers, ...) or a bare ``a \\\\ b`` is split into one formula per row, so a prediction that
wrote the rows as separate formulas can still match. Environments that read as one unit (a brace
``\\left\\{ ... \\right.`` around aligned conditions, nested environments, explanatory text rows)
stay whole. ``normalize_logic_brace_formula`` rewrites logic-style ``cases`` blocks into the
``\\left\\{ \\begin{array}{l} .. \\end{array} \\right.`` form the ground truth uses.

Pure string code reproducing upstream; positions of split predicted rows are recomputed from where
each row sits in the original string (rows are ordered by them).
"""

from __future__ import annotations

import re
from copy import deepcopy

from padoc_ray.eval.e2e.normalize import strip_formula_delimiters, strip_formula_tags

MULTILINE_ENVS = ("array", "aligned", "align", "align*", "alignedat", "alignedat*", "split", "gather", "gather*",
                  "gathered", "multline", "multline*", "flalign", "flalign*", "eqnarray", "eqnarray*", "cases")
_ENV_START = re.compile(r"^\\begin\{(?P<env>" + "|".join(re.escape(n) for n in MULTILINE_ENVS) + r")\}"
                        r"\s*(?P<extra>(?:\{[^{}]*\}\s*)*)", re.S)
_SPACING_TOKENS = re.compile(r"(?:\\qquad|\\quad|\\,|\\;|\\!|\\>|\\:|~)+")
_LABEL = re.compile(r"\\label\s*\{[^{}]*\}")
_TAG = re.compile(r"\\tag\*?\s*\{[^{}]*\}")
_ALIGNED = {"aligned", "align", "align*", "alignedat", "alignedat*"}
_LOGIC = re.compile(r"\\(?:Rightarrow|Leftrightarrow|Longrightarrow|Longleftrightarrow|"
                    r"longrightarrow|longleftrightarrow|implies|therefore|because|"
                    r"uparrow|downarrow|Updownarrow|forall|exists)\b|单调|否定")
_NESTED = re.compile(r"\\begin\{(?:array|aligned|align\*?|alignedat\*?|split|gathered?|multline\*?|flalign\*?|"
                     r"eqnarray\*?|cases)\}")
_CASE_LEAD = re.compile(r"^(?:\(?\d+\)?|\\(?:Rightarrow|Leftrightarrow|Longrightarrow|Longleftrightarrow|implies|"
                        r"therefore|uparrow|downarrow|Updownarrow|leftarrow|rightarrow))")
_EXPLANATION = re.compile(r"\\(?:text|mathrm|operatorname)\s*\{")


def _array_spec(spec: str) -> str:
    spec = re.sub(r"\s+|\|", "", str(spec or ""))
    return re.sub(r"!{[^}]*}", "", re.sub(r"@{[^}]*}", "", spec))


def _splittable_spec(spec: str) -> bool:
    spec = _array_spec(spec)
    if not spec or any(ch not in "lcr" for ch in spec):
        return False
    return len(spec) == 1 or (len(spec) == 2 and ("l" in spec or "r" in spec))


def _env_end(text: str, env: str, start: int) -> int:
    """Index of the ``\\end{env}`` closing an environment whose body starts at ``start`` (nesting
    of the same environment counted); -1 if none."""
    begin, end = f"\\begin{{{env}}}", f"\\end{{{env}}}"
    depth, i = 1, start
    while i < len(text):
        nb, ne = text.find(begin, i), text.find(end, i)
        if ne < 0:
            return -1
        if 0 <= nb < ne:
            depth, i = depth + 1, nb + len(begin)
            continue
        depth -= 1
        if depth == 0:
            return ne
        i = ne + len(end)
    return -1


def _escaped(text: str, i: int) -> bool:
    n, j = 0, i - 1
    while j >= 0 and text[j] == "\\":
        n, j = n + 1, j - 1
    return n % 2 == 1


def split_rows(body: str) -> list[str]:
    """Top-level ``\\\\`` rows of an environment body (nested environments and braces respected;
    ``\\\\*`` and ``\\\\[2pt]`` handled)."""
    rows, cur, braces, envs, i = [], [], 0, 0, 0
    while i < len(body):
        if body.startswith("\\begin{", i) or body.startswith("\\end{", i):
            is_begin = body.startswith("\\begin{", i)
            close = body.find("}", i + (7 if is_begin else 5))
            if close != -1:
                cur.append(body[i:close + 1])
                envs = envs + 1 if is_begin else max(0, envs - 1)
                i = close + 1
                continue
        if body.startswith("\\\\", i) and braces == 0 and envs == 0:
            row = "".join(cur).strip()
            if row:
                rows.append(row)
            cur, i = [], i + 2
            while i < len(body) and body[i].isspace():
                i += 1
            if i < len(body) and body[i] == "*":
                i += 1
            if i < len(body) and body[i] == "[":
                close = body.find("]", i + 1)
                if close != -1:
                    i = close + 1
            continue
        ch = body[i]
        cur.append(ch)
        if ch == "{" and not _escaped(body, i):
            braces += 1
        elif ch == "}" and not _escaped(body, i):
            braces = max(0, braces - 1)
        i += 1
    tail = "".join(cur).strip()
    if tail:
        rows.append(tail)
    return rows


def _alignment_cells(line: str) -> list[str]:
    cells, cur, envs, i = [], [], 0, 0
    while i < len(line):
        if line.startswith("\\begin{", i) or line.startswith("\\end{", i):
            is_begin = line.startswith("\\begin{", i)
            close = line.find("}", i + (7 if is_begin else 5))
            if close != -1:
                cur.append(line[i:close + 1])
                envs = envs + 1 if is_begin else max(0, envs - 1)
                i = close + 1
                continue
        if line[i] == "&" and envs == 0 and not _escaped(line, i):
            cells.append("".join(cur).strip())
            cur, i = [], i + 1
            continue
        cur.append(line[i])
        i += 1
    cells.append("".join(cur).strip())
    return cells


def _lstrip_amp(line: str) -> str:
    s = str(line or "").lstrip()
    while s.startswith("&"):
        s = s[1:].lstrip()
    return s


def _independent_lhs(row: str) -> bool:
    cells = _alignment_cells(row)
    return len(cells) > 1 and bool(strip_formula_tags(cells[0]).strip())


def _case_like(row: str) -> bool:
    lead = strip_formula_tags(_lstrip_amp(row)).strip()
    return bool(lead) and bool(_CASE_LEAD.match(lead))


def _explains(row: str) -> bool:
    return bool(_EXPLANATION.search(_lstrip_amp(row)))


def _aligned_cases_row(row: str) -> bool:
    return len(_alignment_cells(row)) > 1


def _logic_row(row: str) -> bool:
    return bool(_LOGIC.search(_lstrip_amp(row)))


def _split_cases(body: str, rows: list[str]) -> bool:
    if len(rows) <= 1 or any(_aligned_cases_row(r) for r in rows) or not _LOGIC.search(body):
        return False
    if _NESTED.search(body):
        return True
    return any(_logic_row(r) for r in rows[1:]) or any(_explains(r) for r in rows[1:]) or _logic_row(rows[0])


def _normalize_cases(body: str, rows: list[str], after: str) -> bool:
    if len(rows) <= 1 or any(_aligned_cases_row(r) for r in rows):
        return False
    after = after.lstrip()
    logic = bool(_LOGIC.search(body)) or bool(_LOGIC.search(after))
    following_env = bool(_ENV_START.match(after))
    if not logic and not following_env:
        return False
    return True  # every remaining upstream branch answers True here


def _keep_aligned(body: str, rows: list[str], braced: bool) -> bool:
    nested = bool(_NESTED.search(body))
    if nested and any(_case_like(r) for r in rows[1:]):
        return True
    if not braced:
        return False
    if nested or sum(1 for r in rows if _independent_lhs(r)) >= 2:
        return True
    return any(_explains(r) for r in rows[1:]) or any(_case_like(r) for r in rows[1:])


def _keep_array(spec: str, body: str, rows: list[str], braced: bool) -> bool:
    spec = _array_spec(spec)
    if not spec:
        return False
    if _NESTED.search(body) and any(_case_like(r) for r in rows[1:]):
        return True
    return braced and set(spec) <= {"l"} and len(rows) > 1


def _strip_end_labels(trailing: str) -> str:
    work = _LABEL.sub("", str(trailing or ""))
    while True:
        s = work.rstrip()
        if not s:
            return ""
        tag = _TAG.search(s)
        if tag and tag.end() == len(s):
            work = _rstrip_spacing(s[:tag.start()].rstrip())
            continue
        if s[-1] not in ")]":
            return s
        start = s.rfind("(" if s[-1] == ")" else "[")
        if start < 0:
            return s
        label, prefix = s[start + 1:-1].strip(), s[:start]
        if not _end_label(label, prefix):
            return s
        work = _rstrip_spacing(prefix)


def _rstrip_spacing(text: str) -> str:
    work = str(text or "").rstrip()
    while True:
        new = re.sub(r"(?:\\qquad|\\quad|\\,|\\;|\\!|\\>|\\:|~)\s*$", "", work).rstrip()
        if new == work:
            return work
        work = new


def _end_label(label: str, prefix: str) -> bool:
    label = str(label or "").strip()
    if not label:
        return False
    if prefix and not (prefix[-1].isspace() or _SPACING_TOKENS.search(prefix[-10:])):
        return False
    if re.fullmatch(r"[a-z]{1,3}", label):
        return False
    return bool(re.fullmatch(r"[A-Za-z0-9.\-#]+", label) or re.fullmatch(r"(?:\\[A-Za-z#]+)+", label))


def _env_parts(formula: str) -> dict | None:
    raw = str(formula or "")
    stripped = strip_formula_delimiters(raw).strip()
    if not stripped:
        return None
    prefix = re.match(r"^(?P<prefix>(?:\\left\s*\\\{|\\left\.))\s*", stripped)
    candidate = stripped[prefix.end():].lstrip() if prefix else stripped
    suffix = re.search(r"(?P<suffix>\s*\\right(?:\.|\\\}))\s*$", candidate)
    core = candidate[:suffix.start()].rstrip() if suffix else candidate
    start = _ENV_START.match(core)
    if not start:
        return None
    env = start.group("env")
    end_tag = f"\\end{{{env}}}"
    end = _env_end(core, env, start.end())
    if end < start.end():
        return None
    spec = ""
    if env == "array":
        groups = re.findall(r"\{([^{}]*)\}", start.group("extra"))
        spec = groups[0] if groups else ""
    body = core[start.end():end]
    trailing_suffix = _strip_end_labels(core[end + len(end_tag):]).strip()
    body_at = raw.find(body)
    body_at = body_at if body_at >= 0 else 0
    suffix_end = -1
    if trailing_suffix:
        end_at = raw.find(end_tag, body_at + len(body))
        if end_at >= 0:
            s = raw.find(trailing_suffix, end_at + len(end_tag))
            if s >= 0:
                suffix_end = s + len(trailing_suffix)
    return {"env": env, "spec": spec, "body": body, "rows": split_rows(body), "braced": bool(prefix or suffix),
            "trailing_suffix": trailing_suffix, "body_at": body_at, "suffix_end": suffix_end}


def _env_match(formula: str) -> dict | None:
    parts = _env_parts(formula)
    if not parts:
        return None
    env, body, rows, braced = parts["env"], parts["body"], parts["rows"], parts["braced"]
    if env == "cases" and not _split_cases(body, rows):
        return None
    if env in _ALIGNED and _keep_aligned(body, rows, braced):
        return None
    if env == "array" and (not parts["spec"] or not _splittable_spec(parts["spec"])
                           or _keep_array(parts["spec"], body, rows, braced)):
        return None
    if parts["trailing_suffix"] and len(split_rows(parts["trailing_suffix"])) > 1:
        return None
    return parts


def _multiline_match(formula: str) -> dict | None:
    """The environment to split by, else a bare top-level ``\\\\`` split (also tried when the
    environment itself was judged to stay whole)."""
    parts = _env_match(formula)
    if parts:
        return parts
    stripped = strip_formula_delimiters(str(formula or "")).strip()
    if not stripped or "\\\\" not in stripped or len(split_rows(stripped)) <= 1:
        return None
    at = str(formula or "").find(stripped)
    return {"env": "bare", "body": stripped, "body_at": at if at >= 0 else 0, "trailing_suffix": "", "suffix_end": -1}


def formula_rows(formula: str) -> tuple[dict, list[dict]] | None:
    """``(match info, [{"raw", "content"}, ...])`` when the formula should be split, else None."""
    info = _multiline_match(formula)
    if not info:
        return None
    rows = []
    for raw in split_rows(info["body"]):
        content = strip_formula_tags(raw).strip()
        if content:
            rows.append({"raw": raw, "content": content})
    if len(rows) <= 1:
        return None
    suffix = strip_formula_tags(info.get("trailing_suffix", "")).strip()
    if suffix:
        rows[-1]["content"] = f"{rows[-1]['content']} {suffix}".strip()
    return info, rows


def split_gt_formulas(items: list[dict]) -> list[dict]:
    """Ground-truth display formulas split into rows; row ``k`` (1-based) of a formula with order
    ``o`` gets order ``o + k/1000``."""
    out = []
    for item in items:
        split = formula_rows(item.get("latex", "")) if item.get("category_type") == "equation_isolated" else None
        if not split:
            out.append(item)
            continue
        base = float(item["order"])
        for k, row in enumerate(split[1], start=1):
            new = deepcopy(item)
            new["latex"] = f"\\[{row['content']}\\]"
            new["order"] = base + k / 1000.0
            out.append(new)
    return out


def split_pred_formulas(items: list[dict]) -> list[dict]:
    """Predicted display formulas split into rows, each row positioned where it sits in the page."""
    out = []
    for item in items:
        split = formula_rows(item.get("content", "")) if item.get("category_type") == "equation_isolated" else None
        if not split:
            out.append(item)
            continue
        info, rows = split
        key = "position" if "position" in item else "positions"
        origin, body, cursor = item[key][0], info["body"], 0
        for k, row in enumerate(rows):
            raw = strip_formula_tags(row["raw"]).strip()
            at = body.find(raw, cursor)
            at = cursor if at == -1 else at
            cursor = at + len(raw)
            start = origin + info["body_at"] + at
            end = start + len(raw) - 1
            if k == len(rows) - 1 and info.get("suffix_end", -1) > 0:
                end = origin + info["suffix_end"] - 1
            new = deepcopy(item)
            new["content"] = f"\\[{row['content'].strip()}\\]"
            new[key] = [start, end]
            out.append(new)
    return out


def normalize_logic_cases(text: str) -> tuple[str, bool]:
    out, cursor, changed = [], 0, False
    while cursor < len(text):
        b = text.find("\\begin{", cursor)
        if b < 0:
            out.append(text[cursor:])
            break
        out.append(text[cursor:b])
        start = _ENV_START.match(text[b:])
        if not start:
            out.append(text[b:b + 7])
            cursor = b + 7
            continue
        env = start.group("env")
        end_tag = f"\\end{{{env}}}"
        body_start = b + start.end()
        end = _env_end(text, env, body_start)
        if end < body_start:
            out.append(text[b:])
            break
        body, body_changed = normalize_logic_cases(text[body_start:end])
        after = text[end + len(end_tag):end + len(end_tag) + 200]
        if env == "cases" and _normalize_cases(body, split_rows(body), after):
            out.append("\\left\\{ \\begin{array}{l} " + body.strip() + " \\end{array} \\right.")
            changed = True
        else:
            out.append(text[b:body_start] + body + end_tag)
            changed = changed or body_changed
        cursor = end + len(end_tag)
    return "".join(out), changed


def normalize_logic_brace_formula(formula: str) -> str:
    new, changed = normalize_logic_cases(str(formula or ""))
    return new if changed else str(formula or "")


# --------------------------------------------------------------------------------------------------
# re-grouping rows

def merged_content(parts: list[str]) -> str:
    """Formulas joined as the rows of one ``\\begin{array}{l}`` (a single formula as it is)."""
    pieces = ["{" + s + "}" for s in (strip_formula_delimiters(str(p or "").strip()) for p in parts) if s]
    if not pieces:
        return ""
    if len(pieces) == 1:
        return pieces[0][1:-1]
    return "\\begin{array}{l} " + " \\\\ ".join(pieces) + " \\end{array}"


def wrap_display(content: str) -> str:
    """``\\[ content \\]`` unless already wrapped in display/inline delimiters."""
    s = str(content or "").strip()
    if not s:
        return ""
    if (s.startswith("$$") and s.endswith("$$")) or (s.startswith("\\[") and s.endswith("\\]")) or \
            (s.startswith("\\(") and s.endswith("\\)")):
        return s
    return f"\\[{s}\\]"


def partitions(items: list[dict]) -> list[list[list[dict]]]:
    """Every split of ``items`` into consecutive groups (2^(n-1) of them, in upstream's order)."""
    n = len(items)
    if n <= 0:
        return []
    if n == 1:
        return [[items]]
    out = []
    for mask in range(1 << (n - 1)):
        start, groups = 0, []
        for b in range(n - 1):
            if mask & (1 << b):
                groups.append(items[start:b + 1])
                start = b + 1
        groups.append(items[start:n])
        out.append(groups)
    return out


def merge_segment(items: list[dict]) -> dict:
    """Consecutive predicted formula rows as one display formula spanning their positions."""
    if len(items) == 1:
        return dict(items[0])
    merged = dict(items[0])
    merged["content"] = wrap_display(merged_content([it.get("content", "") for it in items]))
    merged["position"] = [items[0].get("position", ["", ""])[0], items[-1].get("position", ["", ""])[1]]
    merged["fine_category_type"] = "equation_isolated"
    return merged
