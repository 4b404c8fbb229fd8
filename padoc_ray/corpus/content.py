"""Deterministic page *content* drawn from a ``random.Random``: prose, headings, list items, table
grids, LaTeX formulas, chart specs, captions, running headers, footers and footnotes.

Everything here is plain data (strings, small dataclasses); nothing is measured or drawn (that is
``draw``/``layout``). The same RNG state gives the same content on every machine: only Python's
``random.Random`` is used (its algorithm is fixed across versions for ``random()``,
``randrange``, ``choice``, ``shuffle``), never ``hash()`` or set iteration order.

Languages: ``en`` (a built-in English word list, combined by sentence templates into plausible but
meaningless prose), ``zh`` (common GB2312 words, so reportlab's ``STSong-Light`` CID font covers
every character), ``el`` and ``ru`` (Greek and Russian word lists, drawn with matplotlib's bundled
DejaVu fonts). It does not know what real documents *say*; only how their pieces look.

Formulas only use constructs matplotlib's mathtext renders (``\\frac``, ``\\sqrt``, sub/superscripts,
``\\sum``, ``\\int``, Greek, ``\\left( \\right)``, ``\\mathbf``, accents), so the LaTeX ground truth
is exactly what is drawn.
"""

from __future__ import annotations

import html
import random
from dataclasses import dataclass, field

# ---- word lists ---------------------------------------------------------------------------------
NOUNS = """model method system result analysis data value process network function parameter
structure sample rate error distribution performance approach framework algorithm feature layer
image document page region table figure formula equation section paper study experiment
measurement signal frequency energy temperature pressure surface material particle sequence
protein cell gene market price cost revenue growth demand supply policy risk investment
customer service product quality report survey region population city water soil climate
estimate variable matrix vector graph node edge path boundary domain interval solution
condition constraint objective loss gradient update training evaluation benchmark baseline
dataset accuracy precision latency throughput memory storage server cluster request response
schedule budget project team community student teacher lesson chapter exercise problem answer
question theory proof lemma theorem property relation operator space field force velocity
mass density volume flow current voltage circuit device sensor control feedback response
pattern trend factor effect impact outcome level scale range limit threshold window step
strategy decision interaction context language text word sentence token vocabulary corpus
annotation label category class instance object scene layout column heading caption""".split()

VERBS = """improves reduces increases shows describes provides requires produces supports affects
determines predicts measures estimates extends combines compares captures represents contains
defines follows exceeds remains reaches enables limits controls generates transforms preserves
reveals indicates suggests confirms explains achieves outperforms handles maintains selects""".split()

VERBS_PAST = """improved reduced increased showed described provided required produced supported
measured estimated extended combined compared captured observed found obtained recorded
analyzed evaluated trained tested collected computed derived applied selected reported""".split()

ADJS = """new simple robust efficient accurate stable large small high low significant
different similar important additional previous current average total final main key
linear nonlinear dynamic static local global standard typical optimal effective limited
annual quarterly regional national digital structural statistical numerical experimental
theoretical practical relative absolute initial random uniform sparse dense parallel
sequential visual spatial temporal multiple single overall specific general consistent""".split()

ADVS = """significantly consistently slightly rapidly directly largely generally approximately
strongly clearly often usually further also""".split()

PREPS = "of in for on with across under between within from over".split()

CONNECT = ["However,", "In addition,", "Moreover,", "As a result,", "In contrast,", "Therefore,",
           "For example,", "In practice,", "On average,", "In this case,", "Finally,", "Overall,"]

SURNAMES = """Smith Chen Garcia Rivera Okafor Novak Tanaka Kumar Silva Weber Rossi Moreau Kim
Ivanova Haddad Larsen Costa Nguyen Schmidt Dubois Andersen Patel Sato Müller Fischer""".split()
INITIALS = list("ABCDEFGHJKLMNPRSTW")

JOURNALS = ["Journal of Applied Computation", "Transactions on Document Analysis",
            "Proceedings of the Annual Conference on Learning", "Letters in Physical Sciences",
            "Review of Economic Studies", "International Journal of Engineering Systems"]
COMPANIES = ["Northwind Analytics", "Blue Harbor Capital", "Meridian Research Group",
             "Cedar Systems Ltd.", "Atlas Energy Partners", "Summit Health Institute"]

# Common words of modern Chinese, all in GB2312 (covered by STSong-Light and one token each in the
# tiny model's tokenizer).
ZH_WORDS = """我们 研究 方法 结果 分析 数据 系统 模型 问题 发展 经济 社会 企业 市场 技术 管理 服务 产品
质量 政策 投资 风险 增长 收入 成本 价格 需求 供给 行业 公司 地区 城市 农村 教育 学生 学校 教师 课程
学习 文化 历史 艺术 文学 作品 作者 读者 时间 空间 环境 资源 能源 水平 程度 条件 因素 影响 作用
变化 过程 结构 功能 特点 规律 原则 标准 要求 目标 任务 计划 措施 方案 效果 效率 能力 水平 基础
理论 实践 经验 知识 信息 网络 平台 应用 设计 开发 建设 改革 创新 合作 交流 组织 机构 部门 政府
国家 人民 群众 生活 工作 生产 科学 实验 测量 计算 统计 指标 比例 总量 规模 速度 温度 压力 材料
图像 文本 页面 表格 公式 区域 内容 版面 识别 解析 文档 数字 单位 方向 位置 范围 部分 整体 中心
进一步 显著 明显 主要 重要 基本 一般 具体 相关 有效 合理 稳定 持续 快速 全面 积极 不断 逐步
提高 降低 增加 减少 促进 推动 加强 完善 实现 保持 形成 提供 具有 进行 采用 利用 通过 根据 对于
由于 因此 但是 同时 而且 以及 并且 其中 此外 总之 例如 如果 虽然 已经 正在 可以 需要 应该 能够""".split()
ZH_HEADINGS = ["引言", "研究背景", "研究方法", "实验结果", "结果分析", "讨论", "结论", "市场分析", "行业概况",
               "投资建议", "风险提示", "财务分析", "发展现状", "主要问题", "对策建议", "数据来源", "模型构建"]
ZH_NUMS = "一二三四五六七八九十"

EL_WORDS = """και το η ο της των στην στο με για από που είναι μια ένα δεν θα ως σε αυτό
ανάλυση μέθοδος αποτέλεσμα σύστημα δεδομένα μοντέλο έρευνα μελέτη πίνακας σχήμα εξίσωση
ταχύτητα ενέργεια θερμοκρασία πίεση χρόνος απόσταση αριθμός τιμή σημαντική νέα μεγάλη
μικρή αύξηση μείωση ανάπτυξη οικονομία αγορά κοινωνία ιστορία γλώσσα κείμενο σελίδα""".split()
RU_WORDS = """и в не на с что по как из это для от при так до все также или
анализ метод результат система данные модель исследование работа таблица рисунок уравнение
скорость энергия температура давление время расстояние число значение важный новый большой
малый рост снижение развитие экономика рынок общество история язык текст страница вывод""".split()


@dataclass(frozen=True)
class Lang:
    code: str  # en, zh, el, ru
    name: str  # OmniDocBench page_attribute language
    figure: str  # caption label words
    table: str
    spaced: bool  # words separated by spaces (False: CJK, wrapped per character)


LANGS = {
    "en": Lang("en", "english", "Figure", "Table", True),
    "zh": Lang("zh", "simplified_chinese", "图", "表", False),
    "el": Lang("el", "greek", "Σχήμα", "Πίνακας", True),
    "ru": Lang("ru", "russian", "Рисунок", "Таблица", True),
}


# ---- prose ----------------------------------------------------------------------------------------
def _en_sentence(rng: random.Random) -> str:
    n, n2, a = rng.choice(NOUNS), rng.choice(NOUNS), rng.choice(ADJS)
    t = rng.randrange(8)
    if t == 0:
        s = f"the {a} {n} {rng.choice(VERBS)} the {rng.choice(NOUNS)} {rng.choice(PREPS)} {n2}"
    elif t == 1:
        v1, p1 = rng.choice(VERBS_PAST), rng.choice(PREPS)
        s = f"we {v1} the {n} {p1} each {n2} and {rng.choice(VERBS_PAST)} the {rng.choice(ADJS)} {rng.choice(NOUNS)}"
    elif t == 2:
        s = f"this {n} {rng.choice(ADVS)} {rng.choice(VERBS)} {a} {n2}s {rng.choice(PREPS)} the {rng.choice(NOUNS)}"
    elif t == 3:
        v = rng.choice(["%d.%d" % (rng.randrange(1, 99), rng.randrange(10)), "%d%%" % rng.randrange(1, 100),
                        str(rng.randrange(2, 5000))])
        s = f"the {n} of the {a} {n2} was {v} {rng.choice(PREPS)} the {rng.choice(NOUNS)}"
    elif t == 4:
        s = f"a {a} {n} is {rng.choice(VERBS_PAST)} when the {n2} {rng.choice(VERBS)} the {rng.choice(NOUNS)}"
    elif t == 5:
        s = f"{rng.choice(ADJS)} {n}s {rng.choice(VERBS_PAST[:10])} the {n2} of {rng.choice(ADJS)} {rng.choice(NOUNS)}s"
    elif t == 6:
        v1, n3 = rng.choice(VERBS), rng.choice(NOUNS)
        s = f"the {n} and the {n2} {v1} a {a} {n3} {rng.choice(PREPS)} the {rng.choice(ADJS)} {rng.choice(NOUNS)}"
    else:
        s = f"in the {a} {n}, the {n2} {rng.choice(VERBS)} the {rng.choice(NOUNS)}"
    if rng.random() < 0.25:
        s = rng.choice(CONNECT) + " " + s
    return s[0].upper() + s[1:] + "."


def _words_sentence(rng: random.Random, words: list[str]) -> str:
    s = " ".join(rng.choice(words) for _ in range(rng.randrange(6, 16)))
    return s[0].upper() + s[1:] + "."


def _zh_sentence(rng: random.Random) -> str:
    parts = []
    for _ in range(rng.randrange(1, 4)):
        parts.append("".join(rng.choice(ZH_WORDS) for _ in range(rng.randrange(3, 9))))
    return "，".join(parts) + "。"


def sentence(rng: random.Random, lang: str) -> str:
    if lang == "zh":
        return _zh_sentence(rng)
    if lang == "el":
        return _words_sentence(rng, EL_WORDS)
    if lang == "ru":
        return _words_sentence(rng, RU_WORDS)
    return _en_sentence(rng)


def paragraph(rng: random.Random, lang: str, n_sentences: int) -> str:
    sep = "" if lang == "zh" else " "
    return sep.join(sentence(rng, lang) for _ in range(max(1, n_sentences)))


def short_phrase(rng: random.Random, lang: str, lo: int = 2, hi: int = 6) -> str:
    """A capitalized phrase (titles, captions, table labels)."""
    n = rng.randrange(lo, hi + 1)
    if lang == "zh":
        return "".join(rng.choice(ZH_WORDS) for _ in range(max(1, n // 2 + 1)))
    words = {"el": EL_WORDS, "ru": RU_WORDS}.get(lang)
    if words is None:
        ws = [rng.choice(ADJS)] + [rng.choice(NOUNS) for _ in range(n - 1)]
        if n >= 4 and rng.random() < 0.5:
            ws.insert(n // 2, rng.choice(["and", "of", "for", "in"]))
        return " ".join(w.capitalize() if i == 0 or len(w) > 3 else w for i, w in enumerate(ws))
    ws = [rng.choice(words) for _ in range(n)]
    return ws[0].capitalize() + "".join(" " + w for w in ws[1:])


def section_heading(rng: random.Random, lang: str, number: str | None) -> str:
    if lang == "zh":
        body = rng.choice(ZH_HEADINGS) if rng.random() < 0.6 else short_phrase(rng, lang, 2, 5)
        return f"{number}{body}" if number else body
    body = short_phrase(rng, lang, 1, 4)
    if lang == "en" and rng.random() < 0.3:
        body = rng.choice(["Introduction", "Related Work", "Method", "Experiments", "Results", "Discussion",
                           "Conclusion", "Background", "Evaluation", "Market Overview", "Outlook", "Summary"])
    return f"{number} {body}" if number else body


def zh_number(k: int) -> str:
    return ZH_NUMS[k - 1] if 1 <= k <= 10 else str(k)


def author_line(rng: random.Random, lang: str) -> str:
    if lang == "zh":
        return "，".join("".join(rng.choice(ZH_WORDS)[:1] for _ in range(rng.randrange(2, 4)))
                        for _ in range(rng.randrange(2, 5)))
    names = [f"{rng.choice(INITIALS)}. {rng.choice(SURNAMES)}" for _ in range(rng.randrange(2, 6))]
    return ", ".join(names[:-1]) + " and " + names[-1]


def reference_entry(rng: random.Random, k: int) -> str:
    authors = ", ".join(f"{rng.choice(INITIALS)}. {rng.choice(SURNAMES)}" for _ in range(rng.randrange(1, 4)))
    title = short_phrase(rng, "en", 3, 8)
    return (f"[{k}] {authors}. {title}. {rng.choice(JOURNALS)}, {rng.randrange(1, 60)}"
            f"({rng.randrange(1, 12)}):{rng.randrange(1, 400)}-{rng.randrange(401, 900)}, {rng.randrange(1995, 2025)}.")


def list_item(rng: random.Random, lang: str, marker: str) -> str:
    body = paragraph(rng, lang, rng.randrange(1, 3)) if rng.random() < 0.6 else sentence(rng, lang)
    return f"{marker} {body}" if lang != "zh" else f"{marker}{body}"


def list_markers(rng: random.Random, n: int, lang: str) -> list[str]:
    kind = rng.randrange(4)
    if kind == 0:
        return ["\u2022"] * n
    if kind == 1:
        return [f"{i + 1}." for i in range(n)]
    if kind == 2:
        return [f"({chr(97 + i)})" for i in range(n)]
    return [f"({i + 1})" if lang != "zh" else f"（{i + 1}）" for i in range(n)]


# ---- tables ---------------------------------------------------------------------------------------
@dataclass
class Cell:
    row: int
    col: int
    text: str
    rowspan: int = 1
    colspan: int = 1
    header: bool = False


@dataclass
class TableSpec:
    n_rows: int
    n_cols: int
    cells: list[Cell]  # in HTML order (row-major; a spanning cell in its first row)
    header_rows: int
    style: str  # "grid", "booktabs" (three lines) or "rows" (horizontal rules)

    def html(self) -> str:
        """OmniDocBench-style HTML: thead with th cells, tbody with td cells, one cell per line."""
        out = ["<table>"]
        by_row: dict[int, list[Cell]] = {}
        for c in self.cells:
            by_row.setdefault(c.row, []).append(c)
        if self.header_rows:
            out.append("<thead>")
        for r in range(self.n_rows):
            if r == self.header_rows and self.header_rows:
                out.append("</thead>")
            if r == self.header_rows:
                out.append("<tbody>")
            out.append("<tr>")
            for c in by_row.get(r, []):
                tag = "th" if c.header else "td"
                attrs = (f' colspan="{c.colspan}"' if c.colspan > 1 else "") + \
                    (f' rowspan="{c.rowspan}"' if c.rowspan > 1 else "")
                out.append(f" <{tag}{attrs}>{html.escape(c.text, quote=False)}</{tag}>")
            out.append("</tr>")
        out.append("</tbody>")
        out.append("</table>")
        return "\n".join(out)


def _num(rng: random.Random, kind: int) -> str:
    if kind == 0:
        return f"{rng.uniform(0, 100):.1f}"
    if kind == 1:
        return f"{rng.random():.3f}"
    if kind == 2:
        return f"{rng.randrange(100, 99999):,}"
    if kind == 3:
        return f"{rng.uniform(-20, 40):.2f}%"
    return str(rng.randrange(1, 500))


def table_spec(rng: random.Random, lang: str, n_rows: int, n_cols: int, *, merged: float = 0.5) -> TableSpec:
    """A grid of ``n_rows`` body rows x ``n_cols`` columns with a header, numbers in the body, a
    label column, and (with probability ``merged``) a grouped header (colspan) and/or grouped row
    labels (rowspan)."""
    n_cols = max(2, n_cols)
    cells: list[Cell] = []
    label = (lambda: short_phrase(rng, lang, 1, 2)) if lang != "en" else (lambda: rng.choice(NOUNS).capitalize())
    group_cols = rng.random() < merged and n_cols >= 4
    group_rows = rng.random() < merged and n_rows >= 4 and n_cols >= 3
    header_rows = 2 if group_cols else 1
    first_data_col = 2 if group_rows else 1
    r = 0
    if group_cols:
        # row 0: corner cell(s) spanning both header rows, then groups of 2-3 columns
        cells.append(Cell(0, 0, label(), rowspan=2, colspan=first_data_col, header=True))
        c = first_data_col
        while c < n_cols:
            span = min(n_cols - c, rng.choice([2, 2, 3]))
            if span == 1:
                cells.append(Cell(0, c, label(), rowspan=2, header=True))
            else:
                cells.append(Cell(0, c, short_phrase(rng, lang, 1, 3), colspan=span, header=True))
            c += span
        covered = {cc.col for cc in cells if cc.rowspan == 2}
        for c in range(first_data_col, n_cols):
            if c not in covered:
                cells.append(Cell(1, c, label(), header=True))
        r = 2
    else:
        cells.append(Cell(0, 0, label(), colspan=first_data_col, header=True))
        for c in range(first_data_col, n_cols):
            cells.append(Cell(0, c, label(), header=True))
        r = 1
    kinds = [rng.randrange(5) for _ in range(n_cols)]
    body_end = header_rows + n_rows
    group_left = 0
    while r < body_end:
        if group_rows:
            if group_left == 0:
                span = min(body_end - r, rng.randrange(2, 4))
                cells.append(Cell(r, 0, label(), rowspan=span))
                group_left = span
            group_left -= 1
        cells.append(Cell(r, first_data_col - 1, label()))
        for c in range(first_data_col, n_cols):
            cells.append(Cell(r, c, "" if rng.random() < 0.03 else _num(rng, kinds[c])))
        r += 1
    style = rng.choice(["grid", "grid", "booktabs", "rows"])
    if group_cols or group_rows:
        style = "grid" if rng.random() < 0.7 else style
    return TableSpec(body_end, n_cols, cells, header_rows, style)


# ---- formulas -------------------------------------------------------------------------------------
_VARS = list("xyzabnkt") + [r"\alpha", r"\beta", r"\gamma", r"\lambda", r"\mu", r"\sigma", r"\theta", r"\phi",
                            r"\omega"]
_FUNCS = ["f", "g", "h", "F", "L", "P", "E"]
_OPS = ["+", "-", "+", r"\cdot", r"\times"]
_RELS2 = ["=", "=", r"\leq"]


def _atom(rng: random.Random) -> str:
    v = rng.choice(_VARS)
    r = rng.random()
    if r < 0.2:
        return f"{v}_{{{rng.choice(['i', 'j', 'k', 'n', 't', '0', '1'])}}}"
    if r < 0.35:
        return f"{v}^{{{rng.choice(['2', '3', 'n', '-1', 'k'])}}}"
    if r < 0.45:
        return rf"\mathbf{{{rng.choice('xyzuvw')}}}"
    if r < 0.52:
        return rf"\{rng.choice(['hat', 'bar', 'tilde'])}{{{rng.choice('xyzab')}}}"
    if r < 0.62:
        return str(rng.choice([2, 3, 4, 10, "0.5", "1"]))
    return v


def _term(rng: random.Random, depth: int) -> str:
    r = rng.random() if depth > 0 else 1.0
    if r < 0.18:
        return rf"\frac{{{_expr(rng, depth - 1, 2)}}}{{{_expr(rng, depth - 1, 2)}}}"
    if r < 0.28:
        return rf"\sqrt{{{_expr(rng, depth - 1, 3)}}}"
    if r < 0.40:
        return rf"\left( {_expr(rng, depth - 1, 3)} \right)"
    if r < 0.48:
        return rf"\sum_{{i=1}}^{{n}} {_term(rng, depth - 1)}"
    if r < 0.53:
        return rf"\int_{{0}}^{{\infty}} {_term(rng, depth - 1)} \, d{rng.choice('xt')}"
    if r < 0.60:
        return rf"{rng.choice(_FUNCS)}\left( {_atom(rng)} \right)"
    if r < 0.65:
        return rf"\{rng.choice(['sin', 'cos', 'log', 'exp'])} {_atom(rng)}"
    return _atom(rng) + (" " + _atom(rng) if rng.random() < 0.4 else "")


def _expr(rng: random.Random, depth: int, max_terms: int) -> str:
    n = rng.randrange(1, max_terms + 1)
    out = _term(rng, depth)
    for _ in range(n - 1):
        out += f" {rng.choice(_OPS)} {_term(rng, depth)}"
    return out


def formula(rng: random.Random) -> str:
    """A display formula in LaTeX that mathtext can draw (no delimiters)."""
    lhs = rng.choice([_atom(rng), rf"{rng.choice(_FUNCS)}\left( {_atom(rng)} \right)", rng.choice(_VARS)])
    rel = rng.choice(["=", "=", "=", r"\leq", r"\geq", r"\approx"])
    out = f"{lhs} {rel} {_expr(rng, 2, 4)}"
    if rng.random() < 0.35:  # a second relation, as in derivations
        out += f" {rng.choice(_RELS2)} {_expr(rng, 1, 3)}"
    return out


# ---- figures --------------------------------------------------------------------------------------
@dataclass
class ChartSpec:
    kind: str  # line, bar, scatter, pie, hist, photo
    seed: int  # numpy seed for the data / pixels
    n_series: int = 1
    title: str = ""
    xlabel: str = ""
    ylabel: str = ""
    labels: list[str] = field(default_factory=list)


def chart_spec(rng: random.Random, lang: str, photo_share: float = 0.25) -> ChartSpec:
    if rng.random() < photo_share:
        return ChartSpec("photo", rng.getrandbits(32))
    kind = rng.choice(["line", "line", "bar", "bar", "scatter", "pie", "hist"])
    # chart text is pixels inside the image (no text layer), so ASCII labels are fine for any language
    lab = lambda: rng.choice(NOUNS).capitalize()  # noqa: E731
    return ChartSpec(kind, rng.getrandbits(32), n_series=rng.randrange(1, 4),
                     title=short_phrase(rng, "en", 2, 4) if rng.random() < 0.4 else "",
                     xlabel=lab(), ylabel=lab(), labels=[lab() for _ in range(6)])


# ---- captions and page furniture ------------------------------------------------------------------
def caption(rng: random.Random, lang: str, what: str, k: int) -> str:
    L = LANGS[lang]
    label = L.figure if what == "figure" else L.table
    if lang == "zh":
        return f"{label}{k} {short_phrase(rng, lang, 2, 7)}"
    body = short_phrase(rng, lang, 2, 6)
    if rng.random() < 0.3:
        body += ". " + sentence(rng, lang)
    sep = rng.choice([":", "."])
    return f"{label} {k}{sep} {body}"


def footnote_text(rng: random.Random, lang: str, k: int) -> str:
    if lang == "zh":
        return f"{k} " + paragraph(rng, lang, rng.randrange(1, 3))
    return f"{k} " + paragraph(rng, lang, rng.randrange(1, 3))


def table_note(rng: random.Random, lang: str) -> str:
    if lang == "zh":
        return "注：" + sentence(rng, lang)
    return rng.choice(["Note: ", "Source: ", "* "]) + sentence(rng, lang)


def running_header(rng: random.Random, lang: str, kind: str) -> list[str]:
    """1-2 header strings for a document (left/right)."""
    if lang == "zh":
        a = short_phrase(rng, lang, 2, 6)
        return [a, f"{rng.randrange(2000, 2025)}年{rng.randrange(1, 13)}月"] if rng.random() < 0.5 else [a]
    if kind == "academic":
        j = rng.choice(JOURNALS)
        vol, year = rng.randrange(1, 80), rng.randrange(1990, 2025)
        return [f"{j} {vol} ({year}) {rng.randrange(1, 900)}-{rng.randrange(900, 2000)}"]
    if kind == "report":
        company, kind_name = rng.choice(COMPANIES), rng.choice(["Annual", "Quarterly", "Research"])
        return [company, f"{kind_name} Report {rng.randrange(2015, 2026)}"]
    return [short_phrase(rng, lang, 2, 6)]


def footer_text(rng: random.Random, lang: str) -> str:
    if lang == "zh":
        return "请务必阅读正文之后的" + short_phrase(rng, lang, 2, 4)
    return rng.choice([f"\u00a9 {rng.randrange(2010, 2026)} {rng.choice(COMPANIES)}. All rights reserved.",
                       "Confidential. For internal use only.",
                       f"{rng.choice(COMPANIES)} | {short_phrase(rng, lang, 2, 4)}",
                       "Please see the disclosures at the end of this report."])


def page_number_text(rng_style: int, page: int, total: int, lang: str) -> str:
    if lang == "zh" and rng_style == 3:
        return f"第{page}页"
    return [str(page), f"- {page} -", f"Page {page} of {total}", str(page)][rng_style % 4]
