"""The Makefile's choice of interpreter for `.venv` (docs/testing.md#speed): the distribution's
/usr/bin/python3.11 where it can make a venv and has its C headers, else the first python3.11 on PATH;
``PY=...`` overrides both. Asked of make itself (`make -f Makefile -f <a rule that prints $(PY)>`), nothing
installed."""

from __future__ import annotations

import os
import subprocess

from tests.conftest import ROOT

DISTRO = "/usr/bin/python3.11"


def _make_py(tmp_path, *overrides: str) -> str:
    """$(PY) as the repository's Makefile sets it, with ``overrides`` (VAR=value) on make's command line."""
    show = tmp_path / "show.mk"
    show.write_text("show-py:\n\t@echo $(PY)\n")
    out = subprocess.run(["make", "-s", "-C", ROOT, "-f", "Makefile", "-f", str(show), "show-py", *overrides],
                         capture_output=True, text=True, timeout=60, check=True)
    return out.stdout.strip()


def _usable(python: str) -> bool:
    """What the Makefile asks of the distribution's interpreter, asked here in words of our own."""
    probe = ("import ensurepip, os, sysconfig, venv, sys; "
             "assert sys.version_info[:2] == (3, 11); "
             "assert os.path.isfile(os.path.join(sysconfig.get_paths()['include'], 'Python.h'))")
    return subprocess.run([python, "-c", probe], capture_output=True, timeout=60).returncode == 0


def test_the_distributions_python_when_it_can_make_a_venv_with_headers(tmp_path):
    if not (os.path.exists(DISTRO) and _usable(DISTRO)):
        assert _make_py(tmp_path) == "python3.11"
    else:
        assert _make_py(tmp_path) == DISTRO


def test_python311_on_path_when_the_distributions_cannot(tmp_path):
    # a check the distribution's interpreter fails (its prefix is /usr) and any other passes
    rejects_usr = "import sys; assert not sys.base_prefix.startswith('/usr')"
    assert _make_py(tmp_path, f"PY_USABLE={rejects_usr}") == "python3.11"


def test_py_on_the_command_line_wins(tmp_path):
    assert _make_py(tmp_path, "PY=/opt/some/python3.11") == "/opt/some/python3.11"
