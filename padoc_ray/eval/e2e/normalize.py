"""String normalizations of the OmniDocBench v1.6 end-to-end protocol.

What is compared is never the raw string: text blocks keep only word characters and CJK
(``normalized_text``), display formulas drop spacing, font and delimiter commands
(``normalized_formula``), tables are reduced to one canonical ``<table>`` HTML string
(``normalized_html_table``). Inline LaTeX inside text is turned into Unicode with pylatexenc, behind
the same guards as the upstream evaluator (malformed or prose-like LaTeX is kept as it is).

Each function reproduces the upstream behaviour string for string, quirks included (they change the
scores); comments mark the quirks. This module knows nothing of pages, matching or metrics.
"""

from __future__ import annotations

import html
import logging
import re
import unicodedata
from contextlib import contextmanager

from bs4 import BeautifulSoup, NavigableString
from pylatexenc.latex2text import LatexNodes2Text

# --------------------------------------------------------------------------------------------------
# circled characters

_CIRCLED = {chr(0x2460 + i): str(i + 1) for i in range(20)}
_CIRCLED.update({chr(0x24D0 + i): chr(ord("a") + i) for i in range(26)})
_CIRCLED.update({chr(0x24B6 + i): chr(ord("A") + i) for i in range(26)})
_TEXTCIRCLED = re.compile(r"\\textcircled\s*\{\s*([^{}]+?)\s*\}")


def replace_circled(text: str) -> str:
    """``①`` -> ``1``, ``ⓐ`` -> ``a``, ``\\textcircled{3}`` -> ``3``."""
    text = _TEXTCIRCLED.sub(lambda m: m.group(1).strip(), str(text))
    return "".join(_CIRCLED.get(ch, ch) for ch in text)


# --------------------------------------------------------------------------------------------------
# guarded LaTeX -> Unicode text

_MAX_LATEX_LEN = 8000
_SIGNAL = re.compile(r"\\[A-Za-z]+|[_^{}$]|\\[\[\]()]]|&|%|#")
_WORD3 = re.compile(r"[A-Za-z]{3,}")
_COMMAND = re.compile(r"\\[A-Za-z]+")
_ENV = re.compile(r"\\(begin|end)\{([^{}]+)\}")
_NOISE_COMMANDS = ("\\frac", "\\sqrt", "\\left", "\\right", "\\begin", "\\end", "\\sum", "\\int", "\\alpha", "\\beta")
_PYLATEXENC_LOGGERS = ("pylatexenc", "pylatexenc.latexwalker", "pylatexenc.latexwalker._walker",
                       "pylatexenc.macrospec", "pylatexenc.macrospec._environmentbodyparser")
_L2T = LatexNodes2Text()


def _prose_not_latex(s: str) -> bool:
    """A long line of plain words with almost no LaTeX signal: converting it would only damage it."""
    if len(s) < 32 or len(_SIGNAL.findall(s)) > 2:
        return False
    if any(c in s for c in "{}$^_") or any(t in s for t in _NOISE_COMMANDS):
        return False
    return len(_WORD3.findall(s)) >= 6 and s.count(" ") >= 5


def _weak_latex(s: str, kind: str) -> bool:
    if s in ("\\", "\\\\"):
        return True
    commands = len(_COMMAND.findall(s))
    words = len(_WORD3.findall(s))
    signals = sum(ch in "{}$^_=&%#" for ch in s)
    if s.endswith("\\") and not s.endswith("\\\\") and commands == 0:
        return True
    if "\\" in s and commands == 0 and signals == 0:
        return True
    if kind == "formula" and words >= 2 and commands == 0 and signals <= 1:
        return True
    return kind == "formula" and words >= 4 and commands <= 1 and signals <= 2


def _braces_balanced(s: str) -> bool:
    depth, i = 0, 0
    while i < len(s):
        ch = s[i]
        if ch == "\\" and i + 1 < len(s) and s[i + 1] in "{}[]()":
            i += 2
            continue
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth < 0:
                return False
        i += 1
    return depth == 0


def _envs_balanced(s: str) -> bool:
    stack: list[str] = []
    for m in _ENV.finditer(s):
        if m.group(1) == "begin":
            stack.append(m.group(2))
        elif not stack or stack.pop() != m.group(2):
            return False
    return not stack


def bad_latex(s: str, kind: str = "formula") -> bool:
    """Too long, unbalanced braces/environments, and for formulas unbalanced ``\\left``/``\\right``
    or math delimiters."""
    s = str(s or "").strip()
    if not s:
        return False
    if len(s) > _MAX_LATEX_LEN or not _braces_balanced(s) or not _envs_balanced(s):
        return True
    if kind == "formula":
        if len(re.findall(r"\\left\b", s)) != len(re.findall(r"\\right\b", s)):
            return True
        if s.count("\\(") != s.count("\\)") or s.count("\\[") != s.count("\\]"):
            return True
        if len(re.findall(r"(?<!\\)\$", s)) % 2:
            return True
    return False


@contextmanager
def _quiet_pylatexenc():
    saved = [(logging.getLogger(n), logging.getLogger(n).level) for n in _PYLATEXENC_LOGGERS]
    for lg, _ in saved:
        lg.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for lg, level in saved:
            lg.setLevel(level)


def latex_to_text(latex: str, fallback: str | None = None, kind: str = "formula") -> str:
    """pylatexenc's LaTeX-to-text behind the upstream guards; ``fallback`` (or the stripped input)
    is returned when a guard trips or pylatexenc fails. ``kind`` is ``formula`` or ``text``/``table``.

    Upstream runs pylatexenc in a subprocess with a 30 s timeout; it is run in-process here (the
    results are the same; a pathological input would only be slower)."""
    s = str(latex or "").strip()
    if not s:
        return "" if fallback is None else fallback
    if "\\" not in s and "{" not in s and "}" not in s and "$" not in s:
        return s  # quirk kept: this early exit ignores ``fallback``
    keep = s if fallback is None else fallback
    if _prose_not_latex(s) or _weak_latex(s, kind) or bad_latex(s, kind):
        return keep
    try:
        with _quiet_pylatexenc():
            return _L2T.latex_to_text(s)
    except Exception:  # pylatexenc raises assorted errors on odd input; upstream falls back the same way
        return keep


# --------------------------------------------------------------------------------------------------
# text

INLINE_MATH = re.compile(r"\$(.*?)\$|\\\((.*?)\\\)")
_ESCAPES = re.compile(r"\\([\\_&%^])")
_COMPLEX_INLINE = ("\\begin{", "\\end{", "\\array", "\\matrix", "\\tabular", "\\cases", "\\align", "\\\\", "&")


def _skip_inline(latex: str) -> bool:
    latex = latex.strip()
    if not latex:
        return False
    return (len(latex) > 128 or any(t in latex for t in _COMPLEX_INLINE)
            or latex.count("{") != latex.count("}"))


def text_with_unicode_math(text: str) -> str:
    """Inline ``$..$`` / ``\\(..\\)`` math that has a backslash, ``^`` or ``_`` becomes Unicode text
    (``$x^{2}$`` -> ``x^2``); other inline math keeps its delimiters (they vanish in
    :func:`clean_text`)."""
    text = replace_circled(text)
    edits = []
    for m in INLINE_MATH.finditer(text):
        body = m.group(1) if m.group(1) is not None else m.group(2)
        clean = _ESCAPES.sub("", body)
        if not any(ch in clean for ch in "\\^_"):
            continue
        if clean.endswith("\\"):
            clean += " "
        if _skip_inline(clean):
            continue
        edits.append((m.start(), m.end(), latex_to_text(clean, fallback=clean, kind="formula")))
    for start, end, rep in reversed(edits):
        text = text[:start] + rep.strip() + text[end:]
    return text


_NON_WORD = re.compile(r"[^\w\u4e00-\u9fff]")


def clean_text(text: str) -> str:
    """Keep letters, digits, ``_`` and CJK only (after removing literal ``\\t``/``\\n``/``/t``/``/n``)."""
    text = replace_circled(text)
    for junk in ("\\t", "\\n", "\t", "\n", "/t", "/n"):
        text = text.replace(junk, "")
    return _NON_WORD.sub("", text)


def normalized_text(text: str) -> str:
    """The form text blocks are compared in."""
    return clean_text(text_with_unicode_math(text))


def text_with_normalized_inline_formulas(text: str) -> str:
    """Each inline formula replaced by its :func:`normalized_formula` form."""
    edits = [(m.start(), m.end(), normalized_formula(m.group(1) if m.group(1) is not None else m.group(2)))
             for m in INLINE_MATH.finditer(text)]
    for start, end, rep in reversed(edits):
        text = text[:start] + rep.strip() + text[end:]
    return text


# --------------------------------------------------------------------------------------------------
# formulas

_DELIMS = (("$$", "$$"), ("\\[", "\\]"), ("\\(", "\\)"), ("$", "$"))


def strip_formula_delimiters(text: str) -> str:
    """Peel ``$$``, ``\\[ \\]``, ``\\( \\)`` and ``$`` wrappers (repeatedly)."""
    if not isinstance(text, str):
        return ""
    text = text.strip().strip("\n")
    changed = True
    while text and changed:
        changed = False
        for left, right in _DELIMS:
            if text.startswith(left) and text.endswith(right) and len(text) >= len(left) + len(right):
                text = text[len(left):len(text) - len(right)].strip()
                changed = True
                break
    return text


def _group_end(text: str, open_index: int) -> int:
    """Index just past the group opened at ``text[open_index] == '{'``; -1 if it never closes."""
    depth, i = 1, open_index + 1
    while i < len(text) and depth:
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        i += 1
    return i if depth == 0 else -1


def drop_command_group(text: str, command: str) -> str:
    """Remove every ``\\command{...}`` (balanced braces). As upstream: an unclosed group removes just
    the command name and stops."""
    text, token = str(text or ""), command + "{"
    while (start := text.find(token)) >= 0:
        end = _group_end(text, start + len(command))
        if end < 0:
            return text[:start] + text[start + len(command):]
        text = text[:start] + text[end:]
    return text


def drop_command_starred_group(text: str, command: str) -> str:
    """Remove ``\\command{...}`` and ``\\command*{...}`` (spaces allowed before ``*`` and ``{``); a
    longer command name (``\\tagx``) is left alone; an unclosed group loses just the command name."""
    text, search_from = str(text or ""), 0
    while (start := text.find(command, search_from)) >= 0:
        i = start + len(command)
        if i < len(text) and text[i].isalpha():
            search_from = i
            continue
        while i < len(text) and text[i].isspace():
            i += 1
        if i < len(text) and text[i] == "*":
            i += 1
            while i < len(text) and text[i].isspace():
                i += 1
        if i >= len(text) or text[i] != "{":
            search_from = start + len(command)
            continue
        end = _group_end(text, i)
        text = text[:start] + (text[end:] if end >= 0 else text[start + len(command):])
        search_from = start
    return text


def strip_formula_tags(text: str) -> str:
    """Drop ``\\tag{..}``/``\\tag*{..}``, ``\\notag`` and ``\\nonumber``."""
    text = str(text or "")
    if not text:
        return ""
    text = drop_command_starred_group(text, "\\tag")
    return text.replace("\\notag", "").replace("\\nonumber", "")


# removed one after another in exactly this order (as upstream): the order changes results, e.g.
# "\\mathbf" is removed before "\\mathbfcal" (leaving "cal"), "\\textbf" before "\\text"
_FORMULA_DROP = ("\\mathbf", "\\mathrm", "\\mathnormal", "\\mathit", "\\mathbb", "\\mathcal", "\\mathscr",
                 "\\mathfrak", "\\mathsf", "\\mathtt", "\\textbf", "\\text", "\\boldmath", "\\boldsymbol",
                 "\\operatorname", "\\bm", "\\symbfit", "\\mathbfcal", "\\symbf", "\\scriptscriptstyle", "\\notag",
                 "\\setlength", "\\coloneqq", "\\space", "\\thickspace", "\\thinspace", "\\medspace",
                 "\\nobreakspace", "\\negmedspace", "\\quad", "\\qquad", "\\enspace", "\\substackw", " ", "$$",
                 "\\left", "\\right", "\\displaystyle", "\\text")
_INNER_MATH = re.compile(r"\\\[(.+?)(?<!\\)\\\]|\\\((.+?)(?<!\\)\\\)")
_SIMPLE_GROUP = re.compile(r"\{([A-Za-z0-9.+\-]+)\}")
_SHORT_GROUP = re.compile(r"\{([^{}]{1,160})\}")
_STRUCTURAL = ("=", "+", "-", "\\\\", "^", "_", "[", "]", "(", ")")


def normalized_formula(text: str) -> str:
    """The form display formulas are matched and edit-distanced in: no delimiters, tags, spacing,
    font/style commands, environments or braces around simple groups; lower case, no whitespace."""
    text = strip_formula_tags(strip_formula_delimiters(replace_circled(text)))
    m = _INNER_MATH.search(text)
    if m:
        text = (m.group(1) or m.group(2) or "").strip()
    text = drop_command_group(text, "\\phantom")
    text = re.sub(r"\\[!,;:]", "", text)
    text = re.sub(r"(?<!\\)&", "", text)
    text = text.replace("\\mid", "|").replace("\\vert", "|").replace(r"\{", "").replace(r"\}", "").replace("~", "")
    for pattern in (r"\\hspace\{.*?\}", r"\\begin\{.*?\}", r"\\end\{.*?\}", r"\\arraycolsep.*?\}", r"\{[lcr| ]+\}"):
        text = re.sub(pattern, "", text)
    text = text.strip(".")
    for token in _FORMULA_DROP:
        text = text.replace(token, "")
    previous = None
    while text != previous:
        previous = text
        text = _SIMPLE_GROUP.sub(r"\1", text).replace("{}", "")
        text = re.sub(r"\{\{+", "{", text)
        text = re.sub(r"}}+", "}", text)
        text = _SHORT_GROUP.sub(lambda g: g.group(1) if any(t in g.group(1) for t in _STRUCTURAL) else g.group(0), text)
    return re.sub(r"\s+", "", text.lower())


# --------------------------------------------------------------------------------------------------
# tables

_TABLE_LATEX_SYMBOLS = (
    (r"\checkmark", "√"), (r"\checked", "√"), (r"\surd", "√"), (r"\times", "×"), (r"\xmark", "×"),
    (r"\crossmark", "×"), (r"\pm", "±"), (r"\mp", "∓"), (r"\alpha", "α"), (r"\beta", "β"), (r"\gamma", "γ"),
    (r"\gama", "γ"), (r"\mu", "μ"), (r"\lambda", "λ"), (r"\theta", "θ"), (r"\eta", "η"), (r"\pi", "π"),
    (r"\rho", "ρ"), (r"\sigma", "σ"), (r"\omega", "ω"), (r"\delta", "δ"), (r"\Delta", "Δ"), (r"\epsilon", "ε"),
    (r"\varepsilon", "ε"), (r"\phi", "φ"), (r"\varphi", "φ"), (r"\tau", "τ"), (r"\partial", "∂"),
    (r"\varnothing", "∅"), (r"\emptyset", "∅"), (r"\sim", "～"),
    ("✓", "√"), ("✔", "√"), ("☑", "√"), ("✅", "√"), ("🗸", "√"), ("✗", "×"), ("✘", "×"), ("✕", "×"), ("✖", "×"),
    ("☒", "×"), ("❌", "×"), ("╳", "×"), ("⨯", "×"), ("Ø", "∅"), ("∼", "～"), ("〜", "～"),
    (r"\%", "%"), (r"\#", "#"), (r"\&", "&"), (r"\_", "_"),
)
_DASHES = {"-": "—", "–": "—", "−": "—", "－": "—", "—": "—"}


def _table_symbols(text: str) -> str:
    for src, dst in _TABLE_LATEX_SYMBOLS:
        text = text.replace(src, dst)
    return text


def _unwrap_cell_math(text: str) -> str:
    text = text.strip()
    changed = True
    while text and changed:
        changed = False
        for left, right in _DELIMS:
            if text.startswith(left) and text.endswith(right) and len(text) >= len(left) + len(right):
                inner = text[len(left):len(text) - len(right)].strip()
                if not inner or len(inner) > 128 or "<" in inner or ">" in inner or "$" in inner:
                    continue
                text, changed = inner, True
                break
    return text


def normalize_cell_text(text: str) -> str:
    """One table cell's text: NFKC, symbol spellings unified (check marks, crosses, Greek, dashes),
    simple math wrappers removed, whitespace collapsed."""
    text = unicodedata.normalize("NFKC", str(text or "")).replace("\xa0", " ").replace("\u200b", "")
    text = _table_symbols(_unwrap_cell_math(_table_symbols(text)))
    text = _DASHES.get(text.strip(), text)
    return re.sub(r"\s+", " ", text).strip()


def _canonical_table_dom(markup: str) -> str:
    soup = BeautifulSoup(markup, "html.parser")
    for th in soup.find_all("th"):
        th.name = "td"
    for tag in soup.find_all(["thead", "tbody"]):
        tag.unwrap()
    for math in soup.find_all("math"):
        math.replace_with(f"${math.get('alttext', '')}$")
    for span in soup.find_all("span"):
        span.unwrap()
    soup = BeautifulSoup(str(soup), "html.parser")
    for cell in soup.find_all(["td", "th"]):
        for node in list(cell.descendants):
            if isinstance(node, NavigableString):
                new = normalize_cell_text(str(node))
                if new != str(node):
                    node.replace_with(new)
    return str(soup)


_TABLE_BODY = re.compile(r"<table\b[^>]*>(.*)</table>", re.DOTALL | re.IGNORECASE)
TABLE_PREFIX = '<html><body><table border="1" >'
TABLE_SUFFIX = "</table></body></html>"


def normalized_html_table(markup: str) -> str:
    """One canonical HTML string for a table (``""`` if ``markup`` has no ``<table``): ``th`` ->
    ``td``, no ``thead``/``tbody``/``span``/``sup``/``sub``/``div``/``p``/``colgroup``, no style,
    size, alignment or class attributes, cell text normalized, whitespace collapsed."""
    markup = str(markup or "")
    if "<table" not in markup.replace(" ", "").replace("'", '"'):
        return ""
    out = html.unescape(_canonical_table_dom(markup)).replace("\n", "")
    out = unicodedata.normalize("NFKC", out).strip()
    out = "".join(_TABLE_BODY.findall(out))
    for attr in ("style", "height", "width", "align", "class"):
        out = re.sub(f'( {attr}=".*?")', "", out)
    out = re.sub("</?tbody>", "", out)
    out = re.sub(r"\s+", " ", out)
    out = TABLE_PREFIX + out + TABLE_SUFFIX
    for tag in ("sup", "sub", "span", "div", "p"):
        out = out.replace(f"<{tag}>", "").replace(f"</{tag}>", "")
    out = out.replace('<spandata-span-identity="">', "")
    return re.sub("<colgroup>.*?</colgroup>", "", out)
