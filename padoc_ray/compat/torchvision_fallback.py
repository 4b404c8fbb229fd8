"""Activate padoc-ray's torchvision stand-in when (and only when) the real torchvision does not import.

transformers' Qwen2-VL / Qwen3-VL processors (and so vLLM's Qwen-VL model files) need
``torchvision.transforms.v2``. On the CPU install profile no torchvision wheel works next to
``torch==*+cpu``, so this module can put a small pure-torch stand-in
(``padoc_ray/compat/torchvision_shim/torchvision``) in front of ``sys.path``.

Activation is a ``padoc_ray_torchvision_fallback.pth`` file in the interpreter's site-packages
(``sysconfig`` purelib). Python's ``site`` module runs its single ``import ...`` line at every
interpreter start-up, so the stand-in reaches every process started from this interpreter:
subprocesses, ``multiprocessing`` spawn children, Ray workers and vLLM engine processes (none of
them depends on an inherited environment variable). The line inserts the stand-in directory at
``sys.path[0]`` so it wins over an installed-but-broken torchvision too. It does nothing when the
directory is gone or ``PADOC_RAY_DISABLE_TORCHVISION_SHIM`` is set to a non-empty value.

The decision is taken at install time; re-run ``install`` after installing or removing torchvision::

    python -m padoc_ray.compat.torchvision_fallback install     # stand-in only if needed
    python -m padoc_ray.compat.torchvision_fallback status
    python -m padoc_ray.compat.torchvision_fallback uninstall
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

__all__ = [
    "DISABLE_ENV",
    "PTH_NAME",
    "install",
    "main",
    "pth_line",
    "pth_path",
    "real_torchvision_works",
    "shim_dir",
    "uninstall",
]

PTH_NAME = "padoc_ray_torchvision_fallback.pth"
DISABLE_ENV = "PADOC_RAY_DISABLE_TORCHVISION_SHIM"

# Run in a child interpreter: a broken torchvision can fail half-way (or abort) and leave the
# parent's torch / sys.modules in a bad state. The stand-in is removed from sys.path first, and
# the marker check makes sure the stand-in is never mistaken for a working torchvision.
_PROBE = """
import os, sys
shim = os.path.realpath(sys.argv[1])
sys.path[:] = [p for p in sys.path if os.path.realpath(p or os.getcwd()) != shim]
import torchvision
import torchvision.transforms.v2
import torchvision.transforms.v2.functional
if getattr(torchvision, "__padoc_shim__", False):
    raise SystemExit("only the padoc-ray stand-in was found")
"""


def shim_dir() -> str:
    """Absolute path of the folder that holds the stand-in ``torchvision`` package (what goes on sys.path)."""
    return os.path.realpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "torchvision_shim"))


def _site_dir(site_dir: str | os.PathLike[str] | None) -> Path:
    return Path(site_dir) if site_dir is not None else Path(sysconfig.get_paths()["purelib"])


def pth_path(site_dir: str | os.PathLike[str] | None = None) -> str:
    """Where the ``.pth`` file lives (default: this interpreter's site-packages)."""
    return str(_site_dir(site_dir) / PTH_NAME)


def pth_line(path: str | None = None) -> str:
    """The single line written to the ``.pth`` file (``site`` executes lines that start with ``import``)."""
    path = shim_dir() if path is None else path
    return (
        f"import os, sys; p = {path!r}; "
        f"os.environ.get({DISABLE_ENV!r}) or not os.path.isdir(p) or p in sys.path or sys.path.insert(0, p)\n"
    )


def real_torchvision_works(python: str | None = None, timeout: float = 300.0) -> bool:
    """True if a real (non stand-in) ``torchvision`` with ``transforms.v2`` imports in a fresh ``python``."""
    env = dict(os.environ)
    env[DISABLE_ENV] = "1"
    try:
        proc = subprocess.run(
            [python or sys.executable, "-c", _PROBE, shim_dir()],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return False
    return proc.returncode == 0


def uninstall(site_dir: str | os.PathLike[str] | None = None) -> str | None:
    """Remove the ``.pth`` file; return its path if one was removed, else None."""
    path = Path(pth_path(site_dir))
    try:
        path.unlink()
    except FileNotFoundError:
        return None
    return str(path)


def install(site_dir: str | os.PathLike[str] | None = None) -> str | None:
    """Activate the stand-in if the real torchvision does not work; return the ``.pth`` path, or None.

    When the real torchvision works, any previously installed fallback is removed and None is returned.
    """
    if real_torchvision_works():
        uninstall(site_dir)
        return None
    shim = shim_dir()
    if not os.path.isfile(os.path.join(shim, "torchvision", "__init__.py")):
        raise FileNotFoundError(f"torchvision stand-in not found under {shim}")
    path = Path(pth_path(site_dir))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(pth_line(shim), encoding="utf-8")
    os.replace(tmp, path)  # atomic: a concurrently starting interpreter never sees half a line
    return str(path)


def _torchvision_in_fresh_interpreter() -> str:
    proc = subprocess.run(
        [sys.executable, "-c", "import torchvision; print(torchvision.__file__)"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return proc.stdout.strip() if proc.returncode == 0 else "nothing importable"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m padoc_ray.compat.torchvision_fallback",
        description=(
            "Manage padoc-ray's pure-torch torchvision stand-in (CPU install profile). transformers' "
            "Qwen2-VL/Qwen3-VL processors import torchvision.transforms.v2; when no working torchvision "
            "can be installed, 'install' writes a .pth file into this interpreter's site-packages so "
            "that every process started from it (subprocesses, Ray workers, vLLM engines) uses the stand-in."
        ),
        epilog=(
            f"The decision is taken when 'install' runs: re-run it after installing or removing torchvision. "
            f"Set {DISABLE_ENV}=1 to bypass an installed fallback for one process tree."
        ),
    )
    parser.add_argument(
        "--site-dir",
        default=None,
        help="site-packages folder for the .pth file (default: this interpreter's sysconfig purelib)",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="{install,uninstall,status}")
    sub.add_parser(
        "install",
        help="use the stand-in if the real torchvision does not import; otherwise remove any fallback",
    )
    sub.add_parser("uninstall", help="remove the fallback .pth file (the stand-in is no longer used)")
    sub.add_parser("status", help="show whether the fallback is installed and which torchvision is imported")
    args = parser.parse_args(argv)

    if args.command == "install":
        path = install(args.site_dir)
        if path is None:
            print("torchvision-fallback: real torchvision works; stand-in not installed (any old fallback removed)")
        else:
            print(f"torchvision-fallback: real torchvision unusable; installed stand-in {shim_dir()} via {path}")
    elif args.command == "uninstall":
        path = uninstall(args.site_dir)
        if path is None:
            print(f"torchvision-fallback: nothing to remove ({pth_path(args.site_dir)} does not exist)")
        else:
            print(f"torchvision-fallback: removed {path}")
    else:
        path = pth_path(args.site_dir)
        installed = os.path.isfile(path)
        real = real_torchvision_works()
        hint = " (run 'install' again to drop the now-unneeded fallback)" if installed and real else ""
        hint = " (run 'install' to enable the fallback)" if not installed and not real else hint
        print(
            f"torchvision-fallback: {'installed at ' + path if installed else 'not installed'}; "
            f"real torchvision works: {'yes' if real else 'no'}; "
            f"a fresh interpreter imports: {_torchvision_in_fresh_interpreter()}{hint}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
