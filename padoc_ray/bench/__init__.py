"""Every benchmark: a config dataclass per command (its fields are the command's flags) and an entry that
runs it, ``main(cfg) -> exit code``. ``padoc-ray bench ...`` (:mod:`padoc_ray.cli.bench`) is a table over
them. Figures go in reports and issue notes, never in tests. Library code never imports this."""

from __future__ import annotations

import glob
import json
import os

#: the repository folder, and what the benchmarks default to in it (as ``padoc_ray.cli.common``'s)
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLES_DIR = os.path.join(ROOT, "examples")
DEFAULT_MODEL = os.path.join(ROOT, "models", "tiny")


class UsageError(ValueError):
    """The benchmark cannot run as asked (a missing file, flags that contradict each other): the command
    says this message and exits 2, with no traceback."""


def write_json(path: str | None, obj, *, announce: bool = True) -> None:
    """``--json PATH``: the benchmark's figures as JSON (nothing when the flag is absent)."""
    if not path:
        return
    with open(path, "w") as f:
        json.dump(obj, f, indent=2)
    if announce:
        print(f"wrote {path}")


def pdf_paths(spec: str) -> list[str]:
    """PDFs of a folder (searched recursively) or a glob; :class:`UsageError` when there are none."""
    paths = sorted(glob.glob(os.path.join(spec, "**", "*.pdf"), recursive=True)) if os.path.isdir(spec) \
        else sorted(glob.glob(spec))
    if not paths:
        raise UsageError(f"no PDFs at {spec}")
    return paths


def require_path(path: str | None, what: str, *, kind: str = "exists") -> None:
    """:class:`UsageError` unless ``path`` exists (``kind``: ``exists``, ``file`` or ``dir``)."""
    check = {"exists": os.path.exists, "file": os.path.isfile, "dir": os.path.isdir}[kind]
    if path and not check(path):
        noun = {"exists": "does not exist", "file": "is not a file", "dir": "is not a folder"}[kind]
        raise UsageError(f"{what}: {path} {noun}")


def service_report(cfg, run) -> dict:
    """A benchmark that starts its own ``padoc-ray serve`` (soak, fairness): ``run(cfg, ROOT, log)``'s report,
    written to ``cfg.json`` (which the command line requires)."""
    import sys

    if not cfg.json:
        raise UsageError("--json OUT.json is required: the report goes there")
    try:
        report = run(cfg, ROOT, log=lambda m: print(m, file=sys.stderr, flush=True))
    except (ValueError, RuntimeError) as e:
        raise UsageError(str(e)) from None
    write_json(cfg.json, report)
    return report
