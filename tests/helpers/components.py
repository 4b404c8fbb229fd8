"""What some tests need from the machine beyond the virtual environment, and what such a test does
where it is missing: it skips, saying what is missing and how ``make test`` gets it, on a developer's
machine, and it fails on CI (``CI`` set to ``true``/``1``/``yes``, as ``.ci/run`` sets it), where a
skip would hide that the run checked less than it says.

Being root is the one exception: CI need not run as root, so a check that only root can make skips
on CI too (reported by ``-ra`` like every skip)."""

from __future__ import annotations

import os
import shutil
from typing import NoReturn

import pytest

CI_ENV = "CI"  #: set by CI services (and by .ci/run where it is not): missing components fail the run


def on_ci() -> bool:
    """Whether this run is a CI run (``CI`` is ``true``, ``1`` or ``yes``, in any case)."""
    return os.environ.get(CI_ENV, "").strip().lower() in ("1", "true", "yes")


def missing(what: str, how: str) -> NoReturn:
    """``what`` is missing: skip the test with the reason (``how`` says how to get it), or fail it on CI."""
    reason = f"{what} is missing ({how})"
    if on_ci():
        pytest.fail(f"CI={os.environ[CI_ENV]}: {reason}; a CI run must have it, so this fails instead of "
                    f"skipping", pytrace=False)
    _skip(reason)


def _skip(reason: str) -> NoReturn:
    """pytest.skip, which ``-ra`` reports at the test, not at this helper (what a skip mark does)."""
    raise pytest.skip.Exception(reason, _use_item_location=True)


def chromium() -> str:
    """The path of Debian's chromium (what the browser tests drive through Playwright)."""
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        missing("the browser: Debian's `chromium` on PATH", "`make browser` installs it with apt")
    return path


def playwright_sync_api():
    """Playwright's synchronous API (``playwright.sync_api``), the browser tests' driver."""
    try:
        from playwright import sync_api
    except ImportError as e:
        missing(f"the browser driver: the `playwright` package ({e})", "the `dev` extra installs it: make install")
    return sync_api


def tcmalloc() -> str:
    """The tcmalloc the engine would preload (:func:`padoc_ray.engine.memory.find_tcmalloc`)."""
    from padoc_ray.engine.memory import find_tcmalloc

    path = find_tcmalloc()
    if path is None:
        missing("tcmalloc: Debian's libtcmalloc-minimal4 (or vLLM's bundled copy)",
                "`make tcmalloc` installs it with apt")
    return path


def shared_file(path: str, what: str) -> str:
    """``path``, a file of the shared data beside the repository (``../shared``), which ``what`` is."""
    if not os.path.exists(path):
        missing(f"{what} ({path})", "a checkout has ../shared/data beside the repository")
    return path


def root(check: str) -> None:
    """Skip unless this process is root: ``check`` is what only root can set up (never a failure on CI,
    which need not run as root)."""
    if os.getuid() != 0:
        _skip(f"needs root: {check}")
