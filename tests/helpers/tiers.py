"""The suite's tiers, the folders under tests/ (docs/testing.md): ``unit`` and ``contracts`` (the fast
tiers, what ``make test-fast`` runs), ``engine`` (a real CPU vLLM engine) and ``cluster`` (Ray, Ray
Serve, an S3 server, a browser). A pytest plugin that tests/conftest.py registers:

* every test carries its tier's marker, taken from its folder (:func:`mark_tiers`; ``-m "not cluster"``);
* a test of a fast tier that starts a Ray cluster, a vLLM engine, Ray Serve, an S3 server or a
  browser (in its setup, call or teardown) fails, with :class:`TierViolation` saying which tier
  it belongs in; the guard watches :func:`ray.init`, ``VllmEngine`` (and vLLM's ``AsyncLLM``/``LLM``
  where imported) and every child process (:func:`starts`: `ray start`, Ray's own servers, `padoc-ray`
  commands that start Ray or an engine, moto, chromium or Playwright's driver);
* at the end of a run, after pytest's slowest tests, the seconds each tier took (setup + call +
  teardown of its tests, summed over the xdist workers: the reports the controller received)."""

from __future__ import annotations

import contextlib
import os
import shlex
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

TESTS_DIR = Path(__file__).resolve().parent.parent  #: tests/
TIERS = ("unit", "engine", "cluster", "contracts")  #: the folders under tests/ that hold tests, one tier each
FAST_TIERS = ("unit", "contracts")  #: what `make test-fast` runs: neither Ray nor an engine may start here

#: `padoc-ray COMMAND` runs that start something a fast tier must not: command -> (what, its tier)
CLI_STARTS = {
    "parse": ("Ray (`padoc-ray parse`: the batch job)", "cluster"),
    "demo": ("Ray and a vLLM engine (`padoc-ray demo`)", "engine"),
    "serve": ("Ray Serve (`padoc-ray serve`)", "cluster"),
    "train": ("Ray Train (`padoc-ray train`)", "cluster"),
    "parse-page": ("a vLLM engine (`padoc-ray parse-page`)", "engine"),
}
#: `padoc-ray bench NAME` runs likewise
BENCH_STARTS = {
    "replay": ("a vLLM engine (`padoc-ray bench replay`)", "engine"),
    "serve": ("a vLLM engine (`padoc-ray bench serve`)", "engine"),
    "steps": ("a vLLM engine (`padoc-ray bench steps`)", "engine"),
    "pipeline": ("Ray (`padoc-ray bench pipeline`)", "cluster"),
    "soak": ("Ray Serve (`padoc-ray bench soak`)", "cluster"),
    "fairness": ("Ray Serve (`padoc-ray bench fairness`)", "cluster"),
    "http": ("Ray Serve (`padoc-ray bench http`)", "cluster"),
}
RAY_SERVERS = ("gcs_server", "raylet")  #: what `ray.init` starts for a local cluster, also in this process
JOB_SCRIPTS = ("batch_parse.py", "reannotate.py", "train.py")  #: jobs/*.py: Ray job entry points


class TierViolation(RuntimeError):
    """A test of a fast tier started what only the engine or the cluster tier may start."""


def tier_of(path: str | os.PathLike) -> str | None:
    """The tier of a test file (its first folder under tests/), or None outside the tiers."""
    try:
        first = Path(path).resolve().relative_to(TESTS_DIR).parts[0]
    except (ValueError, IndexError):
        return None
    return first if first in TIERS else None


def _words(args) -> list[str]:
    """A child's command as a list of words (a shell command line split into its words)."""
    argv = [args] if isinstance(args, (str, bytes, os.PathLike)) else list(args)
    argv = [os.fsdecode(a) for a in argv]
    if len(argv) >= 3 and os.path.basename(argv[0]) in ("sh", "bash", "dash") and argv[1] == "-c":
        argv = argv[2:3]
    if len(argv) == 1 and " " in argv[0]:
        try:
            return shlex.split(argv[0])
        except ValueError:
            return argv[0].split()
    return argv


def _padoc_ray(rest: list[str]) -> tuple[str, str] | None:
    """What `padoc-ray *rest` starts (nothing with --help)."""
    if "-h" in rest or "--help" in rest:
        return None
    words = [w for w in rest if not w.startswith("-")]
    if not words:
        return None
    if words[0] == "bench":
        return BENCH_STARTS.get(words[1]) if len(words) > 1 else None
    if words[0] == "doctor" and "--start" in rest:
        return "a vLLM engine (`padoc-ray doctor --start`)", "engine"
    return CLI_STARTS.get(words[0])


def starts(args) -> tuple[str, str] | None:
    """(what, the tier it belongs to) if a child process with these arguments starts Ray, Ray Serve, a
    vLLM engine, an S3 server (moto) or a browser; else None."""
    argv = _words(args)
    names = [os.path.basename(a) for a in argv]
    if names and names[0] in RAY_SERVERS:
        return f"a Ray cluster (Ray's {names[0]})", "cluster"
    for i, (word, name) in enumerate(zip(argv, names)):
        following = argv[i + 1:]
        if name == "ray" and following[:1] == ["start"]:
            return "a Ray cluster (`ray start`)", "cluster"
        if name == "padoc-ray":
            return _padoc_ray(following)
        if word == "-m" and following[:1] in (["padoc_ray.cli"], ["padoc_ray"]):
            return _padoc_ray(following[1:])
        if word == "moto.server" or name == "moto_server":
            return "an S3 server (moto)", "cluster"
        if name in ("chromium", "chromium-browser") or word == "run-driver":
            return "a browser (chromium or Playwright's driver)", "cluster"
        if name in JOB_SCRIPTS and os.path.basename(os.path.dirname(word)) == "jobs":
            return f"a Ray job (jobs/{name})", "cluster"
    return None


class Guard:
    """While active: what starts Ray or an engine raises :class:`TierViolation` (and is recorded, so
    that the test fails even where its code catches the error)."""

    def __init__(self, tier: str):
        self.tier = tier
        self.violations: list[str] = []

    def violation(self, what: str, belongs: str) -> TierViolation:
        message = (f"{self.tier} tier: this test starts {what}; move it to tests/{belongs}/ (the fast tiers, "
                   f"tests/unit and tests/contracts, start neither Ray nor an engine: docs/testing.md)")
        self.violations.append(message)
        return TierViolation(message)

    def _refuse(self, what: str, belongs: str):
        def refused(*args, **kwargs):
            raise self.violation(what, belongs)
        return refused

    @contextlib.contextmanager
    def active(self):
        """The seams patched: every child process (``Popen._execute_child``, which asyncio's children and
        Ray's own servers go through too), ``VllmEngine`` and, where already imported, vLLM's engines
        and ``ray.init`` (Ray imported later still starts its local cluster's servers as children)."""
        from padoc_ray.engine.vllm_engine import VllmEngine  # imports no vLLM

        execute_child = subprocess.Popen._execute_child

        def guarded_execute_child(popen, args, *rest, **kw):
            found = starts(args)
            if found is not None:
                raise self.violation(*found)
            return execute_child(popen, args, *rest, **kw)

        mp = pytest.MonkeyPatch()
        try:
            mp.setattr(subprocess.Popen, "_execute_child", guarded_execute_child)
            mp.setattr(VllmEngine, "__init__", self._refuse("a vLLM engine (VllmEngine)", "engine"))
            for module, cls in (("vllm.v1.engine.async_llm", "AsyncLLM"), ("vllm.entrypoints.llm", "LLM")):
                if hasattr(sys.modules.get(module), cls):  # never imported for the guard
                    mp.setattr(getattr(sys.modules[module], cls), "__init__",
                               self._refuse(f"a vLLM engine (vLLM's {cls})", "engine"))
            if hasattr(sys.modules.get("ray"), "init"):
                mp.setattr(sys.modules["ray"], "init", self._refuse("Ray (ray.init)", "cluster"))
            yield self
        finally:
            mp.undo()


def _guarded(item):
    """The body of the three run-phase wrappers: the phase under a :class:`Guard` in the fast tiers."""
    tier = tier_of(item.path)
    if tier not in FAST_TIERS:
        return (yield)
    guard = Guard(tier)
    with guard.active():
        result = yield
    if guard.violations:  # the phase passed: its code caught the error
        pytest.fail(f"{guard.violations[0]} [the test's code caught the TierViolation]", pytrace=False)
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    return (yield from _guarded(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    return (yield from _guarded(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    return (yield from _guarded(item))


def mark_tiers(items) -> None:
    """Each test gets its tier's marker. Called from the collection hook after the files are ordered
    (tests/helpers/suite_order.py weighs the marks set by hand) and before ``-m`` selects."""
    for item in items:
        tier = tier_of(item.path)
        if tier is not None:
            item.add_marker(tier)


def tier_totals(reports, rootpath: Path) -> dict[str, list]:
    """{tier: [seconds, tests]}: the setup, call and teardown durations of the test reports, by tier
    (tests outside the tiers under "other")."""
    totals: dict[str, list] = defaultdict(lambda: [0.0, set()])
    for rep in reports:
        if getattr(rep, "when", None) not in ("setup", "call", "teardown") or not hasattr(rep, "duration"):
            continue
        tier = tier_of(rootpath / rep.nodeid.split("::", 1)[0]) or "other"
        totals[tier][0] += rep.duration
        totals[tier][1].add(rep.nodeid)
    return {tier: [secs, len(ids)] for tier, (secs, ids) in totals.items()}


@pytest.hookimpl(trylast=True)  # after --durations' slowest tests
def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    reports = [rep for replist in terminalreporter.stats.values() for rep in replist]
    totals = tier_totals(reports, config.rootpath)
    if not totals:
        return
    terminalreporter.write_sep("=", "tier totals: seconds of setup + call + teardown, summed over the workers")
    for tier in [*TIERS, *sorted(set(totals) - set(TIERS))]:
        if tier in totals:
            secs, n = totals[tier]
            terminalreporter.write_line(f"{tier:<10} {secs:9.1f} s  {n:5d} tests")
