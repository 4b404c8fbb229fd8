"""Runs first in the engine processes that vLLM spawns for padoc-ray (the engine core: on CPU vLLM always
spawns it). :func:`padoc_ray.engine.vllm_engine._spawn_env` puts this folder on their PYTHONPATH, and
Python imports ``sitecustomize`` when it starts.

Python's cyclic garbage collector stays off while such a process prepares (imports vLLM, which is what
unpickling its target does). That import builds a million objects and no cyclic garbage worth a collection,
yet the collector walked them again and again: a spawned process whose target is in a module that imports
``vllm.v1.engine.core`` had used 6.3-6.6 user CPU-s when its target started, 5.3-5.8 with it off (python
3.11, 2 cores). When the target starts, one collection takes the preparation's garbage (about 17,000
objects) and the survivors are frozen (``gc.freeze``), as vLLM's own ``freeze_gc_heap`` does once the engine
is built, and then the collector is back on. Without the freeze, the engine's start walked the imports'
objects again: its first automatic collection (every object made while the collector was off is in the
youngest generation), the two ``gc.collect()`` of vLLM's model loader and ``freeze_gc_heap``'s own
collection, about half a CPU-second each: a `parse-page` run's user CPU 15.6-16.8 s without the freeze,
14.4-15.0 with it. The frontend pauses the collector around its own start
(:func:`padoc_ray.engine.memory.paused_gc`) and freezes in the same way.

Only a direct child of the process that set this up (``PARENT_VAR`` names its pid) is changed, and
only a multiprocessing child resumes (any other one, such as vLLM's short model-inspection subprocess,
keeps the collector off until it exits). Either way the folder and the variable are taken out of
PYTHONPATH, ``sys.path`` and the environment first, so what the process starts in turn is unchanged, and
a ``sitecustomize`` of the environment's own still runs.
"""

import gc
import importlib.machinery
import importlib.util
import os
import sys

#: the pid of the process whose spawned children this applies to
PARENT_VAR = "PADOC_RAY_SPAWN_BOOT_PARENT"

_HERE = os.path.dirname(os.path.abspath(__file__))


def _not_here(paths):
    return [p for p in paths if os.path.abspath(p or os.curdir) != _HERE]


def _forget_this_folder() -> str | None:
    """Take the folder out of ``sys.path`` and PYTHONPATH, and the variable out of the environment;
    returns the variable's value."""
    sys.path[:] = _not_here(sys.path)
    rest = _not_here(p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p)
    if rest:
        os.environ["PYTHONPATH"] = os.pathsep.join(rest)
    else:
        os.environ.pop("PYTHONPATH", None)
    return os.environ.pop(PARENT_VAR, None)


def _run_the_environments_own() -> None:
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", sys.path)
    if spec is not None and spec.loader is not None:
        spec.loader.exec_module(importlib.util.module_from_spec(spec))


def _pause_until_the_target_starts() -> None:
    from multiprocessing import process

    bootstrap = process.BaseProcess._bootstrap

    def _bootstrap(self, *args, **kwargs):
        process.BaseProcess._bootstrap = bootstrap
        from padoc_ray.engine.memory import freeze_startup_heap  # the package is importable here: the parent runs it

        freeze_startup_heap()  # with the collector still off: the preparation's garbage, then the rest out of its walk
        gc.enable()
        return bootstrap(self, *args, **kwargs)

    gc.disable()
    process.BaseProcess._bootstrap = _bootstrap


_parent = _forget_this_folder()
_run_the_environments_own()
if _parent == str(os.getppid()) and gc.isenabled():
    _pause_until_the_target_starts()
