"""The documentation: README.md is the guide, docs/ the reference. The generated pages (docs/flags.md,
docs/statuses.md) equal what the code generates now, every relative link in README.md and docs/
leads to a file (and, with an anchor, to a heading of it), and the README starts with the two
commands a fresh machine needs."""

from __future__ import annotations

import os
import pathlib
import re
import tempfile

import pytest

from padoc_ray.cli import docgen

ROOT = pathlib.Path(__file__).resolve().parents[2]
assert (ROOT / "padoc_ray").is_dir(), ROOT
REGENERATE = "python -m padoc_ray.cli.docgen"


def markdown_files() -> list[pathlib.Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


# ---- generated pages ------------------------------------------------------------------------------------
def test_generated_pages_are_current():
    stale = docgen.stale(str(ROOT))
    assert not stale, f"stale generated docs: {', '.join(stale)}: run `{REGENERATE}` and commit the result"


def test_generated_pages_do_not_depend_on_the_machine(monkeypatch, tmp_path):
    """Another temp folder and another core count give the same pages."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)  # gettempdir() reads TMPDIR again
    monkeypatch.setattr(os, "cpu_count", lambda: 97)
    assert tempfile.gettempdir() == str(tmp_path)
    for rel, make in docgen.PAGES.items():
        assert make() == (ROOT / rel).read_text(encoding="utf-8"), (
            f"{rel} changes with TMPDIR or the core count: normalize that default in padoc_ray/cli/docgen.py")
    assert str(tmp_path) not in docgen.flags_page()


def test_check_names_a_stale_page(tmp_path, capsys):
    (tmp_path / "docs").mkdir()
    for rel, make in docgen.PAGES.items():
        (tmp_path / rel).write_text(make(), encoding="utf-8")
    assert docgen.main(["--check", "--root", str(tmp_path)]) == 0
    (tmp_path / docgen.STATUSES_PATH).write_text("old\n", encoding="utf-8")
    assert docgen.main(["--check", "--root", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert docgen.STATUSES_PATH in err and REGENERATE in err and docgen.FLAGS_PATH not in err


# ---- links ----------------------------------------------------------------------------------------------
FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")


def outside_fences(text: str):
    """The lines of ``text`` outside fenced code blocks."""
    fence = None
    for line in text.splitlines():
        m = FENCE.match(line)
        if fence:
            if m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence):
                fence = None
            continue
        if m:
            fence = m.group(1)
            continue
        yield line


def prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks, with inline code spans blanked."""
    return [re.sub(r"(`+)(?:(?!\1).)+?\1", lambda s: " " * len(s.group(0)), line) for line in outside_fences(text)]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lowercase, punctuation other than '-' and '_' dropped, spaces to '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading anchors by its text
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(path: pathlib.Path) -> set[str]:
    """Every heading anchor of a Markdown file (repeated headings get -1, -2, ... as on GitHub)."""
    seen: dict[str, int] = {}
    out = set()
    for line in outside_fences(path.read_text(encoding="utf-8")):
        h = HEADING.match(line)
        if h:
            s = slug(h.group(2))
            n = seen.get(s, 0)
            seen[s] = n + 1
            out.add(s if n == 0 else f"{s}-{n}")
    return out


def links(path: pathlib.Path) -> list[tuple[int, str]]:
    return [(i, m.group(1)) for i, line in enumerate(prose_lines(path.read_text(encoding="utf-8")), 1)
            for m in LINK.finditer(line)]


def test_slug_follows_github():
    assert slug("In the browser: `padoc-ray view`") == "in-the-browser-padoc-ray-view"
    assert slug("Evaluation: end-to-end (OmniDocBench v1.6)") == "evaluation-end-to-end-omnidocbench-v16"
    assert slug("On a GPU: vLLM's two model runners") == "on-a-gpu-vllms-two-model-runners"
    assert slug("The `padoc_ray` row_schema") == "the-padoc_ray-row_schema"


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(path: pathlib.Path):
    bad = []
    for line, target in links(path):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        where = f"{path.relative_to(ROOT)}:{line}: {target}"
        if not dest.exists():
            bad.append(f"{where} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"{where} (no heading with that anchor in {dest.relative_to(ROOT)})")
    assert not bad, "broken links:\n" + "\n".join(bad)


def test_every_docs_page_is_linked_from_the_readme_or_docs():
    linked = set()
    for path in markdown_files():
        for _, target in links(path):
            file_part = target.partition("#")[0]
            if file_part and not re.match(r"^[a-z][a-z0-9+.-]*:", file_part, re.I):
                linked.add((path.parent / file_part).resolve())
    orphans = [str(p.relative_to(ROOT)) for p in markdown_files()[1:] if p.resolve() not in linked]
    assert not orphans, f"docs pages no page links to: {orphans}"


# ---- the README -----------------------------------------------------------------------------------------
def test_readme_is_a_short_guide_that_starts_with_make_demo_and_make_test():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 220, "README.md is the guide: move reference text to docs/"
    m = re.search(r"^```[^\n]*\n(.*?)^```", text, re.S | re.M)
    assert m, "README.md has no fenced code block"
    commands = [line.split("#")[0].strip() for line in m.group(1).splitlines() if line.strip()]
    assert commands[:2] == ["make demo", "make test"], (
        f"README.md's first code block must start with `make demo` and `make test` (.ci/run runs `make test`), "
        f"got {commands[:2]}")
