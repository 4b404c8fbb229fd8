"""The generated reference pages of ``docs/``: the code is their one home, these pages are its print.

* ``docs/statuses.md`` from :mod:`padoc_ray.status` (:data:`~padoc_ray.status.CODES` and the document,
  job and region vocabularies): :func:`statuses_page`;
* ``docs/flags.md`` from the ``padoc-ray`` parsers (:func:`padoc_ray.cli.build_parser`, every command
  and sub-command, each option's flags, metavar, default and help as argparse holds them):
  :func:`flags_page`.

``python -m padoc_ray.cli.docgen`` writes both; ``--check`` writes nothing and exits 1 naming each
page that differs from what the code generates now (``tests/contracts/test_docs.py`` runs the same check).

The pages are the same on every machine: commands and options keep the order the parsers give them
(registration order, which ``--help`` shows), and defaults that depend on the machine are printed
as the code writes them: the repository folder (``padoc_ray.cli.common.ROOT``) as ``$REPO``, the
temporary folder (``tempfile.gettempdir()``) as ``$TMPDIR`` and ``os.cpu_count()`` as itself.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import os
import re
import sys
import tempfile
from unittest import mock

from padoc_ray.cli.common import ROOT

STATUSES_PATH = os.path.join("docs", "statuses.md")
FLAGS_PATH = os.path.join("docs", "flags.md")
REGENERATE = "python -m padoc_ray.cli.docgen"
TMPDIR_MARK = "$TMPDIR"
REPO_MARK = "$REPO"


def _banner(source: str) -> str:
    return (f"<!-- Generated from {source} by `{REGENERATE}`; do not edit by hand: change the code and run it "
            f"again (tests/contracts/test_docs.py fails while this page is stale). -->")


def _rst_to_md(text: str) -> str:
    """A docstring's reStructuredText roles and literals as Markdown code spans."""
    text = re.sub(r":[a-z]+:`~?([^`]+)`", r"`\1`", text)
    return text.replace("``", "`")


def _md(text: str, *, cell: bool = False) -> str:
    """Plain text as Markdown that renders as written: ``*`` and a ``<`` that could open a tag escaped
    outside code spans; with ``cell``, one line with ``|`` escaped (a table cell)."""
    text = str(text)
    if cell:
        text = " ".join(text.split())
    parts = re.split(r"(`[^`]*`)", text)
    for i in range(0, len(parts), 2):
        parts[i] = re.sub(r"<(?=[A-Za-z/!?])", "&lt;", parts[i].replace("*", "\\*"))
    text = "".join(parts)
    return text.replace("|", "\\|") if cell else text


def _cell(text: str) -> str:
    """One Markdown table cell."""
    return _md(text, cell=True)


def _code(text: str) -> str:
    """``text`` as a code span (longer fences when it holds backticks)."""
    text = str(text)
    if not text:
        return ""
    fence = "``" if "`" in text else "`"
    pad = " " if fence == "``" else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def _code_cell(text: str) -> str:
    """``text`` as a code span in a table cell: one line, ``|`` escaped (GitHub's tables allow that)."""
    return _code(" ".join(str(text).split()).replace("|", "\\|"))


def _constant_comments(module) -> dict[str, str]:
    """{NAME: its ``#:`` comment} for the module-level constants of ``module`` that have one (a trailing
    ``#:`` on the assignment's line, or ``#:`` lines right above it)."""
    lines = inspect.getsource(module).splitlines()
    out: dict[str, str] = {}
    for i, line in enumerate(lines):
        m = re.match(r"([A-Z][A-Z0-9_]*)\s*=", line)
        if not m:
            continue
        parts = []
        j = i - 1
        while j >= 0 and lines[j].strip().startswith("#:"):
            parts.insert(0, lines[j].strip()[2:].strip())
            j -= 1
        if "#:" in line:
            parts.append(line.split("#:", 1)[1].strip())
        if parts:
            out[m.group(1)] = " ".join(parts)
    return out


# ---- docs/statuses.md ----------------------------------------------------------------------------------
def statuses_page() -> str:
    """``docs/statuses.md``: every code of :data:`padoc_ray.status.CODES` with its tiers, rerun rule, HTTP
    status and whether its row keeps content, then the document, job and region vocabularies."""
    from padoc_ray import status as st

    notes = {k: _rst_to_md(v) for k, v in _constant_comments(st).items()}
    rerun = {st.NEVER: "no", st.ALWAYS: "yes", st.IF_ALLOWED: "if the cap allows"}
    tier_order = (st.PAGE, st.DOCUMENT)
    doc = _rst_to_md(inspect.getdoc(st) or "")
    out = [
        _banner("`padoc_ray/status.py`"),
        "",
        "# Statuses",
        "",
        "Every status a page row, a document row, a document or an online job can have, as "
        "`padoc_ray/status.py` lists them. How the batch job uses them: [batch.md](batch.md#statuses); "
        "what the online service answers: [serve.md](serve.md).",
        "",
        "## What the codes and columns mean",
        "",
        doc,
        "",
        "## Page and document codes",
        "",
        f"{len(st.CODES)} codes, in the order `padoc_ray/status.py` lists them.",
        "",
        "| code | tiers | meaning | retried by a rerun | HTTP status | content kept |",
        "|---|---|---|---|---|---|",
    ]
    for c in st.CODES.values():
        tiers = ", ".join(t for t in tier_order if t in c.tiers)
        out.append(f"| {_code(c.name)} | {tiers} | {_cell(c.meaning)} | {rerun.get(c.rerun, c.rerun)} | "
                   f"{c.http} | {'yes' if c.content else 'no'} |")
    out += [
        "",
        "Retried by a rerun: `yes` is the `always` rule, `if the cap allows` the `if_allowed` rule, `no` the "
        "`never` rule (the column notes above). Codes that mean \"not a document we parse\" (the document counts as "
        f"`{st.DOC_SKIPPED}`): {', '.join(_code(c) for c in sorted(st.SKIPPED_CODES))}.",
        "",
        "## Document statuses",
        "",
        "A document whose pages ran has one of these (`documents.parquet` also carries the input's document "
        "code when the whole input failed):",
        "",
        "| status | meaning |",
        "|---|---|",
    ]
    by_value = {getattr(st, n): n for n in ("DOC_OK", "DOC_PARTIAL", "DOC_FAILED", "DOC_SKIPPED",
                                            "DOC_INCOMPLETE", "DOC_MISSING")}
    for s in st.DOCUMENT_STATUSES:
        out.append(f"| {_code(s)} | {_cell(notes.get(by_value[s], ''))} |")
    out += [
        "",
        "Not accounted for yet (a rerun works on them): "
        f"{', '.join(_code(s) for s in st.DOCUMENT_STATUSES if s in st.UNACCOUNTED)}. "
        "Values written before this vocabulary are read as today's: "
        + ", ".join(f"{_code(old)} -> {_code(new)}" for old, new in st.LEGACY_DOCUMENT_STATUSES.items()) + ".",
        "",
        "## Online job states",
        "",
        "A job's own life, apart from its document's status (`/v1/jobs`).",
        "",
        "| state | final | meaning |",
        "|---|---|---|",
    ]
    seen = set()
    for n in (n for n in vars(st) if n.startswith("JOB_") and isinstance(getattr(st, n), str)):
        v = getattr(st, n)
        if v in seen:
            continue
        seen.add(v)
        out.append(f"| {_code(v)} | {'yes' if v in st.JOB_FINAL else 'no'} | {_cell(notes.get(n, ''))} |")
    out += [
        "",
        "## A region's finish",
        "",
        "A page row's `regions[].finish` says how the last attempt of the region's branch ended; other "
        "values are the engine's finish reasons.",
        "",
        "| finish | meaning |",
        "|---|---|",
    ]
    for n in (n for n in vars(st) if n.startswith("REGION_")):
        out.append(f"| {_code(getattr(st, n))} | {_cell(notes.get(n, ''))} |")
    return "\n".join(out) + "\n"


# ---- docs/flags.md ------------------------------------------------------------------------------------
class _CpuCount(int):
    """What ``os.cpu_count()`` returns while the parsers are built for the page: prints as the call."""

    def __repr__(self) -> str:
        return "os.cpu_count()"

    __str__ = __repr__


@contextlib.contextmanager
def _machine_neutral():
    """Build parsers whose defaults name the machine-dependent calls instead of this machine's values."""
    with mock.patch.object(os, "cpu_count", lambda: _CpuCount(7)), \
            mock.patch.object(tempfile, "gettempdir", lambda: TMPDIR_MARK):
        yield


def _neutral(text: str) -> str:
    text = text.replace(ROOT + os.sep, REPO_MARK + "/").replace(ROOT, REPO_MARK)
    return re.sub(r" at 0x[0-9a-fA-F]+", "", text)


def _subparsers(parser: argparse.ArgumentParser) -> argparse._SubParsersAction | None:
    return next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)


def _commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """(path, parser, one-line help) of ``parser`` and every command below it, depth first, in the order
    they were registered (an alias is listed once, under its first name)."""
    yield path, parser
    sub = _subparsers(parser)
    if sub is None:
        return
    seen: set[int] = set()
    for name, child in sub.choices.items():
        if id(child) in seen:
            continue
        seen.add(id(child))
        yield from _commands(child, path + (name,))


def _one_line_help(parser: argparse.ArgumentParser) -> dict[str, str]:
    sub = _subparsers(parser)
    return {a.dest: (a.help or "") for a in sub._choices_actions} if sub else {}


def _metavar(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    fmt = parser._get_formatter()
    if not action.option_strings:
        return fmt._format_args(action, fmt._get_default_metavar_for_positional(action))
    if action.nargs == 0:
        return ""
    return fmt._format_args(action, fmt._get_default_metavar_for_optional(action))


def _default(action: argparse.Action) -> str:
    if action.required:
        return "required"
    if action.default is argparse.SUPPRESS:
        return "not set"
    return _code_cell(_neutral(repr(action.default)))


def _help(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    if not action.help:
        return ""
    return _neutral(parser._get_formatter()._expand_help(action))


def _description(text: str | None) -> list[str]:
    if not text:
        return []
    paras = [" ".join(p.split()) for p in re.split(r"\n\s*\n", text) if p.strip()]
    return [x for p in paras for x in (_md(_neutral(p)), "")]


def _anchor(text: str) -> str:
    """GitHub's anchor for a heading: lowercase, spaces to '-', punctuation but '-' and '_' dropped."""
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def _command_section(path: tuple[str, ...], parser: argparse.ArgumentParser, parent_help: str) -> list[str]:
    name = " ".join(("padoc-ray",) + path)
    out = [f"## `{name}`", ""]
    if parent_help:
        out += [f"{_md(_neutral(parent_help[0].upper() + parent_help[1:]))}.", ""]
    out += _description(parser.description)
    subs = _one_line_help(parser)
    if subs:
        out += ["Commands: " + ", ".join(f"[`{sub}`](#{_anchor(f'{name} {sub}')})" for sub in subs) + ".", ""]
    for group in parser._action_groups:
        actions = [a for a in group._group_actions
                   if not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction))
                   and a.help is not argparse.SUPPRESS]
        if not actions:
            continue
        title = group.title or "options"
        out += [f"**{title}**", "", "| flags | metavar | default | help |", "|---|---|---|---|"]
        for a in actions:
            flags = ", ".join(_code(f) for f in a.option_strings) or f"{_code(a.dest)} (positional)"
            out.append(f"| {flags} | {_code_cell(_metavar(parser, a))} | {_default(a)} | {_cell(_help(parser, a))} |")
        out.append("")
    for group in parser._mutually_exclusive_groups:
        names = ", ".join(_code(a.option_strings[0] if a.option_strings else a.dest) for a in group._group_actions)
        out += [f"Only one of {names}" + (" (one is required)." if group.required else "."), ""]
    if parser.epilog:
        out += _description(parser.epilog)
    return out


def flags_page(parser: argparse.ArgumentParser | None = None) -> str:
    """``docs/flags.md``: every ``padoc-ray`` command and sub-command with every option argparse knows."""
    if parser is None:
        from padoc_ray.cli import build_parser

        build_parser()  # first imports run unpatched: a module must not keep the stand-ins past this page
        with _machine_neutral():
            parser = build_parser()
    commands = list(_commands(parser))
    out = [
        _banner("the `padoc-ray` parsers (`padoc_ray/cli/`)"),
        "",
        "# Command-line flags",
        "",
        "Every `padoc-ray` command and sub-command with each option's flags, metavar, default and help, as "
        "argparse holds them (`padoc-ray COMMAND --help` prints the same). Every command also takes "
        "`-h`/`--help`. Flags of config fields are made from the config dataclasses (`padoc_ray/cli/flags.py`), "
        "so their help ends with the field's default. Defaults that depend on the machine are shown as the code "
        "writes them: `$REPO` is the folder padoc-ray is installed from, `$TMPDIR` the temporary folder "
        "(`tempfile.gettempdir()`), `os.cpu_count()` the machine's cores. A default `not set` means the option "
        "sets nothing unless given (a command's `-v` leaves the top-level one as it is). What each command is for: "
        "[the README's command list](../README.md#commands).",
        "",
        "| command | what |",
        "|---|---|",
    ]
    helps: dict[tuple[str, ...], str] = {}
    for path, p in commands:
        for sub, h in _one_line_help(p).items():
            helps[path + (sub,)] = h
    for path, _p in commands[1:]:
        name = " ".join(("padoc-ray",) + path)
        out.append(f"| [`{name}`](#{_anchor(name)}) | {_cell(_neutral(helps.get(path, '')))} |")
    out.append("")
    for path, p in commands:
        out += _command_section(path, p, helps.get(path, ""))
    while out and out[-1] == "":
        out.pop()
    return "\n".join(out) + "\n"


# ---- writing and checking ------------------------------------------------------------------------------
PAGES = {STATUSES_PATH: statuses_page, FLAGS_PATH: flags_page}


def generate(root: str = ROOT) -> dict[str, str]:
    """{absolute path: the page's text as the code generates it now}."""
    return {os.path.join(root, rel): make() for rel, make in PAGES.items()}


def stale(root: str = ROOT) -> list[str]:
    """The pages (relative paths) whose file is missing or differs from what the code generates now."""
    out = []
    for path, text in generate(root).items():
        try:
            with open(path, encoding="utf-8") as f:
                same = f.read() == text
        except FileNotFoundError:
            same = False
        if not same:
            out.append(os.path.relpath(path, root))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog=REGENERATE, description="Write docs/statuses.md and docs/flags.md from "
                                                              "the code (or, with --check, say which is stale).")
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 naming every stale page")
    ap.add_argument("--root", default=ROOT, help="repository folder (default: the one padoc-ray runs from)")
    args = ap.parse_args(argv)
    if args.check:
        bad = stale(args.root)
        for rel in bad:
            print(f"{rel} is stale: run `{REGENERATE}`", file=sys.stderr)
        return 1 if bad else 0
    for path, text in generate(args.root).items():
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        print(os.path.relpath(path, args.root))
    return 0


if __name__ == "__main__":
    sys.exit(main())
