"""Split one page of predicted Markdown into the items OmniDocBench v1.6 scores.

:func:`extract_markdown` returns ``{category: [item, ...]}``; each item is a dict with
``category_type`` (``text_all``, ``equation_isolated``, ``formula_rescue``, ``html_table``,
``latex_table``), ``position`` ``[start, end]`` (character offsets, used only for ordering),
``content`` and usually ``fine_category_type`` (``text_block``, ``equation_inline``, ``code``,
``md2html_table``, ``text_formula``, ``image_formula``, ``table_formula_rescue``, ``equation_caption``).

The steps follow the upstream ``md_tex_filter``: image alt texts become formula candidates and the
images vanish; LaTeX tables, then HTML tables are cut out; then display math (``$$..$$``,
``\\[..\\]``; inline ``$..$``/``\\(..\\)`` spans are recorded as ``equation_inline`` formulas but
stay in the text); pipe tables are converted to HTML and cut out; fenced code; the rest is split
into text blocks at blank lines. Quirks that change scores are kept and marked ``quirk``.

LaTeX tables: upstream converts them with the external ``latexmlc`` tool; without it (as here, and
in a default upstream install) they are cut out of the text and yield an empty table prediction.
"""

from __future__ import annotations

import re
from collections import defaultdict

from bs4 import BeautifulSoup

from padoc_ray.eval.e2e.rescue import (add_display_formula, add_formula_rescue, drop_short_inline_formula,
                                       table_cell_formulas)

_IMAGE = re.compile(r"!\[(.*?)\]\((.*?)\)")
_IMAGE_ANY = re.compile(r"!\[.*?\]\(.*?\)")
_DISPLAY_MATH = re.compile(r"\$\$(.*?)\$\$|\\\[(.*?)\\\]|\$(.*?)\$|\\\((.*?)\\\)", re.DOTALL)
_DOLLARS = re.compile(r"\$\$(.*?)\$\$|\$(.*?)\$|\\\((.*?)\\\)", re.DOTALL)
_PIPE_ROW = re.compile(r"\|\s*.*?\s*\|\n", re.DOTALL)
_HTML_TABLE_SPAN = re.compile(r"(<table.*?</table>)", re.DOTALL)
_CODE = re.compile(r"```(\w+)\n(.*?)```", re.DOTALL)


def _blank(content: str, start: int, end: int) -> str:
    """Replace a span by spaces: every later offset stays valid."""
    return content[:start] + " " * (end - start) + content[end:]


def strip_fences(content: str) -> str:
    content = re.sub(r"^```markdown\n?", "", content, flags=re.MULTILINE)
    content = re.sub(r"^```html\n?", "", content, flags=re.MULTILINE)
    content = re.sub(r"^```latex\n?", "", content, flags=re.MULTILINE)
    return re.sub(r"```\n?$", "", content, flags=re.MULTILINE)  # quirk: removes any ``` ending a line


def squeeze_runs(content: str) -> str:
    return re.sub(r" {4,}", "    ", re.sub(r"_{4,}", "____", content))


# --------------------------------------------------------------------------------------------------
# nested-environment scanners (LaTeX tabular, HTML table)

def _scan_nested(text: str, begin_pattern: str, end_pattern: str) -> tuple[list[str], list[tuple[int, int]]]:
    """Outermost ``begin ... end`` spans. Reproduces upstream offsets exactly: after a begin match
    the cursor moves by ``len(end_pattern)`` and a span ends ``len(end_pattern)`` characters after
    the end match's start, where the lengths are those of the *regex source strings* (quirk: for
    ``\\\\end{tabular}`` that is one more than the matched text, so the span takes one extra char);
    an unclosed begin restarts the scan ``len(begin_pattern)`` characters after it."""
    found, spans, pos, stack = [], [], 0, []
    while pos < len(text):
        b = re.search(begin_pattern, text[pos:])
        e = re.search(end_pattern, text[pos:])
        if not b and not e:
            break
        if b and (not e or b.start() < e.start()):
            stack.append(pos + b.start())
            pos += b.start() + len(end_pattern)
        else:
            if stack:
                start = stack.pop()
                if not stack:
                    end = pos + e.start() + len(end_pattern)
                    found.append(text[start:end])
                    spans.append((start, end))
            pos += e.start() + len(end_pattern)
    if stack:
        offset = stack[0] + len(begin_pattern)
        more, more_spans = _scan_nested(text[offset:], begin_pattern, end_pattern)
        found.extend(more)
        spans.extend((s + offset, t + offset) for s, t in more_spans)
    return found, spans


def latex_tables(content: str) -> list[tuple[str, tuple[int, int]]]:
    """``\\begin{table}..\\end{table}`` blocks, then outermost tabulars outside them, by position."""
    out = []
    for m in re.finditer(r"\\begin{table}(.*?)\\end{table}", content, re.DOTALL):
        out.append((m.group(0), (m.start(), m.end())))
        content = _blank(content, m.start(), m.end())
    tabs, spans = _scan_nested(content, r"\\begin{tabular}", r"\\end{tabular}")
    out.extend(zip(tabs, spans))
    return sorted(out, key=lambda t: t[1][0])


def html_tables(content: str) -> list[tuple[str, tuple[int, int]]]:
    tabs, spans = _scan_nested(content, r"<table(?:[^>]*)>", r"</table>")
    return list(zip(tabs, spans))


# --------------------------------------------------------------------------------------------------
# pipe tables -> HTML (upstream's converter, whose output is then cut out like an HTML table)

def _pipe_row_table(block: str) -> str:
    rows = [r.strip() for r in block.strip().split("\n")]
    out = "<table>\n  <thead>\n    <tr>\n"
    for cell in rows[0].split("|")[1:-1]:
        out += f"      <th>{cell.strip()}</th>\n"
    out += "    </tr>\n  </thead>\n  <tbody>\n"
    for row in rows[2:]:
        out += "    <tr>\n"
        for cell in row.split("|")[1:-1]:
            out += f"      <td>{cell.strip()}</td>\n"
        out += "    </tr>\n"
    return out + "  </tbody>\n</table>\n"


def _merge_table_block(block: str) -> str:
    """All ``<table>`` blocks of a run merged into one table (``th`` -> ``td``; a block of two lines
    or fewer, such as a separator row, is dropped)."""
    block = re.sub(r"<!--[\s\S]*?-->", "", block)
    rows = []
    for table in re.findall(r"<table>[\s\S]*?</table>", block):
        lines = [ln.replace("<th>", "<td>").replace("</th>", "</td>") if "<th>" in ln else ln
                 for ln in table.split("\n")]
        lines = [ln for ln in lines if not re.search(r"</?t(able|head|body)>", ln)]
        if len(lines) > 2:
            rows.extend(lines)
    return "\n\n" + "<table>\n{}\n</table>".format("\n".join(rows)) + "\n\n"


def _separator_like(line: str) -> bool:
    return ":" in line or "---" in line


def _merge_table_runs(text: str) -> str:
    """Line scanner that merges runs of converted one-row tables. Quirk kept: the line just before a
    run is swallowed into the run (and lost), and the output gains a leading empty line."""
    out, in_block, block, last = [], False, "", ""
    for line in text.split("\n"):
        if "<table>" in line:
            in_block = True
            block += last
        elif in_block:
            if not _separator_like(last) and "</thead>" not in last:
                block += "\n" + last
            if "</table>" in last and "<table>" not in line:
                in_block = False
                out.append(_merge_table_block(block))
                block = ""
        else:
            out.append(last)
        last = line
    if last:
        if in_block or "</table>" in last:
            out.append(_merge_table_block(block + "\n" + last))
        else:
            out.append(last)
    return "\n".join(out)


def pipe_tables_to_html(content: str) -> str:
    content = content.replace("\r", "") + "\n"
    for row in _PIPE_ROW.findall(content):
        content = content.replace(row, _pipe_row_table(row), 1)
    out = _merge_table_runs(content)
    return out.replace("<table>", '<table border="1" >').replace("<td>", '<td colspan="1" rowspan="1">')


# --------------------------------------------------------------------------------------------------
# text blocks

def _html_fragment_text(text: str) -> str:
    """A text block that is a ``<div>``/``<dir>`` fragment becomes its text, one line per block."""
    if not isinstance(text, str):
        return text
    stripped = text.strip()
    if not stripped or "<table" in stripped.lower() or not re.match(r"^<(div|dir)\b", stripped, flags=re.IGNORECASE):
        return stripped
    soup = BeautifulSoup(stripped, "html.parser")
    for tag in soup.find_all(["style", "script"]):
        tag.decompose()
    for tag in soup.find_all(["span", "font", "b", "strong", "i", "em", "u", "a", "sup", "sub"]):
        tag.unwrap()
    for br in soup.find_all("br"):
        br.replace_with("\n")
    for tag in soup.find_all(["div", "dir", "p", "li"]):
        if not tag.contents or tag.contents[-1] != "\n":
            tag.append("\n")
    text = soup.get_text(separator="").replace("\xa0", " ")
    text = re.sub(r"[ \t]*\n[ \t]*", "\n", text)
    return "\n".join(ln.strip() for ln in text.split("\n") if ln.strip()).strip() or stripped


_DESCRIPTION_PREFIXES = ("the image ", "the image displays", "the figure ", "the figure shows", "the diagram ",
                         "diagram:", "[diagram:", "[image:", "qr code ")


def _unmath_image_descriptions(content: str) -> str:
    """Paragraphs that describe an image ("The figure shows ...") lose their inline math delimiters."""
    blocks = re.split(r"(\n\s*\n)", content)
    for i in range(0, len(blocks), 2):
        compact = " ".join(blocks[i].split()).strip().lower()
        if len(compact) >= 24 and compact.startswith(_DESCRIPTION_PREFIXES):
            b = re.sub(r"\\\((.*?)\\\)", lambda m: m.group(1), blocks[i], flags=re.DOTALL)
            blocks[i] = re.sub(r"\$(.*?)\$", lambda m: m.group(1), b, flags=re.DOTALL)
    return "".join(blocks)


def _strip_latex_text_commands(content: str) -> str:
    content = re.sub(r"\\title\{(.*?)\}", r"\1", content)
    content = re.sub(r"\\title\s*\{\s*(.*?)\s*\}", r"\1", content, flags=re.DOTALL)
    content = re.sub(r"\\text\s*\{\s*(.*?)\s*\}", r"\1", content, flags=re.DOTALL)
    content = re.sub(r"\\section\*?\{(.*?)\}", r"\1", content)
    return re.sub(r"\\section\*?\{\s*(.*?)\s*\}", r"\1", content, flags=re.DOTALL)


def _text_blocks(content: str, items: list[dict]) -> None:
    parts = content.split("\n\n")
    if len(parts) == 1:
        parts = content.split("\n")
    cursor = 0
    for part in parts:
        # quirk: the separator is not counted, so text offsets drift behind the true ones (this
        # decides how text blocks sort against formulas and tables)
        position = [cursor, cursor + len(part)]
        cursor += len(part)
        text = part.strip().strip("\n")
        text = "\n".join(ln.strip() for ln in text.split("\n") if ln.strip())
        text = _html_fragment_text(text)
        text = text.strip() if text else text
        if text:
            items.append({"category_type": "text_all", "position": position, "content": text,
                          "fine_category_type": "text_block"})
            add_formula_rescue(items, text, position, "text_formula")


# --------------------------------------------------------------------------------------------------

def _display_math(content: str, items: list[dict]) -> str:
    for m in _DISPLAY_MATH.finditer(content):  # iterates the string as it was before blanking
        line = " ".join(m.group(0).strip().split("\n"))
        position = [m.start(), m.end()]
        inner = _DOLLARS.search(line)
        if inner is None:  # \[ .. \]
            content = _blank(content, *position)
            add_display_formula(items, line, position)
        elif inner.group(1):  # $$ .. $$
            content = _blank(content, *position)
            add_display_formula(items, _DOLLARS.sub(r"\\[\1\\]", line), position)
        else:  # $ .. $ or \( .. \): recorded as an inline formula, left in the text
            add_display_formula(items, _DOLLARS.sub(r"\\[\2\3\\]", line), position, fine="equation_inline")
    return content


def extract_markdown(content: str) -> dict[str, list[dict]]:
    """Items of one predicted page, grouped by ``category_type`` (see the module docstring)."""
    items: list[dict] = []
    for m in _IMAGE.finditer(content):
        add_formula_rescue(items, (m.group(1) or "").strip(), [m.start(), m.end()], "image_formula")
    content = _IMAGE_ANY.sub(lambda m: " " * len(m.group(0)), content)
    content = squeeze_runs(strip_fences(content))
    for tag in ("<html>", "</html>", "<body>", "</body>"):
        content = content.replace(tag, "")
    content = _unmath_image_descriptions(content)

    for latex, (start, _) in latex_tables(content):
        end = start + len(latex)
        items.append({"category_type": "latex_table", "position": [start, end], "content": latex,
                      "fine_category_type": "latex_table"})
        content = _blank(content, start, end)
    for table, (start, _) in html_tables(content):
        position = [start, start + len(table)]
        items.append({"category_type": "html_table", "position": position, "content": table})
        items.extend(table_cell_formulas(table, position))
        content = _blank(content, *position)

    content = _display_math(content, items)

    if len(_PIPE_ROW.findall(content + "\n")) >= 2:
        content = pipe_tables_to_html(content)
        for m in _HTML_TABLE_SPAN.finditer(content):
            position = [m.start(), m.end()]
            content = _blank(content, *position)
            table = m.group(0).strip()
            items.append({"category_type": "html_table", "position": position, "content": table,
                          "fine_category_type": "md2html_table"})
            items.extend(table_cell_formulas(table, position))

    for m in _CODE.finditer(content):
        content = _blank(content, m.start(), m.end())
        items.append({"category_type": "text_all", "position": [m.start(), m.end()], "content": m.group(2).strip(),
                      "language": m.group(1), "fine_category_type": "code"})

    _text_blocks(_strip_latex_text_commands(content), items)

    grouped: dict[str, list[dict]] = defaultdict(list)
    for item in sorted(items, key=lambda it: it["position"][0]):
        if not drop_short_inline_formula(item):
            grouped[item["category_type"]].append(item)
    return grouped
