"""padoc_ray/status.py is the one home of every page, document and job status: the table is
consistent with its producers, rolls pages up the way both surfaces do, and no module of the
package spells a status as a string literal (an AST scan)."""

from __future__ import annotations

import ast
import pathlib

import pytest

from padoc_ray import status

PKG = pathlib.Path(__file__).resolve().parents[2] / "padoc_ray"
assert PKG.is_dir(), PKG

#: status words that are also plain English (or another vocabulary's): a literal of one is a status
#: literal only where it stands for a status (compared with, or given as, a status or code)
GENERIC = frozenset({status.OK, status.DOC_FAILED, status.DOC_PARTIAL, status.DOC_SKIPPED, status.DOC_MISSING,
                     status.DOC_INCOMPLETE, status.CANCELLED, status.DEADLINE, status.RUNAWAY, status.SYMLINK,
                     status.JOB_QUEUED, status.JOB_RUNNING, status.JOB_DONE, status.JOB_CANCELLING, "success",
                     "failure"})
ALL_VALUES = (frozenset(status.CODES) | set(status.DOCUMENT_STATUSES) | set(status.LEGACY_DOCUMENT_STATUSES)
              | {status.JOB_QUEUED, status.JOB_RUNNING, status.JOB_DONE, status.JOB_CANCELLING})
#: a literal is a status wherever it stands if it cannot mean anything else
DISTINCT = ALL_VALUES - GENERIC
#: names whose values are statuses
STATUS_NAMES = ("status", "code", "stopped", "finish")
#: modules with a vocabulary of their own that shares words with the statuses, and what it is
OTHER_VOCABULARIES = {
    "eval/e2e/evaluate.py": "the end-to-end evaluator's verdict on one ground-truth page (ok | empty_prediction | "
                            "failed), not a page row's status",
}
STATUS_KEYS = frozenset({"status", "code", "error_code", "document_status", "page_status", "prediction_status"})


def _docstrings(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def _names_status(node: ast.AST) -> bool:
    text = ast.unparse(node).lower()
    return any(n in text for n in STATUS_NAMES)


def _strings(node: ast.AST):
    """The string constants of ``node`` itself or of a tuple/list/set display it is."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        yield node
    elif isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        for e in node.elts:
            yield from _strings(e)


def status_literals(source: str) -> list[tuple[int, str]]:
    tree = ast.parse(source)
    docs = _docstrings(tree)
    found: dict[int, tuple[int, str]] = {}

    def hit(const: ast.Constant, generic_ok: bool = False) -> None:
        if id(const) in docs:
            return
        if const.value in DISTINCT or (generic_ok and const.value in GENERIC):
            found[id(const)] = (const.lineno, const.value)

    keys = {id(k) for node in ast.walk(tree) if isinstance(node, ast.Dict) for k in node.keys if k is not None}
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if id(node) not in keys:  # a mapping's key names a field (pyarrow's request_timeout), not a status
                hit(node)
        elif isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(_names_status(s) for s in sides):
                for s in sides:
                    for c in _strings(s):
                        hit(c, True)
        elif isinstance(node, ast.Dict):
            for k, v in zip(node.keys, node.values):
                if isinstance(k, ast.Constant) and k.value in STATUS_KEYS:
                    for c in _strings(v):
                        hit(c, True)
        elif isinstance(node, ast.keyword) and node.arg in STATUS_KEYS:
            for c in _strings(node.value):
                hit(c, True)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if node.value is not None and any(_names_status(t) for t in targets):
                for c in _strings(node.value):
                    hit(c, True)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" \
                and len(node.args) == 2 and isinstance(node.args[0], ast.Constant) \
                and node.args[0].value in STATUS_KEYS:
            for c in _strings(node.args[1]):
                hit(c, True)
    return sorted(found.values())


def test_no_status_literal_outside_status_py():
    offenders = []
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG)
        if rel.parts[0] == "compat" or rel.as_posix() == "status.py" or rel.as_posix() in OTHER_VOCABULARIES:
            continue
        for line, value in status_literals(path.read_text(encoding="utf-8")):
            offenders.append(f"padoc_ray/{rel}:{line}: {value!r}")
    assert not offenders, "status literals outside padoc_ray/status.py (import the constant):\n" + "\n".join(offenders)


@pytest.mark.parametrize("src, found", [
    ('x = "render_failed"', [(1, "render_failed")]),  # a distinct code anywhere
    ('if row["status"] == "ok": pass', [(1, "ok")]),  # a generic one compared with a status
    ('d = {"status": "failed"}', [(1, "failed")]),
    ('f(status="cancelled")', [(1, "cancelled")]),
    ('st.get("code", "failed")', [(1, "failed")]),
    ('stopped = "runaway"', [(1, "runaway")]),
    ('if x in ("ok", "partial") and row.status: pass', []),  # no status on the compared side
    ('print("ok")', []),  # plain English
    ('"""ok: render_failed"""', []),  # docstrings are prose
    ('kw = {"request_timeout": 5}', []),  # a mapping's key is a field name
])
def test_the_scan_finds_status_literals(src, found):
    assert status_literals(src) == found


def test_the_table():
    for name, c in status.CODES.items():
        assert c.name == name and c.tiers and c.tiers <= {status.PAGE, status.DOCUMENT}
        assert c.rerun in (status.NEVER, status.ALWAYS, status.IF_ALLOWED)
        assert c.content is False or status.PAGE in c.tiers
        assert 200 <= c.http < 600 and c.meaning
        # a rerun retries documents, never page rows
        assert c.rerun == status.NEVER or c.tiers == {status.DOCUMENT}
    assert status.CONTENT_CODES == {status.OK, status.MALFORMED_LAYOUT, status.TOKEN_LIMIT, status.BRANCH_LIMIT,
                                    status.RUNAWAY, status.BRANCH_UNRECOVERED, status.LAYOUT_UNRECOVERED}
    # document statuses and document codes never collide (documents.parquet holds both in one column)
    assert not set(status.DOCUMENT_STATUSES[1:]) & set(status.CODES)
    assert status.http_status(status.FILE_TOO_LARGE) == 413 and status.http_status(status.CORRUPT_PDF) == 422
    assert status.http_status("a code nobody knows", 500) == 500


def test_producers_use_the_table():
    from padoc_ray.pipeline import limits
    from padoc_ray.scheduler.state import PageStatus

    # every scheduler verdict is a page code, and the host's INTERNAL_ERROR is the scheduler's
    assert {p.label for p in PageStatus} <= status.PAGE_CODES
    assert PageStatus.INTERNAL_ERROR.label == status.INTERNAL_ERROR
    # the listing's refusals are document codes a rerun decides again
    assert limits.LISTING_CODES <= status.RETRIED_CODES
    assert {code for _, code in limits.REFUSALS} <= status.DOCUMENT_CODES


def test_rollup():
    d = status.document_status
    assert d([status.OK, status.OK]) == status.DOC_OK
    assert d([status.OK, status.RENDER_TIMEOUT]) == status.DOC_PARTIAL
    assert d([status.TOKEN_LIMIT]) == status.DOC_FAILED  # content, but not ok: as both surfaces count
    assert d([]) == status.DOC_FAILED
    assert d([status.OK, None]) == status.DOC_INCOMPLETE
    assert status.rollup(3, 0) == status.DOC_OK and status.rollup(0, 2) == status.DOC_FAILED


def test_legacy_document_statuses_are_read_as_today():
    n = status.normalize_document_status
    assert [n(v) for v in ("success", "partial_success", "failure")] == [status.DOC_OK, status.DOC_PARTIAL,
                                                                         status.DOC_FAILED]
    assert n(status.DOC_OK) == status.DOC_OK and n(status.CORRUPT_PDF) == status.CORRUPT_PDF and n(None) is None


def test_a_job_stored_with_the_old_vocabulary_reads_as_today(tmp_path):
    from padoc_ray.serve.jobs import JobStore

    store = JobStore(str(tmp_path / "jobs"))
    st = store.create(tenant="t", name="x.pdf", data=b"%PDF", options={}, pages_total=1)
    for old, new in status.LEGACY_DOCUMENT_STATUSES.items():
        store.put({**st, "status": status.JOB_DONE, "document_status": old})  # signed as jobs always were
        assert store.get(st["id"])["document_status"] == new


def test_serve_error_codes_are_spelled_only_in_serve_errors_py():
    """Serve's request-level codes (``padoc_ray/serve/errors.py``'s constants) appear as string literals
    nowhere else in the package: every route refers to the one home of its code (docstrings aside)."""
    from padoc_ray.serve import errors

    codes = {v for k, v in vars(errors).items() if k.isupper() and isinstance(v, str)} - {errors.ERROR}
    assert {"too_many_jobs", "job_cancelled", "bad_image_url", "not_found"} <= codes
    offenders = []
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG).as_posix()
        if rel == "serve/errors.py" or rel.startswith("compat/"):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docs = _docstrings(tree)
        keys = {id(k) for node in ast.walk(tree) if isinstance(node, ast.Dict) for k in node.keys if k is not None}
        offenders += [f"padoc_ray/{rel}:{n.lineno}: {n.value!r}" for n in ast.walk(tree)
                      if isinstance(n, ast.Constant) and n.value in codes and id(n) not in docs and id(n) not in keys]
    assert not offenders, "serve error codes spelled outside serve/errors.py:\n" + "\n".join(offenders)
